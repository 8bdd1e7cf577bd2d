/* collectives/ring.h — the ring rotator.
 *
 * A dt_ring owns two buffers of `bytes` bytes (backend memory), allocated once.
 * A step sends the current buffer to the next rank and receives into the other;
 * dt_ring_wait completes it and swaps. Between start and wait the caller may
 * read the current buffer (compute overlaps transfer) but not write it.
 * FORWARD: at step t rank j holds the block rank (j - t) mod P filled at step 0;
 * BACKWARD: (j + t) mod P. After P-1 steps each rank has seen every block once.
 * Test: tests/test_ring.c.
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
/* NOT collective. dt_ring_create_in without the agreement check, for callers
 * that already checked what bytes and direction follow from (the attention
 * calls); ranks that disagree hang or fail at the first step. */
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

/* COLLECTIVE. dt_ring_start sending parts[0..n_parts) (sizes[i] bytes, summing
 * to bytes) from where they are, not the current buffer (a first step without a
 * copy); they land packed in the other buffer. Every rank passes the same sizes;
 * parts stay unwritten until dt_ring_wait. */
dt_status dt_ring_start_from(dt_ring *ring, const void *const *parts, const size_t *sizes,
                             int n_parts);
/* The most parts dt_ring_reserve takes. */
#define DT_RING_RESERVE_MAX 65536

/* Not collective. Room for dt_ring_start_into steps of up to max_parts parts
 * (DT_RING_MAX_PARTS from creation). May allocate: call it before the loop. */
dt_status dt_ring_reserve(dt_ring *ring, int max_parts);

/* COLLECTIVE. A step over caller memory: parts[i] (sizes[i] bytes, the same on
 * every rank) go to the next rank, the previous rank's land in into[i]; the
 * ring's buffers are untouched and not swapped. chained: ordered after earlier
 * ring steps only (dt_comm_p2p_start_chained's contract). Untouched until wait. */
dt_status dt_ring_start_into(dt_ring *ring, const void *const *parts, void *const *into,
                             const size_t *sizes, int n_parts, int chained);

/* Complete the posted step (dt_comm_p2p_wait; bounded by the timeout) and swap
 * buffers (not after dt_ring_start_into). */
dt_status dt_ring_wait(dt_ring *ring);
/* dt_ring_start then dt_ring_wait. */
dt_status dt_ring_step(dt_ring *ring);

#ifdef __cplusplus
}
#endif
#endif /* DT_RING_H */
