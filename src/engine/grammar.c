/* GBNF grammars: the compiler (text -> rules of elements) and the pushdown recognizer over the
 * set of every parse's stack (grammar.h). */
#include "engine/grammar.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* A rule is its alternatives' elements one after another, ALT between two, END after the last.
 * REF: rule a; SET / NSET: the character is (is not) in ranges [a, a + n); ANY: any character. */
enum { GE_END, GE_ALT, GE_REF, GE_SET, GE_NSET, GE_ANY };
typedef struct gel {
    uint32_t type, n, a;
} gel;
typedef struct grange {
    uint32_t lo, hi;
} grange;

#define MAX_ELEMENTS (1 << 18) /* elements of a compiled grammar (repeats multiply them; 12 B each) */

/* ---- growing arrays (MISC) ---- */

static bool grow(void **p, int32_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return true;
    int64_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    if (nc > INT32_MAX / 2) return false;
    void *q = fl_realloc(FL_MEM_GUIDE, *p, (size_t)*cap * size, (size_t)nc * size, 0);
    if (!q) return false;
    *p = q;
    *cap = (int32_t)nc;
    return true;
}

/* ---- compiling ---- */

typedef struct grule {
    const char *name;  /* in the source: the named rule this one is (or, generated, came from) */
    int32_t name_len;
    bool generated;    /* a group or a repeat */
    bool defined;
    const char *used;  /* where a named rule was first used */
    gel *el;
    int32_t n, cap;
} grule;

typedef struct gbuild {
    const char *src;
    grule *rules;
    int32_t n_rules, cap_rules;
    grange *rg;
    int32_t n_rg, cap_rg;
    int64_t n_el; /* elements over all rules */
    int32_t *names; /* open addressing: the named rules by their names' hash (-1 empty) */
    int32_t cap_names, n_names;
    fl_status st; /* the first error */
} gbuild;

FL_PRINTF(3, 4) static fl_status perr(gbuild *b, const char *at, const char *fmt, ...) {
    if (b->st != FL_OK) return b->st;
    int line = 1, col = 1;
    for (const char *q = b->src; q < at && *q; q++) {
        if (*q == '\n') line++, col = 1;
        else if ((*q & 0xC0) != 0x80) col++;
    }
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return b->st = fl_set_error(FL_ERR_INVALID, "grammar: line %d, column %d: %s", line, col, msg);
}

static fl_status nomem(gbuild *b) {
    if (b->st == FL_OK) b->st = fl_set_error(FL_ERR_NOMEM, "grammar: no memory");
    return b->st;
}

static int32_t new_rule(gbuild *b, const char *name, int32_t len, bool generated) {
    if (!grow((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof *b->rules)) return nomem(b), -1;
    b->rules[b->n_rules] = (grule){.name = name, .name_len = len, .generated = generated};
    return b->n_rules++;
}

static bool push(gbuild *b, int32_t rule, gel x, const char *at) {
    if (b->st != FL_OK) return false;
    if (++b->n_el > MAX_ELEMENTS) return perr(b, at, "the grammar expands to more than %d elements (repeats multiply)", MAX_ELEMENTS), false;
    grule *r = &b->rules[rule];
    if (!grow((void **)&r->el, &r->cap, r->n + 1, sizeof *r->el)) return nomem(b), false;
    r->el[r->n++] = x;
    return true;
}

static bool add_range(gbuild *b, uint32_t lo, uint32_t hi) {
    if (!grow((void **)&b->rg, &b->cap_rg, b->n_rg + 1, sizeof *b->rg)) return nomem(b), false;
    b->rg[b->n_rg++] = (grange){lo, hi};
    return true;
}

static bool word_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

/* Spaces, tabs and comments; newlines too where nl. */
static const char *skip(const char *p, bool nl) {
    for (;;) {
        if (*p == ' ' || *p == '\t' || (nl && (*p == '\n' || *p == '\r'))) p++;
        else if (*p == '#')
            while (*p && *p != '\n' && *p != '\r') p++;
        else return p;
    }
}

/* One character of a literal or a class (an escape or raw UTF-8) into *cp; NULL on an error (set). */
static const char *parse_char(gbuild *b, const char *p, uint32_t *cp) {
    if (*p == '\\') {
        int digits = 0;
        switch (p[1]) {
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'n': *cp = '\n'; return p + 2;
        case 'r': *cp = '\r'; return p + 2;
        case 't': *cp = '\t'; return p + 2;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': *cp = (unsigned char)p[1]; return p + 2;
        default: return perr(b, p, "unknown escape '\\%c'", p[1] ? p[1] : '0'), NULL;
        }
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            const char c = p[2 + i];
            const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) return perr(b, p, "'\\%c' needs %d hex digits", p[1], digits), NULL;
            v = v << 4 | (uint32_t)d;
        }
        if (v > 0x10FFFF) return perr(b, p, "'\\%c' past U+10FFFF", p[1]), NULL;
        *cp = v;
        return p + 2 + digits;
    }
    const size_t n = fl_utf8_decode(p, strnlen(p, 4), cp);
    if (!n) return perr(b, p, "the grammar is not UTF-8 here"), NULL;
    return p + n;
}

static const char *parse_alternates(gbuild *b, int32_t rule, const char *p, bool nested);

/* The postfix operator at p on the item elements [start, n) of rule: * + ? {m} {m,} {m,n}. */
static const char *parse_repeat(gbuild *b, int32_t rule, int32_t start, const char *p) {
    const char *at = p;
    long m = 0, n = -1; /* n < 0: no bound */
    if (*p == '*') p++;
    else if (*p == '+') m = 1, p++;
    else if (*p == '?') n = 1, p++;
    else { /* { */
        char *end;
        p = skip(p + 1, false);
        if (*p < '0' || *p > '9') return perr(b, p, "expected a number after '{'"), NULL;
        m = strtol(p, &end, 10);
        p = skip(end, false);
        if (*p == ',') {
            p = skip(p + 1, false);
            if (*p >= '0' && *p <= '9') {
                n = strtol(p, &end, 10);
                p = skip(end, false);
            }
        } else n = m;
        if (*p != '}') return perr(b, p, "expected '}'"), NULL;
        p++;
        if (m > FL_GRAMMAR_MAX_REPEAT || n > FL_GRAMMAR_MAX_REPEAT) return perr(b, at, "repeat counts above %d", FL_GRAMMAR_MAX_REPEAT), NULL;
        if (n >= 0 && n < m) return perr(b, at, "{%ld,%ld}: the bound is below the minimum", m, n), NULL;
    }
    if (b->rules[rule].n == start) return perr(b, at, "nothing to repeat"), NULL;
    if (b->rules[rule].n - start > 1) { /* a literal of several characters: its own rule */
        const int32_t w = new_rule(b, b->rules[rule].name, b->rules[rule].name_len, true);
        if (w < 0) return NULL;
        for (int32_t i = start; i < b->rules[rule].n; i++)
            if (!push(b, w, b->rules[rule].el[i], at)) return NULL;
        if (!push(b, w, (gel){GE_END, 0, 0}, at)) return NULL;
        b->n_el -= b->rules[rule].n - start;
        b->rules[rule].n = start;
        if (!push(b, rule, (gel){GE_REF, 0, (uint32_t)w}, at)) return NULL;
    }
    const gel x = b->rules[rule].el[start];
    b->rules[rule].n = start, b->n_el--;
    for (long i = 0; i < m; i++)
        if (!push(b, rule, x, at)) return NULL;
    if (n < 0) { /* s ::= x s | (nothing) */
        const int32_t s = new_rule(b, b->rules[rule].name, b->rules[rule].name_len, true);
        if (s < 0 || !push(b, s, x, at) || !push(b, s, (gel){GE_REF, 0, (uint32_t)s}, at) || !push(b, s, (gel){GE_ALT, 0, 0}, at) ||
            !push(b, s, (gel){GE_END, 0, 0}, at) || !push(b, rule, (gel){GE_REF, 0, (uint32_t)s}, at))
            return NULL;
    } else if (n > m) { /* o_k ::= x o_{k-1} | (nothing), o_1 ::= x | (nothing) */
        int32_t prev = -1;
        for (long k = 1; k <= n - m; k++) {
            const int32_t o = new_rule(b, b->rules[rule].name, b->rules[rule].name_len, true);
            if (o < 0 || !push(b, o, x, at) || (prev >= 0 && !push(b, o, (gel){GE_REF, 0, (uint32_t)prev}, at)) ||
                !push(b, o, (gel){GE_ALT, 0, 0}, at) || !push(b, o, (gel){GE_END, 0, 0}, at))
                return NULL;
            prev = o;
        }
        if (!push(b, rule, (gel){GE_REF, 0, (uint32_t)prev}, at)) return NULL;
    }
    return p;
}

static uint64_t name_hash(const char *name, int32_t len) { return XXH3_64bits(name, (size_t)len); }

/* The named rule name[0, len) (made, undefined, at its first use); -1 out of memory (set). */
static int32_t named_rule(gbuild *b, const char *name, int32_t len) {
    if (2 * (b->n_names + 1) > b->cap_names) { /* grow the table to keep it at most half full */
        const int32_t nc = b->cap_names ? 2 * b->cap_names : 64;
        int32_t *t = fl_alloc(FL_MEM_GUIDE, (size_t)nc * sizeof *t, 0);
        if (!t) return nomem(b), -1;
        for (int32_t i = 0; i < nc; i++) t[i] = -1;
        for (int32_t i = 0; i < b->cap_names; i++) {
            const int32_t r = b->names[i];
            if (r < 0) continue;
            size_t h = (size_t)name_hash(b->rules[r].name, b->rules[r].name_len) & (size_t)(nc - 1);
            while (t[h] >= 0) h = (h + 1) & (size_t)(nc - 1);
            t[h] = r;
        }
        fl_free(FL_MEM_GUIDE, b->names, (size_t)b->cap_names * sizeof *b->names);
        b->names = t;
        b->cap_names = nc;
    }
    size_t h = (size_t)name_hash(name, len) & (size_t)(b->cap_names - 1);
    for (; b->names[h] >= 0; h = (h + 1) & (size_t)(b->cap_names - 1)) {
        const grule *q = &b->rules[b->names[h]];
        if (q->name_len == len && !memcmp(q->name, name, (size_t)len)) return b->names[h];
    }
    const int32_t r = new_rule(b, name, len, false);
    if (r < 0) return -1;
    b->rules[r].used = name;
    b->names[h] = r;
    b->n_names++;
    return r;
}

/* Items until the end of the sequence: |, ), the end of the text, or (not nested) the end of
 * the line; p after them. */
static const char *parse_sequence(gbuild *b, int32_t rule, const char *p, bool nested) {
    for (;;) {
        const int32_t start = b->rules[rule].n;
        const char *at = p;
        uint32_t lo, hi;
        if (*p == '"') {
            for (p++; *p != '"';) {
                if (!*p || *p == '\n' || *p == '\r') return perr(b, at, "a literal without its closing '\"'"), NULL;
                if (!(p = parse_char(b, p, &lo)) || !add_range(b, lo, lo) ||
                    !push(b, rule, (gel){GE_SET, 1, (uint32_t)b->n_rg - 1}, at))
                    return NULL;
            }
            p++;
        } else if (*p == '[') {
            p++;
            const bool neg = *p == '^';
            p += neg;
            const int32_t first = b->n_rg;
            while (*p != ']') {
                if (!*p || *p == '\n' || *p == '\r') return perr(b, at, "a class without its closing ']'"), NULL;
                if (!(p = parse_char(b, p, &lo))) return NULL;
                hi = lo;
                if (*p == '-' && p[1] != ']') {
                    const char *r = p + 1;
                    if (!(p = parse_char(b, p + 1, &hi))) return NULL;
                    if (hi < lo) return perr(b, r, "a range that ends below its start"), NULL;
                }
                if (!add_range(b, lo, hi)) return NULL;
            }
            p++;
            if (!push(b, rule, (gel){neg ? GE_NSET : GE_SET, (uint32_t)(b->n_rg - first), (uint32_t)first}, at)) return NULL;
        } else if (*p == '.') {
            p++;
            if (!push(b, rule, (gel){GE_ANY, 0, 0}, at)) return NULL;
        } else if (word_char(*p)) {
            while (word_char(*p)) p++;
            const int32_t r = named_rule(b, at, (int32_t)(p - at));
            if (r < 0 || !push(b, rule, (gel){GE_REF, 0, (uint32_t)r}, at)) return NULL;
        } else if (*p == '(') {
            const int32_t g = new_rule(b, b->rules[rule].name, b->rules[rule].name_len, true);
            if (g < 0 || !(p = parse_alternates(b, g, skip(p + 1, true), true))) return NULL;
            if (*p != ')') return perr(b, p, "expected ')' closing the group"), NULL;
            p++;
            if (!push(b, rule, (gel){GE_REF, 0, (uint32_t)g}, at)) return NULL;
        } else return p;
        p = skip(p, nested);
        if (*p == '*' || *p == '+' || *p == '?' || *p == '{') {
            if (!(p = parse_repeat(b, rule, start, p))) return NULL;
            p = skip(p, nested);
        }
    }
}

static const char *parse_alternates(gbuild *b, int32_t rule, const char *p, bool nested) {
    if (!(p = parse_sequence(b, rule, p, nested))) return NULL;
    while (*p == '|') {
        if (!push(b, rule, (gel){GE_ALT, 0, 0}, p) || !(p = parse_sequence(b, rule, skip(p + 1, true), nested))) return NULL;
    }
    return push(b, rule, (gel){GE_END, 0, 0}, p) ? p : NULL;
}

static fl_status parse(gbuild *b) {
    const char *p = skip(b->src, true);
    while (*p) {
        const char *name = p;
        while (word_char(*p)) p++;
        if (p == name) return perr(b, p, "expected a rule name");
        const int nl = (int)(p - name > 64 ? 64 : p - name);
        const int32_t r = named_rule(b, name, (int32_t)(p - name));
        if (r < 0) return b->st;
        if (b->rules[r].defined) return perr(b, name, "rule '%.*s' is defined twice", nl, name);
        b->rules[r].defined = true;
        p = skip(p, false);
        if (strncmp(p, "::=", 3)) return perr(b, p, "expected '::=' after the rule name '%.*s' (GBNF: name ::= alternatives)", nl, name);
        if (!(p = parse_alternates(b, r, skip(p + 3, true), false))) return b->st;
        if (*p && *p != '\n' && *p != '\r') return perr(b, p, "unexpected '%c'", *p);
        p = skip(p, true);
    }
    for (int32_t i = 0; i < b->n_rules; i++)
        if (!b->rules[i].generated && !b->rules[i].defined)
            return perr(b, b->rules[i].used, "rule '%.*s' is used but not defined", (int)(b->rules[i].name_len > 64 ? 64 : b->rules[i].name_len), b->rules[i].name);
    return FL_OK;
}

/* ---- the recognizer ---- */

/* Stacks one after another: each its length, then its positions bottom to top. */
typedef struct gset {
    uint32_t *v;
    int32_t n, cap, n_stacks;
} gset;

struct fl_grammar_guide {
    gel *el;
    int32_t n_el;
    grange *rg;
    int32_t n_rg;
    int32_t *alt_off; /* [n_rules + 1]: rule r's alternatives start at el[alts[alt_off[r] ..]] */
    int32_t *alts;
    int32_t n_rules, n_alts, root;
    uint64_t hash; /* of the source */
    gset cur, x[2];
    uint8_t pend[4]; /* the text so far ends inside a character: its first n_pend bytes */
    int32_t n_pend;
    int64_t budget, work; /* a mask walk's bound on the state ints its transitions read and write */
    gset *lv;      /* the mask walk's states by characters in (level 0 is cur) */
    int32_t *lvb;  /* the byte each level ends at */
    int32_t n_lv, n_lvb;
    uint32_t *buf; /* [FL_GRAMMAR_MAX_DEPTH + 1] */
    const uint32_t **sortp;
    int32_t cap_sortp;
    /* the walk's transitions kept: (state, character) -> state, the states in pool */
    uint64_t *lvh; /* each level's state's hash (as lv) */
    int32_t n_lvh;
    struct gmemo *memo; /* [MEMO_SLOTS] */
    uint32_t *pool;
    int32_t n_pool, cap_pool;
};

#define MEMO_SLOTS 256
#define MEMO_POOL (1 << 16) /* ints of states the memo keeps (256 KiB), then it starts over */
typedef struct gmemo {
    uint64_t h, hout; /* the hashes of the state and of the state after cp */
    uint32_t cp;
    int32_t at, n_in, n_out, out_stacks; /* pool[at, + n_in) the state, then the one after; n_in < 0 empty */
} gmemo;

static fl_status too_deep(void) {
    return fl_set_error(FL_ERR_INVALID, "grammar: a parse nests more than %d rules deep", FL_GRAMMAR_MAX_DEPTH);
}

static fl_status emit(gset *out, const uint32_t *s, int32_t len) {
    if ((int64_t)out->n + len + 1 > FL_GRAMMAR_MAX_STATE)
        return fl_set_error(FL_ERR_INVALID, "grammar: more than %d ints of parses at once (too ambiguous a grammar)", FL_GRAMMAR_MAX_STATE);
    if (!grow((void **)&out->v, &out->cap, out->n + len + 1, sizeof *out->v)) return fl_set_error(FL_ERR_NOMEM, "grammar: no memory for its state");
    out->v[out->n] = (uint32_t)len;
    memcpy(out->v + out->n + 1, s, (size_t)len * sizeof *s);
    out->n += len + 1;
    out->n_stacks++;
    return FL_OK;
}

/* The stack buf[0, len) with its top expanded into out: a class on top is a stack of the state;
 * the end of an alternative pops; a rule reference is replaced by where its rule resumes (unless
 * that is the end of its alternative) with each of the rule's alternatives on top.  buf[0, len)
 * is as it was on return; buf[len ..] is scratch. */
static fl_status expand(const fl_grammar_guide *g, uint32_t *buf, int32_t len, gset *out, int32_t depth) {
    if (depth > FL_GRAMMAR_MAX_DEPTH) return too_deep();
    if (len == 0) return emit(out, buf, 0);
    const uint32_t top = buf[len - 1];
    const gel *x = &g->el[top];
    fl_status st = FL_OK;
    if (x->type == GE_END || x->type == GE_ALT) {
        st = expand(g, buf, len - 1, out, depth + 1);
        buf[len - 1] = top;
    } else if (x->type == GE_REF) {
        const uint32_t t = g->el[top + 1].type;
        const int32_t base = t == GE_END || t == GE_ALT ? len - 1 : len;
        if (base >= FL_GRAMMAR_MAX_DEPTH) return too_deep();
        if (base == len) buf[len - 1] = top + 1;
        for (int32_t a = g->alt_off[x->a]; a < g->alt_off[x->a + 1] && st == FL_OK; a++) {
            buf[base] = (uint32_t)g->alts[a];
            st = expand(g, buf, base + 1, out, depth + 1);
        }
        buf[len - 1] = top;
    } else st = emit(out, buf, len);
    return st;
}

static int cmp_stack(const void *pa, const void *pb) {
    const uint32_t *a = *(const uint32_t *const *)pa, *b = *(const uint32_t *const *)pb;
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    for (uint32_t i = 1; i <= a[0]; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

/* s sorted, each stack once (into t, then swapped; as it is where it already is: the usual case,
 * as expand emits a rule's alternatives in order). */
static fl_status canonical(fl_grammar_guide *g, gset *s, gset *t) {
    if (s->n_stacks < 2) return FL_OK;
    if (!grow((void **)&g->sortp, &g->cap_sortp, s->n_stacks, sizeof *g->sortp)) return fl_set_error(FL_ERR_NOMEM, "grammar: no memory for its state");
    int32_t k = 0;
    bool sorted = true;
    for (int32_t i = 0; i < s->n; i += (int32_t)s->v[i] + 1) {
        g->sortp[k] = s->v + i;
        if (k && sorted && cmp_stack(&g->sortp[k - 1], &g->sortp[k]) >= 0) sorted = false;
        k++;
    }
    if (sorted) return FL_OK;
    if (k <= 16) /* insertion sort: few stacks */
        for (int32_t i = 1; i < k; i++) {
            const uint32_t *x = g->sortp[i];
            int32_t j = i;
            for (; j > 0 && cmp_stack(&g->sortp[j - 1], &x) > 0; j--) g->sortp[j] = g->sortp[j - 1];
            g->sortp[j] = x;
        }
    else qsort(g->sortp, (size_t)k, sizeof *g->sortp, cmp_stack);
    t->n = t->n_stacks = 0;
    for (int32_t i = 0; i < k; i++) {
        if (i && !cmp_stack(&g->sortp[i - 1], &g->sortp[i])) continue;
        const fl_status st = emit(t, g->sortp[i] + 1, (int32_t)g->sortp[i][0]);
        if (st != FL_OK) return st;
    }
    const gset tmp = *s;
    *s = *t;
    *t = tmp;
    return FL_OK;
}

static bool admits(const fl_grammar_guide *g, const gel *x, uint32_t cp) {
    if (x->type == GE_ANY) return true;
    bool in = false;
    for (uint32_t i = 0; i < x->n && !in; i++) in = g->rg[x->a + i].lo <= cp && cp <= g->rg[x->a + i].hi;
    return in == (x->type == GE_SET);
}

/* Some character in [lo, hi] is admitted by x. */
static bool admits_range(const fl_grammar_guide *g, const gel *x, uint32_t lo, uint32_t hi) {
    if (x->type == GE_ANY) return true;
    if (x->type == GE_SET) {
        for (uint32_t i = 0; i < x->n; i++)
            if (g->rg[x->a + i].lo <= hi && lo <= g->rg[x->a + i].hi) return true;
        return false;
    }
    for (uint32_t c = lo;;) { /* NSET: is [lo, hi] covered by the ranges? */
        uint32_t i = 0;
        while (i < x->n && !(g->rg[x->a + i].lo <= c && c <= g->rg[x->a + i].hi)) i++;
        if (i == x->n) return true; /* c is not in any */
        if (g->rg[x->a + i].hi >= hi) return false;
        c = g->rg[x->a + i].hi + 1;
    }
}

/* b[0, n) is the beginning of a well-formed UTF-8 character but not all of it: the characters
 * that complete it are [*lo, *hi] (the first continuation byte's range is the only one narrowed,
 * so they are contiguous). */
static bool utf8_prefix(const uint8_t *b, size_t n, uint32_t *lo, uint32_t *hi) {
    uint32_t v;
    unsigned l1, h1;
    const size_t len = fl_utf8_lead(b[0], &v, &l1, &h1);
    if (n < 1 || len < 2 || n >= len) return false;
    uint32_t a = v, z = v;
    for (size_t k = 1; k < len; k++) {
        const unsigned kl = k == 1 ? l1 : 0x80, kh = k == 1 ? h1 : 0xBF;
        if (k < n) {
            if (b[k] < kl || b[k] > kh) return false;
            a = a << 6 | (b[k] & 0x3Fu), z = z << 6 | (b[k] & 0x3Fu);
        } else a = a << 6 | (kl & 0x3Fu), z = z << 6 | (kh & 0x3Fu);
    }
    *lo = a, *hi = z;
    return true;
}

/* Some stack of s admits a character in [lo, hi]. */
static bool viable(const fl_grammar_guide *g, const gset *s, uint32_t lo, uint32_t hi) {
    for (int32_t i = 0; i < s->n; i += (int32_t)s->v[i] + 1)
        if (s->v[i] && admits_range(g, &g->el[s->v[i + s->v[i]]], lo, hi)) return true;
    return false;
}

/* out := the state after the character cp in state in (out != in; x[1] is the scratch where
 * out is x[0] ...: the caller passes the other). */
static fl_status advance(fl_grammar_guide *g, const gset *in, uint32_t cp, gset *out, gset *scratch) {
    out->n = out->n_stacks = 0;
    for (int32_t i = 0; i < in->n; i += (int32_t)in->v[i] + 1) {
        const int32_t len = (int32_t)in->v[i];
        if (!len || !admits(g, &g->el[in->v[i + len]], cp)) continue;
        memcpy(g->buf, in->v + i + 1, (size_t)len * sizeof *g->buf);
        g->buf[len - 1]++;
        const fl_status st = expand(g, g->buf, len, out, 0);
        if (st != FL_OK) return st;
    }
    return canonical(g, out, scratch);
}

void fl_grammar_guide_free(fl_grammar_guide *g) {
    if (!g) return;
    fl_free(FL_MEM_GUIDE, g->el, (size_t)g->n_el * sizeof *g->el);
    fl_free(FL_MEM_GUIDE, g->rg, (size_t)g->n_rg * sizeof *g->rg);
    fl_free(FL_MEM_GUIDE, g->alt_off, (size_t)(g->n_rules + 1) * sizeof *g->alt_off);
    fl_free(FL_MEM_GUIDE, g->alts, (size_t)g->n_alts * sizeof *g->alts);
    fl_free(FL_MEM_GUIDE, g->cur.v, (size_t)g->cur.cap * sizeof(uint32_t));
    for (int i = 0; i < 2; i++) fl_free(FL_MEM_GUIDE, g->x[i].v, (size_t)g->x[i].cap * sizeof(uint32_t));
    for (int32_t i = 0; i < g->n_lv; i++) fl_free(FL_MEM_GUIDE, g->lv[i].v, (size_t)g->lv[i].cap * sizeof(uint32_t));
    fl_free(FL_MEM_GUIDE, g->lv, (size_t)g->n_lv * sizeof *g->lv);
    fl_free(FL_MEM_GUIDE, g->lvb, (size_t)g->n_lvb * sizeof *g->lvb);
    fl_free(FL_MEM_GUIDE, g->buf, (FL_GRAMMAR_MAX_DEPTH + 1) * sizeof *g->buf);
    fl_free(FL_MEM_GUIDE, g->sortp, (size_t)g->cap_sortp * sizeof *g->sortp);
    fl_free(FL_MEM_GUIDE, g->lvh, (size_t)g->n_lvh * sizeof *g->lvh);
    fl_free(FL_MEM_GUIDE, g->memo, g->memo ? MEMO_SLOTS * sizeof *g->memo : 0);
    fl_free(FL_MEM_GUIDE, g->pool, (size_t)g->cap_pool * sizeof *g->pool);
    fl_free(FL_MEM_GUIDE, g, sizeof *g);
}

static void build_free(gbuild *b) {
    fl_free(FL_MEM_GUIDE, b->names, (size_t)b->cap_names * sizeof *b->names);
    for (int32_t i = 0; i < b->n_rules; i++) fl_free(FL_MEM_GUIDE, b->rules[i].el, (size_t)b->rules[i].cap * sizeof(gel));
    fl_free(FL_MEM_GUIDE, b->rules, (size_t)b->cap_rules * sizeof *b->rules);
    fl_free(FL_MEM_GUIDE, b->rg, (size_t)b->cap_rg * sizeof *b->rg);
}

/* Rules that can reach themselves before consuming a character: refused (the recognizer would
 * expand them forever).  Nullable rules first (some alternative all nullable references), then
 * a search along the references each alternative starts with, past nullable ones. */
static fl_status left_recursion(fl_grammar_guide *g, gbuild *b) {
    const int32_t nr = g->n_rules;
    uint8_t *mark = fl_alloc(FL_MEM_GUIDE, (size_t)nr * 2, 0); /* [0, nr) nullable; [nr, 2 nr) search colour */
    int32_t *stk = fl_alloc(FL_MEM_GUIDE, (size_t)nr * 2 * sizeof *stk, 0);
    fl_status st = FL_OK;
    if (!mark || !stk) {
        st = fl_set_error(FL_ERR_NOMEM, "grammar: no memory");
        goto out;
    }
    memset(mark, 0, (size_t)nr * 2);
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < nr; r++) {
            if (mark[r]) continue;
            for (int32_t a = g->alt_off[r]; a < g->alt_off[r + 1] && !mark[r]; a++) {
                int32_t i = g->alts[a];
                while (g->el[i].type == GE_REF && mark[g->el[i].a]) i++;
                if (g->el[i].type == GE_END || g->el[i].type == GE_ALT) mark[r] = 1, changed = true;
            }
        }
    }
    /* depth-first, iterative: stk holds (rule, next alternative-element position) pairs */
    uint8_t *col = mark + nr; /* 0 new, 1 on the path, 2 done */
    for (int32_t s = 0; s < nr && st == FL_OK; s++) {
        if (col[s]) continue;
        int32_t sp = 0;
        stk[sp++] = s, stk[sp++] = 0;
        col[s] = 1;
        while (sp && st == FL_OK) {
            const int32_t r = stk[sp - 2], k = stk[sp - 1]++;
            /* the k-th leading reference of r: over the alternatives, each its leading nullable run and the one after */
            int32_t seen = 0, next = -1;
            for (int32_t a = g->alt_off[r]; a < g->alt_off[r + 1] && next < 0; a++)
                for (int32_t i = g->alts[a]; g->el[i].type == GE_REF; i++) {
                    if (seen++ == k) {
                        next = (int32_t)g->el[i].a;
                        break;
                    }
                    if (!mark[g->el[i].a]) break;
                }
            if (next < 0) {
                col[r] = 2;
                sp -= 2;
            } else if (col[next] == 1) {
                const grule *q = &b->rules[next];
                st = fl_set_error(FL_ERR_INVALID, "grammar: rule '%.*s'%s is left-recursive: it can reach itself before consuming a character",
                                  q->name_len > 64 ? 64 : q->name_len, q->name, q->generated ? " (a group or repeat in it)" : "");
            } else if (!col[next]) {
                col[next] = 1;
                stk[sp++] = next, stk[sp++] = 0;
            }
        }
    }
out:
    fl_free(FL_MEM_GUIDE, mark, mark ? (size_t)nr * 2 : 0);
    fl_free(FL_MEM_GUIDE, stk, stk ? (size_t)nr * 2 * sizeof *stk : 0);
    return st;
}

/* The state before any text: root's alternatives expanded */
static fl_status start_state(fl_grammar_guide *g) {
    fl_status st = FL_OK;
    g->cur.n = g->cur.n_stacks = 0;
    g->n_pend = 0;
    for (int32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1] && st == FL_OK; a++) {
        g->buf[0] = (uint32_t)g->alts[a];
        st = expand(g, g->buf, 1, &g->cur, 0);
    }
    return st == FL_OK ? canonical(g, &g->cur, &g->x[0]) : st;
}

fl_status fl_grammar_guide_reset(fl_grammar_guide *g) { return start_state(g); }

fl_status fl_grammar_guide_new(const char *gbnf, fl_grammar_guide **out) {
    *out = NULL;
    const size_t len = strnlen(gbnf, FL_GRAMMAR_MAX_TEXT + 1);
    if (len > FL_GRAMMAR_MAX_TEXT) return fl_set_error(FL_ERR_INVALID, "grammar: longer than %d bytes", FL_GRAMMAR_MAX_TEXT);
    gbuild b = {.src = gbnf};
    fl_grammar_guide *g = NULL;
    fl_status st = parse(&b);
    if (st != FL_OK) goto fail;
    int32_t root = -1;
    for (int32_t i = 0; i < b.n_rules && root < 0; i++)
        if (!b.rules[i].generated && b.rules[i].name_len == 4 && !memcmp(b.rules[i].name, "root", 4)) root = i;
    if (root < 0) {
        st = fl_set_error(FL_ERR_INVALID, "grammar: no rule 'root' (the start)");
        goto fail;
    }
    if (!(g = fl_alloc(FL_MEM_GUIDE, sizeof *g, 0))) goto nomem;
    memset(g, 0, sizeof *g);
    g->n_rules = b.n_rules;
    g->root = root;
    g->hash = XXH3_64bits(gbnf, len);
    g->budget = FL_GRAMMAR_WALK_BUDGET;
    g->n_el = (int32_t)b.n_el;
    g->n_rg = b.n_rg;
    for (int32_t r = 0; r < b.n_rules; r++)
        for (int32_t i = 0; i < b.rules[r].n; i++) g->n_alts += b.rules[r].el[i].type == GE_END || b.rules[r].el[i].type == GE_ALT;
    if (!(g->el = fl_alloc(FL_MEM_GUIDE, (size_t)g->n_el * sizeof *g->el, 0)) || (g->n_rg && !(g->rg = fl_alloc(FL_MEM_GUIDE, (size_t)g->n_rg * sizeof *g->rg, 0))) ||
        !(g->alt_off = fl_alloc(FL_MEM_GUIDE, (size_t)(g->n_rules + 1) * sizeof *g->alt_off, 0)) ||
        !(g->alts = fl_alloc(FL_MEM_GUIDE, (size_t)g->n_alts * sizeof *g->alts, 0)) ||
        !(g->buf = fl_alloc(FL_MEM_GUIDE, (FL_GRAMMAR_MAX_DEPTH + 1) * sizeof *g->buf, 0)))
        goto nomem;
    if (g->n_rg) memcpy(g->rg, b.rg, (size_t)g->n_rg * sizeof *g->rg);
    /* rules one after another; references to rule numbers; each alternative's first element */
    int32_t *start = fl_alloc(FL_MEM_GUIDE, (size_t)b.n_rules * sizeof *start, 0);
    if (!start) goto nomem;
    for (int32_t r = 0, o = 0; r < b.n_rules; r++) start[r] = o, o += b.rules[r].n;
    for (int32_t r = 0, o = 0, a = 0; r < b.n_rules; r++) {
        g->alt_off[r] = a;
        g->alts[a++] = o;
        for (int32_t i = 0; i < b.rules[r].n; i++, o++) {
            g->el[o] = b.rules[r].el[i];
            if (g->el[o].type == GE_ALT) g->alts[a++] = o + 1;
        }
        g->alt_off[r + 1] = a;
    }
    fl_free(FL_MEM_GUIDE, start, (size_t)b.n_rules * sizeof *start);
    if ((st = left_recursion(g, &b)) != FL_OK) goto fail;
    if ((st = start_state(g)) != FL_OK) goto fail;
    build_free(&b);
    *out = g;
    return FL_OK;
nomem:
    st = fl_set_error(FL_ERR_NOMEM, "grammar: no memory");
fail:
    build_free(&b);
    fl_grammar_guide_free(g);
    return st;
}

/* The state after s[0, n) from the current one (and its pending bytes), in one of x[] (or cur):
 * 1 alive, 0 dead (or not UTF-8, or the text ends inside a character no parse can take), -1 an
 * error (set).  The bytes of a character begun and not finished go to pend[0, *n_pend). */
static int run(fl_grammar_guide *g, const char *s, size_t n, gset **res, uint8_t pend[4], int32_t *n_pend) {
    const gset *in = &g->cur;
    int k = 0;
    *res = &g->cur;
    uint8_t cb[4];
    size_t nc = (size_t)g->n_pend;
    memcpy(cb, g->pend, nc);
    uint32_t lo = 0, hi = 0;
    if (nc) utf8_prefix(cb, nc, &lo, &hi); /* (the pending bytes are one, as fed) */
    for (size_t i = 0; i < n; i++) {
        cb[nc++] = (uint8_t)s[i];
        uint32_t cp;
        if (fl_utf8_decode((const char *)cb, nc, &cp) != nc) {
            if (!utf8_prefix(cb, nc, &lo, &hi)) return 0;
            continue;
        }
        nc = 0;
        gset *out = &g->x[k];
        /* the scratch for sorting: the other x[] (its contents are dead by now) */
        if (advance(g, in, cp, out, &g->x[k ^ 1]) != FL_OK) return -1;
        if (!out->n_stacks) return 0;
        *res = out;
        in = out;
        k ^= 1;
    }
    if (nc && !viable(g, in, lo, hi)) return 0;
    memcpy(pend, cb, nc);
    *n_pend = (int32_t)nc;
    return in->n_stacks > 0;
}

int fl_grammar_guide_allows(fl_grammar_guide *g, const char *s, size_t n) {
    gset *res;
    uint8_t pend[4];
    int32_t np;
    return run(g, s, n, &res, pend, &np);
}

fl_status fl_grammar_guide_feed(fl_grammar_guide *g, const char *s, size_t n) {
    gset *res;
    uint8_t pend[4];
    int32_t np;
    const int ok = run(g, s, n, &res, pend, &np);
    if (ok < 0) return FL_ERR_INVALID;
    if (!ok) return fl_set_error(FL_ERR_INVALID, "grammar: the text cannot continue a sentence here");
    if (res != &g->cur) {
        const gset t = g->cur;
        g->cur = *res;
        *res = t;
    }
    memcpy(g->pend, pend, (size_t)np);
    g->n_pend = np;
    return FL_OK;
}

/* sorted by length first: the empty stack (a complete parse) comes first */
bool fl_grammar_guide_complete(const fl_grammar_guide *g) { return !g->n_pend && g->cur.n_stacks && g->cur.v[0] == 0; }
bool fl_grammar_guide_finished(const fl_grammar_guide *g) { return !g->n_pend && g->cur.n_stacks == 1 && g->cur.v[0] == 0; }
int32_t fl_grammar_guide_n_stacks(const fl_grammar_guide *g) { return g->cur.n_stacks; }
void fl_grammar_guide_set_budget(fl_grammar_guide *g, int64_t ints) { g->budget = ints; }

void fl_grammar_guide_key(const fl_grammar_guide *g, uint8_t key[16]) {
    uint64_t pend = (uint64_t)g->n_pend << 32; /* the bytes of a character begun are part of the state */
    for (int32_t i = 0; i < g->n_pend; i++) pend |= (uint64_t)g->pend[i] << (8 * i);
    const XXH128_hash_t h = XXH3_128bits_withSeed(g->cur.v, (size_t)g->cur.n * sizeof *g->cur.v, g->hash ^ 0x67626e66ull ^ pend * 0x9E3779B97F4A7C15ull);
    XXH128_canonicalFromHash((XXH128_canonical_t *)key, h);
}

/* token a's text before token b's (bytewise; a prefix first; ties by id) */
static bool tok_before(const char *text, const int64_t *off, int32_t a, int32_t b) {
    const int64_t na = off[a + 1] - off[a], nb = off[b + 1] - off[b];
    const int c = memcmp(text + off[a], text + off[b], (size_t)(na < nb ? na : nb));
    return c ? c < 0 : na != nb ? na < nb : a < b;
}

/* in place (heapsort: no second array, so nothing beside the engine's order is allocated) */
fl_status fl_grammar_vocab_order(const char *text, const int64_t *off, int32_t n, int32_t *order) {
    for (int32_t t = 0; t < n; t++) order[t] = t;
    for (int64_t end = n, i = n / 2 - 1; end > 1;) {
        if (i >= 0) i--; /* building the heap: sift down i + 1 */
        else {           /* taking the largest to the end */
            const int32_t x = order[0];
            order[0] = order[--end], order[end] = x;
        }
        for (int64_t j = i >= 0 ? i + 1 : 0;;) {
            int64_t c = 2 * j + 1;
            if (c >= end) break;
            if (c + 1 < end && tok_before(text, off, order[c], order[c + 1])) c++;
            if (!tok_before(text, off, order[j], order[c])) break;
            const int32_t x = order[j];
            order[j] = order[c], order[c] = x;
            j = c;
        }
    }
    return FL_OK;
}

fl_status fl_vocab_text_build(fl_vocab_text *v, int32_t n, fl_piece_fn piece, void *ctx) {
    char buf[256];
    memset(v, 0, sizeof *v);
    if (!(v->off = fl_alloc(FL_MEM_MISC, ((size_t)n + 1) * sizeof *v->off, 0))) goto nomem;
    v->n = n;
    v->off[0] = 0;
    for (int32_t t = 0; t < n; t++) {
        const int32_t k = piece ? piece(ctx, t, buf, (int32_t)sizeof buf) : 0;
        v->off[t + 1] = v->off[t] + (k > 0 ? k : 0);
    }
    if (!(v->text = fl_alloc(FL_MEM_MISC, (size_t)v->off[n] + 1, 0)) || !(v->order = fl_alloc(FL_MEM_MISC, (size_t)n * sizeof *v->order, 0)))
        goto nomem;
    for (int32_t t = 0; t < n; t++)
        if (v->off[t + 1] > v->off[t]) {
            piece(ctx, t, buf, (int32_t)sizeof buf);
            memcpy(v->text + v->off[t], buf, (size_t)(v->off[t + 1] - v->off[t]));
        }
    v->text[v->off[n]] = 0;
    return fl_grammar_vocab_order(v->text, v->off, n, v->order);
nomem:
    fl_vocab_text_free(v);
    return fl_set_error(FL_ERR_NOMEM, "no memory for the vocabulary's text");
}

void fl_vocab_text_free(fl_vocab_text *v) {
    if (v->off) fl_free(FL_MEM_MISC, v->text, (size_t)v->off[v->n] + 1);
    fl_free(FL_MEM_MISC, v->off, v->off ? ((size_t)v->n + 1) * sizeof *v->off : 0);
    fl_free(FL_MEM_MISC, v->order, v->order ? (size_t)v->n * sizeof *v->order : 0);
    memset(v, 0, sizeof *v);
}

/* level k of the walk: cur for 0 */
static gset *level(fl_grammar_guide *g, int32_t k) { return k ? &g->lv[k] : &g->cur; }

static uint64_t set_hash(const gset *s) { return XXH3_64bits(s->v, (size_t)s->n * sizeof *s->v); }

/* Level k + 1 := level k after cp: the memo's answer where it has this state and character (the
 * states compared whole), else advance's, then kept.  A loop (a state that comes back after each
 * character, as in [a-z]+ or inside a string) is computed once for the whole walk. */
static fl_status advance_level(fl_grammar_guide *g, int32_t k, uint32_t cp) {
    const gset *in = level(g, k);
    gset *out = &g->lv[k + 1];
    const uint64_t h = g->lvh[k];
    gmemo *m = &g->memo[(h ^ (uint64_t)cp * 0x9E3779B97F4A7C15ull) >> 56];
    if (m->n_in == in->n && m->h == h && m->cp == cp && !memcmp(g->pool + m->at, in->v, (size_t)in->n * sizeof *in->v)) {
        if (!grow((void **)&out->v, &out->cap, m->n_out, sizeof *out->v)) return fl_set_error(FL_ERR_NOMEM, "grammar: no memory for its state");
        if (m->n_out) memcpy(out->v, g->pool + m->at + m->n_in, (size_t)m->n_out * sizeof *out->v);
        out->n = m->n_out, out->n_stacks = m->out_stacks;
        g->lvh[k + 1] = m->hout;
        return FL_OK;
    }
    fl_status st = advance(g, in, cp, out, &g->x[0]);
    if (st != FL_OK) return st;
    if ((g->work += in->n + out->n) > g->budget)
        return fl_set_error(FL_ERR_INVALID, "grammar: one token mask would read more than %lld ints of parse states (too ambiguous a grammar here)",
                            (long long)g->budget);
    g->lvh[k + 1] = set_hash(out);
    if ((int64_t)in->n + out->n > MEMO_POOL) return FL_OK;
    if (g->n_pool + in->n + out->n > MEMO_POOL) { /* full: start over */
        for (int i = 0; i < MEMO_SLOTS; i++) g->memo[i].n_in = -1;
        g->n_pool = 0;
    }
    if (!grow((void **)&g->pool, &g->cap_pool, (int64_t)g->n_pool + in->n + out->n, sizeof *g->pool)) return FL_OK; /* (not kept) */
    *m = (gmemo){h, g->lvh[k + 1], cp, g->n_pool, in->n, out->n, out->n_stacks};
    memcpy(g->pool + g->n_pool, in->v, (size_t)in->n * sizeof *in->v);
    if (out->n) memcpy(g->pool + g->n_pool + in->n, out->v, (size_t)out->n * sizeof *out->v);
    g->n_pool += in->n + out->n;
    return FL_OK;
}

fl_status fl_grammar_guide_mask(fl_grammar_guide *g, const char *text, const int64_t *off, const int32_t *order,
                                int32_t n, uint64_t *bits) {
    memset(bits, 0, ((size_t)n + 63) / 64 * 8);
    int64_t maxlen = 0;
    for (int32_t t = 0; t < n; t++) maxlen = off[t + 1] - off[t] > maxlen ? off[t + 1] - off[t] : maxlen;
    const int32_t old = g->n_lv; /* a level per byte of the longest token, and level 0 */
    if (!grow((void **)&g->lv, &g->n_lv, maxlen + 1, sizeof *g->lv)) return fl_set_error(FL_ERR_NOMEM, "grammar: no memory for the token walk");
    memset(g->lv + old, 0, (size_t)(g->n_lv - old) * sizeof *g->lv);
    if (!grow((void **)&g->lvb, &g->n_lvb, maxlen + 1, sizeof *g->lvb) || !grow((void **)&g->lvh, &g->n_lvh, maxlen + 1, sizeof *g->lvh))
        return fl_set_error(FL_ERR_NOMEM, "grammar: no memory for the token walk");
    if (!g->memo) {
        if (!(g->memo = fl_alloc(FL_MEM_GUIDE, MEMO_SLOTS * sizeof *g->memo, 0))) return fl_set_error(FL_ERR_NOMEM, "grammar: no memory for the token walk");
        for (int i = 0; i < MEMO_SLOTS; i++) g->memo[i].n_in = -1;
    }
    g->lvh[0] = set_hash(&g->cur);
    g->work = 0;
    const char *prev = NULL;
    int64_t prev_n = 0;
    int32_t nlv = 1; /* levels 0 .. nlv - 1 hold the states of the previous token's first characters */
    g->lvb[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t t = order[i];
        const char *s = text + off[t];
        const int64_t len = off[t + 1] - off[t];
        if (!len) continue;
        int64_t common = 0;
        while (common < len && common < prev_n && s[common] == prev[common]) common++;
        int32_t k = nlv - 1;
        while (g->lvb[k] > common) k--;
        int64_t pos = g->lvb[k];
        bool ok = level(g, k)->n_stacks > 0;
        while (ok && pos < len) {
            uint32_t cp, lo, hi;
            size_t d; /* the token's bytes this character takes */
            if (k == 0 && g->n_pend) { /* the first completes the character the text ends inside */
                uint8_t cb[4];
                const size_t np = (size_t)g->n_pend, m = (size_t)len < 4 - np ? (size_t)len : 4 - np;
                memcpy(cb, g->pend, np);
                memcpy(cb + np, s, m);
                const size_t full = fl_utf8_decode((const char *)cb, np + m, &cp);
                d = full > np ? full - np : 0;
                if (!d) { /* the token ends inside it too, or it is not UTF-8 */
                    ok = utf8_prefix(cb, np + m, &lo, &hi) && viable(g, level(g, k), lo, hi);
                    break;
                }
            } else if (!(d = fl_utf8_decode(s + pos, (size_t)(len - pos), &cp))) { /* the token ends inside a character, or not UTF-8 */
                ok = utf8_prefix((const uint8_t *)s + pos, (size_t)(len - pos), &lo, &hi) && viable(g, level(g, k), lo, hi);
                break;
            }
            const fl_status st = advance_level(g, k, cp);
            if (st != FL_OK) return st;
            pos += (int64_t)d;
            g->lvb[++k] = (int32_t)pos;
            ok = g->lv[k].n_stacks > 0;
        }
        nlv = k + 1;
        prev = s, prev_n = len;
        if (ok) bits[t >> 6] |= (uint64_t)1 << (t & 63);
    }
    return FL_OK;
}
