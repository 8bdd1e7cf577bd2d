/* dtensor/check.c — the entry check of collective ops (context.h): every
 * rank shows the others whether its arguments are valid and what it is about
 * to call, before any data moves; and the bookkeeping of failures at the
 * public boundary (context_internal.h). */
#include "context_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    return dt_comm_check_call(ctx->comm, op, local, values, names, n);
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
