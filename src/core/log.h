/*
 * log.h - leveled logging routed to a settable callback (stderr by default).
 * FL_LOG_ERROR/WARN/INFO/DEBUG(fmt, ...) are printf-checked.  The level comes from
 * fl_log_set_level() or the FITLLM_LOG environment variable (error|warn|info|debug).
 * No logging inside kernels or per-token loops: count and report per step instead.
 * Thread safety: the callback may be called from any thread; the default one is line-atomic.
 */
#ifndef FL_LOG_H
#define FL_LOG_H

#include "core/status.h"

typedef enum fl_log_level { FL_LOG_LEVEL_ERROR = 0, FL_LOG_LEVEL_WARN, FL_LOG_LEVEL_INFO, FL_LOG_LEVEL_DEBUG } fl_log_level;
typedef void (*fl_log_fn)(fl_log_level level, const char *msg, void *ud);

void fl_log_set_level(fl_log_level level);
fl_log_level fl_log_get_level(void);
void fl_log_set_callback(fl_log_fn fn, void *ud); /* NULL restores the stderr default */
void fl_log(fl_log_level level, const char *fmt, ...) FL_PRINTF(2, 3);

#define FL_LOG_ERROR(...) fl_log(FL_LOG_LEVEL_ERROR, __VA_ARGS__)
#define FL_LOG_WARN(...) fl_log(FL_LOG_LEVEL_WARN, __VA_ARGS__)
#define FL_LOG_INFO(...) fl_log(FL_LOG_LEVEL_INFO, __VA_ARGS__)
#define FL_LOG_DEBUG(...) fl_log(FL_LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
