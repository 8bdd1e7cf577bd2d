/* base/backoff.h — PRIVATE. How bounded waits poll (the CUDA backend's
 * device waits, the NCCL transport; MPI keeps longer sleeps so that ranks
 * sharing cores under --oversubscribe let each other run).
 * Test: tests/test_collectives.c (backoff).
 */
#ifndef DT_BACKOFF_H
#define DT_BACKOFF_H

#ifdef __cplusplus
extern "C" {
#endif

/* Call between two polls (spin: polls so far). The first `spins` polls yield
 * the core; later ones sleep `us` microseconds with the timer slack lowered to
 * 1 us (Linux stretches a sleep by the slack, 50 us by default). */
void dt_backoff(unsigned spin, unsigned spins, long us);

#ifdef __cplusplus
}
#endif
#endif /* DT_BACKOFF_H */
