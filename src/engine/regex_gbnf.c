/* A regular expression of the common subset rewritten as GBNF (regex_gbnf.h).  Every character
 * is written as \UXXXXXXXX, inside literals and classes alike, so no escaping rule of GBNF can be
 * got wrong. */
#include "engine/regex_gbnf.h"
#include "engine/grammar.h"
#include "engine/regex_guide.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/utf8.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct xb {
    char *p;
    size_t n, cap;
    bool nomem;
} xb;

static void put(xb *o, const char *s, size_t n) {
    if (o->nomem) return;
    if (o->n + n + 1 > o->cap) {
        size_t nc = o->cap ? o->cap : 256;
        while (nc < o->n + n + 1) nc *= 2;
        char *q = fl_realloc(FL_MEM_GUIDE, o->p, o->cap, nc, 0);
        if (!q) {
            o->nomem = true;
            return;
        }
        o->p = q, o->cap = nc;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
    o->p[o->n] = 0;
}
static void puts_(xb *o, const char *s) { put(o, s, strlen(s)); }
static void put_cp(xb *o, uint32_t c) {
    char b[12];
    snprintf(b, sizeof b, "\\U%08X", (unsigned)c);
    put(o, b, 10);
}

typedef struct rx {
    const char *p, *end;
    int depth;
} rx;

enum { SET_D, SET_W, SET_S };
static const uint32_t SETS[3][9] = {/* ranges: count, then lo, hi pairs */
                                    {1, 0x30, 0x39},
                                    {4, 0x30, 0x39, 0x41, 0x5A, 0x5F, 0x5F, 0x61, 0x7A},
                                    {2, 0x09, 0x0D, 0x20, 0x20}};

static void put_set_ranges(xb *o, int set) {
    for (uint32_t i = 0; i < SETS[set][0]; i++) {
        put_cp(o, SETS[set][1 + 2 * i]);
        puts_(o, "-");
        put_cp(o, SETS[set][2 + 2 * i]);
    }
}

static int hexval(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; }
static bool is_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* One character or escape at r->p: 1 a character (*c), 2 a set (*c: SET_*, *neg), 0 unsupported.
 * in_class: \b is a backspace there. */
static int read_atom(rx *r, bool in_class, uint32_t *c, bool *neg) {
    const char *p = r->p;
    *neg = false;
    if (p >= r->end) return 0;
    if (*p != '\\') {
        const size_t d = fl_utf8_decode(p, (size_t)(r->end - p), c);
        if (!d) return 0;
        r->p = p + d;
        return 1;
    }
    if (p + 1 >= r->end) return 0;
    const char e = p[1];
    r->p = p + 2;
    switch (e) {
    case 'd': case 'D': *c = SET_D, *neg = e == 'D'; return 2;
    case 'w': case 'W': *c = SET_W, *neg = e == 'W'; return 2;
    case 's': case 'S': *c = SET_S, *neg = e == 'S'; return 2;
    case 'n': *c = '\n'; return 1;
    case 'r': *c = '\r'; return 1;
    case 't': *c = '\t'; return 1;
    case 'f': *c = '\f'; return 1;
    case 'e': *c = 0x1B; return 1;
    case 'a': *c = 0x07; return 1;
    case 'b': *c = 0x08; return in_class;
    case 'x': {
        uint32_t v = 0;
        if (r->p < r->end && *r->p == '{') {
            const char *q = r->p + 1;
            int nd = 0;
            for (; q < r->end && hexval(*q) >= 0 && nd < 8; q++, nd++) v = v << 4 | (uint32_t)hexval(*q);
            if (!nd || q >= r->end || *q != '}') return 0;
            r->p = q + 1;
        } else {
            if (r->end - r->p < 2 || hexval(r->p[0]) < 0 || hexval(r->p[1]) < 0) return 0;
            v = (uint32_t)(hexval(r->p[0]) << 4 | hexval(r->p[1]));
            r->p += 2;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
        *c = v;
        return 1;
    }
    default:
        if ((unsigned char)e < 0x80 && !is_alnum(e)) { /* escaped punctuation: itself */
            *c = (unsigned char)e;
            return 1;
        }
        return 0;
    }
}

static bool parse_alt(rx *r, xb *o);

/* [...] at r->p (after the '['). */
static bool parse_class(rx *r, xb *o) {
    puts_(o, "[");
    if (r->p < r->end && *r->p == '^') {
        puts_(o, "^");
        r->p++;
    }
    for (bool first = true;; first = false) {
        if (r->p >= r->end) return false;
        if (*r->p == ']' && !first) {
            r->p++;
            break;
        }
        if (*r->p == '[' && r->p + 1 < r->end && (r->p[1] == ':' || r->p[1] == '.' || r->p[1] == '=')) return false; /* POSIX */
        uint32_t lo, hi;
        bool neg;
        int k = read_atom(r, true, &lo, &neg);
        if (!k || (k == 2 && neg)) return false;
        if (k == 2) {
            put_set_ranges(o, (int)lo);
            continue;
        }
        hi = lo;
        if (r->p + 1 < r->end && r->p[0] == '-' && r->p[1] != ']') { /* a range */
            r->p++;
            if ((k = read_atom(r, true, &hi, &neg)) != 1 || hi < lo) return false;
        }
        put_cp(o, lo);
        if (hi != lo) {
            puts_(o, "-");
            put_cp(o, hi);
        }
    }
    puts_(o, "]");
    return true;
}

/* A quantifier after an item, if any: true and written (or none), false unsupported. */
static bool parse_quant(rx *r, xb *o) {
    if (r->p >= r->end) return true;
    const char q = *r->p;
    if (q == '*' || q == '+' || q == '?') {
        put(o, &q, 1);
        r->p++;
    } else if (q == '{') {
        const char *s = r->p + 1;
        char *e;
        if (s >= r->end || *s < '0' || *s > '9') return false;
        const long m = strtol(s, &e, 10);
        long n = m;
        if (*e == ',') {
            if (e[1] == '}') n = -1, e++;
            else {
                if (e[1] < '0' || e[1] > '9') return false;
                n = strtol(e + 1, &e, 10);
            }
        }
        if (*e != '}' || m > FL_GRAMMAR_MAX_REPEAT || n > FL_GRAMMAR_MAX_REPEAT || (n >= 0 && n < m)) return false;
        char b[48];
        const int k = n < 0 ? snprintf(b, sizeof b, "{%ld,}", m) : n == m ? snprintf(b, sizeof b, "{%ld}", m) : snprintf(b, sizeof b, "{%ld,%ld}", m, n);
        put(o, b, (size_t)k);
        r->p = e + 1;
    } else return true;
    if (r->p < r->end && *r->p == '?') r->p++;      /* lazy: the same whole matches */
    else if (r->p < r->end && *r->p == '+') return false; /* possessive: fewer */
    return r->p >= r->end || (*r->p != '*' && *r->p != '+' && *r->p != '?' && *r->p != '{');
}

static bool parse_seq(rx *r, xb *o) {
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        puts_(o, " ");
        const char c = *r->p;
        if (c == '(') {
            r->p++;
            if (r->p < r->end && *r->p == '?') { /* (?: (?<name> (?P<name>; else (lookaround, options, ...) no */
                const char *q = r->p + 1;
                if (q < r->end && *q == ':') r->p = q + 1;
                else if (q < r->end && (*q == '<' || (*q == 'P' && q + 1 < r->end && q[1] == '<'))) {
                    q += *q == 'P' ? 2 : 1;
                    if (q >= r->end || !((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || *q == '_')) return false;
                    while (q < r->end && *q != '>') q++;
                    if (q >= r->end) return false;
                    r->p = q + 1;
                } else return false;
            }
            if (++r->depth > 200) return false;
            puts_(o, "(");
            if (!parse_alt(r, o) || r->p >= r->end || *r->p != ')') return false;
            r->p++;
            r->depth--;
            puts_(o, " )");
        } else if (c == '[') {
            r->p++;
            if (!parse_class(r, o)) return false;
        } else if (c == '.') {
            r->p++;
            puts_(o, "[^");
            put_cp(o, '\n');
            puts_(o, "]");
        } else if (c == '^' || c == '$' || c == '*' || c == '+' || c == '?' || c == '{') {
            return false;
        } else {
            uint32_t v;
            bool neg;
            const int k = read_atom(r, false, &v, &neg);
            if (!k) return false;
            if (k == 2) {
                puts_(o, neg ? "[^" : "[");
                put_set_ranges(o, (int)v);
                puts_(o, "]");
            } else {
                puts_(o, "\"");
                put_cp(o, v);
                puts_(o, "\"");
            }
        }
        if (!parse_quant(r, o)) return false;
    }
    return true;
}

static bool parse_alt(rx *r, xb *o) {
    if (!parse_seq(r, o)) return false;
    while (r->p < r->end && *r->p == '|') {
        r->p++;
        puts_(o, " |");
        if (!parse_seq(r, o)) return false;
    }
    return true;
}

fl_status fl_regex_to_gbnf(const char *pattern, char **gbnf, size_t *len) {
    *gbnf = NULL;
    *len = 0;
    const size_t n = strlen(pattern);
    size_t b, e;
    fl_regex_strip_anchors(pattern, n, &b, &e);
    rx r = {pattern + b, pattern + e, 0};
    xb o = {0};
    puts_(&o, "root ::=");
    const bool ok = parse_alt(&r, &o) && r.p == r.end;
    if (ok && !o.nomem) { /* (to the size the caller frees) */
        char *fit = fl_realloc(FL_MEM_GUIDE, o.p, o.cap, o.n + 1, 0);
        if (fit) {
            *gbnf = fit;
            *len = o.n;
            return FL_OK;
        }
        o.nomem = true;
    }
    fl_free(FL_MEM_GUIDE, o.p, o.cap);
    return o.nomem ? fl_set_error(FL_ERR_NOMEM, "regex: no memory to rewrite it as a grammar") : FL_ERR_UNSUPPORTED;
}
