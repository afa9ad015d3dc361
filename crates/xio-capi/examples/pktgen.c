/*
 * pktgen: a packet generator for l2fwd_echo that measures round-trip
 * latency over X-IO's zero-copy interface (the paper's zero-copy
 * experiment). Each round trip allocates a pool buffer, writes a header
 * (two MAC addresses and a sequence number), sends it, waits for the echo
 * and checks it came back with the addresses swapped.
 *
 *   pktgen <prefix> <ip:port> [count] [size] [--busy-poll] [--stop]
 *
 * Prints "XIO:rtt n=<count> p50_ns=.. p99_ns=.. mean_ns=..". --stop asks
 * the echo function to exit afterwards.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xio.h"

static void die(const char *what, xio_result r) {
    fprintf(stderr, "pktgen: %s: %s (%s)\n", what, xio_strerror(r), xio_last_error());
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

static const uint8_t SRC[6] = {0x02, 0, 0, 0, 0, 0x01};
static const uint8_t DST[6] = {0x02, 0, 0, 0, 0, 0x02};

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <prefix> <ip:port> [count] [size] [--busy-poll] [--stop]\n", argv[0]);
        return 2;
    }
    size_t count = argc > 3 ? (size_t)strtoul(argv[3], NULL, 10) : 100000;
    size_t size = argc > 4 ? (size_t)strtoul(argv[4], NULL, 10) : 64;
    int busy = 0, stop = 0;
    for (int i = 5; i < argc; i++) {
        busy |= strcmp(argv[i], "--busy-poll") == 0;
        stop |= strcmp(argv[i], "--stop") == 0;
    }
    if (size < 20 || count == 0) {
        fprintf(stderr, "pktgen: size must be >= 20 and count > 0\n");
        return 2;
    }

    xio_stack *stack;
    xio_result r = xio_stack_attach(argv[1], &stack);
    if (r != XIO_OK)
        die("attach", r);
    if (busy && (r = xio_stack_set_wait_mode(stack, XIO_WAIT_BUSY_POLL)) != XIO_OK)
        die("wait mode", r);
    xio_peer peer;
    if ((r = xio_stack_connect(stack, argv[2], &peer)) != XIO_OK)
        die("connect", r);

    uint64_t *rtt = malloc(count * sizeof *rtt);
    size_t warmup = count / 10 < 1000 ? count / 10 : 1000;
    for (size_t i = 0; i < count + warmup; i++) {
        uint64_t t0 = now_ns();
        xio_buf *buf;
        if ((r = xio_alloc(stack, size, &buf)) != XIO_OK)
            die("alloc", r);
        uint8_t *p;
        size_t cap;
        if ((r = xio_buf_mut(buf, &p, &cap)) != XIO_OK)
            die("buf", r);
        memcpy(p, DST, 6);
        memcpy(p + 6, SRC, 6);
        uint64_t seq = i;
        memcpy(p + 12, &seq, 8);
        xio_buf_set_len(buf, size);
        if ((r = xio_send(stack, peer, buf)) != XIO_OK)
            die("send", r);

        xio_buf *echo;
        xio_peer from;
        if ((r = xio_recv(stack, -1, &echo, &from)) != XIO_OK)
            die("recv", r);
        uint64_t t1 = now_ns();
        const uint8_t *d;
        size_t len;
        if ((r = xio_buf_data(echo, &d, &len)) != XIO_OK)
            die("data", r);
        uint64_t got;
        memcpy(&got, d + 12, 8);
        if (from != peer || len != size || memcmp(d, SRC, 6) || memcmp(d + 6, DST, 6) || got != seq) {
            fprintf(stderr, "pktgen: bad echo %zu (len %zu, seq %llu)\n", i, len, (unsigned long long)got);
            return 1;
        }
        xio_buf_free(echo);
        if (i >= warmup)
            rtt[i - warmup] = t1 - t0;
    }
    qsort(rtt, count, sizeof *rtt, cmp_u64);
    uint64_t sum = 0;
    for (size_t i = 0; i < count; i++)
        sum += rtt[i];
    printf("XIO:rtt n=%zu size=%zu p50_ns=%llu p99_ns=%llu mean_ns=%llu\n", count, size,
           (unsigned long long)rtt[count / 2], (unsigned long long)rtt[count * 99 / 100],
           (unsigned long long)(sum / count));
    free(rtt);

    if (stop) {
        xio_buf *buf;
        if ((r = xio_alloc(stack, 1, &buf)) != XIO_OK || (r = xio_send_tagged(stack, peer, 1, buf)) != XIO_OK)
            die("stop", r);
    }
    xio_stack_close(stack);
    return 0;
}
