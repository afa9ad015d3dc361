/* Real functions around DPDK's static-inline fast paths (see shim.h). */
#include "shim.h"

#include <string.h>

int xio_shim_errno(void) { return rte_errno; }

int xio_shim_mempool_get_bulk(struct rte_mempool *mp, void **objs, unsigned int n) {
    return rte_mempool_get_bulk(mp, objs, n);
}

void xio_shim_mempool_put_bulk(struct rte_mempool *mp, void *const *objs, unsigned int n) {
    rte_mempool_put_bulk(mp, objs, n);
}

unsigned int xio_shim_mempool_elt_size(const struct rte_mempool *mp) { return mp->elt_size; }

/* The ring under `mp`, if it uses the default multi-producer/consumer
 * ring ops (whose head/tail pairs the functions below rewrite). */
static struct rte_ring *mempool_mpmc_ring(struct rte_mempool *mp) {
    if (strcmp(rte_mempool_get_ops(mp->ops_index)->name, "ring_mp_mc") != 0) {
        return NULL;
    }
    return mp->pool_data;
}

int xio_shim_mempool_ring_repair(struct rte_mempool *mp) {
    struct rte_ring *r = mempool_mpmc_ring(mp);
    if (r == NULL) {
        return -1;
    }
    int fixed = 0;
    uint32_t h = __atomic_load_n(&r->cons.head, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&r->cons.tail, __ATOMIC_ACQUIRE) != h) {
        /* Slots a dead consumer reserved: consumed (what it took is
         * found by its header). */
        __atomic_store_n(&r->cons.tail, h, __ATOMIC_RELEASE);
        fixed = 1;
    }
    uint32_t t = __atomic_load_n(&r->prod.tail, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&r->prod.head, __ATOMIC_ACQUIRE) != t) {
        /* Slots a dead producer reserved, maybe half written: dropped
         * (what it was putting back is found by its header). */
        __atomic_store_n(&r->prod.head, t, __ATOMIC_RELEASE);
        fixed = 1;
    }
    return fixed;
}

int xio_shim_mempool_ring_half_dequeue(struct rte_mempool *mp, unsigned int n) {
    struct rte_ring *r = mempool_mpmc_ring(mp);
    if (r == NULL || rte_ring_count(r) < n) {
        return -1;
    }
    __atomic_fetch_add(&r->cons.head, n, __ATOMIC_ACQ_REL);
    return 0;
}

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
