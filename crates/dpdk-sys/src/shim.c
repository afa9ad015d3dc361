/* Real functions around DPDK's static-inline fast paths (see shim.h). */
#include "shim.h"

int xio_shim_errno(void) { return rte_errno; }

int xio_shim_mempool_get_bulk(struct rte_mempool *mp, void **objs, unsigned int n) {
    return rte_mempool_get_bulk(mp, objs, n);
}

void xio_shim_mempool_put_bulk(struct rte_mempool *mp, void *const *objs, unsigned int n) {
    rte_mempool_put_bulk(mp, objs, n);
}

unsigned int xio_shim_mempool_elt_size(const struct rte_mempool *mp) { return mp->elt_size; }

unsigned int xio_shim_ring_enqueue_burst_elem(struct rte_ring *r, const void *objs,
                                              unsigned int esize, unsigned int n,
                                              unsigned int *free_space) {
    return rte_ring_enqueue_burst_elem(r, objs, esize, n, free_space);
}

unsigned int xio_shim_ring_dequeue_burst_elem(struct rte_ring *r, void *objs,
                                              unsigned int esize, unsigned int n,
                                              unsigned int *available) {
    return rte_ring_dequeue_burst_elem(r, objs, esize, n, available);
}

unsigned int xio_shim_ring_count(const struct rte_ring *r) { return rte_ring_count(r); }

unsigned int xio_shim_ring_free_count(const struct rte_ring *r) { return rte_ring_free_count(r); }
