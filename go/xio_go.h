/* Wrappers for the Go package: one xio_ call each, which also copies the
 * call's error message when it failed. xio_last_error() is per thread,
 * and a goroutine may run on another thread by its next cgo call, so the
 * message must be read within the failing call. */
#ifndef XIO_GO_H
#define XIO_GO_H

#include <stdlib.h>
#include <string.h>
#include "xio.h"

#define XG_ERR 256

static inline xio_result xg_fail(xio_result r, char *err) {
	if (r != XIO_OK && r != XIO_ERR_WOULD_BLOCK && err != NULL) {
		strncpy(err, xio_last_error(), XG_ERR - 1);
		err[XG_ERR - 1] = 0;
	}
	return r;
}

static inline xio_result xg_net_attach(const char *prefix, xio_net **out, char *err) {
	return xg_fail(xio_net_attach(prefix, out), err);
}
static inline xio_result xg_net_close(xio_net *n, char *err) {
	return xg_fail(xio_net_close(n), err);
}
static inline xio_result xg_net_fd(xio_net *n, int32_t *fd, char *err) {
	return xg_fail(xio_net_fd(n, fd), err);
}
static inline xio_result xg_net_manager_fd(xio_net *n, int32_t *fd, char *err) {
	return xg_fail(xio_net_manager_fd(n, fd), err);
}
static inline xio_result xg_net_manager_gone(xio_net *n, int32_t *gone, char *err) {
	return xg_fail(xio_net_manager_gone(n, gone), err);
}
static inline xio_result xg_net_poll(xio_net *n, xio_event *evs, size_t cap, size_t *cnt, char *err) {
	return xg_fail(xio_net_poll(n, evs, cap, 0, cnt), err);
}
static inline xio_result xg_net_watch_begin(xio_net *n, uint64_t *budget, char *err) {
	return xg_fail(xio_net_watch_begin(n, budget), err);
}
static inline int32_t xg_net_watch_look(xio_net *n) {
	int32_t in = 0;
	return xio_net_watch_look(n, &in) == XIO_OK ? in : 1;
}
static inline xio_result xg_net_watch_end(xio_net *n, int32_t hit, uint64_t spun, char *err) {
	return xg_fail(xio_net_watch_end(n, hit, spun), err);
}
static inline xio_result xg_listen(xio_net *n, const char *addr, size_t backlog, xio_listener **out, char *err) {
	return xg_fail(xio_listen_backlog(n, addr, backlog, out), err);
}
/* A new listener's setup: non-blocking, its token and its address. */
static inline xio_result xg_listener_setup(xio_listener *l, uint64_t *token, char *addr, size_t cap, char *err) {
	xio_result r = xio_listener_set_nonblocking(l, 1);
	if (r == XIO_OK) r = xio_listener_token(l, token);
	if (r == XIO_OK) r = xio_listener_local_addr(l, addr, cap);
	return xg_fail(r, err);
}
static inline xio_result xg_listener_close(xio_listener *l, char *err) {
	return xg_fail(xio_listener_close(l), err);
}
static inline xio_result xg_accept(xio_listener *l, xio_stream **out, char *err) {
	return xg_fail(xio_accept(l, out), err);
}
static inline xio_result xg_dial(xio_net *n, const char *addr, xio_stream **out, char *err) {
	return xg_fail(xio_dial(n, addr, out), err);
}
/* A new stream's setup: non-blocking, its token, its addresses. */
static inline xio_result xg_stream_setup(xio_stream *s, uint64_t token, char *local, char *peer, size_t cap, char *err) {
	xio_result r = xio_stream_set_nonblocking(s, 1);
	if (r == XIO_OK) r = xio_stream_set_token(s, token);
	if (r == XIO_OK) r = xio_stream_local_addr(s, local, cap);
	/* A stream reset before its setup has no peer address: left empty. */
	if (r == XIO_OK && xio_stream_peer_addr(s, peer, cap) != XIO_OK) peer[0] = 0;
	return xg_fail(r, err);
}
static inline xio_result xg_stream_connected(xio_stream *s, int32_t *done, char *err) {
	return xg_fail(xio_stream_connected(s, done), err);
}
static inline xio_result xg_stream_check_connect(xio_stream *s, char *err) {
	return xg_fail(xio_stream_check_connect(s), err);
}
static inline xio_result xg_stream_close(xio_stream *s, char *err) {
	return xg_fail(xio_stream_close(s), err);
}
static inline xio_result xg_read(xio_stream *s, void *b, size_t n, size_t *out, char *err) {
	return xg_fail(xio_read(s, b, n, out), err);
}
static inline xio_result xg_write(xio_stream *s, const void *b, size_t n, size_t *out, char *err) {
	return xg_fail(xio_write(s, b, n, out), err);
}
static inline xio_result xg_writev(xio_stream *s, const xio_iovec *iov, size_t cnt, size_t *out, char *err) {
	return xg_fail(xio_writev(s, iov, cnt, out), err);
}
static inline xio_result xg_shutdown(xio_stream *s, int32_t how, char *err) {
	return xg_fail(xio_shutdown(s, how), err);
}
/* A writable pool buffer of len bytes: its handle and memory. */
static inline xio_result xg_alloc(xio_stream *s, size_t len, xio_buf **out, uint8_t **data, char *err) {
	size_t cap = 0;
	xio_result r = xio_stream_alloc(s, len, out);
	if (r == XIO_OK) {
		r = xio_buf_mut(*out, data, &cap);
		if (r != XIO_OK) {
			xio_buf_free(*out);
			*out = NULL;
		}
	}
	return xg_fail(r, err);
}
/* Sets a filled buffer's length and sends it; on failure the buffer is
 * still the caller's. */
static inline xio_result xg_send_buf(xio_stream *s, xio_buf *b, size_t len, char *err) {
	xio_result r = xio_buf_set_len(b, len);
	if (r == XIO_OK) r = xio_stream_send_buf(s, b);
	return xg_fail(r, err);
}
/* The next received buffer (NULL at end of stream) and its bytes. */
static inline xio_result xg_recv_buf(xio_stream *s, xio_buf **out, const uint8_t **data, size_t *len, char *err) {
	xio_result r = xio_stream_recv_buf(s, out);
	if (r == XIO_OK && *out != NULL) r = xio_buf_data(*out, data, len);
	return xg_fail(r, err);
}
static inline void xg_buf_free(xio_buf *b) {
	xio_buf_free(b);
}
static inline xio_result xg_manager_spawn(const char *prefix, xio_manager **out, char *err) {
	return xg_fail(xio_manager_spawn(prefix, out), err);
}
static inline xio_result xg_manager_stop(xio_manager *m, char *err) {
	return xg_fail(xio_manager_stop(m), err);
}
static inline xio_result xg_manager_stats(xio_manager *m, xio_manager_stats *st, char *err) {
	return xg_fail(xio_manager_get_stats(m, st), err);
}

#endif
