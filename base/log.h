/* base/log.h — rank-prefixed logging to stderr.
 *
 * The level comes from the environment variable DT_LOG (error, warn, info,
 * debug; default warn), read when a context or communicator is created and
 * stored in it: there is no global logging state. Every line starts with
 * "[dtensor rank R] LEVEL: ".
 */
#ifndef DT_LOG_H
#define DT_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_log_level {
    DT_LOG_ERROR = 0,
    DT_LOG_WARN,
    DT_LOG_INFO,
    DT_LOG_DEBUG,
    DT_LOG_LEVEL_COUNT
} dt_log_level;

const char *dt_log_level_name(dt_log_level level);

/* Parse DT_LOG from the environment (default DT_LOG_WARN; unknown values
 * give DT_LOG_WARN and a warning on stderr). */
dt_log_level dt_log_level_from_env(void);

/* Write one line if level <= threshold. rank < 0 prints no rank. */
void dt_log_write(dt_log_level threshold, int rank, dt_log_level level,
                  const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif /* DT_LOG_H */
