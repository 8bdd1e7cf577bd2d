/* collectives/failure.h — PRIVATE. A world's first failure: the one record
 * that every transport (local, NCCL, MPI) keeps of it, and the error a rank
 * returns when it stops because of it.
 *
 * The rule (docs/RELIABILITY.md): the first failure of a world is kept. The
 * rank where it happened returns it; every other rank returns
 * DT_ERR_PEER_FAILED naming that rank and its message, except a mismatch:
 * DT_ERR_MISMATCH everywhere (a property of the program, not of one rank).
 *
 * Pure bookkeeping: the caller holds its world's lock (or has the world to
 * itself). Test: tests/test_collectives.c (failure_record).
 */
#ifndef DT_FAILURE_H
#define DT_FAILURE_H

#include <stddef.h>

#include "../base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_failure {
    int set;         /* a failure is recorded */
    dt_status status;
    int rank;        /* the world rank it happened on */
    char msg[1024];  /* its message, cut to fit */
} dt_failure;

/* Records the failure unless one is recorded already; 1 if this was the
 * first. A NULL msg records "". */
int dt_failure_record(dt_failure *f, int rank, dt_status status, const char *msg);

/* The recorded failure's status (DT_SUCCESS if none), and where rank and
 * msg are not NULL its rank (-1 if none) and message ("" if none). */
dt_status dt_failure_get(const dt_failure *f, int *rank, char *msg, size_t size);

/* The error rank `rank` returns when `what` stops because of the recorded
 * failure (the rule above); sets the thread's message (dt_error).
 * DT_ERR_INTERNAL if none is recorded. */
dt_status dt_failure_error(const dt_failure *f, int rank, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* DT_FAILURE_H */
