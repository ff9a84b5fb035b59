/*
 * json_fsm.h - a byte-level recognizer of one JSON object (RFC 8259), for constrained decoding
 * ("response_format": {"type": "json_object"}).
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
 * Nothing is accepted after the closing brace.
 */
#ifndef FL_JSON_FSM_H
#define FL_JSON_FSM_H

#include <stdbool.h>
#include <stdint.h>

#define FL_JSON_MAX_DEPTH 128
#define FL_JSON_MAX_WS 24      /* a newline and 20 spaces of indentation, and some */
#define FL_JSON_MAX_WS_LEAD 2

typedef struct fl_json_fsm {
    uint8_t st;         /* state (json_fsm.c) */
    uint8_t sub;        /* literal position, \u digits left, UTF-8 continuation bytes left */
    uint8_t ws;         /* whitespace bytes in a row */
    uint8_t key;        /* the string being read is an object key */
    uint8_t lit;        /* which literal (0 true, 1 false, 2 null) */
    uint16_t depth;     /* open containers */
    uint64_t obj[FL_JSON_MAX_DEPTH / 64]; /* bit d: container at depth d is an object (else an array) */
} fl_json_fsm;

void fl_json_fsm_init(fl_json_fsm *f);
/* Feed n bytes.  false: some byte cannot continue a valid document (f is then unspecified). */
bool fl_json_fsm_feed(fl_json_fsm *f, const char *bytes, int32_t n);
/* The object is complete (nothing more may follow). */
bool fl_json_fsm_done(const fl_json_fsm *f);
/* Inside a string, where any plain text (fl_json_plain) is accepted and changes nothing: a
 * vocabulary mask can skip feeding such tokens. */
bool fl_json_fsm_in_string(const fl_json_fsm *f);
/* The n bytes are plain string text: printable ASCII other than '"' and '\\'. */
bool fl_json_plain(const char *bytes, int32_t n);

#endif
