/* dtensor/check.c — the entry check of collective ops (context.h): every
 * rank shows the others whether its arguments are valid and what it is about
 * to call, before any data moves; and the bookkeeping of failures at the
 * public boundary (context_internal.h). */
#include "context_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DT_CHECK_MAX_VALUES 64

dt_status dt_context_check_call(dt_context *ctx, const char *op, dt_status local,
                                const int64_t *values, const char *const *names, int n,
                                dt_check_mode mode) {
    /* A rank whose call has no tensor (NULL) has no context of its own
     * there: it still shows its peers that its arguments were bad, through
     * its thread's, so that they fail at once instead of at the timeout. */
    if (!ctx) ctx = dt_context_current();
    if (!ctx) return local;
    int on = mode == DT_CHECK_ON || (mode == DT_CHECK_AUTO && ctx->check);
    if (!on) return local;
    if (n < 0 || n + 1 > DT_CHECK_MAX_VALUES || (n > 0 && (!values || !names)))
        return dt_error(DT_ERR_INVALID_ARGUMENT, "rank %d: %s: bad check table (%d values)",
                        ctx->rank, op, n);
    int64_t v[DT_CHECK_MAX_VALUES];
    const char *nm[DT_CHECK_MAX_VALUES];
    v[0] = local == DT_SUCCESS;
    nm[0] = "valid arguments (1) or not (0)";
    for (int i = 0; i < n; i++) {
        /* A rank with bad arguments may not know its values: do not compare them. */
        v[i + 1] = local == DT_SUCCESS ? values[i] : 0;
        nm[i + 1] = names[i];
    }
    if (local != DT_SUCCESS) {
        char msg[1024];
        dt_error_save_(msg, sizeof msg);
        (void)dt_comm_check_agreement(ctx->comm, op, v, nm, n + 1);
        dt_error_restore_(msg);
        return local;
    }
    return dt_comm_check_agreement(ctx->comm, op, v, nm, n + 1);
}

dt_status dt_context_note_failure(dt_context *ctx, dt_status st) {
    ctx->last_status = st;
    const char *msg = dt_last_error();
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "rank %d", ctx->rank);
    /* Messages from lower layers may already name the rank. */
    if (strncmp(msg, prefix, (size_t)n) != 0 && strncmp(msg, "rank ", 5) != 0) {
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", msg);
        dt_error(st, "%s: %s", prefix, keep);
    }
    return st;
}
