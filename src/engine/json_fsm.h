/*
 * json_fsm.h - a byte-level recognizer of one JSON object (RFC 8259), for constrained decoding
 * ("response_format": {"type": "json_object"}), or of one value of a JSON Schema (json_schema.h).
 *
 * The state is a small value (copied freely): the engine keeps one per constrained request, and
 * to mask the vocabulary at a step it feeds each token's bytes to a copy and keeps the tokens the
 * copy accepts.  Fed byte by byte, the recognizer accepts exactly the prefixes of documents
 * made of optional whitespace and one object, and says when the object is complete:
 *   - strings: no raw control bytes, escapes \" \\ \/ \b \f \n \r \t \uXXXX, UTF-8 sequences
 *     with a valid lead byte (C2..F4) and their continuation bytes;
 *   - numbers: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?;
 *   - literals true, false, null; nesting up to FL_JSON_MAX_DEPTH;
 *   - at most FL_JSON_MAX_WS whitespace bytes in a row, and FL_JSON_MAX_WS_LEAD before the
 *     object (a sampled model could otherwise spend its whole budget on blank lines).
 * Nothing is accepted after the closing brace.  With a schema, whitespace between tokens is
 * one space, or one or two newlines and an indent of up to FL_JSON_MAX_INDENT spaces or tabs,
 * and a string with a pattern is matched character by character as decoded (an escape is the
 * character it stands for; its UTF-8 must be well formed, and \u escapes of surrogates are
 * refused in it: such characters are written as themselves).
 */
#ifndef FL_JSON_FSM_H
#define FL_JSON_FSM_H

#include "engine/regex_guide.h"

#include <stdbool.h>
#include <stdint.h>

#define FL_JSON_MAX_DEPTH 128
#define FL_JSON_MAX_WS 24      /* a newline and 20 spaces of indentation, and some */
#define FL_JSON_MAX_WS_LEAD 2
#define FL_JSON_MAX_INDENT 20  /* schema mode: whitespace is " " or 1-2 newlines and this many spaces / tabs */

struct fl_json_schema;

/* an open container */
typedef struct fl_json_frame {
    uint64_t seen;      /* object with a schema: declared properties given */
    uint32_t count;     /* array: values begun */
    int32_t node;       /* its schema node (schema mode) */
    int32_t vnode;      /* object: the node of the current member's value */
    uint8_t obj;        /* an object (else an array) */
} fl_json_frame;

typedef struct fl_json_fsm {
    uint8_t st;         /* state (json_fsm.c) */
    uint8_t sub;        /* literal position, \u digits left, UTF-8 continuation bytes left */
    uint8_t ws;         /* whitespace bytes in a row (schema mode: newlines, then indent) */
    uint8_t wsk;        /* schema mode: the whitespace run so far (json_fsm.c's schema_ws) */
    uint8_t key;        /* the string being read is an object key */
    uint8_t lit;        /* which literal (0 true, 1 false, 2 null) */
    uint8_t num_neg;    /* the integer being read (bounded, schema mode) is negative */
    uint8_t num_nd;     /* its digits so far */
    uint8_t low;        /* the \u escape being read is a surrogate pair's low half */
    uint16_t depth;     /* open containers */
    const struct fl_json_schema *sc; /* NULL: any one object (json_object) */
    int32_t node;       /* schema mode: node of the string / number / enum value being read */
    uint32_t nch;       /* characters of the string value so far */
    uint32_t pos;       /* bytes of the key / enum text matched */
    uint64_t cand;      /* the declared properties the key may still be / enum texts the value may be */
    int64_t num_v;      /* magnitude of the bounded integer so far (saturating) */
    uint8_t rx_on;      /* schema mode: the string value being read has a pattern (rx below) */
    uint8_t rxn;        /* its character being read: UTF-8 bytes in rxb so far */
    uint8_t rxb[4];
    uint16_t rxu;       /* its \u escape's value so far */
    fl_json_frame fr[FL_JSON_MAX_DEPTH]; /* [depth]: only these are live (fl_json_fsm_copy) */
    fl_regex_state rx;  /* with rx_on: the pattern's state after the string's characters so far */
} fl_json_fsm;

/* Any one object (json_object). */
void fl_json_fsm_init(fl_json_fsm *f);
/* One value of the compiled schema (json_schema.h; it must outlive f): the same lexical rules,
 * and at every value, key and closing bracket what the schema allows. */
void fl_json_fsm_init_schema(fl_json_fsm *f, const struct fl_json_schema *sc);
/* *dst = *src, copying only the live frames (and the pattern's state while it is in use). */
void fl_json_fsm_copy(fl_json_fsm *dst, const fl_json_fsm *src);
/* Feed n bytes.  false: some byte cannot continue a valid document (f is then unspecified). */
bool fl_json_fsm_feed(fl_json_fsm *f, const char *bytes, int32_t n);
/* The value is complete (nothing more may follow). */
bool fl_json_fsm_done(const fl_json_fsm *f);
/* The output may end here: complete, or (choices) a complete choice that a longer one extends. */
bool fl_json_fsm_may_end(const fl_json_fsm *f);
/* Inside a string where any plain text (fl_json_plain) is accepted and changes nothing that
 * decides what may follow: a vocabulary mask can skip feeding such tokens. */
bool fl_json_fsm_in_string(const fl_json_fsm *f);
/* The n bytes are plain string text: printable ASCII other than '"' and '\\'. */
bool fl_json_plain(const char *bytes, int32_t n);

#endif
