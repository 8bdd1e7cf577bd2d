/* collectives/ring.h — the ring rotator.
 *
 * A dt_ring owns two buffers of `bytes` bytes each, allocated once at
 * creation. The "current" buffer holds the block the caller computes on. A
 * step posts, in one group, a send of the current buffer to the next rank and
 * a receive of the next block into the other buffer; dt_ring_wait completes
 * the step and swaps the buffers. Between dt_ring_start and dt_ring_wait the
 * caller may read the current buffer (compute overlaps the transfer) but must
 * not write it. Nothing is allocated per step.
 *
 * Direction DT_RING_FORWARD sends to rank+1 and receives from rank-1, so at
 * step t (t = 0 before any transfer) rank j holds the block that rank
 * (j - t) mod P filled in at step 0; DT_RING_BACKWARD sends to rank-1, and
 * rank j holds the block of rank (j + t) mod P. After P-1 steps every rank
 * has seen every block exactly once; one more step brings each block home.
 *
 * Buffers live where the communicator's backend keeps data (host memory on
 * the CPU backend).
 *
 * Test: tests/test_ring.c (make test).
 */
#ifndef DT_RING_H
#define DT_RING_H

#include <stddef.h>
#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_ring dt_ring;

typedef enum dt_ring_direction {
    DT_RING_FORWARD = 0,   /* send to rank+1, receive from rank-1 */
    DT_RING_BACKWARD,      /* send to rank-1, receive from rank+1 */
    DT_RING_DIRECTION_COUNT
} dt_ring_direction;

const char *dt_ring_direction_name(dt_ring_direction direction);

/* COLLECTIVE over comm: every rank passes the same bytes and direction
 * (checked). The ring borrows comm (it must outlive the ring). */
dt_status dt_ring_create(dt_comm *comm, size_t bytes, dt_ring_direction direction,
                         dt_ring **out);
/* COLLECTIVE. The same over caller-owned memory: `buffers` holds 2*bytes
 * (where the backend keeps data) and must outlive the ring. For callers that
 * preallocate a workspace once and run many calls. */
dt_status dt_ring_create_in(dt_comm *comm, size_t bytes, dt_ring_direction direction,
                            void *buffers, dt_ring **out);
/* NOT collective. dt_ring_create_in without the agreement check, for a
 * caller whose ranks have just agreed on everything bytes and direction
 * follow from, in a check of their own (dt_attention_forward checks its
 * whole call once): one rendezvous of the ranks less per call. Ranks that
 * disagree anyway hang or fail at the first step. */
dt_status dt_ring_create_in_agreed(dt_comm *comm, size_t bytes, dt_ring_direction direction,
                                   void *buffers, dt_ring **out);
/* Accepts NULL. */
void dt_ring_destroy(dt_ring *ring);

/* The current block (bytes long); owned by the ring. Valid until the next
 * dt_ring_wait, which swaps buffers. */
void *dt_ring_current(dt_ring *ring);
size_t dt_ring_bytes(const dt_ring *ring);
/* Number of completed steps since creation. */
long dt_ring_step_index(const dt_ring *ring);
/* The rank (in comm) whose step-0 block is current. */
int dt_ring_source(const dt_ring *ring);

/* COLLECTIVE. Post the transfer of the current block (non-blocking). */
dt_status dt_ring_start(dt_ring *ring);

/* The most parts dt_ring_start_from takes. */
#define DT_RING_MAX_PARTS 4

/* COLLECTIVE. dt_ring_start, but the block sent is the concatenation of
 * parts[0 .. n_parts) (sizes[i] bytes each, summing to the ring's bytes),
 * read where they are, instead of the current buffer: a caller's first step
 * sends its data without first copying it into the ring (the attention
 * passes send K and V straight from their tensors). The block lands packed
 * in the other buffer as any step's, and the current buffer is neither read
 * nor written. Each part travels as its own message, so every rank must
 * pass the same sizes at the same step; the parts must stay unwritten until
 * dt_ring_wait. */
dt_status dt_ring_start_from(dt_ring *ring, const void *const *parts, const size_t *sizes,
                             int n_parts);
/* The most parts dt_ring_reserve takes. */
#define DT_RING_RESERVE_MAX 65536

/* Make room for steps of up to max_parts parts (dt_ring_start_into; a ring
 * takes DT_RING_MAX_PARTS from its creation). It may allocate: call it
 * before the loop. Not collective. */
dt_status dt_ring_reserve(dt_ring *ring, int max_parts);

/* COLLECTIVE. A step over the caller's memory on both sides: parts[i]
 * (sizes[i] bytes) go to the next rank, and the previous rank's parts land
 * in into[i]; the ring's buffers are neither read nor written and
 * dt_ring_wait does not swap them (a ring made with 0 bytes has none). For
 * a caller that places each block where its computation wants it (the
 * attention forward's grouped steps: several blocks side by side, one
 * launch over them), its pieces scattered (every rank must pass the same
 * sizes at the same step). chained: the step is ordered after the ring's
 * earlier steps only, not after the device work queued since
 * (dt_comm_p2p_start_chained, whose guarantee the caller gives): the
 * second and later steps a ring runs ahead of a kernel. Parts and into must
 * stay untouched until dt_ring_wait. */
dt_status dt_ring_start_into(dt_ring *ring, const void *const *parts, void *const *into,
                             const size_t *sizes, int n_parts, int chained);

/* Complete the posted transfer (bounded by the timeout) and swap buffers
 * (not after a dt_ring_start_into step). */
dt_status dt_ring_wait(dt_ring *ring);
/* dt_ring_start then dt_ring_wait. */
dt_status dt_ring_step(dt_ring *ring);

#ifdef __cplusplus
}
#endif
#endif /* DT_RING_H */
