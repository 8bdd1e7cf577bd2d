/* dtensor/docs.h — packed documents: where each token's document starts and
 * ends, from the documents' lengths, as attention and rotary take them.
 *
 * A batch of B rows of S tokens packs documents given by their lengths in
 * sequence order (host array `lens` of `count` entries, each >= 1):
 *   - summing to S: one list, the same documents in every row;
 *   - summing to B x S: row 0's documents, then row 1's, ...; the lengths
 *     must meet every row boundary (each row's sum to S, no document
 *     crosses rows).
 * lens NULL with count 0: one document per row (no documents given).
 *
 * Pure functions; nothing is kept. Test: tests/test_attention.c (make test).
 */
#ifndef DT_DOCS_H
#define DT_DOCS_H

#include <stddef.h>
#include <stdint.h>
#include "../base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Local. DT_SUCCESS if lens / count describe B rows of S tokens as above,
 * with *per_row (may be NULL) 1 for one list per row, 0 for one list for all
 * (or none); else DT_ERR_INVALID_ARGUMENT naming op, the first length < 1,
 * the sum, or the row boundary a document crosses. */
dt_status dt_docs_check(const char *op, const int64_t *lens, int64_t count, int64_t B, int64_t S,
                        int *per_row);

/* Fill bounds[2p], bounds[2p + 1] (p < S) with the start and end (exclusive)
 * of the document that holds token p of batch row `row` (any row when the
 * list is one for all; ignored with no documents: [0, S)). lens must have
 * passed dt_docs_check for some B > row. bounds: caller-owned, 2 S entries. */
void dt_docs_bounds(const int64_t *lens, int64_t count, int64_t S, int64_t row, int64_t *bounds);

#ifdef __cplusplus
}
#endif
#endif /* DT_DOCS_H */
