/*
 * What a sleeping round trip costs on this machine, by wake-up mechanism:
 * two processes pinned to CPUs 0 and 1 hand a token back and forth, each
 * sleeping in the kernel until the other wakes it. No X-IO code: this is
 * the floor under X-IO's blocking mode (see BENCHMARKS.md and
 * docs/design.md, "Known limits").
 *
 *   cc -O2 -o /tmp/wake_pingpong benches/c/wake_pingpong.c
 *   for m in futex futex-timeout futex-waitv eventfd eventfd-poll eventfd-epoll uds pipe; do
 *       /tmp/wake_pingpong $m; done
 *
 * futex          FUTEX_WAIT / FUTEX_WAKE on a word in a shared memfd page
 *                (a shared futex, as X-IO's doorbell word)
 * futex-timeout  the same, each wait with a 1 s timeout (X-IO's liveness tick)
 * futex-waitv    futex_waitv on the word and a second shared word (a
 *                manager's liveness word) with no timeout
 * eventfd        blocking read / write of an eventfd per direction
 * eventfd-poll   poll() with a 1 s timeout, then read
 * eventfd-epoll  epoll_wait() with a 1 s timeout, then read
 * uds [B [W]]    a B-byte message (64 by default) on a Unix-domain stream
 *                socket pair, written in W equal writes (1 by default) and
 *                read until all B bytes are in
 * pipe           1-byte write / read on a pipe per direction (woken like a
 *                socket's reader, through the kernel's sync wake-up)
 *
 * Prints the p50 and p90 of 60,000 timed round trips (after 1,000 untimed).
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { WARM = 1000, N = 60000 };

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s) != 0) {
        perror("sched_setaffinity");
        exit(1);
    }
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A read or write of exactly `n` bytes, or the end of the program. */
static void xread(int fd, void *b, size_t n) {
    if (read(fd, b, n) != (ssize_t)n) {
        perror("read");
        exit(1);
    }
}

static void xwrite(int fd, const void *b, size_t n) {
    if (write(fd, b, n) != (ssize_t)n) {
        perror("write");
        exit(1);
    }
}

/* The `uds` mode's message: its size, the writes it is sent in, and the
 * bytes (each process has its own copy after the fork). */
static size_t msg_size = 64, msg_writes = 1;
static char *msg;

/* One side of a channel: how to wait for a token and how to pass one. */
struct chan {
    int mode;
    _Atomic uint32_t *word; /* futex modes */
    int fd;                 /* eventfd, socket */
    int ep;                 /* epoll instance */
    int wfd;                /* pipe: the write end */
};

enum { FUTEX, FUTEX_TIMEOUT, FUTEX_WAITV, EVENTFD, EVENTFD_POLL, EVENTFD_EPOLL, UDS, PIPE };

/* The second word a futex-waitv sleeper watches (a manager's liveness word,
 * never woken here). */
static _Atomic uint32_t *alive;

static void take(struct chan *c) {
    uint64_t v;
    char buf[64];
    struct timespec sec = {1, 0};
    switch (c->mode) {
    case FUTEX:
    case FUTEX_TIMEOUT:
        for (;;) {
            uint32_t expected = 1;
            if (atomic_compare_exchange_strong(c->word, &expected, 0))
                return;
            syscall(SYS_futex, c->word, FUTEX_WAIT, 0, c->mode == FUTEX ? NULL : &sec, NULL, 0);
        }
    case FUTEX_WAITV:
        for (;;) {
            uint32_t expected = 1;
            if (atomic_compare_exchange_strong(c->word, &expected, 0))
                return;
            struct futex_waitv w[2] = {
                {.val = 0, .uaddr = (uintptr_t)c->word, .flags = FUTEX_32},
                {.val = 7, .uaddr = (uintptr_t)alive, .flags = FUTEX_32},
            };
            syscall(SYS_futex_waitv, w, 2, 0, NULL, CLOCK_MONOTONIC);
        }
    case EVENTFD_POLL: {
        struct pollfd p = {c->fd, POLLIN, 0};
        poll(&p, 1, 1000);
    } /* fall through */
    case EVENTFD:
        xread(c->fd, &v, 8);
        return;
    case EVENTFD_EPOLL: {
        struct epoll_event e;
        epoll_wait(c->ep, &e, 1, 1000);
        xread(c->fd, &v, 8);
        return;
    }
    case UDS:
        for (size_t got = 0; got < msg_size;) {
            ssize_t k = read(c->fd, msg + got, msg_size - got);
            if (k <= 0) {
                perror("read");
                exit(1);
            }
            got += (size_t)k;
        }
        return;
    case PIPE:
        xread(c->fd, buf, 1);
        return;
    }
}

static void give(struct chan *c) {
    uint64_t one = 1;
    char buf[64] = {0};
    switch (c->mode) {
    case FUTEX:
    case FUTEX_TIMEOUT:
    case FUTEX_WAITV:
        atomic_store(c->word, 1);
        syscall(SYS_futex, c->word, FUTEX_WAKE, 1, NULL, NULL, 0);
        return;
    case EVENTFD:
    case EVENTFD_POLL:
    case EVENTFD_EPOLL:
        xwrite(c->fd, &one, 8);
        return;
    case UDS:
        for (size_t w = 0, put = 0; w < msg_writes; w++) {
            size_t end = msg_size * (w + 1) / msg_writes;
            xwrite(c->fd, msg + put, end - put);
            put = end;
        }
        return;
    case PIPE:
        xwrite(c->wfd, buf, 1);
        return;
    }
}

/* The epoll instance of the side that waits on `c` (eventfd-epoll). */
static void watch(struct chan *c) {
    struct epoll_event e = {.events = EPOLLIN};
    c->ep = epoll_create1(0);
    if (c->ep < 0 || epoll_ctl(c->ep, EPOLL_CTL_ADD, c->fd, &e) != 0) {
        perror("epoll");
        exit(1);
    }
}

int main(int argc, char **argv) {
    static const char *names[] = {"futex",        "futex-timeout", "futex-waitv", "eventfd",
                                  "eventfd-poll", "eventfd-epoll", "uds", "pipe"};
    int mode = -1;
    for (int i = 0; argc >= 2 && i < 8; i++)
        if (strcmp(argv[1], names[i]) == 0)
            mode = i;
    if (mode == UDS && argc >= 3)
        msg_size = strtoul(argv[2], NULL, 10);
    if (mode == UDS && argc >= 4)
        msg_writes = strtoul(argv[3], NULL, 10);
    if (mode < 0 || (mode != UDS && argc > 2) || argc > 4 || msg_size == 0 || msg_writes == 0 ||
        msg_writes > msg_size) {
        fprintf(stderr,
                "usage: %s futex|futex-timeout|futex-waitv|eventfd|eventfd-poll|eventfd-epoll|pipe\n"
                "       %s uds [BYTES [WRITES]]\n",
                argv[0], argv[0]);
        return 2;
    }
    msg = calloc(msg_size, 1);
    if (!msg) {
        perror("calloc");
        return 1;
    }
    /* to_child: parent gives, child takes; to_parent: the reverse. */
    struct chan to_child = {mode, NULL, -1, -1, -1}, to_parent = {mode, NULL, -1, -1, -1};
    if (mode == FUTEX || mode == FUTEX_TIMEOUT || mode == FUTEX_WAITV) {
        int fd = memfd_create("wake_pingpong", 0);
        if (fd < 0 || ftruncate(fd, 4096) != 0) {
            perror("memfd");
            return 1;
        }
        _Atomic uint32_t *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        to_child.word = &w[0];
        to_parent.word = &w[16]; /* another cache line */
        alive = &w[32];
        *alive = 7;
    } else if (mode == UDS) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
            perror("socketpair");
            return 1;
        }
        /* Parent writes sv[0] and reads sv[0]; child uses sv[1]. */
        to_child.fd = sv[0];
        to_parent.fd = sv[1];
    } else if (mode == PIPE) {
        int a[2], b[2];
        if (pipe(a) != 0 || pipe(b) != 0) {
            perror("pipe");
            return 1;
        }
        to_child.fd = a[0];
        to_child.wfd = a[1];
        to_parent.fd = b[0];
        to_parent.wfd = b[1];
    } else {
        to_child.fd = eventfd(0, 0);
        to_parent.fd = eventfd(0, 0);
    }
    pid_t pid = fork();
    if (pid == 0) {
        pin(1);
        struct chan in = to_child, out = to_parent;
        if (mode == UDS)
            in.fd = out.fd = to_parent.fd;
        if (mode == EVENTFD_EPOLL)
            watch(&in);
        for (int i = 0; i < WARM + N; i++) {
            take(&in);
            give(&out);
        }
        _exit(0);
    }
    pin(0);
    struct chan in = to_parent, out = to_child;
    if (mode == UDS)
        in.fd = out.fd = to_child.fd;
    if (mode == EVENTFD_EPOLL)
        watch(&in);
    double *lat = malloc(sizeof(double) * N);
    for (int i = 0; i < WARM + N; i++) {
        double t = now_ns();
        give(&out);
        take(&in);
        if (i >= WARM)
            lat[i - WARM] = now_ns() - t;
    }
    waitpid(pid, NULL, 0);
    qsort(lat, N, sizeof(double), cmp);
    if (mode == UDS)
        printf("uds %zu B in %zu write%s  p50 %.2f us  p90 %.2f us\n", msg_size, msg_writes,
               msg_writes == 1 ? "" : "s", lat[N / 2] / 1e3, lat[N * 9 / 10] / 1e3);
    else
        printf("%-14s p50 %.2f us  p90 %.2f us\n", names[mode], lat[N / 2] / 1e3,
               lat[N * 9 / 10] / 1e3);
    return 0;
}
