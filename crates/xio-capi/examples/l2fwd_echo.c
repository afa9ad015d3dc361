/*
 * l2fwd_echo: an L2-forwarder-style network function over X-IO's
 * zero-copy interface. It receives bursts of buffers, swaps the two
 * 6-byte "MAC addresses" at the front of each in place (the buffer turns
 * writable again without a copy or a new allocation) and sends it back to
 * whoever sent it: the paper's zero-copy echo.
 *
 *   l2fwd_echo <prefix> <ip:port> [--hold N] [--busy-poll]
 *
 * A buffer tagged 1 stops it. With --hold N it keeps the first N buffers
 * it receives without answering (to show that a killed process's buffers
 * return to the pool). Prints "XIO:ready" once bound.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xio.h"

#define TAG_STOP 1

static void die(const char *what, xio_result r) {
    fprintf(stderr, "l2fwd_echo: %s: %s (%s)\n", what, xio_strerror(r), xio_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <prefix> <ip:port> [--hold N] [--busy-poll]\n", argv[0]);
        return 2;
    }
    size_t hold = 0;
    int busy = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--hold") == 0 && i + 1 < argc)
            hold = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--busy-poll") == 0)
            busy = 1;
    }

    xio_stack *stack;
    xio_result r = xio_stack_attach(argv[1], &stack);
    if (r != XIO_OK)
        die("attach", r);
    if (busy && (r = xio_stack_set_wait_mode(stack, XIO_WAIT_BUSY_POLL)) != XIO_OK)
        die("wait mode", r);
    if ((r = xio_stack_bind(stack, argv[2])) != XIO_OK)
        die("bind", r);
    printf("XIO:ready\n");
    fflush(stdout);

    xio_buf **held = calloc(hold ? hold : 1, sizeof *held);
    size_t n_held = 0;
    /* Messages echoed; and messages taken in to echo, which also counts
     * those whose sender left before its echo could go back. */
    unsigned long forwarded = 0, received = 0;
    for (;;) {
        xio_buf *buf;
        xio_peer from;
        uint32_t tag;
        r = xio_recv_tagged(stack, -1, &buf, &from, &tag);
        if (r == XIO_ERR_CONNECTION_RESET)
            continue; /* a client left: its channel is gone, others go on */
        if (r == XIO_ERR_MANAGER_GONE)
            continue; /* a one-time notice: the channels made keep working */
        if (r != XIO_OK)
            die("recv", r);
        if (tag == TAG_STOP) {
            xio_buf_free(buf);
            break;
        }
        if (n_held < hold) {
            held[n_held++] = buf;
            if (n_held == hold) {
                printf("XIO:holding %zu\n", n_held);
                fflush(stdout);
            }
            continue;
        }
        received++;
        /* Receive, rewrite the header in place, send back: no copy. */
        if ((r = xio_buf_make_writable(buf)) != XIO_OK)
            die("make writable", r);
        uint8_t *p;
        size_t cap, len;
        const uint8_t *ro;
        if ((r = xio_buf_data(buf, &ro, &len)) != XIO_OK || (r = xio_buf_mut(buf, &p, &cap)) != XIO_OK)
            die("buffer", r);
        if (len >= 12) {
            uint8_t mac[6];
            memcpy(mac, p, 6);
            memmove(p, p + 6, 6);
            memcpy(p + 6, mac, 6);
        }
        r = xio_send(stack, from, buf);
        if (r == XIO_ERR_CONNECTION_RESET) {
            xio_buf_free(buf); /* failed sends leave the buffer with us */
            continue;
        }
        if (r != XIO_OK)
            die("send", r);
        forwarded++;
    }
    for (size_t i = 0; i < n_held; i++)
        xio_buf_free(held[i]);
    free(held);
    printf("XIO:forwarded %lu\n", forwarded);
    printf("XIO:received %lu\n", received);
    xio_stack_close(stack);
    return 0;
}
