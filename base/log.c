/* base/log.c — rank-prefixed log lines on stderr. One fprintf per line so
 * lines of concurrent ranks do not interleave mid-line. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const dt_log_names[DT_LOG_LEVEL_COUNT] = {"error", "warn", "info", "debug"};

const char *dt_log_level_name(dt_log_level level) {
    if ((int)level < 0 || level >= DT_LOG_LEVEL_COUNT) return "unknown";
    return dt_log_names[level];
}

dt_log_level dt_log_level_from_env(void) {
    const char *v = getenv("DT_LOG");
    if (!v || !*v) return DT_LOG_WARN;
    for (int i = 0; i < DT_LOG_LEVEL_COUNT; i++)
        if (strcasecmp(v, dt_log_names[i]) == 0) return (dt_log_level)i;
    if (strcasecmp(v, "warning") == 0) return DT_LOG_WARN;
    fprintf(stderr, "[dtensor] warn: DT_LOG=%s is not one of error|warn|info|debug; using warn\n", v);
    return DT_LOG_WARN;
}

void dt_log_write(dt_log_level threshold, int rank, dt_log_level level, const char *fmt, ...) {
    if (level > threshold) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (rank >= 0)
        fprintf(stderr, "[dtensor rank %d] %s: %s\n", rank, dt_log_level_name(level), msg);
    else
        fprintf(stderr, "[dtensor] %s: %s\n", dt_log_level_name(level), msg);
}
