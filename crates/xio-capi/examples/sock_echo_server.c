/*
 * sock_echo_server: an echo server over X-IO streams, driven by an
 * ordinary epoll loop. The X-IO net's fd (xio_net_fd) sits in the epoll
 * set next to whatever else the program waits on (here: stdin, to show
 * the mix); when it is readable, xio_net_poll(..., 0, ...) says which
 * streams and listeners are ready. Streams and the listener are
 * non-blocking.
 *
 *   sock_echo_server <prefix> <ip:port> [connections]
 *
 * Exits after serving `connections` connections to the end (0: never).
 * Prints "XIO:ready" once listening.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "xio.h"

#define MAX_CONNS 4096

struct conn {
    xio_stream *s;
    uint64_t token;
    uint8_t out[65536]; /* bytes read but not yet written back */
    size_t out_len;
};

static struct conn *conns[MAX_CONNS];

static void die(const char *what, xio_result r) {
    fprintf(stderr, "sock_echo_server: %s: %s (%s)\n", what, xio_strerror(r), xio_last_error());
    exit(1);
}

static struct conn *find(uint64_t token) {
    for (size_t i = 0; i < MAX_CONNS; i++)
        if (conns[i] && conns[i]->token == token)
            return conns[i];
    return NULL;
}

static void drop_conn(struct conn *c) {
    for (size_t i = 0; i < MAX_CONNS; i++)
        if (conns[i] == c)
            conns[i] = NULL;
    xio_stream_close(c->s);
    free(c);
}

/* Writes what is pending; returns 0 while the connection lives. */
static int flush(struct conn *c) {
    size_t off = 0;
    while (off < c->out_len) {
        size_t n;
        xio_result r = xio_write(c->s, c->out + off, c->out_len - off, &n);
        if (r == XIO_ERR_WOULD_BLOCK)
            break;
        if (r != XIO_OK)
            return -1;
        off += n;
    }
    memmove(c->out, c->out + off, c->out_len - off);
    c->out_len -= off;
    return 0;
}

/* Reads and echoes until it would block; returns 1 at end of stream. */
static int serve(struct conn *c) {
    for (;;) {
        if (flush(c) < 0)
            return -1;
        if (c->out_len == sizeof c->out)
            return 0; /* wait for the peer to read: back-pressure */
        size_t n;
        xio_result r = xio_read(c->s, c->out + c->out_len, sizeof c->out - c->out_len, &n);
        if (r == XIO_ERR_WOULD_BLOCK)
            return 0;
        if (r != XIO_OK)
            return -1;
        if (n == 0)
            return flush(c) < 0 ? -1 : (c->out_len ? 0 : 1);
        c->out_len += n;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <prefix> <ip:port> [connections]\n", argv[0]);
        return 2;
    }
    long want = argc > 3 ? strtol(argv[3], NULL, 10) : 0;

    xio_net *net;
    xio_listener *lis;
    xio_result r = xio_net_attach(argv[1], &net);
    if (r != XIO_OK)
        die("attach", r);
    if ((r = xio_listen(net, argv[2], &lis)) != XIO_OK)
        die("listen", r);
    if ((r = xio_listener_set_nonblocking(lis, 1)) != XIO_OK)
        die("nonblocking", r);
    uint64_t lis_token;
    xio_listener_token(lis, &lis_token);

    /* The net's fd, and beside it the manager's (readable when the
     * manager has something to say or dies). */
    int xfd, mfd;
    if ((r = xio_net_fd(net, &xfd)) != XIO_OK || (r = xio_net_manager_fd(net, &mfd)) != XIO_OK)
        die("fd", r);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = xfd};
    struct epoll_event mev = {.events = EPOLLIN, .data.fd = mfd};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, xfd, &ev) < 0 ||
        epoll_ctl(ep, EPOLL_CTL_ADD, mfd, &mev) < 0) {
        perror("epoll");
        return 1;
    }
    int manager_gone = 0;
    printf("XIO:ready\n");
    fflush(stdout);

    long served = 0;
    xio_event events[64];
    size_t n = 0;
    /* Poll once before the first wait: it arms the fd. */
    if ((r = xio_net_poll(net, events, 64, 0, &n)) != XIO_OK)
        die("poll", r);
    while (want == 0 || served < want) {
        for (size_t i = 0; i < n; i++) {
            if (events[i].token == lis_token) {
                xio_stream *s;
                while ((r = xio_accept(lis, &s)) == XIO_OK) {
                    struct conn *c = calloc(1, sizeof *c);
                    c->s = s;
                    xio_stream_set_nonblocking(s, 1);
                    xio_stream_token(s, &c->token);
                    size_t k = 0;
                    while (k < MAX_CONNS && conns[k])
                        k++;
                    if (k == MAX_CONNS) {
                        fprintf(stderr, "sock_echo_server: too many connections\n");
                        return 1;
                    }
                    conns[k] = c;
                    int st = serve(c); /* data may have come with the connection */
                    if (st != 0) {
                        drop_conn(c);
                        served++;
                    }
                }
                if (r != XIO_ERR_WOULD_BLOCK)
                    die("accept", r);
                continue;
            }
            struct conn *c = find(events[i].token);
            if (!c)
                continue; /* closed meanwhile */
            int st = serve(c);
            if (st != 0) {
                drop_conn(c);
                served++;
            }
        }
        if (want && served >= want)
            break;
        /* Wait in the program's own loop, for as long as it takes: the
         * net's fd also becomes readable for a write that waits on a full
         * ring or an empty pool. */
        struct epoll_event got[4];
        int k = epoll_wait(ep, got, 4, -1);
        if (k < 0 && errno != EINTR) {
            perror("epoll_wait");
            return 1;
        }
        if ((r = xio_net_poll(net, events, 64, 0, &n)) != XIO_OK)
            die("poll", r);
        if (!manager_gone && xio_net_manager_gone(net, &manager_gone) == XIO_OK && manager_gone)
            fprintf(stderr, "sock_echo_server: the X-IO manager went away; "
                            "open connections keep working\n");
    }
    printf("XIO:served %ld\n", served);
    for (size_t i = 0; i < MAX_CONNS; i++)
        if (conns[i])
            drop_conn(conns[i]);
    close(ep);
    xio_listener_close(lis);
    xio_net_close(net);
    return 0;
}
