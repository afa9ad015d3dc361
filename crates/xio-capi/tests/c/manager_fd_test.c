/*
 * An idle epoll loop learns that its manager went away through
 * xio_net_manager_fd: the loop sleeps in epoll_wait with no timeout on
 * xio_net_fd and xio_net_manager_fd; tests/c.rs stops the manager; the
 * manager's fd wakes the loop, and after xio_net_poll,
 * xio_net_manager_gone says so and the fd is quiet. Without that fd the
 * loop would sleep on (the test's watchdog fails it).
 * Run as: manager_fd_test <prefix>.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <sys/epoll.h>

#include "xio.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <prefix>\n", argv[0]);
        return 2;
    }
    xio_net *net = NULL;
    xio_listener *l = NULL;
    int bell = -1, manager = -1;
    if (xio_net_attach(argv[1], &net) != XIO_OK || xio_listen(net, "10.8.4.1:80", &l) != XIO_OK ||
        xio_listener_set_nonblocking(l, 1) != XIO_OK || xio_net_fd(net, &bell) != XIO_OK ||
        xio_net_manager_fd(net, &manager) != XIO_OK) {
        fprintf(stderr, "setup: %s\n", xio_last_error());
        return 1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event a = {.events = EPOLLIN, .data.u64 = 1};
    struct epoll_event b = {.events = EPOLLIN, .data.u64 = 2};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, bell, &a) != 0 ||
        epoll_ctl(ep, EPOLL_CTL_ADD, manager, &b) != 0) {
        perror("epoll");
        return 1;
    }
    xio_event evs[8];
    size_t n = 0;
    if (xio_net_poll(net, evs, 8, 0, &n) != XIO_OK) {
        fprintf(stderr, "first poll: %s\n", xio_last_error());
        return 1;
    }
    printf("XIO:ready\n");
    fflush(stdout);
    for (;;) {
        struct epoll_event got[2];
        int k = epoll_wait(ep, got, 2, -1);
        if (k < 0) {
            perror("epoll_wait");
            return 1;
        }
        int from_manager = 0;
        for (int i = 0; i < k; i++)
            from_manager |= got[i].data.u64 == 2;
        int gone = 0;
        if (xio_net_poll(net, evs, 8, 0, &n) != XIO_OK || xio_net_manager_gone(net, &gone) != XIO_OK) {
            fprintf(stderr, "poll: %s\n", xio_last_error());
            return 1;
        }
        if (gone) {
            /* The manager's fd went quiet: a wait on it now would not
             * return. (Asked alone: the net's own fd may be rung once
             * more by the stopping manager, a harmless extra wake-up.) */
            struct pollfd pf = {.fd = manager, .events = POLLIN};
            printf("XIO:gone %d %d\n", from_manager, poll(&pf, 1, 0));
            fflush(stdout);
            break;
        }
    }
    xio_listener_close(l);
    xio_net_close(net);
    return 0;
}
