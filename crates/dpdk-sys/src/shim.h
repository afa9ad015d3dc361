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
int xio_shim_mempool_get_bulk(struct rte_mempool *mp, void **objs, unsigned int n);
void xio_shim_mempool_put_bulk(struct rte_mempool *mp, void *const *objs, unsigned int n);
unsigned int xio_shim_ring_enqueue_burst_elem(struct rte_ring *r, const void *objs,
                                              unsigned int esize, unsigned int n,
                                              unsigned int *free_space);
unsigned int xio_shim_ring_dequeue_burst_elem(struct rte_ring *r, void *objs,
                                              unsigned int esize, unsigned int n,
                                              unsigned int *available);
/* Bytes of each object's element (the part a get hands out). */
unsigned int xio_shim_mempool_elt_size(const struct rte_mempool *mp);
/* Finishes, in the ring under a mempool of the default ring ops, what a
 * process killed inside an enqueue or dequeue left half done (DPDK's
 * multi-producer/consumer ring then makes every later operation on that
 * side wait for ever): a dequeue's reservation is taken as done, an
 * enqueue's is dropped. Only with no other process inside an operation
 * on the mempool. Returns 1 if something was finished, 0 if nothing was
 * half done, -1 if the mempool does not use the ring ops. */
int xio_shim_mempool_ring_repair(struct rte_mempool *mp);
/* Test hook: reserves `n` objects for a dequeue and stops there, as a
 * process killed inside one would (the objects are in nobody's hands).
 * Returns 0, or -1 if the mempool does not use the ring ops or holds
 * fewer than `n`. Not for applications. */
int xio_shim_mempool_ring_half_dequeue(struct rte_mempool *mp, unsigned int n);
unsigned int xio_shim_ring_count(const struct rte_ring *r);
unsigned int xio_shim_ring_free_count(const struct rte_ring *r);

/* Name limits DPDK defines with sizeof expressions, which bindgen cannot
 * evaluate in a #define; clang evaluates them here. */
enum xio_shim_limits {
    XIO_SHIM_RING_NAMESIZE = RTE_RING_NAMESIZE,
    XIO_SHIM_MEMPOOL_NAMESIZE = RTE_MEMPOOL_NAMESIZE,
};
