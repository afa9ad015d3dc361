/* What the Rust side needs from DPDK: the EAL, memzones, mempools and
 * element rings. DPDK's fast paths are static inline functions, which
 * bindgen cannot bind; shim.c wraps them as real functions (xio_shim_*). */
#include <rte_config.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_memzone.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <rte_ring_elem.h>

int xio_shim_errno(void);
/* Bytes of each object's element (the part a get hands out). */
unsigned int xio_shim_mempool_elt_size(const struct rte_mempool *mp);
/* The mempool's object count (`size`: shared memory, check it). */
unsigned int xio_shim_mempool_size(const struct rte_mempool *mp);
/* The mempool's first object (the element after its DPDK object header),
 * or NULL: the start of the walk rte_mempool_obj_iter makes, one step at
 * a time, so the caller can check each object's address before the next
 * step reads its header. */
void *xio_shim_mempool_first_obj(const struct rte_mempool *mp);
/* The object after `obj` in its mempool's list, or NULL: reads the DPDK
 * object header just before `obj` (XIO_SHIM_OBJHDR_SIZE bytes). */
void *xio_shim_mempool_next_obj(const void *obj);
/* Links the mempool's object list as `objs` (the primary, in the order
 * it numbered them at creation). */
void xio_shim_mempool_relink(struct rte_mempool *mp, void *const *objs, unsigned int n);
/* Test hook: overwrites the list link in `obj`'s DPDK object header, as
 * a broken or hostile process of the prefix can. Not for applications. */
void xio_shim_mempool_scribble_next(void *obj, uintptr_t next);
/* The mempool's ring pointer (shared memory: check it). */
struct rte_ring *xio_shim_mempool_pool_data(const struct rte_mempool *mp);
/* Ring `r` (the mempool's ring pointer, as the caller read and checked
 * it) under `mp`, of `nobjs` objects, checked once: the mempool
 * uses the default multi-producer/consumer ring ops (by this process's
 * own ops table) and the ring's size, mask and capacity are what those
 * ops make for `nobjs` objects. Sets `*mask` and returns 0, or
 * returns -1. Everything here is shared memory any process of the
 * prefix can write: the caller keeps `r` and `*mask` and passes them
 * to the xio_shim_mpring_* functions, which read neither the mempool's
 * ops index, ring pointer and cache nor the ring's mask again. */
int xio_shim_mempool_ring(struct rte_mempool *mp, struct rte_ring *r, unsigned int nobjs,
                          uint32_t *mask);
/* Writes back what xio_shim_mempool_ring checked (the primary, which made
 * the mempool, with the values it took then). */
void xio_shim_mempool_ring_restore(struct rte_mempool *mp, struct rte_ring *r, uint32_t mask);
/* rte_mempool_get_bulk / put_bulk of a mempool with the ring ops and no
 * cache: takes or puts exactly `n` objects (0) or none (-1), on ring `r`
 * with slot mask `mask` (from xio_shim_mempool_ring). */
int xio_shim_mpring_get(struct rte_ring *r, uint32_t mask, void **objs, unsigned int n);
int xio_shim_mpring_put(struct rte_ring *r, uint32_t mask, void *const *objs, unsigned int n);
/* The same, for a caller that is the only one inside an operation on the
 * ring (the mempool's lock held by every process that uses it): no
 * reservation to wait behind, so a get or put half done in the ring (a
 * process killed inside one, or a hostile one that moved an index) is
 * not waited for (DPDK's protocol waits for its tail for ever) but
 * refused: returns -2, the ring untouched, until something repairs it
 * (xio_shim_mpring_repair). Otherwise 0 or -1, as above. */
int xio_shim_mpring_get_excl(struct rte_ring *r, uint32_t mask, void **objs, unsigned int n);
int xio_shim_mpring_put_excl(struct rte_ring *r, uint32_t mask, void *const *objs,
                             unsigned int n);
/* Objects in the ring. */
unsigned int xio_shim_mpring_count(const struct rte_ring *r, uint32_t mask);
/* Finishes, in a mempool's ring, what a process killed inside an enqueue
 * or dequeue left half done (DPDK's multi-producer/consumer ring then
 * makes every later operation on that side wait for ever): a dequeue's
 * reservation is taken as done, an enqueue's is dropped. Only with no
 * other process inside an operation on the mempool. Returns 1 if
 * something was finished, 0 if nothing was half done. */
int xio_shim_mpring_repair(struct rte_ring *r);
/* Test hook: reserves `n` objects for a dequeue and stops there, as a
 * process killed inside one would (the objects are in nobody's hands).
 * Returns 0, or -1 if the ring holds fewer than `n`. Not for
 * applications. */
int xio_shim_mpring_half_dequeue(struct rte_ring *r, uint32_t mask, unsigned int n);
/* Test hook: overwrites the mempool's ops index and its ring's mask, as
 * a broken or hostile process of the prefix can. Not for applications. */
int xio_shim_mempool_scribble(struct rte_mempool *mp, int ops_index, uint32_t ring_mask);
/* Checks a ring's size, mask and capacity once (a power of two, its mask,
 * and one less than it): sets `*mask` and returns 0, or returns -1. The
 * caller keeps the mask and passes it to xio_shim_spsc_*, which never
 * read the ring's own fields (shared memory any process of the prefix
 * can write) again. */
int xio_shim_ring_check(const struct rte_ring *r, uint32_t *mask);
/* rte_ring_enqueue_burst_elem / dequeue_burst_elem of 16-byte elements on
 * a single-producer single-consumer ring, slots masked by `mask`: how
 * many went in or came out. */
unsigned int xio_shim_spsc_enqueue(struct rte_ring *r, uint32_t mask, const void *objs,
                                   unsigned int n);
unsigned int xio_shim_spsc_dequeue(struct rte_ring *r, uint32_t mask, void *objs,
                                   unsigned int n);
/* Elements waiting. */
unsigned int xio_shim_spsc_count(const struct rte_ring *r, uint32_t mask);
/* Test hook: overwrites the ring's mask and size and puts its heads and
 * tails at `at` with one element waiting, as a broken or hostile process
 * of the prefix can. Not for applications. */
void xio_shim_ring_scribble(struct rte_ring *r, uint32_t mask, uint32_t size, uint32_t at);

/* Name limits DPDK defines with sizeof expressions, which bindgen cannot
 * evaluate in a #define; clang evaluates them here. */
enum xio_shim_limits {
    XIO_SHIM_RING_NAMESIZE = RTE_RING_NAMESIZE,
    XIO_SHIM_MEMPOOL_NAMESIZE = RTE_MEMPOOL_NAMESIZE,
    XIO_SHIM_OBJHDR_SIZE = sizeof(struct rte_mempool_objhdr),
};
