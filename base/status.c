/* base/status.c — status names and the thread-local last-error message,
 * the one piece of thread-local state in the library. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DT_ERROR_MSG_SIZE 1024

static _Thread_local char dt_error_msg[DT_ERROR_MSG_SIZE];

const char *dt_status_name(dt_status status) {
    static const char *const names[DT_STATUS_COUNT] = {
        "DT_SUCCESS",        "DT_ERR_INVALID_ARGUMENT", "DT_ERR_NOT_SUPPORTED",
        "DT_ERR_OUT_OF_MEMORY", "DT_ERR_TIMEOUT",       "DT_ERR_PEER_FAILED",
        "DT_ERR_MISMATCH",   "DT_ERR_BACKEND",          "DT_ERR_SYSTEM",
        "DT_ERR_INTERNAL",   "DT_ERR_NONFINITE",        "DT_ERR_OUT_OF_RANGE",
    };
    if ((int)status < 0 || status >= DT_STATUS_COUNT) return "DT_STATUS_UNKNOWN";
    return names[status];
}

const char *dt_last_error(void) { return dt_error_msg; }

dt_status dt_error(dt_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dt_error_msg, sizeof dt_error_msg, fmt, ap);
    va_end(ap);
    return status;
}

void dt_clear_error(void) { dt_error_msg[0] = '\0'; }

void dt_error_save_(char *buf, unsigned long size) {
    if (size == 0) return;
    snprintf(buf, size, "%s", dt_error_msg);
}

void dt_error_restore_(const char *buf) {
    snprintf(dt_error_msg, sizeof dt_error_msg, "%s", buf);
}
