/* dtensor/backend_cuda_alloc.cu — the CUDA backend's device memory: a
 * caching allocator, as PyTorch's, per rank, and the pool (dt_cuda_pool,
 * backend_cuda.h) through which the ranks sharing a device reclaim each
 * other's cached blocks.
 *
 * free keeps the block for reuse instead of calling cudaFree (which
 * synchronises the whole device): the communication stream's queued work is
 * ordered before the compute stream's next work (event free_ev), so every
 * later use of the block, on either stream, comes after every earlier one,
 * and an alloc may hand it out again at once. Blocks are not split: sizes
 * are rounded (512 B, 2 MiB from 1 MiB up) and a cached block serves a
 * request of its rounded size only, so a loop takes no new block after its
 * first pass (dt_context_memory counts them). The cache is emptied (after draining
 * the streams) when cudaMalloc runs out of memory, then the allocation is
 * tried again, and at destroy. Ranks of one launch sharing a device (a
 * pool) reclaim each other's when that is not enough: the reclaiming rank
 * takes another's cached blocks under that cache's lock, waits (bounded)
 * for an event recorded on each of that rank's streams, which follows every
 * use of them queued before they were freed, and frees them.
 *
 * Test: tests/test_cuda.c, test_memory, test_cache and test_cache_pool
 * (make test; skipped without a GPU).
 */
#include "backend_cuda_impl.cuh"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Under AddressSanitizer on the CPU emulator of CUDA (tests/emu), where
 * device memory is host memory and kernels run as host code: the bytes of
 * a fresh block past the request are poisoned (alloc_of), so that a
 * kernel's access past a tensor shows as it would past a cudaMalloc of its
 * exact size, instead of landing in the allocator's rounding; a block taken
 * from the cache is unpoisoned whole (no finer: its last owner's queued
 * work may still run on it, later in the emulated streams' order). Nothing
 * on a GPU. */
#if defined(DT_CUDA_EMULATE) && defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define DT_DEVICE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define DT_DEVICE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define DT_DEVICE_POISON(p, n) ((void)(p), (void)(n))
#define DT_DEVICE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* The ranks whose caches reclaim each other (backend_cuda.h; pool_reclaim). */
struct dt_cuda_pool {
    pthread_mutex_t lock;   /* members, and a reclaim from start to end */
    dt_backend **members;
    int n, cap;
};

namespace dt_cuda {
namespace {

/* 0 when the host is out of memory. */
int blocks_push(dev_blocks *s, void *p, size_t bytes) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        dev_block *v = static_cast<dev_block *>(realloc(s->v, cap * sizeof *v));
        if (!v) return 0;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = dev_block{p, bytes};
    return 1;
}

/* Removes and returns entry i (order is not kept). */
dev_block blocks_take(dev_blocks *s, size_t i) {
    dev_block blk = s->v[i];
    s->v[i] = s->v[--s->n];
    return blk;
}

/* Every block of im's cache, taken off it (under its lock). */
dev_blocks cache_take_all(cuda_impl *im) {
    pthread_mutex_lock(&im->cache_lock);
    const dev_blocks all = im->cached;
    im->cached = dev_blocks{};
    im->cached_bytes = 0;
    pthread_mutex_unlock(&im->cache_lock);
    return all;
}

/* Puts a block into im's cache; 0 if there is no host memory for it. */
int cache_put(cuda_impl *im, void *p, size_t bytes) {
    pthread_mutex_lock(&im->cache_lock);
    const int ok = blocks_push(&im->cached, p, bytes);
    if (ok) im->cached_bytes += bytes;
    pthread_mutex_unlock(&im->cache_lock);
    return ok;
}

/* cudaFree of every block of `blocks`, which it then releases. */
void free_blocks(dev_blocks *blocks) {
    for (size_t i = 0; i < blocks->n; i++)
        if (cudaFree(blocks->v[i].p) != cudaSuccess) (void)cudaGetLastError();
    free(blocks->v);
    *blocks = dev_blocks{};
}

/* A cached block of exactly want bytes (a rounded size), the most recently
 * cached first, taken off the cache; NULL if there is none. Exact sizes
 * make a loop that repeats its requests take no new block after its first
 * pass: each request then finds the block its size had then. */
void *cache_take(cuda_impl *im, size_t want, size_t *bytes) {
    pthread_mutex_lock(&im->cache_lock);
    size_t best = im->cached.n;
    for (size_t i = im->cached.n; i > 0 && best == im->cached.n; i--)
        if (im->cached.v[i - 1].bytes == want) best = i - 1;
    void *p = NULL;
    if (best < im->cached.n) {
        dev_block blk = blocks_take(&im->cached, best);
        im->cached_bytes -= blk.bytes;
        *bytes = blk.bytes;
        p = blk.p;
    }
    pthread_mutex_unlock(&im->cache_lock);
    return p;
}

} /* namespace */

/* Frees every cached block, after draining the rank's streams (queued work
 * may still use them). */
dt_status cache_flush(dt_backend *b, const char *op) {
    cuda_impl *im = impl_of(b);
    pthread_mutex_lock(&im->cache_lock);
    const size_t n = im->cached.n;
    pthread_mutex_unlock(&im->cache_lock);
    if (n == 0) return DT_SUCCESS;
    DT_TRY(wait_all(b, op));
    dev_blocks all = cache_take_all(im);
    free_blocks(&all);
    return DT_SUCCESS;
}

/* ------------------------------------------------------------- the pool */

/* b joins its pool (im->pool): 0 if there is no host memory for it. */
int pool_join(dt_backend *b) {
    dt_cuda_pool *p = impl_of(b)->pool;
    pthread_mutex_lock(&p->lock);
    int ok = 1;
    if (p->n == p->cap) {
        const int cap = p->cap ? 2 * p->cap : 8;
        dt_backend **m = static_cast<dt_backend **>(realloc(p->members, (size_t)cap * sizeof *m));
        if (m) {
            p->members = m;
            p->cap = cap;
        } else {
            ok = 0;
        }
    }
    if (ok) p->members[p->n++] = b;
    pthread_mutex_unlock(&p->lock);
    return ok;
}

/* b leaves its pool, if it joined: no other rank reclaims its cache after. */
void pool_leave(dt_backend *b) {
    dt_cuda_pool *p = impl_of(b)->pool;
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->n; i++)
        if (p->members[i] == b) {
            p->members[i] = p->members[--p->n];
            break;
        }
    pthread_mutex_unlock(&p->lock);
}

namespace {

/* Out of memory with its own cache empty: frees the blocks that the other
 * ranks of b's pool on its device keep cached. A rank's blocks are taken
 * off its cache (under its lock: from then on it cannot hand them out),
 * then freed once an event recorded on each of its two streams has
 * completed: every use of a block was queued there before the block was
 * freed into the cache, so before the record. The waits are b's (its
 * timeout; one that runs out fails b, as any wait of b's does, and the
 * rank's blocks go back to its cache). *freed: how many were freed. One
 * reclaim at a time per pool. */
dt_status pool_reclaim(dt_backend *b, const char *op, size_t *freed) {
    cuda_impl *im = impl_of(b);
    *freed = 0;
    dt_cuda_pool *p = im->pool;
    if (!p) return DT_SUCCESS;
    dt_status st = DT_SUCCESS;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->n && st == DT_SUCCESS; i++) {
        const dt_backend *other = p->members[i];
        cuda_impl *om = impl_of(other);
        if (other == b || om->device != im->device) continue;
        dev_blocks took = cache_take_all(om);
        if (took.n == 0) {
            free(took.v);
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "rank %d's work queued before its frees", other->rank);
        for (cudaStream_t s : {om->compute, om->comm}) {
            if (st != DT_SUCCESS) break;
            const cudaError_t e = cudaEventRecord(im->reclaim_ev, s);
            st = e == cudaSuccess
                     ? wait_event(b, im->reclaim_ev, op, what)
                     : cuda_error(b, op, "cudaEventRecord", e);
        }
        if (st == DT_SUCCESS) {
            *freed += took.n;
            free_blocks(&took);
        } else {   /* back where they were (leaked where the host has no room) */
            for (size_t j = 0; j < took.n; j++) (void)cache_put(om, took.v[j].p, took.v[j].bytes);
            free(took.v);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* cuda_alloc and cuda_alloc_uninit: zero says whether the memory is zeroed
 * (a memset on the compute stream). */
dt_status alloc_of(dt_backend *b, size_t bytes, void **out, bool zero) {
    if (!out) return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: cuda alloc: out is NULL", b->rank);
    *out = NULL;
    DT_TRY(enter(b, "alloc"));
    cuda_impl *im = impl_of(b);
    size_t unit = bytes < ((size_t)1 << 20) ? 512 : (size_t)2 << 20;
    if (bytes > SIZE_MAX - unit)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: cuda alloc: %zu bytes is too many",
                        b->rank, bytes);
    size_t want = (bytes + unit - 1) / unit * unit;
    if (want == 0) want = unit;
    size_t have = 0;
    void *p = cache_take(im, want, &have);
    if (!p) {
        have = want;
        im->mallocs++;
        cudaError_t e = cudaMalloc(&p, want);
        if (e == cudaErrorMemoryAllocation) {   /* this rank's cache, then its pool's */
            (void)cudaGetLastError();
            DT_TRY(cache_flush(b, "alloc"));
            e = cudaMalloc(&p, want);
        }
        size_t reclaimed = 0;
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            DT_TRY(pool_reclaim(b, "alloc", &reclaimed));
            if (reclaimed) e = cudaMalloc(&p, want);
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return dt_error(e == cudaErrorMemoryAllocation ? DT_ERR_OUT_OF_MEMORY : DT_ERR_BACKEND,
                            "rank %d: cuda alloc: cudaMalloc of %zu bytes on device %d failed: "
                            "%s (%s)", b->rank, want, im->device, cudaGetErrorString(e),
                            cudaGetErrorName(e));
        }
        DT_DEVICE_POISON(static_cast<char *>(p) + bytes, want - bytes);
    } else {
        DT_DEVICE_UNPOISON(p, have);
    }
    if (!blocks_push(&im->live, p, have)) {
        if (!cache_put(im, p, have)) (void)cudaFree(p); /* not used yet: nothing to wait for */
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: cuda alloc: out of host memory",
                        b->rank);
    }
    im->in_use += have;
    if (im->in_use > im->peak) im->peak = im->in_use;
    if (zero && bytes > 0) {
        cudaError_t e = cudaMemsetAsync(p, 0, bytes, im->compute);
        if (e != cudaSuccess) {
            dt_status st = cuda_error(b, "alloc", "cudaMemsetAsync", e);
            cuda_free(b, p);
            return st;
        }
    }
    *out = p;
    return DT_SUCCESS;
}

} /* namespace */

dt_status cuda_alloc(dt_backend *b, size_t bytes, void **out) {
    return alloc_of(b, bytes, out, true);
}

dt_status cuda_alloc_uninit(dt_backend *b, size_t bytes, void **out) {
    return alloc_of(b, bytes, out, false);
}

void cuda_free(dt_backend *b, void *p) {
    if (!p) return;
    cuda_impl *im = impl_of(b);
    if (im->failed) return; /* leak: cudaFree could wait forever on a hung device */
    char saved[1024];
    dt_error_save_(saved, sizeof saved);
    size_t i = im->live.n;
    while (i > 0 && im->live.v[i - 1].p != p) i--; /* the newest first: frees tend to be LIFO */
    if (enter(b, "free") == DT_SUCCESS) {
        dev_block blk = i > 0 ? blocks_take(&im->live, i - 1) : dev_block{p, 0};
        im->in_use -= blk.bytes < im->in_use ? blk.bytes : im->in_use;
        int ordered = blk.bytes > 0 && cudaEventRecord(im->free_ev, im->comm) == cudaSuccess &&
                      cudaStreamWaitEvent(im->compute, im->free_ev, 0) == cudaSuccess;
        const int cached = ordered && cache_put(im, blk.p, blk.bytes);
        /* Not from cuda_alloc, or the cache could not take it: freed now. */
        if (!cached && wait_all(b, "free") == DT_SUCCESS && cudaFree(p) != cudaSuccess)
            (void)cudaGetLastError();
    }
    (void)cudaGetLastError();
    dt_error_restore_(saved);
}

/* Grows a device scratch to `need` bytes (contents not kept). The old one
 * may still be read by queued work: drain first. */
dt_status grow_device(const dt_backend *b, void **p, size_t *bytes, size_t need, const char *op) {
    if (need <= *bytes) return DT_SUCCESS;
    if (*p) {
        DT_TRY(wait_all(b, op));
        CU_TRY(b, op, cudaFree(*p));
        *p = NULL;
        *bytes = 0;
    }
    size_t want = need < 4096 ? 4096 : need;
    cuda_impl *im = impl_of(b);
    im->mallocs++;
    CU_TRY(b, op, cudaMalloc(p, want));
    *bytes = want;
    return DT_SUCCESS;
}

dt_status cuda_memory(dt_backend *b, dt_memory_stats *out, int what) {
    cuda_impl *im = impl_of(b);
    if (what & DT_MEMORY_RELEASE) DT_TRY(cache_flush(b, "memory release"));
    if (what & DT_MEMORY_RESET_PEAK) im->peak = im->in_use;
    pthread_mutex_lock(&im->cache_lock);
    const size_t cached = im->cached_bytes;
    pthread_mutex_unlock(&im->cache_lock);
    *out = dt_memory_stats{im->in_use, im->peak, cached, im->mallocs};
    return DT_SUCCESS;
}

} /* namespace dt_cuda */

/* ---------------------------------------------------------------- public */

extern "C" dt_status dt_cuda_pool_create(dt_cuda_pool **out) {
    if (!out) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_cuda_pool_create: out is NULL");
    *out = NULL;
    dt_cuda_pool *p = static_cast<dt_cuda_pool *>(calloc(1, sizeof *p));
    if (!p) return dt_error(DT_ERR_OUT_OF_MEMORY, "dt_cuda_pool_create: out of host memory");
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return dt_error(DT_ERR_SYSTEM, "dt_cuda_pool_create: pthread_mutex_init failed");
    }
    *out = p;
    return DT_SUCCESS;
}

extern "C" void dt_cuda_pool_destroy(dt_cuda_pool *p) {
    if (!p) return;
    pthread_mutex_destroy(&p->lock);
    free(p->members);
    free(p);
}
