/* collectives/ring.c — the ring rotator: two buffers, one grouped send/recv
 * per step (a send and a receive per part: one part, the current buffer,
 * unless dt_ring_start_from or dt_ring_start_into names others), buffers
 * swapped when the step completes (not after a dt_ring_start_into step,
 * which lands in the caller's memory).
 *
 * Invariant: buf[cur] holds the block of rank source(step) (the caller's
 * parts hold it instead at a step posted by dt_ring_start_from or _into);
 * buf[1-cur] is the landing buffer of the step in flight (if any, and not
 * _into). Both, and the operations' array, are allocated at creation (or by
 * dt_ring_reserve); a step allocates nothing.
 *
 * Test: tests/test_ring.c (make test).
 */
#include "ring.h"
#include "transport.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct dt_ring {
    dt_comm *comm;
    size_t bytes;
    dt_ring_direction direction;
    void *buf[2];
    int cur;
    long step;
    int in_flight;
    int into;                  /* the step in flight lands in the caller's memory */
    int owns_buffers;
    dt_p2p_op *ops;            /* one send and one receive a part */
    int max_parts;             /* ops holds 2 x max_parts */
};

const char *dt_ring_direction_name(dt_ring_direction direction) {
    switch (direction) {
    case DT_RING_FORWARD: return "forward";
    case DT_RING_BACKWARD: return "backward";
    default: return "unknown";
    }
}

static dt_status ring_create(dt_comm *comm, size_t bytes, dt_ring_direction direction,
                             void *buffers, int check, dt_ring **out) {
    if (!out) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_ring_create: out is NULL");
    if (!comm) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_ring_create: comm is NULL");
    if ((int)direction < 0 || direction >= DT_RING_DIRECTION_COUNT)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: dt_ring_create: unknown direction %d",
                        dt_comm_world_rank(comm), (int)direction);
    /* Ranks that disagree would hang (NCCL) or fail late: check up front,
     * unless the caller has (dt_ring_create_in_agreed). */
    int64_t mine[2] = {(int64_t)bytes, (int64_t)direction};
    static const char *const names[2] = {"bytes", "direction"};
    if (check) DT_TRY(dt_comm_check_agreement(comm, "dt_ring_create", mine, names, 2));
    /* Owned buffers come from the communicator's memory (device memory for
     * CUDA ranks), zeroed. */
    dt_ring *r = calloc(1, sizeof *r);
    dt_p2p_op *ops = calloc(2 * DT_RING_MAX_PARTS, sizeof *ops);
    dt_status st = r && ops ? DT_SUCCESS : DT_ERR_OUT_OF_MEMORY;
    if (r) {
        r->comm = comm;
        r->ops = ops;
        r->max_parts = DT_RING_MAX_PARTS;
    } else {
        free(ops);
    }
    if (r && buffers) {
        r->buf[0] = buffers;
        r->buf[1] = (char *)buffers + bytes;
    } else if (r) {
        r->owns_buffers = 1;
        st = comm->mem.ops->alloc(comm->mem.arg, bytes, &r->buf[0]);
        if (st == DT_SUCCESS) st = comm->mem.ops->alloc(comm->mem.arg, bytes, &r->buf[1]);
    }
    if (st != DT_SUCCESS) {
        char why[512];
        snprintf(why, sizeof why, "%s%s", r ? ": " : "", r ? dt_last_error() : "");
        dt_ring_destroy(r);
        return dt_error(st, "rank %d: dt_ring_create: cannot allocate 2 x %zu bytes%s",
                        dt_comm_world_rank(comm), bytes, why);
    }
    r->bytes = bytes;
    r->direction = direction;
    *out = r;
    return DT_SUCCESS;
}

dt_status dt_ring_create(dt_comm *comm, size_t bytes, dt_ring_direction direction,
                         dt_ring **out) {
    return ring_create(comm, bytes, direction, NULL, 1, out);
}

dt_status dt_ring_create_in(dt_comm *comm, size_t bytes, dt_ring_direction direction,
                            void *buffers, dt_ring **out) {
    if (!buffers && bytes)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_ring_create_in: buffers is NULL");
    return ring_create(comm, bytes, direction, buffers, 1, out);
}

dt_status dt_ring_create_in_agreed(dt_comm *comm, size_t bytes, dt_ring_direction direction,
                                   void *buffers, dt_ring **out) {
    if (!buffers && bytes)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_ring_create_in_agreed: buffers is NULL");
    return ring_create(comm, bytes, direction, buffers, 0, out);
}

void dt_ring_destroy(dt_ring *ring) {
    if (!ring) return;
    /* A step still in flight (a caller failing mid-loop) completes first, so
     * no peer copies from or into the buffers after they are freed; after an
     * abort that wait returns at once with an error, which is not ours. */
    if (ring->in_flight) (void)dt_comm_p2p_wait(ring->comm);
    if (ring->owns_buffers) {
        const dt_mem *mem = &ring->comm->mem;
        if (ring->buf[0]) mem->ops->free(mem->arg, ring->buf[0]);
        if (ring->buf[1]) mem->ops->free(mem->arg, ring->buf[1]);
    }
    free(ring->ops);
    free(ring);
}

void *dt_ring_current(dt_ring *ring) { return ring ? ring->buf[ring->cur] : NULL; }
size_t dt_ring_bytes(const dt_ring *ring) { return ring ? ring->bytes : 0; }
long dt_ring_step_index(const dt_ring *ring) { return ring ? ring->step : -1; }

int dt_ring_source(const dt_ring *ring) {
    if (!ring) return -1;
    long p = dt_comm_size(ring->comm), j = dt_comm_rank(ring->comm);
    long t = ring->step % p;
    long src = ring->direction == DT_RING_FORWARD ? j - t : j + t;
    return (int)(((src % p) + p) % p);
}

dt_status dt_ring_reserve(dt_ring *ring, int max_parts) {
    if (!ring) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_ring_reserve: ring is NULL");
    if (max_parts < 1 || max_parts > DT_RING_RESERVE_MAX)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: dt_ring_reserve: %d parts (1 to %d)",
                        dt_comm_world_rank(ring->comm), max_parts, DT_RING_RESERVE_MAX);
    if (ring->in_flight)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: dt_ring_reserve: a step is in flight",
                        dt_comm_world_rank(ring->comm));
    if (max_parts <= ring->max_parts) return DT_SUCCESS;
    dt_p2p_op *ops = realloc(ring->ops, 2 * (size_t)max_parts * sizeof *ops);
    if (!ops)
        return dt_error(DT_ERR_OUT_OF_MEMORY, "rank %d: dt_ring_reserve: out of memory for %d "
                        "parts", dt_comm_world_rank(ring->comm), max_parts);
    ring->ops = ops;
    ring->max_parts = max_parts;
    return DT_SUCCESS;
}

/* Posts the step: parts[i] (sizes[i] bytes) to the next rank, each received
 * at into[i], or (into NULL) at the same offset of the landing buffer. */
static dt_status ring_post(dt_ring *ring, const char *op, const void *const *parts,
                           void *const *into, const size_t *sizes, int n, int chained) {
    if (ring->in_flight)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: %s: step %ld is already in flight; call "
                        "dt_ring_wait first", dt_comm_world_rank(ring->comm), op, ring->step);
    int p = dt_comm_size(ring->comm), j = dt_comm_rank(ring->comm);
    int next = (j + 1) % p, prev = (j + p - 1) % p;
    int to = ring->direction == DT_RING_FORWARD ? next : prev;
    int from = ring->direction == DT_RING_FORWARD ? prev : next;
    char *landing = ring->buf[1 - ring->cur];
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        void *dst = into ? into[i] : landing + off;
        ring->ops[2 * i] = (dt_p2p_op){DT_P2P_SEND, to, (void *)parts[i], sizes[i], DT_U8};
        ring->ops[2 * i + 1] = (dt_p2p_op){DT_P2P_RECV, from, dst, sizes[i], DT_U8};
        off += sizes[i];
    }
    DT_TRY(chained ? dt_comm_p2p_start_chained(ring->comm, ring->ops, 2 * n)
                   : dt_comm_p2p_start(ring->comm, ring->ops, 2 * n));
    ring->in_flight = 1;
    ring->into = into != NULL;
    return DT_SUCCESS;
}

dt_status dt_ring_start(dt_ring *ring) {
    if (!ring) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_ring_start: ring is NULL");
    const void *cur = ring->buf[ring->cur];
    return ring_post(ring, "dt_ring_start", &cur, NULL, &ring->bytes, 1, 0);
}

dt_status dt_ring_start_from(dt_ring *ring, const void *const *parts, const size_t *sizes,
                             int n_parts) {
    if (!ring) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_ring_start_from: ring is NULL");
    int rank = dt_comm_world_rank(ring->comm);
    if (n_parts < 1 || n_parts > DT_RING_MAX_PARTS || !parts || !sizes)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: dt_ring_start_from: %d parts (1 to %d, "
                        "parts and sizes not NULL)", rank, n_parts, DT_RING_MAX_PARTS);
    size_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        if (!parts[i] && sizes[i])
            return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: dt_ring_start_from: part %d is NULL",
                            rank, i);
        if (sizes[i] > ring->bytes - total)   /* more than the block, and no wrap-around */
            return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: dt_ring_start_from: parts 0 to %d "
                            "hold more than the ring's blocks of %zu bytes", rank, i, ring->bytes);
        total += sizes[i];
    }
    if (total != ring->bytes)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: dt_ring_start_from: the parts hold %zu "
                        "bytes, the ring's blocks %zu", rank, total, ring->bytes);
    return ring_post(ring, "dt_ring_start_from", parts, NULL, sizes, n_parts, 0);
}

dt_status dt_ring_start_into(dt_ring *ring, const void *const *parts, void *const *into,
                             const size_t *sizes, int n_parts, int chained) {
    if (!ring) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_ring_start_into: ring is NULL");
    int rank = dt_comm_world_rank(ring->comm);
    if (n_parts < 1 || n_parts > ring->max_parts || !parts || !into || !sizes)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: dt_ring_start_into: %d parts (1 to %d, "
                        "dt_ring_reserve; parts, into and sizes not NULL)", rank, n_parts,
                        ring->max_parts);
    for (int i = 0; i < n_parts; i++)
        if ((!parts[i] || !into[i]) && sizes[i])
            return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: dt_ring_start_into: part %d is NULL "
                            "on the %s side", rank, i, parts[i] ? "receiving" : "sending");
    return ring_post(ring, "dt_ring_start_into", parts, into, sizes, n_parts, chained);
}

dt_status dt_ring_wait(dt_ring *ring) {
    if (!ring) return dt_error(DT_ERR_INVALID_ARGUMENT, "dt_ring_wait: ring is NULL");
    if (!ring->in_flight)
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: dt_ring_wait: no step was started",
                        dt_comm_world_rank(ring->comm));
    ring->in_flight = 0;
    DT_TRY(dt_comm_p2p_wait(ring->comm));
    if (!ring->into) ring->cur = 1 - ring->cur;
    ring->step++;
    return DT_SUCCESS;
}

dt_status dt_ring_step(dt_ring *ring) {
    DT_TRY(dt_ring_start(ring));
    return dt_ring_wait(ring);
}
