/*
 * json_schema.h - a JSON Schema compiled for constrained decoding ("response_format":
 * {"type": "json_schema", ...}, vLLM's guided_json, llama.cpp's json_schema).
 *
 * The compiled form is a graph of nodes that the byte-level recognizer (json_fsm.h) walks: at
 * each value it looks up the node that a value starting with a given class of byte (object,
 * array, string, number, true/false, null) must follow, so a union (anyOf / oneOf / a list of
 * types) is resolved by the value's first byte.  Supported, with the rest refused by name:
 *   - type (a name or a list), enum, const, nullable (OpenAPI);
 *   - objects: properties, required, additionalProperties (false or absent: only the declared
 *     properties, as llama.cpp; true or a schema: others too; an object schema with no
 *     properties and no additionalProperties takes any members); each declared property at
 *     most once (undeclared names are not remembered, so they may repeat), in declared order (as
 *     OpenAI's structured outputs and xgrammar: an optional one may be skipped, a required one
 *     not; undeclared ones between them), every required one before the closing brace;
 *   - arrays: items, minItems, maxItems;  strings: minLength, maxLength (in characters),
 *     pattern (the whole decoded string one match, on PCRE2's DFA: regex_guide.h's
 *     fl_regex_str, which says what it refuses); format date, time, date-time, uuid, ipv4 and
 *     email as patterns (json_schema.c FORMATS; not with pattern);
 *   - integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (within +-10^15);
 *   - anyOf / oneOf whose alternatives start with different classes of byte (a nullable field,
 *     a string or a number, ...); allOf of one schema; $ref to the document ("#", "#/$defs/X",
 *     any JSON pointer), recursion included;
 *   - annotations ignored: title, description, default, examples, other formats, $schema, $id,
 *     $comment, deprecated, readOnly, writeOnly, $defs, definitions.
 * At most FL_JS_MAX_PROPS properties per object and FL_JS_MAX_ENUM values per enum.  The root
 * must not admit a bare number (nothing would end it).
 */
#ifndef FL_JSON_SCHEMA_H
#define FL_JSON_SCHEMA_H

#include "fitllm.h"

#include <stddef.h>
#include <stdint.h>

/* classes of value, by their first byte */
enum { FL_JS_NULL, FL_JS_BOOL, FL_JS_NUM, FL_JS_STR, FL_JS_ARR, FL_JS_OBJ, FL_JS_NCLASS };

/* The class of a value that starts with byte c, -1 for none. */
static inline int fl_js_class_of_byte(unsigned c) {
    switch (c) {
    case '{': return FL_JS_OBJ;
    case '[': return FL_JS_ARR;
    case '"': return FL_JS_STR;
    case 't': case 'f': return FL_JS_BOOL;
    case 'n': return FL_JS_NULL;
    default: return c == '-' || (c >= '0' && c <= '9') ? FL_JS_NUM : -1;
    }
}

#define FL_JS_MAX_PROPS 64
#define FL_JS_MAX_ENUM 64
#define FL_JS_UNBOUNDED UINT32_MAX
#define FL_JS_INT_LIMIT 1000000000000000LL /* integer bounds beyond +-10^15 are refused */

typedef struct fl_js_node {
    int32_t cls[FL_JS_NCLASS]; /* node a value of this class follows; -1: not allowed */
    /* numbers */
    uint8_t integer;           /* integers only */
    uint8_t has_min, has_max;  /* integer bounds (inclusive) */
    int64_t min, max;
    /* objects: properties [p0, p0 + np) of the schema's strings */
    int32_t p0, np;
    uint64_t required;         /* bit i: property p0 + i */
    int32_t addl;              /* node of undeclared members; -1: none allowed */
    /* arrays */
    int32_t items;
    uint32_t min_items, max_items;
    /* strings (characters: code points, an escape one) */
    uint32_t min_len, max_len;
    int32_t rx;                /* pattern: the schema's rx[rx], -1 none */
    /* enum / const: the values' compact JSON texts [e0, e0 + ne) of the schema's strings */
    int32_t e0, ne;
} fl_js_node;

/* a property name (JSON-escaped, without its quotes: the bytes a key must be) or an enum value's
 * compact JSON text */
typedef struct fl_js_str {
    char *p;
    uint32_t len;
    int32_t node;              /* a property: its value's node (else -1) */
} fl_js_str;

typedef struct fl_json_schema {
    fl_js_node *nodes;
    int32_t n_nodes, cap_nodes;
    fl_js_str *str;            /* property names, then their value's node; enum texts */
    int32_t n_str, cap_str;
    struct fl_regex_str **rx;  /* string patterns */
    int32_t n_rx, cap_rx;
    int32_t root;
    int raw;                   /* choices (fl_json_schema_choices): the root's texts are plain text */
} fl_json_schema;

/* Compile the schema text (JSON).  FL_ERR_INVALID with a message naming the place (a JSON
 * pointer) and what is wrong or unsupported; FL_ERR_NOMEM. */
fl_status fl_json_schema_compile(const char *text, fl_json_schema **out);
void fl_json_schema_free(fl_json_schema *s);
/* vLLM's guided_choice: the output is exactly one of the n texts (plain text, not JSON), n in
 * 1..FL_JS_MAX_ENUM, each non-empty and different.  The recognizer then takes no whitespace
 * around it, and says the text may end (fl_json_fsm_may_end) where a choice is complete and a
 * longer one could still follow.  FL_ERR_INVALID naming the fault; FL_ERR_NOMEM. */
fl_status fl_json_schema_choices(const char *const *texts, int32_t n, fl_json_schema **out);

#endif
