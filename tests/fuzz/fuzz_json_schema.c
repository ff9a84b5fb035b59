/*
 * fuzz_json_schema.c - libFuzzer target for constrained decoding by JSON Schema: the compiler
 * (src/engine/json_schema.c) on arbitrary schema text and the recognizer in schema mode
 * (src/engine/json_fsm.c) on an arbitrary document.
 *
 * Input: a split byte, the schema text up to the first NUL byte, then the document.
 * Invariants checked on every input:
 *   - compiling never crashes or leaks; a refusal leaves no schema and says why;
 *   - fed in two pieces (cut at a position taken from the split byte), and continued from a copy
 *     made at the cut (fl_json_fsm_copy), the recognizer answers as when fed whole;
 *   - a complete value accepts no further byte, and a value that is complete parses as JSON.
 */
#include "engine/json_fsm.h"
#include "engine/json_schema.h"

#include "core/alloc.h"
#include "core/status.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 1 complete, 0 a prefix, -1 refused */
static int feed(const fl_json_schema *s, const char *d, size_t n, size_t cut, bool via_copy) {
    static fl_json_fsm f, g; /* (large: off the fuzzer's stack) */
    fl_json_fsm_init_schema(&f, s);
    if (!fl_json_fsm_feed(&f, d, (int32_t)cut)) return -1;
    fl_json_fsm *h = &f;
    if (via_copy) {
        fl_json_fsm_copy(&g, &f);
        h = &g;
    }
    if (!fl_json_fsm_feed(h, d + cut, (int32_t)(n - cut))) return -1;
    if (!fl_json_fsm_done(h)) return 0;
    for (int c = 0; c < 256; c++) {
        static fl_json_fsm t;
        fl_json_fsm_copy(&t, h);
        const char b = (char)c;
        if (fl_json_fsm_feed(&t, &b, 1)) __builtin_trap(); /* invariant: nothing after a complete value */
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fl_mem_install_cjson_hooks();
    if (size < 2 || size > 8192) return 0;
    const size_t split = data[0];
    const char *p = (const char *)data + 1;
    const size_t rest = size - 1;
    const char *nul = memchr(p, 0, rest);
    if (!nul) return 0;
    char *schema = malloc((size_t)(nul - p) + 1);
    if (!schema) return 0;
    memcpy(schema, p, (size_t)(nul - p));
    schema[nul - p] = 0;
    const char *doc = nul + 1;
    const size_t n = rest - (size_t)(nul - p) - 1;
    fl_json_schema *s = (fl_json_schema *)&s;
    const fl_status st = fl_json_schema_compile(schema, &s);
    if (st != FL_OK) {
        if (s || !fl_last_error()[0]) __builtin_trap(); /* invariant: refused with a reason, nothing left */
    } else {
        const size_t cut = n ? split % (n + 1) : 0;
        const int whole = feed(s, doc, n, n, false);
        if (feed(s, doc, n, cut, false) != whole || feed(s, doc, n, cut, true) != whole) __builtin_trap();
        if (whole == 1) { /* a complete value is JSON */
            cJSON *v = cJSON_ParseWithLengthOpts(doc, n, NULL, 0);
            if (!v) __builtin_trap();
            cJSON_Delete(v);
        }
        fl_json_schema_free(s);
    }
    free(schema);
    return 0;
}
