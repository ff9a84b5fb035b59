/* The JSON object recognizer (see json_fsm.h). */
#include "engine/json_fsm.h"

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
    S_HEX,        /* \u: sub hex digits left */
    S_NUM_MINUS,  /* after '-' */
    S_NUM_ZERO,   /* after a leading 0 */
    S_NUM_INT,    /* in the integer digits */
    S_NUM_DOT,    /* after '.' */
    S_NUM_FRAC,   /* in the fraction digits */
    S_NUM_E,      /* after 'e' */
    S_NUM_ESIGN,  /* after the exponent's sign */
    S_NUM_EXP,    /* in the exponent digits */
    S_LIT,        /* in true / false / null: sub characters matched */
    S_DONE,       /* the object is closed */
};

static const char *const LITS[3] = {"true", "false", "null"};

void fl_json_fsm_init(fl_json_fsm *f) { memset(f, 0, sizeof *f); }

bool fl_json_fsm_done(const fl_json_fsm *f) { return f->st == S_DONE; }

bool fl_json_fsm_in_string(const fl_json_fsm *f) { return f->st == S_STR; }

bool fl_json_plain(const char *bytes, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        const unsigned c = (unsigned char)bytes[i];
        if (c < 0x20 || c > 0x7E || c == '"' || c == '\\') return false;
    }
    return true;
}

static bool top_is_obj(const fl_json_fsm *f) {
    const unsigned d = f->depth - 1u;
    return (f->obj[d / 64] >> (d % 64)) & 1;
}

static void value_done(fl_json_fsm *f) { f->st = f->depth == 0 ? S_DONE : S_AFTER; }

static bool open_container(fl_json_fsm *f, bool obj) {
    if (f->depth >= FL_JSON_MAX_DEPTH) return false;
    const unsigned d = f->depth++;
    if (obj) f->obj[d / 64] |= 1ull << (d % 64);
    else f->obj[d / 64] &= ~(1ull << (d % 64));
    f->st = obj ? S_OBJ_FIRST : S_ARR_FIRST;
    return true;
}

static bool value_start(fl_json_fsm *f, unsigned c) {
    switch (c) {
    case '{': return open_container(f, true);
    case '[': return open_container(f, false);
    case '"': f->st = S_STR; f->key = 0; return true;
    case '-': f->st = S_NUM_MINUS; return true;
    case '0': f->st = S_NUM_ZERO; return true;
    case 't': case 'f': case 'n':
        f->st = S_LIT;
        f->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        f->sub = 1;
        return true;
    default:
        if (c >= '1' && c <= '9') { f->st = S_NUM_INT; return true; }
        return false;
    }
}

static bool is_digit(unsigned c) { return c >= '0' && c <= '9'; }
static bool is_hex(unsigned c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static bool step(fl_json_fsm *f, unsigned c) {
    const bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    switch (f->st) {
    case S_START: case S_VALUE: case S_ARR_FIRST: case S_OBJ_FIRST: case S_OBJ_KEY: case S_COLON: case S_AFTER:
        if (ws) return ++f->ws <= (f->st == S_START ? FL_JSON_MAX_WS_LEAD : FL_JSON_MAX_WS);
        f->ws = 0;
        break;
    default:
        break;
    }
    switch (f->st) {
    case S_START: return c == '{' && open_container(f, true);
    case S_ARR_FIRST:
        if (c == ']') {
            f->depth--;
            value_done(f);
            return true;
        }
        return value_start(f, c);
    case S_VALUE: return value_start(f, c);
    case S_OBJ_FIRST: case S_OBJ_KEY:
        if (c == '}' && f->st == S_OBJ_FIRST) {
            f->depth--;
            value_done(f);
            return true;
        }
        if (c != '"') return false;
        f->st = S_STR;
        f->key = 1;
        return true;
    case S_COLON:
        if (c != ':') return false;
        f->st = S_VALUE;
        return true;
    case S_AFTER:
        if (c == ',') {
            f->st = top_is_obj(f) ? S_OBJ_KEY : S_VALUE;
            return true;
        }
        if (c != (top_is_obj(f) ? '}' : ']')) return false;
        f->depth--;
        value_done(f);
        return true;
    case S_STR:
        if (c == '"') {
            if (f->key) f->st = S_COLON;
            else value_done(f);
            return true;
        }
        if (c == '\\') { f->st = S_ESC; return true; }
        if (c < 0x20) return false;
        if (c < 0x80) return true;
        if (c >= 0xC2 && c <= 0xDF) f->sub = 1;
        else if (c >= 0xE0 && c <= 0xEF) f->sub = 2;
        else if (c >= 0xF0 && c <= 0xF4) f->sub = 3;
        else return false;
        f->st = S_UTF8;
        return true;
    case S_UTF8:
        if ((c & 0xC0) != 0x80) return false;
        if (--f->sub == 0) f->st = S_STR;
        return true;
    case S_ESC:
        if (c == 'u') {
            f->st = S_HEX;
            f->sub = 4;
            return true;
        }
        if (!strchr("\"\\/bfnrt", (int)c) || c == 0) return false;
        f->st = S_STR;
        return true;
    case S_HEX:
        if (!is_hex(c)) return false;
        if (--f->sub == 0) f->st = S_STR;
        return true;
    case S_NUM_MINUS:
        if (c == '0') f->st = S_NUM_ZERO;
        else if (c >= '1' && c <= '9') f->st = S_NUM_INT;
        else return false;
        return true;
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
    case S_NUM_ZERO: case S_NUM_INT: case S_NUM_FRAC: case S_NUM_EXP:
        if (is_digit(c) && f->st != S_NUM_ZERO) return true;
        if (c == '.' && (f->st == S_NUM_ZERO || f->st == S_NUM_INT)) { f->st = S_NUM_DOT; return true; }
        if ((c == 'e' || c == 'E') && f->st != S_NUM_EXP) { f->st = S_NUM_E; return true; }
        /* the number ended (numbers sit inside containers): c continues after it */
        value_done(f);
        return step(f, c);
    case S_LIT:
        if (c != (unsigned char)LITS[f->lit][f->sub]) return false;
        if (LITS[f->lit][++f->sub] == 0) value_done(f);
        return true;
    default: /* S_DONE */
        return false;
    }
}

bool fl_json_fsm_feed(fl_json_fsm *f, const char *bytes, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (!step(f, (unsigned char)bytes[i])) return false;
    return true;
}
