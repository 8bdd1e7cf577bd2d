/* base/backoff.h — PRIVATE. How the library's bounded waits poll: the
 * CUDA backend's waits for the device (backend_cuda.cu's poll_until) and
 * the NCCL transport's (transport_nccl.c; it slept 50 us a poll before).
 * The MPI transport keeps its own longer sleeps (processes that share
 * cores under mpirun --oversubscribe must let each other run).
 *
 * dt_backoff(spin, spins, us), called between two polls of a wait (spin:
 * the polls so far): the first `spins` polls yield the core (a short wait
 * ends within a yield of its end); later ones sleep `us` microseconds with
 * the thread's timer slack lowered to 1 us for the sleep, and put back
 * after it. Why: Linux stretches a sleep by the thread's slack, 50 us by
 * default, so a 20 us sleep took about 70 us, and a wait whose work had
 * ended woke up as late: on this project's 2-core VM under load,
 * nanosleep(20 us) took 98 us on average, 48 us with a 1 us slack
 * (2026-11-27). Where the device waits for the host that waits for it
 * (the end of a backward call on the local transport, the agreement
 * check behind a last hop on NCCL), that lateness is device idle time.
 * Elsewhere (no prctl) a plain sleep.
 *
 * Test: tests/test_collectives.c (backoff).
 */
#ifndef DT_BACKOFF_H
#define DT_BACKOFF_H

#ifdef __cplusplus
extern "C" {
#endif

void dt_backoff(unsigned spin, unsigned spins, long us);

#ifdef __cplusplus
}
#endif
#endif /* DT_BACKOFF_H */
