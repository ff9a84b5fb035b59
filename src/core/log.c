#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1; /* -1: not yet read from the environment */
static fl_log_fn g_fn;
static void *g_ud;

static int level_from_env(void) {
    const char *s = getenv("FITLLM_LOG");
    if (!s) return FL_LOG_LEVEL_WARN;
    if (!strcmp(s, "error")) return FL_LOG_LEVEL_ERROR;
    if (!strcmp(s, "info")) return FL_LOG_LEVEL_INFO;
    if (!strcmp(s, "debug")) return FL_LOG_LEVEL_DEBUG;
    return FL_LOG_LEVEL_WARN;
}

void fl_log_set_level(fl_log_level level) { g_level = (int)level; }

fl_log_level fl_log_get_level(void) {
    if (g_level < 0) g_level = level_from_env();
    return (fl_log_level)g_level;
}

void fl_log_set_callback(fl_log_fn fn, void *ud) {
    g_fn = fn;
    g_ud = ud;
}

void fl_log(fl_log_level level, const char *fmt, ...) {
    if ((int)level > (int)fl_log_get_level()) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_fn) {
        g_fn(level, msg, g_ud);
        return;
    }
    fprintf(stderr, "fitllm %s: %s\n", names[level], msg);
}
