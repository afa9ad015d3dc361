/*
 * sock_client: sends messages over an X-IO stream to an echo server,
 * reads each echo back in full, checks every byte, and reports the
 * round-trip latency. Blocking calls, as in a classic socket client.
 *
 *   sock_client <prefix> <ip:port> [count] [size]
 *
 * Prints "XIO:rtt n=<count> p50_ns=.. p99_ns=.. mean_ns=..".
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xio.h"

static void die(const char *what, xio_result r) {
    fprintf(stderr, "sock_client: %s: %s (%s)\n", what, xio_strerror(r), xio_last_error());
    exit(1);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <prefix> <ip:port> [count] [size]\n", argv[0]);
        return 2;
    }
    size_t count = argc > 3 ? (size_t)strtoul(argv[3], NULL, 10) : 10000;
    size_t size = argc > 4 ? (size_t)strtoul(argv[4], NULL, 10) : 64;
    if (count == 0 || size == 0)
        return 2;

    xio_net *net;
    xio_stream *s;
    xio_result r = xio_net_attach(argv[1], &net);
    if (r != XIO_OK)
        die("attach", r);
    if ((r = xio_dial(net, argv[2], &s)) != XIO_OK)
        die("dial", r);

    uint8_t *msg = malloc(size), *back = malloc(size);
    uint64_t *rtt = malloc(count * sizeof *rtt);
    for (size_t i = 0; i < count; i++) {
        for (size_t j = 0; j < size; j++)
            msg[j] = (uint8_t)(i * 31 + j);
        uint64_t t0 = now_ns();
        size_t n;
        if ((r = xio_write(s, msg, size, &n)) != XIO_OK || n != size)
            die("write", r);
        for (size_t got = 0; got < size; got += n) {
            if ((r = xio_read(s, back + got, size - got, &n)) != XIO_OK)
                die("read", r);
            if (n == 0) {
                fprintf(stderr, "sock_client: early end of stream\n");
                return 1;
            }
        }
        rtt[i] = now_ns() - t0;
        if (memcmp(msg, back, size) != 0) {
            fprintf(stderr, "sock_client: echo %zu differs\n", i);
            return 1;
        }
    }
    /* Half-close, then the server's end of stream. */
    if ((r = xio_shutdown(s, XIO_SHUT_WR)) != XIO_OK)
        die("shutdown", r);
    size_t n;
    if ((r = xio_read(s, back, size, &n)) != XIO_OK || n != 0) {
        fprintf(stderr, "sock_client: expected end of stream (%s)\n", xio_strerror(r));
        return 1;
    }
    qsort(rtt, count, sizeof *rtt, cmp_u64);
    uint64_t sum = 0;
    for (size_t i = 0; i < count; i++)
        sum += rtt[i];
    printf("XIO:rtt n=%zu size=%zu p50_ns=%llu p99_ns=%llu mean_ns=%llu\n", count, size,
           (unsigned long long)rtt[count / 2], (unsigned long long)rtt[count * 99 / 100],
           (unsigned long long)(sum / count));
    free(msg);
    free(back);
    free(rtt);
    xio_stream_close(s);
    xio_net_close(net);
    return 0;
}
