/* collectives/idle_clock.c — see idle_clock.h. */
#include "idle_clock.h"

void dt_idle_clock_init(dt_idle_clock *k, int ranks) {
    k->busy = ranks > 0 ? ranks : 0;
    k->idle_since_ms = 0;
}

void dt_idle_clock_enter(dt_idle_clock *k, int64_t now_ms) {
    /* Never below 0: idle_since stays the moment the last rank arrived. */
    if (k->busy > 0 && --k->busy == 0) k->idle_since_ms = now_ms;
}

void dt_idle_clock_leave(dt_idle_clock *k) { k->busy++; }

int64_t dt_idle_clock_waited(const dt_idle_clock *k, int64_t start_ms, int64_t now_ms) {
    if (k->busy > 0) return 0;
    int64_t from = start_ms > k->idle_since_ms ? start_ms : k->idle_since_ms;
    return now_ms > from ? now_ms - from : 0;
}
