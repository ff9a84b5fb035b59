/* The JSON recognizer of constrained decoding (see json_fsm.h): a lexer for RFC 8259 whose
 * value starts, keys, commas and closing brackets also ask the schema, when there is one. */
#include "engine/json_fsm.h"

#include "engine/json_schema.h"

#include <stddef.h>
#include <string.h>

enum {
    S_START,      /* before the top-level object: whitespace or '{' */
    S_VALUE,      /* a value must start (after ':' or ',' in an array) */
    S_ARR_FIRST,  /* after '[': a value or ']' */
    S_OBJ_FIRST,  /* after '{': a key or '}' */
    S_OBJ_KEY,    /* after ',' in an object: a key */
    S_COLON,      /* after a key */
    S_AFTER,      /* after a value inside a container: ',' or its closing bracket */
    S_STR,        /* inside a string */
    S_UTF8,       /* inside a UTF-8 sequence of a string: sub continuation bytes left */
    S_ESC,        /* after a backslash */
    S_HEX,        /* \u: sub hex digits left (of a low surrogate's, where low) */
    S_LOW_ESC,    /* after a high surrogate's \uD800-DBFF: its low half's backslash */
    S_LOW_U,      /* and its u */
    S_NUM_MINUS,  /* after '-' */
    S_NUM_ZERO,   /* after a leading 0 */
    S_NUM_INT,    /* in the integer digits */
    S_NUM_DOT,    /* after '.' */
    S_NUM_FRAC,   /* in the fraction digits */
    S_NUM_E,      /* after 'e' */
    S_NUM_ESIGN,  /* after the exponent's sign */
    S_NUM_EXP,    /* in the exponent digits */
    S_LIT,        /* in true / false / null: sub characters matched */
    S_ENUM,       /* in an enum / const value: pos bytes of the texts in cand matched */
    S_DONE,       /* the object is closed */
};

static const char *const LITS[3] = {"true", "false", "null"};

void fl_json_fsm_init(fl_json_fsm *f) { memset(f, 0, offsetof(fl_json_fsm, fr)); }

void fl_json_fsm_init_schema(fl_json_fsm *f, const fl_json_schema *sc) {
    fl_json_fsm_init(f);
    f->sc = sc;
}

void fl_json_fsm_copy(fl_json_fsm *dst, const fl_json_fsm *src) {
    memcpy(dst, src, offsetof(fl_json_fsm, fr) + (size_t)src->depth * sizeof src->fr[0]);
    if (src->rx_on) {
        dst->rx.rs = src->rx.rs;
        if (src->rx.rs) memcpy(dst->rx.ws, src->rx.ws, sizeof dst->rx.ws);
    }
}

bool fl_json_fsm_done(const fl_json_fsm *f) { return f->st == S_DONE; }

bool fl_json_fsm_may_end(const fl_json_fsm *f) {
    if (f->st == S_DONE) return true;
    if (f->st != S_ENUM || !f->sc || !f->sc->raw) return false;
    const fl_js_node *n = &f->sc->nodes[f->node];
    for (int32_t i = 0; i < n->ne; i++)
        if (((f->cand >> i) & 1) && f->sc->str[n->e0 + i].len == f->pos) return true;
    return false;
}

bool fl_json_fsm_in_string(const fl_json_fsm *f) {
    if (f->st != S_STR || f->rx_on) return false;
    return !f->sc || (!f->key && f->sc->nodes[f->node].max_len == FL_JS_UNBOUNDED);
}

bool fl_json_plain(const char *bytes, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        const unsigned c = (unsigned char)bytes[i];
        if (c < 0x20 || c > 0x7E || c == '"' || c == '\\') return false;
    }
    return true;
}

static bool top_is_obj(const fl_json_fsm *f) { return f->fr[f->depth - 1].obj; }

static void value_done(fl_json_fsm *f) { f->st = f->depth == 0 ? S_DONE : S_AFTER; }

static bool open_container(fl_json_fsm *f, bool obj, int32_t node) {
    if (f->depth >= FL_JSON_MAX_DEPTH) return false;
    f->fr[f->depth++] = (fl_json_frame){0, 0, node, -1, obj};
    f->st = obj ? S_OBJ_FIRST : S_ARR_FIRST;
    return true;
}

/* ---- schema mode ---- */

static const fl_js_node *nd(const fl_json_fsm *f, int32_t n) { return &f->sc->nodes[n]; }

/* the node the value about to start must follow */
static int32_t expected(const fl_json_fsm *f) {
    if (f->depth == 0) return f->sc->root;
    const fl_json_frame *t = &f->fr[f->depth - 1];
    return t->obj ? t->vnode : nd(f, t->node)->items;
}

#define INT_SAT 100000000000000001LL /* magnitudes saturate here (10^17 + 1: past any bound) */
#define INT_INF 1000000000000000000LL

static int64_t sat_mul10(int64_t x) { return x >= INT_SAT / 10 ? INT_SAT : x * 10; }

/* Can the integer being read (sign num_neg, num_nd digits of magnitude num_v) still end inside
 * the node's bounds?  (done: must it be inside them as it stands.) */
static bool int_feasible(const fl_json_fsm *f, bool done) {
    const fl_js_node *n = nd(f, f->node);
    const int64_t lo = n->has_min ? n->min : -INT_INF, hi = n->has_max ? n->max : INT_INF;
    /* the magnitudes allowed for this sign */
    int64_t lm, hm;
    if (f->num_neg) lm = hi < 0 ? -hi : 0, hm = -lo;
    else lm = lo > 0 ? lo : 0, hm = hi;
    if (hm < lm || hm < 0) return false;
    if (f->num_nd == 0) return true; /* any magnitude still */
    if (done) return f->num_v >= lm && f->num_v <= hm;
    const bool zero = f->num_v == 0; /* a leading 0 takes no more digits */
    int64_t base = f->num_v, span = 0;
    for (int k = 0; k < 20; k++) {
        if (base > hm) return false;
        if (base + span >= lm) return true;
        if (zero) return false;
        base = sat_mul10(base);
        span = span >= INT_SAT / 10 ? INT_SAT : span * 10 + 9;
    }
    return false;
}

static bool bounded(const fl_json_fsm *f) { return f->sc && (nd(f, f->node)->has_min || nd(f, f->node)->has_max); }

/* after the bytes of an enum text: settle whether the value is complete */
static void enum_settle(fl_json_fsm *f) {
    const fl_js_node *n = nd(f, f->node);
    bool complete = false, longer = false;
    for (int32_t i = 0; i < n->ne; i++)
        if ((f->cand >> i) & 1) {
            if (f->sc->str[n->e0 + i].len == f->pos) complete = true;
            else longer = true;
        }
    if (complete && !longer) value_done(f);
}

static bool enum_step(fl_json_fsm *f, unsigned c) {
    const fl_js_node *n = nd(f, f->node);
    uint64_t next = 0;
    bool complete = false;
    for (int32_t i = 0; i < n->ne; i++)
        if ((f->cand >> i) & 1) {
            const fl_js_str *t = &f->sc->str[n->e0 + i];
            if (t->len == f->pos) complete = true;
            else if ((unsigned char)t->p[f->pos] == c) next |= 1ull << i;
        }
    if (!next) {
        if (!complete) return false;
        value_done(f); /* a number text ended: c continues after it */
        return false;  /* (the caller steps c again) */
    }
    f->cand = next;
    f->pos++;
    enum_settle(f);
    return true;
}

/* the key being read can still become a member the object takes */
static bool key_byte(fl_json_fsm *f, unsigned c) {
    const fl_json_frame *t = &f->fr[f->depth - 1];
    const fl_js_node *n = nd(f, t->node);
    uint64_t next = 0;
    for (int32_t i = 0; i < n->np; i++)
        if ((f->cand >> i) & 1) {
            const fl_js_str *p = &f->sc->str[n->p0 + i];
            if (p->len > f->pos && (unsigned char)p->p[f->pos] == c) next |= 1ull << i;
        }
    f->cand = next;
    f->pos++;
    return next || n->addl >= 0;
}

/* The declared members that may come next in object node n after those in seen: in declared
 * order (as OpenAI's structured outputs, llama.cpp's json-schema-to-grammar and xgrammar write
 * them), so those after the last one given, up to the first required one (it cannot be skipped). */
static uint64_t next_members(const fl_js_node *n, uint64_t seen) {
    const uint64_t all = n->np == 64 ? ~0ull : (1ull << n->np) - 1;
    uint64_t after = all;
    if (seen) {
        const int hi = 63 - __builtin_clzll(seen);
        after = hi >= 63 ? 0 : all & ~((2ull << hi) - 1);
    }
    const uint64_t req = n->required & after;
    if (req) after &= ((req & (~req + 1)) << 1) - 1; /* (up to the lowest such bit; bit 63: all) */
    return after;
}

/* the key's closing quote: which member's value follows */
static bool key_end(fl_json_fsm *f) {
    fl_json_frame *t = &f->fr[f->depth - 1];
    const fl_js_node *n = nd(f, t->node);
    for (int32_t i = 0; i < n->np; i++)
        if (((f->cand >> i) & 1) && f->sc->str[n->p0 + i].len == f->pos) {
            if (!((next_members(n, t->seen) >> i) & 1)) return false; /* a member twice, or out of order */
            t->seen |= 1ull << i;
            t->vnode = f->sc->str[n->p0 + i].node;
            return true;
        }
    t->vnode = n->addl;
    return n->addl >= 0;
}

/* another member may follow (a ',' would not strand the object) */
static bool more_members(const fl_json_fsm *f) {
    const fl_json_frame *t = &f->fr[f->depth - 1];
    const fl_js_node *n = nd(f, t->node);
    return n->addl >= 0 || next_members(n, t->seen) != 0;
}

static bool may_close(const fl_json_fsm *f) {
    if (!f->sc) return true;
    const fl_json_frame *t = &f->fr[f->depth - 1];
    const fl_js_node *n = nd(f, t->node);
    return t->obj ? (n->required & ~t->seen) == 0 : t->count >= n->min_items;
}

static bool key_start(fl_json_fsm *f) {
    f->st = S_STR;
    f->key = 1;
    if (!f->sc) return true;
    const fl_json_frame *t = &f->fr[f->depth - 1];
    const fl_js_node *n = nd(f, t->node);
    const uint64_t all = n->np == 64 ? ~0ull : (1ull << n->np) - 1;
    f->cand = n->addl >= 0 ? all : next_members(n, t->seen); /* (with others allowed, key_end refuses a declared name out of order) */
    f->pos = 0;
    return f->cand || n->addl >= 0;
}

/* choices: the first byte picks the texts that begin with it (enum matching from there) */
static bool choice_start(fl_json_fsm *f, unsigned c) {
    const fl_js_node *n = nd(f, f->sc->root);
    uint64_t cand = 0;
    for (int32_t i = 0; i < n->ne; i++)
        if ((unsigned char)f->sc->str[n->e0 + i].p[0] == c) cand |= 1ull << i;
    if (!cand) return false;
    f->st = S_ENUM;
    f->node = f->sc->root;
    f->cand = cand;
    f->pos = 1;
    enum_settle(f);
    return true;
}

static bool value_start(fl_json_fsm *f, unsigned c) {
    int32_t node = -1;
    if (f->sc) {
        const int k = fl_js_class_of_byte(c);
        if (k < 0) return false;
        node = nd(f, expected(f))->cls[k];
        if (node < 0) return false;
        const fl_js_node *n = nd(f, node);
        if (n->ne) {
            uint64_t cand = 0;
            for (int32_t i = 0; i < n->ne; i++)
                if ((unsigned char)f->sc->str[n->e0 + i].p[0] == c) cand |= 1ull << i;
            if (!cand) return false;
            f->st = S_ENUM;
            f->node = node;
            f->cand = cand;
            f->pos = 1;
            enum_settle(f);
            return true;
        }
        f->node = node;
    }
    switch (c) {
    case '{': return open_container(f, true, node);
    case '[': return open_container(f, false, node);
    case '"':
        f->st = S_STR;
        f->key = 0;
        f->nch = 0;
        f->rx_on = f->sc && nd(f, node)->rx >= 0;
        if (f->rx_on) fl_regex_state_init(&f->rx);
        return true;
    case '-':
        f->st = S_NUM_MINUS;
        f->num_neg = 1, f->num_nd = 0, f->num_v = 0;
        return !bounded(f) || int_feasible(f, false);
    case '0':
        f->st = S_NUM_ZERO;
        f->num_neg = 0, f->num_nd = 1, f->num_v = 0;
        return !bounded(f) || int_feasible(f, false);
    case 't': case 'f': case 'n':
        f->st = S_LIT;
        f->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        f->sub = 1;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            f->st = S_NUM_INT;
            f->num_neg = 0, f->num_nd = 1, f->num_v = c - '0';
            return !bounded(f) || int_feasible(f, false);
        }
        return false;
    }
}

/* a digit of a bounded integer */
static bool int_digit(fl_json_fsm *f, unsigned c) {
    f->num_v = f->num_v >= INT_SAT / 10 ? INT_SAT : f->num_v * 10 + (c - '0');
    if (f->num_nd < 255) f->num_nd++;
    return int_feasible(f, false);
}

static bool is_digit(unsigned c) { return c >= '0' && c <= '9'; }

/* the pattern of the string value being read (rx_on), and its next character */
static fl_regex_str *pattern_of(const fl_json_fsm *f) { return f->sc->rx[nd(f, f->node)->rx]; }
static bool pattern_step(fl_json_fsm *f, const char *ch, size_t n) { return fl_regex_str_step(pattern_of(f), &f->rx, ch, n) == 1; }
static bool pattern_char(fl_json_fsm *f, char c) { return pattern_step(f, &c, 1); }
static bool is_hex(unsigned c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* Whitespace between tokens in schema mode, as llama.cpp's grammars allow it: one space, or one
 * or two newlines and an indent of up to FL_JSON_MAX_INDENT spaces or tabs (a sampled model
 * could otherwise spend its tokens on blank lines). */
static bool schema_ws(fl_json_fsm *f, unsigned c) {
    switch (f->wsk) {
    case 0: /* the run begins */
        if (c != ' ' && c != '\n') return false;
        f->wsk = c == ' ' ? 1 : 2;
        f->ws = 1;
        return true;
    case 2: /* newlines */
        if (c == '\n') return ++f->ws <= 2;
        if (c != ' ' && c != '\t') return false;
        f->wsk = 3;
        f->ws = 1;
        return true;
    case 3: /* the indent */
        return (c == ' ' || c == '\t') && ++f->ws <= FL_JSON_MAX_INDENT;
    default: /* after one space */
        return false;
    }
}

static bool step(fl_json_fsm *f, unsigned c) {
    const bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    switch (f->st) {
    case S_START: case S_VALUE: case S_ARR_FIRST: case S_OBJ_FIRST: case S_OBJ_KEY: case S_COLON: case S_AFTER:
        if (ws && f->sc && f->sc->raw) break; /* (choices: whitespace is text) */
        if (ws) return f->sc ? schema_ws(f, c) : ++f->ws <= (f->st == S_START ? FL_JSON_MAX_WS_LEAD : FL_JSON_MAX_WS);
        f->ws = f->wsk = 0;
        break;
    default:
        break;
    }
    switch (f->st) {
    case S_START:
        if (f->sc && f->sc->raw) return choice_start(f, c);
        if (f->sc) return value_start(f, c);
        return c == '{' && open_container(f, true, -1);
    case S_ARR_FIRST:
        if (c == ']') {
            if (!may_close(f)) return false;
            f->depth--;
            value_done(f);
            return true;
        }
        if (f->sc && nd(f, f->fr[f->depth - 1].node)->max_items == 0) return false;
        f->fr[f->depth - 1].count = 1;
        return value_start(f, c);
    case S_VALUE: return value_start(f, c);
    case S_OBJ_FIRST: case S_OBJ_KEY:
        if (c == '}' && f->st == S_OBJ_FIRST) {
            if (!may_close(f)) return false;
            f->depth--;
            value_done(f);
            return true;
        }
        if (c != '"') return false;
        return key_start(f);
    case S_COLON:
        if (c != ':') return false;
        f->st = S_VALUE;
        return true;
    case S_AFTER:
        if (c == ',') {
            if (f->sc) {
                fl_json_frame *t = &f->fr[f->depth - 1];
                if (t->obj ? !more_members(f) : t->count >= nd(f, t->node)->max_items) return false;
                t->count++;
            }
            f->st = top_is_obj(f) ? S_OBJ_KEY : S_VALUE;
            return true;
        }
        if (c != (top_is_obj(f) ? '}' : ']') || !may_close(f)) return false;
        f->depth--;
        value_done(f);
        return true;
    case S_STR:
        if (c == '"') {
            if (f->key) {
                if (f->sc && !key_end(f)) return false;
                f->st = S_COLON;
            } else {
                if (f->sc && f->nch < nd(f, f->node)->min_len) return false;
                if (f->rx_on && !fl_regex_str_complete(pattern_of(f), &f->rx)) return false;
                f->rx_on = 0;
                value_done(f);
            }
            return true;
        }
        if (c < 0x20) return false;
        if (f->sc) {
            if (f->key) {
                if (!key_byte(f, c)) return false;
            } else if ((c < 0x80 || c >= 0xC0) && ++f->nch > nd(f, f->node)->max_len) {
                return false; /* a character begins: ASCII, an escape or a lead byte */
            }
        }
        if (c == '\\') { f->st = S_ESC; return true; }
        if (c < 0x80) return !f->rx_on || pattern_char(f, (char)c);
        if (c >= 0xC2 && c <= 0xDF) f->sub = 1;
        else if (c >= 0xE0 && c <= 0xEF) f->sub = 2;
        else if (c >= 0xF0 && c <= 0xF4) f->sub = 3;
        else return false;
        f->st = S_UTF8;
        f->rxb[0] = (uint8_t)c;
        f->rxn = 1;
        return true;
    case S_UTF8:
        if ((c & 0xC0) != 0x80) return false;
        if (f->sc && f->key && !key_byte(f, c)) return false;
        if (f->rxn < 4) f->rxb[f->rxn++] = (uint8_t)c;
        if (--f->sub == 0) {
            f->st = S_STR;
            if (f->rx_on) return pattern_step(f, (const char *)f->rxb, f->rxn);
        }
        return true;
    case S_ESC:
        if (f->sc && f->key && !key_byte(f, c)) return false;
        if (c == 'u') {
            f->st = S_HEX;
            f->sub = 4;
            f->rxu = 0;
            return true;
        }
        if (!strchr("\"\\/bfnrt", (int)c) || c == 0) return false;
        f->st = S_STR;
        if (f->rx_on) { /* the character the escape stands for */
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            return pattern_char(f, to[strchr(from, (int)c) - from]);
        }
        return true;
    case S_HEX:
        if (!is_hex(c)) return false;
        if (f->sc && f->key && !key_byte(f, c)) return false;
        f->rxu = (uint16_t)(f->rxu * 16 + (is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10));
        if (--f->sub == 0) {
            f->st = S_STR;
            /* a surrogate only as a pair, high then low (lone ones are no Unicode: strict parsers,
             * cJSON among them, refuse them) */
            if (f->low) {
                f->low = 0;
                return f->rxu >= 0xDC00 && f->rxu <= 0xDFFF;
            }
            if (f->rxu >= 0xDC00 && f->rxu <= 0xDFFF) return false;
            if (f->rxu >= 0xD800 && f->rxu <= 0xDBFF && !f->rx_on) {
                f->st = S_LOW_ESC;
                return true;
            }
            if (f->rx_on) {
                const uint32_t u = f->rxu;
                if (u >= 0xD800 && u <= 0xDFFF) return false; /* (a surrogate: the character is written as itself) */
                char o[3];
                const size_t n = u < 0x80 ? 1 : u < 0x800 ? 2 : 3;
                if (n == 1) o[0] = (char)u;
                else if (n == 2) o[0] = (char)(0xC0 | (u >> 6)), o[1] = (char)(0x80 | (u & 0x3F));
                else o[0] = (char)(0xE0 | (u >> 12)), o[1] = (char)(0x80 | ((u >> 6) & 0x3F)), o[2] = (char)(0x80 | (u & 0x3F));
                return pattern_step(f, o, n);
            }
        }
        return true;
    case S_LOW_ESC:
    case S_LOW_U:
        if (c != (f->st == S_LOW_ESC ? '\\' : 'u')) return false;
        if (f->sc && f->key && !key_byte(f, c)) return false;
        if (f->st == S_LOW_U) {
            f->sub = 4;
            f->rxu = 0;
            f->low = 1;
        }
        f->st = f->st == S_LOW_ESC ? S_LOW_U : S_HEX;
        return true;
    case S_NUM_MINUS:
        if (c == '0') f->st = S_NUM_ZERO;
        else if (c >= '1' && c <= '9') f->st = S_NUM_INT;
        else return false;
        return !bounded(f) || int_digit(f, c);
    case S_NUM_DOT:
        if (!is_digit(c)) return false;
        f->st = S_NUM_FRAC;
        return true;
    case S_NUM_E:
        if (c == '+' || c == '-') f->st = S_NUM_ESIGN;
        else if (is_digit(c)) f->st = S_NUM_EXP;
        else return false;
        return true;
    case S_NUM_ESIGN:
        if (!is_digit(c)) return false;
        f->st = S_NUM_EXP;
        return true;
    case S_NUM_ZERO: case S_NUM_INT: case S_NUM_FRAC: case S_NUM_EXP: {
        const bool whole = f->sc && nd(f, f->node)->integer; /* no fraction, no exponent */
        if (is_digit(c) && f->st != S_NUM_ZERO) return !(f->st == S_NUM_INT && bounded(f)) || int_digit(f, c);
        if (c == '.' && (f->st == S_NUM_ZERO || f->st == S_NUM_INT) && !whole) { f->st = S_NUM_DOT; return true; }
        if ((c == 'e' || c == 'E') && f->st != S_NUM_EXP && !whole) { f->st = S_NUM_E; return true; }
        if (bounded(f) && !int_feasible(f, true)) return false;
        /* the number ended (numbers sit inside containers): c continues after it */
        value_done(f);
        return step(f, c);
    }
    case S_LIT:
        if (c != (unsigned char)LITS[f->lit][f->sub]) return false;
        if (LITS[f->lit][++f->sub] == 0) value_done(f);
        return true;
    case S_ENUM:
        if (enum_step(f, c)) return true;
        return f->st != S_ENUM && step(f, c); /* a number text ended before c */
    default: /* S_DONE */
        return false;
    }
}

bool fl_json_fsm_feed(fl_json_fsm *f, const char *bytes, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (!step(f, (unsigned char)bytes[i])) return false;
    return true;
}
