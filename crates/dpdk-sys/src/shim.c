/* Real functions around DPDK's static-inline fast paths (see shim.h). */
#include "shim.h"

#include <string.h>

int xio_shim_errno(void) { return rte_errno; }

unsigned int xio_shim_mempool_elt_size(const struct rte_mempool *mp) { return mp->elt_size; }

static struct rte_mempool_objhdr *objhdr_of(const void *obj) {
    return (struct rte_mempool_objhdr *)obj - 1;
}

unsigned int xio_shim_mempool_size(const struct rte_mempool *mp) {
    return __atomic_load_n(&mp->size, __ATOMIC_RELAXED);
}

void *xio_shim_mempool_first_obj(const struct rte_mempool *mp) {
    struct rte_mempool_objhdr *h = __atomic_load_n(&mp->elt_list.stqh_first, __ATOMIC_RELAXED);
    return h == NULL ? NULL : (void *)(h + 1);
}

void *xio_shim_mempool_next_obj(const void *obj) {
    struct rte_mempool_objhdr *h = __atomic_load_n(&objhdr_of(obj)->next.stqe_next,
                                                   __ATOMIC_RELAXED);
    return h == NULL ? NULL : (void *)(h + 1);
}

void xio_shim_mempool_relink(struct rte_mempool *mp, void *const *objs, unsigned int n) {
    if (n == 0) {
        return;
    }
    for (unsigned int i = 0; i + 1 < n; i++) {
        objhdr_of(objs[i])->next.stqe_next = objhdr_of(objs[i + 1]);
    }
    objhdr_of(objs[n - 1])->next.stqe_next = NULL;
    mp->elt_list.stqh_first = objhdr_of(objs[0]);
    mp->elt_list.stqh_last = &objhdr_of(objs[n - 1])->next.stqe_next;
}

void xio_shim_mempool_scribble_next(void *obj, uintptr_t next) {
    objhdr_of(obj)->next.stqe_next = (struct rte_mempool_objhdr *)next;
}

/* The index of the default multi-producer/consumer ring ops in this
 * process's ops table (its own memory), or -1. */
static int mpmc_ops_index(void) {
    uint32_t n = rte_mempool_ops_table.num_ops;
    for (uint32_t i = 0; i < n && i < RTE_MEMPOOL_MAX_OPS_IDX; i++) {
        if (strcmp(rte_mempool_ops_table.ops[i].name, "ring_mp_mc") == 0) {
            return (int)i;
        }
    }
    return -1;
}

struct rte_ring *xio_shim_mempool_pool_data(const struct rte_mempool *mp) {
    return __atomic_load_n(&mp->pool_data, __ATOMIC_RELAXED);
}

int xio_shim_mempool_ring(struct rte_mempool *mp, struct rte_ring *r, unsigned int nobjs,
                          uint32_t *mask) {
    /* Each field read once: what is checked is what is used. */
    int ops = __atomic_load_n(&mp->ops_index, __ATOMIC_RELAXED);
    if (ops < 0 || ops != mpmc_ops_index()) {
        return -1;
    }
    if (r == NULL || __atomic_load_n(&mp->pool_data, __ATOMIC_RELAXED) != r || nobjs == 0 ||
        nobjs >= (1u << 31)) {
        return -1;
    }
    /* What the ring ops made for `nobjs` objects (rte_ring_create of
     * rte_align32pow2(n + 1) entries, not exact-sized). */
    uint32_t size = rte_align32pow2(nobjs + 1);
    if (__atomic_load_n(&r->size, __ATOMIC_RELAXED) != size ||
        __atomic_load_n(&r->mask, __ATOMIC_RELAXED) != size - 1 ||
        __atomic_load_n(&r->capacity, __ATOMIC_RELAXED) != size - 1) {
        return -1;
    }
    *mask = size - 1;
    return 0;
}

void xio_shim_mempool_ring_restore(struct rte_mempool *mp, struct rte_ring *r, uint32_t mask) {
    int ops = mpmc_ops_index();
    if (ops >= 0) {
        __atomic_store_n(&mp->ops_index, ops, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&mp->pool_data, (void *)r, __ATOMIC_RELAXED);
    __atomic_store_n(&r->size, mask + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&r->mask, mask, __ATOMIC_RELAXED);
    __atomic_store_n(&r->capacity, mask, __ATOMIC_RELAXED);
}

/* The slots of a ring of object pointers follow its header (as DPDK's
 * own element accessors take them). */
static void **mpring_slots(struct rte_ring *r) { return (void **)&r[1]; }

/* DPDK's multi-producer/consumer bulk enqueue and dequeue
 * (rte_ring_c11_pvt.h, rte_ring_elem_pvt.h), the same head/tail protocol
 * and orderings, with the slot index masked by `mask`, kept in this
 * process, not by the ring's own field. */
int xio_shim_mpring_get(struct rte_ring *r, uint32_t mask, void **objs, unsigned int n) {
    uint32_t head = __atomic_load_n(&r->cons.head, __ATOMIC_ACQUIRE);
    uint32_t next;
    do {
        /* Acquire: pairs with the producer's tail release (the slots). */
        uint32_t prod_tail = __atomic_load_n(&r->prod.tail, __ATOMIC_ACQUIRE);
        if (n == 0 || prod_tail - head < n) {
            return -1;
        }
        next = head + n;
    } while (!__atomic_compare_exchange_n(&r->cons.head, &head, next, 0, __ATOMIC_RELEASE,
                                          __ATOMIC_ACQUIRE));
    void **slots = mpring_slots(r);
    for (unsigned int i = 0; i < n; i++) {
        objs[i] = slots[(head + i) & mask];
    }
    rte_wait_until_equal_32(&r->cons.tail, head, __ATOMIC_RELAXED);
    /* Release: the slots were read before producers may reuse them. */
    __atomic_store_n(&r->cons.tail, next, __ATOMIC_RELEASE);
    return 0;
}

int xio_shim_mpring_put(struct rte_ring *r, uint32_t mask, void *const *objs, unsigned int n) {
    uint32_t head = __atomic_load_n(&r->prod.head, __ATOMIC_RELAXED);
    uint32_t next;
    do {
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        /* Acquire: pairs with the consumer's tail release. */
        uint32_t cons_tail = __atomic_load_n(&r->cons.tail, __ATOMIC_ACQUIRE);
        if (n == 0 || mask + cons_tail - head < n) {
            return -1;
        }
        next = head + n;
    } while (!__atomic_compare_exchange_n(&r->prod.head, &head, next, 0, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    void **slots = mpring_slots(r);
    for (unsigned int i = 0; i < n; i++) {
        slots[(head + i) & mask] = objs[i];
    }
    rte_wait_until_equal_32(&r->prod.tail, head, __ATOMIC_RELAXED);
    /* Release: publishes the slots to consumers (their prod.tail acquire). */
    __atomic_store_n(&r->prod.tail, next, __ATOMIC_RELEASE);
    return 0;
}

/* The two above with no other operation on the ring (see shim.h): the
 * same loads, stores and orderings, the head moved by a plain store once
 * its tail is seen to match it instead of by a CAS and a wait. */
int xio_shim_mpring_get_excl(struct rte_ring *r, uint32_t mask, void **objs, unsigned int n) {
    uint32_t head = __atomic_load_n(&r->cons.head, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&r->cons.tail, __ATOMIC_RELAXED) != head) {
        return -2;
    }
    /* Acquire: pairs with the producer's tail release (the slots). */
    uint32_t prod_tail = __atomic_load_n(&r->prod.tail, __ATOMIC_ACQUIRE);
    if (n == 0 || prod_tail - head < n) {
        return -1;
    }
    uint32_t next = head + n;
    __atomic_store_n(&r->cons.head, next, __ATOMIC_RELAXED);
    void **slots = mpring_slots(r);
    for (unsigned int i = 0; i < n; i++) {
        objs[i] = slots[(head + i) & mask];
    }
    /* Release: the slots were read before producers may reuse them. */
    __atomic_store_n(&r->cons.tail, next, __ATOMIC_RELEASE);
    return 0;
}

int xio_shim_mpring_put_excl(struct rte_ring *r, uint32_t mask, void *const *objs,
                             unsigned int n) {
    uint32_t head = __atomic_load_n(&r->prod.head, __ATOMIC_RELAXED);
    if (__atomic_load_n(&r->prod.tail, __ATOMIC_RELAXED) != head) {
        return -2;
    }
    /* Acquire: pairs with the consumer's tail release. */
    uint32_t cons_tail = __atomic_load_n(&r->cons.tail, __ATOMIC_ACQUIRE);
    if (n == 0 || mask + cons_tail - head < n) {
        return -1;
    }
    uint32_t next = head + n;
    __atomic_store_n(&r->prod.head, next, __ATOMIC_RELAXED);
    void **slots = mpring_slots(r);
    for (unsigned int i = 0; i < n; i++) {
        slots[(head + i) & mask] = objs[i];
    }
    /* Release: publishes the slots to consumers (their prod.tail acquire). */
    __atomic_store_n(&r->prod.tail, next, __ATOMIC_RELEASE);
    return 0;
}

unsigned int xio_shim_mpring_count(const struct rte_ring *r, uint32_t mask) {
    uint32_t count = (__atomic_load_n(&r->prod.tail, __ATOMIC_RELAXED) -
                      __atomic_load_n(&r->cons.tail, __ATOMIC_RELAXED)) & mask;
    return count;
}

int xio_shim_mpring_repair(struct rte_ring *r) {
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

int xio_shim_mpring_half_dequeue(struct rte_ring *r, uint32_t mask, unsigned int n) {
    if (xio_shim_mpring_count(r, mask) < n) {
        return -1;
    }
    __atomic_fetch_add(&r->cons.head, n, __ATOMIC_ACQ_REL);
    return 0;
}

int xio_shim_mempool_scribble(struct rte_mempool *mp, int ops_index, uint32_t ring_mask) {
    struct rte_ring *r = mp->pool_data;
    if (r == NULL) {
        return -1;
    }
    mp->ops_index = ops_index;
    r->mask = ring_mask;
    return 0;
}

int xio_shim_ring_check(const struct rte_ring *r, uint32_t *mask) {
    uint32_t size = __atomic_load_n(&r->size, __ATOMIC_RELAXED);
    if (size < 2 || (size & (size - 1)) != 0 ||
        __atomic_load_n(&r->mask, __ATOMIC_RELAXED) != size - 1 ||
        __atomic_load_n(&r->capacity, __ATOMIC_RELAXED) != size - 1) {
        return -1;
    }
    *mask = size - 1;
    return 0;
}

/* DPDK's single-producer/single-consumer burst enqueue and dequeue of
 * 16-byte elements (rte_ring_c11_pvt.h, rte_ring_elem_pvt.h: the same
 * loads, stores and orderings), with the slot index masked by `mask`,
 * kept in the caller's memory, instead of the ring's own size, mask and
 * capacity fields, and without its sync-type switch. */
typedef struct {
    uint64_t w[2];
} xio_elem16;

unsigned int xio_shim_spsc_enqueue(struct rte_ring *r, uint32_t mask, const void *objs,
                                   unsigned int n) {
    uint32_t head = __atomic_load_n(&r->prod.head, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    /* Acquire: pairs with the consumer's release of cons.tail. */
    uint32_t cons_tail = __atomic_load_n(&r->cons.tail, __ATOMIC_ACQUIRE);
    uint32_t free_entries = mask + cons_tail - head;
    if (n > free_entries) {
        n = free_entries;
    }
    if (n == 0) {
        return 0;
    }
    uint32_t next = head + n;
    r->prod.head = next;
    xio_elem16 *slots = (xio_elem16 *)&r[1];
    const xio_elem16 *src = objs;
    for (unsigned int i = 0; i < n; i++) {
        memcpy(&slots[(head + i) & mask], &src[i], sizeof(xio_elem16));
    }
    /* Release: publishes the slots (the consumer's prod.tail acquire). */
    __atomic_store_n(&r->prod.tail, next, __ATOMIC_RELEASE);
    return n;
}

unsigned int xio_shim_spsc_dequeue(struct rte_ring *r, uint32_t mask, void *objs,
                                   unsigned int n) {
    uint32_t head = __atomic_load_n(&r->cons.head, __ATOMIC_ACQUIRE);
    /* Acquire: pairs with the producer's release of prod.tail. */
    uint32_t prod_tail = __atomic_load_n(&r->prod.tail, __ATOMIC_ACQUIRE);
    uint32_t entries = prod_tail - head;
    if (n > entries) {
        n = entries;
    }
    if (n == 0) {
        return 0;
    }
    uint32_t next = head + n;
    r->cons.head = next;
    const xio_elem16 *slots = (const xio_elem16 *)&r[1];
    xio_elem16 *dst = objs;
    for (unsigned int i = 0; i < n; i++) {
        memcpy(&dst[i], &slots[(head + i) & mask], sizeof(xio_elem16));
    }
    /* Release: the slots were read before the producer may reuse them. */
    __atomic_store_n(&r->cons.tail, next, __ATOMIC_RELEASE);
    return n;
}

unsigned int xio_shim_spsc_count(const struct rte_ring *r, uint32_t mask) {
    return (__atomic_load_n(&r->prod.tail, __ATOMIC_RELAXED) -
            __atomic_load_n(&r->cons.tail, __ATOMIC_RELAXED)) & mask;
}

void xio_shim_ring_scribble(struct rte_ring *r, uint32_t mask, uint32_t size, uint32_t at) {
    r->mask = mask;
    r->size = size;
    r->cons.head = r->cons.tail = at;
    r->prod.head = r->prod.tail = at + 1;
}
