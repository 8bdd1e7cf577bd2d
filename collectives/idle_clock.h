/* collectives/idle_clock.h — PRIVATE. The clock that bounds teardown waits
 * of the NCCL transport (transport_nccl.c) when ranks are threads of one
 * process.
 *
 * Destroying an NCCL communicator waits for its peers, which arrive only when
 * their own functions reach teardown: a rank that finishes first is early, not
 * waiting for a failed peer. So a teardown wait counts toward DT_TIMEOUT_MS
 * only while every rank of the process is in a teardown (or done). It stays
 * bounded: a running rank reaches teardown, or fails (aborting the world ends
 * every wait), or never returns, and then dt_launch could not return anyway.
 * With one rank per process the clock runs from arrival, as any wait.
 *
 * Pure bookkeeping: the caller holds the lock and passes the time
 * (milliseconds of a monotonic clock). Test: tests/test_collectives.c
 * (idle_clock).
 */
#ifndef DT_IDLE_CLOCK_H
#define DT_IDLE_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_idle_clock {
    int busy;               /* ranks of this process running, not waiting in a teardown */
    int64_t idle_since_ms;  /* when busy last dropped to 0 */
} dt_idle_clock;

/* `ranks` ranks of this process, all running. */
void dt_idle_clock_init(dt_idle_clock *k, int ranks);

/* A rank starts waiting in a teardown at now_ms. */
void dt_idle_clock_enter(dt_idle_clock *k, int64_t now_ms);

/* A rank's teardown wait ended and it goes back to its function (the
 * teardown of a sub-communicator). A rank's last teardown does not leave. */
void dt_idle_clock_leave(dt_idle_clock *k);

/* How much of a teardown wait that began at start_ms counts toward the
 * timeout at now_ms: 0 while a rank is busy, else the time since both the
 * wait began and the last rank became idle (never more than now - start). */
int64_t dt_idle_clock_waited(const dt_idle_clock *k, int64_t start_ms, int64_t now_ms);

#ifdef __cplusplus
}
#endif
#endif /* DT_IDLE_CLOCK_H */
