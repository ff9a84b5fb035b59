#include "server/server_int.h"
#include "core/alloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

fl_status srv_buf_append(srv_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = fl_realloc(b->misc ? FL_MEM_MISC : FL_MEM_NET, b->p, b->cap, cap, 16);
        if (!p) return FL_ERR_NOMEM;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return FL_OK;
}

fl_status srv_buf_printf(srv_buf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return FL_ERR_INVALID;
    if ((size_t)n < sizeof tmp) return srv_buf_append(b, tmp, (size_t)n);
    /* long output: format again into the buffer itself */
    srv_buf_append(b, "", 0);
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *p = fl_realloc(b->misc ? FL_MEM_MISC : FL_MEM_NET, b->p, b->cap, cap, 16);
        if (!p) return FL_ERR_NOMEM;
        b->p = p;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return FL_OK;
}

void srv_buf_free(srv_buf *b) {
    const bool misc = b->misc;
    fl_free(misc ? FL_MEM_MISC : FL_MEM_NET, b->p, b->cap);
    memset(b, 0, sizeof *b);
    b->misc = misc;
}

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
