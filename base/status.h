/* base/status.h — status codes, the thread-local last-error message, and
 * the one family of check macros used by every layer.
 *
 * Every public function returns a dt_status. On failure it also sets a
 * thread-local message (dt_last_error()) that names the rank, the op and the
 * offending values. The message belongs to the library; copy it if you need
 * it past the next failing call on the same thread.
 */
#ifndef DT_STATUS_H
#define DT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_status {
    DT_SUCCESS = 0,
    DT_ERR_INVALID_ARGUMENT, /* a bad value: NULL handle, dim out of range, shape mismatch */
    DT_ERR_NOT_SUPPORTED,    /* valid but not implemented for this backend/layout/dtype */
    DT_ERR_OUT_OF_MEMORY,    /* host or device allocation failed */
    DT_ERR_TIMEOUT,          /* a bounded wait ran out (DT_TIMEOUT_MS) */
    DT_ERR_PEER_FAILED,      /* another rank failed or aborted; this rank stopped waiting */
    DT_ERR_MISMATCH,         /* ranks disagree: different collectives, sizes, dtypes */
    DT_ERR_BACKEND,          /* CUDA / cuBLAS / NCCL / MPI / BLAS returned an error */
    DT_ERR_SYSTEM,           /* the OS refused: thread creation, clocks */
    DT_ERR_INTERNAL,         /* a bug in dtensor: please report it */
    DT_ERR_NONFINITE,        /* DT_CHECK: a tensor or buffer holds NaN or Inf (named, with an index) */
    DT_ERR_OUT_OF_RANGE,     /* finite inputs whose result would leave fp32's range (it says which) */
    DT_STATUS_COUNT
} dt_status;

/* "DT_ERR_TIMEOUT" etc.; "DT_STATUS_UNKNOWN" for values out of range. */
const char *dt_status_name(dt_status status);

/* The message of the last failure on this thread ("" if none yet). */
const char *dt_last_error(void);

/* Set the thread-local message (printf format) and return `status`.
 * Used by library code and by users writing their own ops. */
dt_status dt_error(dt_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Clear the thread-local message. */
void dt_clear_error(void);

/* Check macros.
 *   DT_TRY(expr)              return the status of expr if it failed.
 *   DT_TRY_GOTO(st, expr, l)  st = expr; on failure jump to label l (single exit).
 *   DT_REQUIRE(cond, ...)     if !cond, return dt_error(DT_ERR_INVALID_ARGUMENT, ...).
 *   DT_KEEP_FIRST(st, expr)   during teardown: run expr, keep the first failure in st,
 *                             and leave the message of that first failure in place. */
#define DT_TRY(expr)                                                     \
    do {                                                                 \
        dt_status dt_try_status_ = (expr);                               \
        if (dt_try_status_ != DT_SUCCESS) return dt_try_status_;         \
    } while (0)

#define DT_TRY_GOTO(st, expr, label)                                     \
    do {                                                                 \
        (st) = (expr);                                                   \
        if ((st) != DT_SUCCESS) goto label;                              \
    } while (0)

#define DT_REQUIRE(cond, ...)                                            \
    do {                                                                 \
        if (!(cond)) return dt_error(DT_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
    } while (0)

#define DT_KEEP_FIRST(st, expr)                                          \
    do {                                                                 \
        if ((st) == DT_SUCCESS) {                                        \
            (st) = (expr);                                               \
        } else {                                                         \
            char dt_keep_msg_[1024];                                     \
            dt_error_save_(dt_keep_msg_, sizeof dt_keep_msg_);           \
            (void)(expr);                                                \
            dt_error_restore_(dt_keep_msg_);                             \
        }                                                                \
    } while (0)

/* Helpers for DT_KEEP_FIRST; not for direct use. */
void dt_error_save_(char *buf, unsigned long size);
void dt_error_restore_(const char *buf);

#ifdef __cplusplus
}
#endif
#endif /* DT_STATUS_H */
