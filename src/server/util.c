#include "server/server_int.h"
#include "core/clock.h"
#include "core/alloc.h"
#include "core/utf8.h"

#include <cjson/cJSON.h>
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

double srv_now(void) { return fl_clock_s(); }

/* The JSON of o onto b (as an SSE event when sse), made well-formed UTF-8: generated text can
 * hold any bytes (byte-fallback tokens), and every ill-formed byte becomes U+FFFD. */
fl_status srv_append_json(srv_buf *b, cJSON *o, bool sse) {
    char *t = cJSON_PrintUnformatted(o);
    if (!t) return FL_ERR_NOMEM;
    size_t n = strlen(t);
    const size_t ubytes = 3 * n + 1;
    char *u = NULL;
    if (!fl_utf8_is_valid(t, n)) {
        if (!(u = fl_alloc(FL_MEM_NET, ubytes, 16))) {
            cJSON_free(t);
            return FL_ERR_NOMEM;
        }
        n = fl_utf8_sanitize(t, n, u);
        u[n] = 0;
    }
    const char *j = u ? u : t;
    fl_status st = sse ? srv_buf_append(b, "data: ", 6) : FL_OK;
    if (st == FL_OK) st = srv_buf_append(b, j, n);
    if (st == FL_OK && sse) st = srv_buf_append(b, "\n\n", 2);
    if (u) fl_free(FL_MEM_NET, u, ubytes);
    cJSON_free(t);
    return st;
}
