/*
 * The C ABI's contract, from C: NULL and foreign handles give errors,
 * failures write nothing, read-only buffers refuse writes, timeouts and
 * non-blocking calls say so, and the zero-copy and socket paths work.
 * Compiled with -Wall -Wextra -Werror (and AddressSanitizer) by
 * tests/c.rs, which runs it against a manager: api_test <prefix>.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "xio.h"

static int failures;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "api_test.c:%d: CHECK(%s) failed (last error: %s)\n", __LINE__, \
                    #cond, xio_last_error());                                                \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

#define OK(call) CHECK((call) == XIO_OK)

/* Another thread's alloc on a stack: what it returned. */
static void *alloc_elsewhere(void *stack) {
    xio_buf *b = NULL;
    xio_result r = xio_alloc((xio_stack *)stack, 8, &b);
    if (r == XIO_OK)
        xio_buf_free(b);
    return (void *)(intptr_t)r;
}

static xio_result from_other_thread(xio_stack *s) {
    pthread_t t;
    void *r = NULL;
    pthread_create(&t, NULL, alloc_elsewhere, s);
    pthread_join(t, &r);
    return (xio_result)(intptr_t)r;
}

/* Polls `net` until an event with `token` and any of `events` comes (a
 * watchdog of 1000 polls of up to 100 ms, not a bound); 1 if it came. */
static int poll_for(xio_net *net, uint64_t token, uint32_t events) {
    xio_event ev[8];
    size_t n;
    for (int round = 0; round < 1000; round++) {
        if (xio_net_poll(net, ev, 8, 100, &n) != XIO_OK)
            return 0;
        for (size_t i = 0; i < n; i++)
            if (ev[i].token == token && (ev[i].events & events))
                return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <prefix>\n", argv[0]);
        return 2;
    }
    const char *prefix = argv[1];

    /* Codes and messages. */
    for (xio_result c = XIO_OK; c <= XIO_ERR_PEER_BUSY; c++)
        CHECK(xio_strerror(c) != NULL && strlen(xio_strerror(c)) > 0);
    CHECK(strcmp(xio_strerror(12345), "unknown error") == 0);
    CHECK(xio_strerror(XIO_ERR_WOULD_BLOCK) != xio_strerror(XIO_ERR_TIMED_OUT));

    /* Attach: NULL arguments, a prefix without a manager (nothing written). */
    xio_stack *sentinel = (xio_stack *)(uintptr_t)0x1234;
    xio_stack *s1 = sentinel;
    CHECK(xio_stack_attach(NULL, &s1) == XIO_ERR_INVALID_ARGUMENT && s1 == sentinel);
    CHECK(xio_stack_attach(prefix, NULL) == XIO_ERR_INVALID_ARGUMENT);
    CHECK(xio_stack_attach("no-manager-here", &s1) == XIO_ERR_NO_MANAGER && s1 == sentinel);
    CHECK(strstr(xio_last_error(), "no-manager-here") != NULL);
    CHECK(xio_stack_attach("bad/prefix", &s1) == XIO_ERR_INVALID_ARGUMENT && s1 == sentinel);
    OK(xio_stack_attach(prefix, &s1));
    xio_stack *s2;
    OK(xio_stack_attach(prefix, &s2));
    CHECK(xio_stack_close(NULL) == XIO_OK);
    CHECK(xio_buf_free(NULL) == XIO_OK);

    /* Bind and connect: bad addresses, unknown peers. */
    CHECK(xio_stack_bind(s1, "not an address") == XIO_ERR_INVALID_ARGUMENT);
    CHECK(xio_stack_bind(s1, NULL) == XIO_ERR_INVALID_ARGUMENT);
    CHECK(xio_stack_bind(NULL, "10.9.0.1:1") == XIO_ERR_INVALID_ARGUMENT);
    OK(xio_stack_bind(s1, "10.9.0.1:1"));
    CHECK(xio_stack_bind(s2, "10.9.0.1:1") == XIO_ERR_ADDR_IN_USE);
    xio_peer peer = 777;
    CHECK(xio_stack_connect(s2, "10.9.0.1:2", &peer) == XIO_ERR_CONNECTION_REFUSED && peer == 777);
    CHECK(xio_stack_set_wait_mode(s2, 99) == XIO_ERR_INVALID_ARGUMENT);
    OK(xio_stack_set_wait_mode(s2, XIO_WAIT_BLOCKING));
    OK(xio_stack_connect(s2, "10.9.0.1:1", &peer));

    /* Allocation limits; a failed send leaves the buffer with us. */
    xio_buf *b = (xio_buf *)(uintptr_t)0x99;
    CHECK(xio_alloc(s2, (size_t)1 << 40, &b) == XIO_ERR_TOO_LARGE && b == (xio_buf *)(uintptr_t)0x99);
    OK(xio_alloc(s2, 100, &b));
    uint8_t *p;
    size_t cap = 0;
    OK(xio_buf_mut(b, &p, &cap));
    CHECK(cap >= 100);
    CHECK(xio_buf_set_len(b, cap + 1) == XIO_ERR_INVALID_ARGUMENT);
    memcpy(p, "hello, xio", 10);
    OK(xio_buf_set_len(b, 10));
    CHECK(xio_send(s2, (xio_peer)(peer + 100), b) == XIO_ERR_NOT_CONNECTED);
    const uint8_t *d;
    size_t len;
    OK(xio_buf_data(b, &d, &len));
    CHECK(len == 10 && memcmp(d, "hello, xio", 10) == 0);

    /* fork(): a child's inherited stack stays the parent's, and says so. */
    pid_t child = fork();
    if (child == 0) {
        xio_buf *cb = NULL;
        int bad = xio_alloc(s2, 8, &cb) != XIO_ERR_FORKED || cb != NULL ||
                  strstr(xio_last_error(), "fork") == NULL ||
                  xio_send(s2, peer, b) != XIO_ERR_FORKED;
        _exit(bad);
    }
    int status = -1;
    CHECK(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
          WEXITSTATUS(status) == 0);
    OK(xio_buf_data(b, &d, &len)); /* still ours, in the parent */
    CHECK(len == 10 && memcmp(d, "hello, xio", 10) == 0);

    /* Foreign handles: a stack is not a buffer, a buffer not a stack. */
    CHECK(xio_buf_data((xio_buf *)s1, &d, &len) == XIO_ERR_INVALID_HANDLE);
    xio_peer id;
    CHECK(xio_stack_id((xio_stack *)b, &id) == XIO_ERR_INVALID_HANDLE);
    CHECK(xio_send(s2, peer, (xio_buf *)s2) == XIO_ERR_INVALID_HANDLE);
    CHECK(xio_buf_free((xio_buf *)s1) == XIO_ERR_INVALID_HANDLE);
    CHECK(xio_read((xio_stream *)b, p, 1, &len) == XIO_ERR_INVALID_HANDLE);

    /* Receive: nothing yet, then the message, read-only, from s2. */
    xio_buf *in = NULL;
    xio_peer from = 0;
    CHECK(xio_recv(s1, 0, &in, &from) == XIO_ERR_WOULD_BLOCK && in == NULL);
    CHECK(xio_recv(s1, 5, &in, &from) == XIO_ERR_TIMED_OUT && in == NULL);
    OK(xio_send_tagged(s2, peer, 42, b)); /* b is gone now */
    uint32_t tag = 0;
    OK(xio_recv_tagged(s1, -1, &in, &from, &tag));
    OK(xio_stack_id(s2, &id));
    CHECK(from == id && tag == 42);
    OK(xio_buf_data(in, &d, &len));
    CHECK(len == 10 && memcmp(d, "hello, xio", 10) == 0);
    CHECK(xio_buf_mut(in, &p, &cap) == XIO_ERR_READ_ONLY);
    CHECK(xio_buf_set_len(in, 1) == XIO_ERR_READ_ONLY);
    CHECK(xio_send(s1, from, in) == XIO_ERR_READ_ONLY);
    /* Forward in place: the same memory, now writable. */
    OK(xio_buf_make_writable(in));
    OK(xio_buf_make_writable(in));
    OK(xio_buf_mut(in, &p, &cap));
    CHECK(p == d);
    p[0] = 'H';
    OK(xio_send(s1, from, in));
    xio_buf *back;
    OK(xio_recv(s2, -1, &back, &from));
    OK(xio_buf_data(back, &d, &len));
    CHECK(len == 10 && memcmp(d, "Hello, xio", 10) == 0);
    OK(xio_buf_free(back));

    /* Copy on receive: the sender writes the buffer it sent, as a hostile
     * one would; the receiver reads that change in place by default, and
     * its own copy with the mode on. Sent on, a copy goes out whole. */
    CHECK(xio_stack_set_copy_on_receive(NULL, 1) == XIO_ERR_INVALID_ARGUMENT);
    for (int copy = 0; copy < 2; copy++) {
        OK(xio_stack_set_copy_on_receive(s1, copy));
        xio_buf *m;
        OK(xio_alloc(s2, 4, &m));
        OK(xio_buf_mut(m, &p, &cap));
        memcpy(p, "sent", 4);
        OK(xio_buf_set_len(m, 4));
        uint8_t *sender_view = p;
        OK(xio_send(s2, peer, m));
        OK(xio_recv(s1, -1, &in, &from));
        memcpy(sender_view, "CHG!", 4);
        OK(xio_buf_data(in, &d, &len));
        CHECK(len == 4 && memcmp(d, copy ? "sent" : "CHG!", 4) == 0);
        OK(xio_buf_make_writable(in));
        OK(xio_send(s1, from, in));
        OK(xio_recv(s2, -1, &back, &from));
        OK(xio_buf_data(back, &d, &len));
        CHECK(len == 4 && memcmp(d, copy ? "sent" : "CHG!", 4) == 0);
        OK(xio_buf_free(back));
    }
    OK(xio_stack_set_copy_on_receive(s1, 0));

    /* Bursts: 8 buffers out in one call, in order, and back in bursts. */
    xio_buf *burst[8];
    for (int i = 0; i < 8; i++) {
        OK(xio_alloc(s2, 16, &burst[i]));
        OK(xio_buf_mut(burst[i], &p, &cap));
        memset(p, 'a' + i, 16);
        OK(xio_buf_set_len(burst[i], 16));
    }
    size_t sent = 99;
    xio_buf *dup[2] = {burst[0], burst[0]};
    CHECK(xio_send_burst(s2, peer, dup, 2, &sent) == XIO_ERR_INVALID_ARGUMENT && sent == 0);
    /* An empty burst still checks its stack. */
    CHECK(xio_send_burst(NULL, peer, NULL, 0, &sent) == XIO_ERR_INVALID_ARGUMENT && sent == 0);
    CHECK(xio_send_burst(s2, peer, NULL, 0, &sent) == XIO_OK && sent == 0);
    OK(xio_send_burst(s2, peer, burst, 8, &sent));
    CHECK(sent == 8);
    for (int i = 0; i < 8; i++)
        CHECK(burst[i] == NULL);
    xio_buf *got[16];
    xio_peer froms[16];
    size_t nb = 0;
    CHECK(xio_recv_burst(s1, 0, got, froms, 0, &nb) == XIO_ERR_INVALID_ARGUMENT && nb == 0);
    size_t total = 0;
    while (total < 8) {
        size_t k = 0;
        OK(xio_recv_burst(s1, 10000, got + total, froms + total, 16 - total, &k));
        CHECK(k >= 1);
        total += k;
    }
    CHECK(total == 8);
    for (size_t i = 0; i < total; i++) {
        OK(xio_buf_data(got[i], &d, &len));
        CHECK(len == 16 && d[0] == 'a' + (int)i && d[15] == 'a' + (int)i);
        CHECK(froms[i] == id);
    }
    /* A received buffer in a burst: refused, nothing sent. */
    CHECK(xio_send_burst(s1, froms[0], got, 8, &sent) == XIO_ERR_READ_ONLY && sent == 0);
    for (size_t i = 0; i < total; i++)
        OK(xio_buf_free(got[i]));
    CHECK(xio_recv(s1, 0, &in, &from) == XIO_ERR_WOULD_BLOCK);

    /* One thread at a time: s1 belongs to this thread since its first
     * send; another thread is refused until we release it. */
    CHECK(from_other_thread(s1) == XIO_ERR_BUSY);
    CHECK(strstr(xio_last_error(), "another thread") == NULL); /* per-thread message */
    OK(xio_stack_release(s1));
    /* The other thread claims it and exits without releasing: its exit
     * gives the stack up, so it is ours again. */
    CHECK(from_other_thread(s1) == XIO_OK);
    OK(xio_alloc(s1, 8, &b));
    OK(xio_buf_free(b));
    CHECK(xio_stack_release(NULL) == XIO_ERR_INVALID_ARGUMENT);

    /* A peer that leaves: the survivor sees a reset once. */
    OK(xio_stack_close(s2));
    /* A watchdog, not a bound: the reset comes at once (60 s for a loaded machine). */
    CHECK(xio_recv(s1, 60000, &in, &from) == XIO_ERR_CONNECTION_RESET);
    OK(xio_stack_close(s1));

    /* Sockets. */
    xio_net *net;
    CHECK(xio_net_attach(prefix, NULL) == XIO_ERR_INVALID_ARGUMENT);
    OK(xio_net_attach(prefix, &net));
    int mfd = -1, mfd2 = -1, gone = -1;
    CHECK(xio_net_manager_fd(net, NULL) == XIO_ERR_INVALID_ARGUMENT);
    CHECK(xio_net_manager_fd(NULL, &mfd) == XIO_ERR_INVALID_ARGUMENT && mfd == -1);
    OK(xio_net_manager_fd(net, &mfd));
    OK(xio_net_manager_fd(net, &mfd2));
    CHECK(mfd >= 0 && mfd == mfd2); /* the net's own fd, made once */
    CHECK(xio_net_manager_gone(net, NULL) == XIO_ERR_INVALID_ARGUMENT);
    OK(xio_net_manager_gone(net, &gone));
    CHECK(gone == 0);
    xio_stream *c = (xio_stream *)(uintptr_t)0x77;
    CHECK(xio_dial(net, "10.9.1.1:80", &c) == XIO_ERR_CONNECTION_REFUSED && c == (xio_stream *)(uintptr_t)0x77);
    xio_listener *l, *l2;
    OK(xio_listen(net, "10.9.1.1:80", &l));
    CHECK(xio_listen(net, "10.9.1.1:80", &l2) == XIO_ERR_ADDR_IN_USE);
    OK(xio_listener_set_nonblocking(l, 1));
    xio_stream *a;
    CHECK(xio_accept(l, &a) == XIO_ERR_WOULD_BLOCK);
    OK(xio_dial(net, "10.9.1.1:80", &c));
    size_t n;
    OK(xio_write(c, "ping", 4, &n));
    CHECK(n == 4);
    xio_event ev[8];
    CHECK(xio_net_poll(net, ev, 0, 0, &n) == XIO_ERR_INVALID_ARGUMENT);
    CHECK(xio_net_poll(net, NULL, 8, 0, &n) == XIO_ERR_INVALID_ARGUMENT);
    uint64_t ltok;
    OK(xio_listener_token(l, &ltok));
    CHECK(poll_for(net, ltok, XIO_EVENT_ACCEPT));
    OK(xio_accept(l, &a));
    char buf[64];
    OK(xio_read(a, buf, sizeof buf, &n));
    CHECK(n == 4 && memcmp(buf, "ping", 4) == 0);
    char addr[64];
    memset(addr, 'x', sizeof addr);
    CHECK(xio_stream_peer_addr(a, addr, 2) == XIO_ERR_INVALID_ARGUMENT && addr[0] == 'x');
    OK(xio_stream_peer_addr(a, addr, sizeof addr));
    char caddr[64];
    OK(xio_stream_local_addr(c, caddr, sizeof caddr));
    CHECK(strcmp(addr, caddr) == 0);
    OK(xio_stream_local_addr(a, addr, sizeof addr));
    CHECK(strcmp(addr, "10.9.1.1:80") == 0);
    CHECK(xio_shutdown(a, 7) == XIO_ERR_INVALID_ARGUMENT);

    /* Non-blocking read with nothing there; a timeout that passes. */
    OK(xio_stream_set_nonblocking(a, 1));
    CHECK(xio_read(a, buf, sizeof buf, &n) == XIO_ERR_WOULD_BLOCK);
    OK(xio_stream_set_nonblocking(a, 0));
    OK(xio_stream_set_timeouts(a, 5, 0));
    CHECK(xio_read(a, buf, sizeof buf, &n) == XIO_ERR_TIMED_OUT);
    OK(xio_stream_set_timeouts(a, 0, 0));

    /* A token of the caller's choosing comes back from poll. */
    CHECK(xio_stream_set_token(NULL, 1) == XIO_ERR_INVALID_ARGUMENT);
    OK(xio_stream_set_token(a, 4242));
    uint64_t atok;
    OK(xio_stream_token(a, &atok));
    CHECK(atok == 4242);
    OK(xio_write(c, "tok", 3, &n));
    CHECK(poll_for(net, 4242, XIO_EVENT_READABLE));
    OK(xio_read(a, buf, sizeof buf, &n));
    CHECK(n == 3 && memcmp(buf, "tok", 3) == 0);

    /* Write batches: a second net (another stack: a stream to the same
     * net is never held) dials the listener; what it writes in a batch
     * leaves only when the batch ends. */
    xio_net *net2;
    OK(xio_net_attach(prefix, &net2));
    xio_stream *c2, *a2 = NULL;
    OK(xio_dial(net2, "10.9.1.1:80", &c2));
    for (int round = 0; round < 1000 && a2 == NULL; round++) {
        OK(xio_net_poll(net, ev, 8, 100, &n));
        if (xio_accept(l, &a2) != XIO_OK)
            a2 = NULL;
    }
    CHECK(a2 != NULL);
    OK(xio_stream_set_token(a2, 777));
    CHECK(xio_net_batch_begin(NULL) == XIO_ERR_INVALID_ARGUMENT);
    OK(xio_net_batch_begin(net2));
    OK(xio_net_batch_begin(net2)); /* already ours: still OK */
    OK(xio_write(c2, "held", 4, &n));
    CHECK(n == 4);
    /* Nothing left the batch: the server's net has nothing for a2. */
    OK(xio_net_poll(net, ev, 8, 0, &n));
    for (size_t i = 0; i < n; i++)
        CHECK(!(ev[i].token == 777 && (ev[i].events & XIO_EVENT_READABLE)));
    OK(xio_stream_set_nonblocking(a2, 1));
    CHECK(xio_read(a2, buf, sizeof buf, &n) == XIO_ERR_WOULD_BLOCK);
    OK(xio_net_batch_end(net2));
    OK(xio_net_batch_end(net2)); /* no batch: a no-op */
    CHECK(poll_for(net, 777, XIO_EVENT_READABLE));
    OK(xio_read(a2, buf, sizeof buf, &n));
    CHECK(n == 4 && memcmp(buf, "held", 4) == 0);
    OK(xio_stream_close(c2));
    OK(xio_stream_close(a2));
    OK(xio_net_close(net2));

    /* Gather write: header + body arrive in order, as one chunk. */
    xio_iovec iov[2] = {{"HEAD", 4}, {"body!", 5}};
    OK(xio_writev(c, iov, 2, &n));
    CHECK(n == 9);
    xio_buf *chunk;
    OK(xio_stream_recv_buf(a, &chunk));
    OK(xio_buf_data(chunk, &d, &len));
    CHECK(len == 9 && memcmp(d, "HEADbody!", 9) == 0);
    OK(xio_buf_free(chunk));

    /* Zero-copy on the stream: alloc, fill, send; read it with xio_read. */
    xio_buf *zb;
    OK(xio_stream_alloc(a, 5, &zb));
    OK(xio_buf_mut(zb, &p, &cap));
    memcpy(p, "reply", 5);
    OK(xio_buf_set_len(zb, 5));
    OK(xio_stream_send_buf(a, zb));
    OK(xio_read(c, buf, sizeof buf, &n));
    CHECK(n == 5 && memcmp(buf, "reply", 5) == 0);

    /* A backlog of one: a second connection waiting to be accepted is
     * refused, by the dial or by the first read. */
    xio_listener *lb;
    OK(xio_listen_backlog(net, "10.9.1.2:80", 1, &lb));
    xio_stream *b1, *b2;
    OK(xio_dial(net, "10.9.1.2:80", &b1));
    xio_result refused = xio_dial(net, "10.9.1.2:80", &b2);
    if (refused == XIO_OK) {
        refused = xio_read(b2, buf, sizeof buf, &n);
        OK(xio_stream_close(b2));
    }
    CHECK(refused == XIO_ERR_CONNECTION_REFUSED);
    OK(xio_stream_close(b1));
    OK(xio_listener_close(lb));

    /* Close: the other side reads end of stream, in both interfaces. */
    OK(xio_shutdown(c, XIO_SHUT_WR));
    OK(xio_read(a, buf, sizeof buf, &n));
    CHECK(n == 0);
    OK(xio_stream_close(a));
    OK(xio_stream_recv_buf(c, &chunk));
    CHECK(chunk == NULL);
    OK(xio_stream_close(c));
    OK(xio_listener_close(l));
    OK(xio_net_close(net));

    /* Two NULL attaches are one net with one readiness queue: a second
     * loop polling it would take the first one's events. Only one handle
     * may poll it (or hand out its fd) at a time; the other is refused,
     * until the first is closed. */
    setenv("XIO_PREFIX", prefix, 1);
    xio_net *g1, *g2;
    int gfd = -1;
    OK(xio_net_attach(NULL, &g1));
    OK(xio_net_attach(NULL, &g2));
    OK(xio_net_poll(g1, ev, 8, 0, &n));
    CHECK(xio_net_poll(g2, ev, 8, 0, &n) == XIO_ERR_INVALID_ARGUMENT);
    CHECK(xio_net_fd(g2, &gfd) == XIO_ERR_INVALID_ARGUMENT && gfd == -1);
    OK(xio_net_fd(g1, &gfd));
    OK(xio_net_poll(g1, ev, 8, 0, &n));
    OK(xio_net_close(g1));
    OK(xio_net_poll(g2, ev, 8, 0, &n));
    OK(xio_net_close(g2));

    if (failures) {
        fprintf(stderr, "api_test: %d checks failed\n", failures);
        return 1;
    }
    printf("XIO:ok\n");
    return 0;
}
