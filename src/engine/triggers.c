/* triggers.c - a lazy grammar's triggers (triggers.h). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/triggers.h"
#include "core/alloc.h"
#include "core/status.h"

#include <pcre2.h>
#include <string.h>

typedef struct trigger {
    int32_t type, token;
    char *value;        /* (GUIDE) the word or pattern */
    size_t len;
    pcre2_code *code;   /* patterns */
} trigger;

struct fl_triggers {
    pcre2_general_context *gctx;
    pcre2_match_data *md;
    int32_t n;
    trigger t[FL_MAX_TRIGGERS];
    enum { PH_START, PH_THINK, PH_ANSWER } phase; /* where the output is (after_think) */
    size_t scan, base; /* PH_THINK: </think> does not start before scan; PH_ANSWER: the answer's first byte */
};

void fl_triggers_free(fl_triggers *x) {
    if (!x) return;
    for (int32_t i = 0; i < x->n; i++) {
        if (x->t[i].code) pcre2_code_free(x->t[i].code);
        fl_free(FL_MEM_GUIDE, x->t[i].value, x->t[i].value ? x->t[i].len + 1 : 0);
    }
    if (x->md) pcre2_match_data_free(x->md);
    if (x->gctx) pcre2_general_context_free(x->gctx);
    fl_free(FL_MEM_GUIDE, x, sizeof *x);
}

fl_status fl_triggers_new(const fl_grammar_trigger *t, int32_t n, int32_t n_vocab, int32_t after_think, fl_triggers **out) {
    *out = NULL;
    if (n < 1 || n > FL_MAX_TRIGGERS || !t) return fl_set_error(FL_ERR_INVALID, "grammar triggers: %d (1..%d)", n, FL_MAX_TRIGGERS);
    if (after_think < 0 || after_think > 2) return fl_set_error(FL_ERR_INVALID, "grammar triggers: lazy_after_think %d (0..2)", after_think);
    fl_triggers *x = fl_calloc(FL_MEM_GUIDE, 1, sizeof *x);
    if (!x) return fl_set_error(FL_ERR_NOMEM, "grammar triggers: out of memory");
    x->phase = after_think == 0 ? PH_ANSWER : after_think == 2 ? PH_THINK : PH_START;
    fl_status st = FL_OK;
    pcre2_compile_context *cctx = NULL;
    if (!(x->gctx = pcre2_general_context_create(fl_mem_malloc_ctx, fl_mem_free_ctx, fl_mem_ctx(FL_MEM_GUIDE))) ||
        !(cctx = pcre2_compile_context_create(x->gctx)) || !(x->md = pcre2_match_data_create(2, x->gctx))) {
        st = fl_set_error(FL_ERR_NOMEM, "grammar triggers: out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) {
        trigger *y = &x->t[i];
        x->n = i + 1; /* (freed with the others should it fail) */
        y->type = t[i].type;
        y->token = t[i].token;
        if (y->type == FL_TRIGGER_TOKEN) {
            if (t[i].token < 0 || t[i].token >= n_vocab) {
                st = fl_set_error(FL_ERR_INVALID, "grammar trigger %d: token %d out of the vocabulary (%d)", i, t[i].token, n_vocab);
                goto done;
            }
            continue;
        }
        if (y->type != FL_TRIGGER_WORD && y->type != FL_TRIGGER_PATTERN && y->type != FL_TRIGGER_PATTERN_FULL) {
            st = fl_set_error(FL_ERR_INVALID, "grammar trigger %d: type %d (token 0, word 1, pattern 2, pattern_full 3)", i, y->type);
            goto done;
        }
        y->len = t[i].value ? strlen(t[i].value) : 0;
        if (y->len < 1 || y->len > FL_TRIGGER_MAX_BYTES) {
            st = fl_set_error(FL_ERR_INVALID, "grammar trigger %d: a %s of 1..%d bytes", i, y->type == FL_TRIGGER_WORD ? "word" : "pattern",
                              FL_TRIGGER_MAX_BYTES);
            goto done;
        }
        if (!(y->value = fl_alloc(FL_MEM_GUIDE, y->len + 1, 0))) {
            st = fl_set_error(FL_ERR_NOMEM, "grammar triggers: out of memory");
            goto done;
        }
        memcpy(y->value, t[i].value, y->len + 1);
        if (y->type == FL_TRIGGER_WORD) continue;
        int err = 0;
        PCRE2_SIZE off = 0;
        const uint32_t opt = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | PCRE2_NEVER_BACKSLASH_C | (y->type == FL_TRIGGER_PATTERN_FULL ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0);
        if (!(y->code = pcre2_compile((PCRE2_SPTR)y->value, y->len, opt, &err, &off, cctx))) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            st = err == PCRE2_ERROR_NOMEMORY || err == PCRE2_ERROR_HEAP_FAILED
                     ? fl_set_error(FL_ERR_NOMEM, "grammar triggers: out of memory")
                     : fl_set_error(FL_ERR_INVALID, "grammar trigger %d: pattern at offset %zu: %s", i, (size_t)off, (const char *)msg);
            goto done;
        }
    }
done:
    if (cctx) pcre2_compile_context_free(cctx);
    if (st) fl_triggers_free(x);
    else *out = x;
    return st;
}

/* The first occurrence of w[0, m) in s[from, n), or -1. */
static int64_t find_word(const char *s, size_t n, size_t from, const char *w, size_t m) {
    for (size_t i = from; i + m <= n; i++)
        if (s[i] == w[0] && !memcmp(s + i, w, m)) return (int64_t)i;
    return -1;
}

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

/* The answer's part of text[0, n) as text[x->base, n) once the reasoning is over (false before):
 * *last cut to the answer's bytes, all of them new where it starts in this token. */
static bool past_reasoning(fl_triggers *x, const char *text, size_t n, size_t *last) {
    if (x->phase == PH_START) {
        size_t i = 0;
        while (i < n && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r')) i++;
        const size_t m = n - i, lo = sizeof THINK_OPEN - 1;
        if (m < lo && !memcmp(text + i, THINK_OPEN, m)) return false; /* (spaces, or a part of <think>: not yet known) */
        if (m >= lo && !memcmp(text + i, THINK_OPEN, lo)) {
            x->phase = PH_THINK;
            x->scan = i + lo;
        } else {
            x->phase = PH_ANSWER;
            x->base = 0;
            *last = n;
        }
    }
    if (x->phase == PH_THINK) {
        const size_t lc = sizeof THINK_CLOSE - 1;
        const int64_t at = find_word(text, n, x->scan, THINK_CLOSE, lc);
        if (at < 0) {
            if (n >= lc && n - (lc - 1) > x->scan) x->scan = n - (lc - 1); /* (a part of it may end the text) */
            return false;
        }
        x->phase = PH_ANSWER;
        x->base = (size_t)at + lc;
        *last = n - x->base;
    }
    if (*last > n - x->base) *last = n - x->base;
    return true;
}

void fl_triggers_rearm(fl_triggers *x) {
    x->phase = PH_ANSWER;
    x->base = 0;
}

int64_t fl_triggers_find(fl_triggers *x, const char *text, size_t n, size_t last, int32_t tok) {
    if (!past_reasoning(x, text, n, &last)) return -1;
    const size_t base = x->base;
    text += base;
    n -= base;
    for (int32_t i = 0; i < x->n; i++) {
        const trigger *y = &x->t[i];
        if (y->type == FL_TRIGGER_TOKEN) {
            if (tok == y->token) return (int64_t)(base + n - last);
            continue;
        }
        if (y->type == FL_TRIGGER_WORD) { /* (an earlier token could not have completed it: it would have fired then) */
            const size_t back = last + y->len - 1, from = back < n ? n - back : 0;
            const int64_t at = find_word(text, n, from, y->value, y->len);
            if (at >= 0) return (int64_t)base + at;
            continue;
        }
        const int rc = pcre2_match(y->code, (PCRE2_SPTR)text, n, 0, 0, x->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) continue;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) continue; /* (the text ends inside a character: not yet) */
            fl_set_error(rc == PCRE2_ERROR_NOMEMORY ? FL_ERR_NOMEM : FL_ERR_INVALID, "grammar trigger %d: cannot match: %s", i, (const char *)msg);
            return -2;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(x->md);
        /* (past an invalid UTF-8 sequence PCRE2 matches the next valid stretch of text on its own,
         * anchored there: a full pattern must span all of it) */
        if (y->type == FL_TRIGGER_PATTERN_FULL && (ov[0] != 0 || ov[1] != n)) continue;
        return (int64_t)base + (rc > 1 && ov[2] != PCRE2_UNSET ? (int64_t)ov[2] : (int64_t)ov[0]);
    }
    return -1;
}
