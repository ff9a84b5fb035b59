#include "core/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char tl_error[1024];

const char *fl_status_str(fl_status st) {
    switch (st) {
    case FL_OK: return "ok";
    case FL_NO_KV_SPACE: return "no KV space";
    case FL_ERR_INVALID: return "invalid argument";
    case FL_ERR_IO: return "I/O error";
    case FL_ERR_NOMEM: return "out of memory";
    case FL_ERR_BUDGET: return "memory budget exceeded";
    case FL_ERR_FORMAT: return "malformed input";
    case FL_ERR_UNSUPPORTED: return "unsupported";
    case FL_ERR_RANGE: return "out of range";
    case FL_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *fl_last_error(void) { return tl_error; }

void fl_clear_error(void) { tl_error[0] = '\0'; }

fl_status fl_set_error(fl_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_error, sizeof tl_error, fmt, ap);
    va_end(ap);
    return st;
}

void fl_add_error_context(const char *fmt, ...) {
    char prefix[512], old[sizeof tl_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tl_error, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof tl_error - 3) n = sizeof tl_error - 3;
    memcpy(tl_error, prefix, n);
    memcpy(tl_error + n, ": ", 2);
    size_t m = strlen(old);
    if (m > sizeof tl_error - n - 3) m = sizeof tl_error - n - 3;
    memcpy(tl_error + n + 2, old, m);
    tl_error[n + 2 + m] = 0;
}

void fl_abort(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "fitllm: fatal: %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}
