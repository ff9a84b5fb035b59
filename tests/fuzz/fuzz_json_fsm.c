/*
 * fuzz_json_fsm.c - libFuzzer target for the JSON-object recognizer of constrained decoding
 * (src/engine/json_fsm.c), against a plain recursive-descent validator written here from RFC 8259
 * with the recognizer's documented limits (at most 2 whitespace bytes before the object and 24
 * in a row inside, nesting to 128, UTF-8 lead bytes C2..F4 with their continuation bytes, a \u
 * surrogate only as a high-low pair).
 *
 * Invariants checked on every input:
 *   - the whole input is a complete object for the recognizer exactly when the validator accepts it;
 *   - fed in two pieces (cut at a position taken from the input) the recognizer answers the same;
 *   - a complete object accepts no further byte.
 */
#include "engine/json_fsm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct rd {
    const unsigned char *p;
    size_t n, i;
    int depth;
} rd;

static bool is_ws(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool digit(unsigned c) { return c >= '0' && c <= '9'; }

static bool skip_ws(rd *s, int max) {
    int k = 0;
    while (s->i < s->n && is_ws(s->p[s->i])) {
        s->i++;
        if (++k > max) return false;
    }
    return true;
}

static bool peek(const rd *s, unsigned c) { return s->i < s->n && s->p[s->i] == c; }

/* Four hex digits at s->i into *v. */
static bool hex4(rd *s, unsigned *v) {
    for (int k = 0; k < 4; k++) {
        if (s->i >= s->n) return false;
        const unsigned h = s->p[s->i++];
        if (!(digit(h) || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) return false;
        *v = *v * 16 + (digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return true;
}

static bool string(rd *s) {
    if (!peek(s, '"')) return false;
    s->i++;
    while (s->i < s->n) {
        const unsigned c = s->p[s->i++];
        if (c == '"') return true;
        if (c < 0x20) return false;
        if (c == '\\') {
            if (s->i >= s->n) return false;
            const unsigned e = s->p[s->i++];
            if (e == 'u') {
                /* a surrogate only as a high-low pair (\uD800-\uDBFF then \uDC00-\uDFFF), as strict
                 * parsers read it and the recognizer is documented to (json_fsm.h) */
                unsigned v = 0;
                if (!hex4(s, &v) || (v >= 0xDC00 && v <= 0xDFFF)) return false;
                if (v >= 0xD800 && v <= 0xDBFF) {
                    unsigned lo = 0;
                    if (s->i + 2 > s->n || s->p[s->i] != '\\' || s->p[s->i + 1] != 'u') return false;
                    s->i += 2;
                    if (!hex4(s, &lo) || lo < 0xDC00 || lo > 0xDFFF) return false;
                }
            } else if (!(e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't')) {
                return false;
            }
            continue;
        }
        if (c < 0x80) continue;
        const int more = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        if (more < 0) return false;
        for (int k = 0; k < more; k++)
            if (s->i >= s->n || (s->p[s->i++] & 0xC0) != 0x80) return false;
    }
    return false;
}

static bool number(rd *s) {
    if (peek(s, '-')) s->i++;
    if (peek(s, '0')) s->i++;
    else if (s->i < s->n && s->p[s->i] >= '1' && s->p[s->i] <= '9')
        while (s->i < s->n && digit(s->p[s->i])) s->i++;
    else return false;
    if (peek(s, '.')) {
        s->i++;
        if (s->i >= s->n || !digit(s->p[s->i])) return false;
        while (s->i < s->n && digit(s->p[s->i])) s->i++;
    }
    if (peek(s, 'e') || peek(s, 'E')) {
        s->i++;
        if (peek(s, '+') || peek(s, '-')) s->i++;
        if (s->i >= s->n || !digit(s->p[s->i])) return false;
        while (s->i < s->n && digit(s->p[s->i])) s->i++;
    }
    return true;
}

static bool literal(rd *s, const char *w) {
    for (; *w; w++, s->i++)
        if (s->i >= s->n || s->p[s->i] != (unsigned char)*w) return false;
    return true;
}

static bool value(rd *s);

static bool container(rd *s, bool obj) {
    if (++s->depth > FL_JSON_MAX_DEPTH) return false;
    s->i++; /* the bracket */
    if (!skip_ws(s, FL_JSON_MAX_WS)) return false;
    const unsigned close = obj ? '}' : ']';
    if (peek(s, close)) {
        s->i++;
        s->depth--;
        return true;
    }
    for (;;) {
        if (obj) {
            if (!string(s) || !skip_ws(s, FL_JSON_MAX_WS) || !peek(s, ':')) return false;
            s->i++;
            if (!skip_ws(s, FL_JSON_MAX_WS)) return false;
        }
        if (!value(s) || !skip_ws(s, FL_JSON_MAX_WS)) return false;
        if (peek(s, close)) {
            s->i++;
            s->depth--;
            return true;
        }
        if (!peek(s, ',')) return false;
        s->i++;
        if (!skip_ws(s, FL_JSON_MAX_WS)) return false;
    }
}

static bool value(rd *s) {
    if (s->i >= s->n) return false;
    switch (s->p[s->i]) {
    case '{': return container(s, true);
    case '[': return container(s, false);
    case '"': return string(s);
    case 't': return literal(s, "true");
    case 'f': return literal(s, "false");
    case 'n': return literal(s, "null");
    default: return number(s);
    }
}

static bool valid_object(const uint8_t *d, size_t n) {
    rd s = {d, n, 0, 0};
    if (!skip_ws(&s, FL_JSON_MAX_WS_LEAD) || !peek(&s, '{')) return false;
    return container(&s, true) && s.i == n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 1 << 16) return 0;
    const size_t cut = data[0] % size; /* the first byte picks the split; the rest is the text */
    const uint8_t *t = data + 1;
    const size_t n = size - 1;
    fl_json_fsm a, b;
    fl_json_fsm_init(&a);
    fl_json_fsm_init(&b);
    const bool whole = fl_json_fsm_feed(&a, (const char *)t, (int32_t)n);
    const bool split = fl_json_fsm_feed(&b, (const char *)t, (int32_t)(cut < n ? cut : n)) &&
                       fl_json_fsm_feed(&b, (const char *)t + (cut < n ? cut : n), (int32_t)(n - (cut < n ? cut : n)));
    if (whole != split || (whole && fl_json_fsm_done(&a) != fl_json_fsm_done(&b))) abort();
    const bool done = whole && fl_json_fsm_done(&a);
    if (done != valid_object(t, n)) abort();
    if (done) {
        const char x = ' ';
        if (fl_json_fsm_feed(&a, &x, 1)) abort();
    }
    return 0;
}
