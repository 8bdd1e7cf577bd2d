/* dtensor/docs.c — document lengths to per-token bounds (docs.h). */
#include "docs.h"

dt_status dt_docs_check(const char *op, const int64_t *lens, int64_t count, int64_t B, int64_t S,
                        int *per_row) {
    if (per_row) *per_row = 0;
    if (!lens || count == 0) {
        DT_REQUIRE(!lens && count == 0, "%s: documents: lens %p with count %lld (both or neither)",
                   op, (const void *)lens, (long long)count);
        return DT_SUCCESS;
    }
    DT_REQUIRE(count > 0, "%s: documents: count %lld < 0", op, (long long)count);
    int64_t sum = 0;
    for (int64_t i = 0; i < count; i++) {
        DT_REQUIRE(lens[i] >= 1 && lens[i] <= S, "%s: document %lld has length %lld (1 to S = %lld)",
                   op, (long long)i, (long long)lens[i], (long long)S);
        if (sum / S != (sum + lens[i] - 1) / S)
            return dt_error(DT_ERR_INVALID_ARGUMENT, "%s: document %lld (tokens %lld to %lld of "
                            "the packed rows) crosses the end of batch row %lld (S = %lld)", op,
                            (long long)i, (long long)sum, (long long)(sum + lens[i] - 1),
                            (long long)(sum / S), (long long)S);
        sum += lens[i];
    }
    DT_REQUIRE(sum == S || sum == B * S, "%s: document lengths sum to %lld, not S = %lld (one list "
               "for every row) or B x S = %lld (a list per row)", op, (long long)sum, (long long)S,
               (long long)(B * S));
    if (per_row) *per_row = sum == B * S && B > 1;
    return DT_SUCCESS;
}

void dt_docs_bounds(const int64_t *lens, int64_t count, int64_t S, int64_t row, int64_t *bounds) {
    int64_t i = 0, at = 0;   /* document i starts at token `at` of the packed rows */
    if (lens) {
        int64_t total = 0;
        for (int64_t j = 0; j < count; j++) total += lens[j];
        const int64_t from = total > S ? row * S : 0;   /* this row's first token */
        while (i < count && at < from) at += lens[i++];
        at -= from;
    }
    for (int64_t p = 0; p < S;) {
        const int64_t end = lens && i < count ? at + lens[i++] : S;
        for (; p < end && p < S; p++) {
            bounds[2 * p] = at;
            bounds[2 * p + 1] = end;
        }
        at = end;
    }
}
