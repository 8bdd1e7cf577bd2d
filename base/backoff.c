/* base/backoff.c — see backoff.h. */
#include "backoff.h"

#include <sched.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

void dt_backoff(unsigned spin, unsigned spins, long us) {
    if (spin < spins) {
        sched_yield();
        return;
    }
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
#ifdef __linux__
    const int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    nanosleep(&ts, NULL);
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
#else
    nanosleep(&ts, NULL);
#endif
}
