/* collectives/failure.c — see failure.h. */
#include "failure.h"

#include <stdio.h>

int dt_failure_record(dt_failure *f, int rank, dt_status status, const char *msg) {
    if (f->set) return 0;
    f->set = 1;
    f->status = status;
    f->rank = rank;
    snprintf(f->msg, sizeof f->msg, "%s", msg ? msg : "");
    return 1;
}

dt_status dt_failure_get(const dt_failure *f, int *rank, char *msg, size_t size) {
    if (rank) *rank = f->set ? f->rank : -1;
    if (msg && size) snprintf(msg, size, "%s", f->set ? f->msg : "");
    return f->set ? f->status : DT_SUCCESS;
}

dt_status dt_failure_error(const dt_failure *f, int rank, const char *what) {
    if (!f->set)
        return dt_error(DT_ERR_INTERNAL, "rank %d: %s stopped for a failure that was not recorded",
                        rank, what);
    if (f->rank == rank) return dt_error(f->status, "%s", f->msg);
    return dt_error(f->status == DT_ERR_MISMATCH ? DT_ERR_MISMATCH : DT_ERR_PEER_FAILED,
                    "rank %d: %s stopped: rank %d failed: %s", rank, what, f->rank, f->msg);
}
