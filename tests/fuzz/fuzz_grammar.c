/*
 * fuzz_grammar.c - libFuzzer target for GBNF grammars (src/engine/grammar.c) on arbitrary
 * grammars and texts.
 *
 * Input: a split byte, the grammar up to the first NUL byte, then the text.
 * Invariants checked on every input:
 *   - compiling never crashes, hangs or leaks; a refusal leaves no guide and says why;
 *   - the text fed in two pieces (cut where the split byte says, inside a character or not) is
 *     answered as the text fed whole;
 *   - two prefixes of the text (ending inside a character or not) with the same
 *     fl_grammar_guide_key answer the rest alike;
 *   - the vocabulary walk (fl_grammar_guide_mask) over pieces cut from the text (every run of 1
 *     to 4 bytes, and a few with a stray byte) agrees with fl_grammar_guide_allows on each.
 */
#include "engine/grammar.h"

#include "core/alloc.h"
#include "core/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 1 allowed (2: and a sentence), 0 not, -1 an error; fed in two pieces at cut */
static int answer(fl_grammar_guide *g, const char *t, size_t n, size_t cut) {
    const int a = fl_grammar_guide_allows(g, t, cut);
    if (a != 1) return a;
    if (fl_grammar_guide_feed(g, t, cut) != FL_OK) return -1;
    const int b = fl_grammar_guide_allows(g, t + cut, n - cut);
    if (b != 1) return b;
    if (fl_grammar_guide_feed(g, t + cut, n - cut) != FL_OK) return -1;
    return fl_grammar_guide_complete(g) ? 2 : 1;
}

/* the guide after t[0, m) (NULL where not allowed or on an error) */
static fl_grammar_guide *fed(const char *gbnf, const char *t, size_t m) {
    fl_grammar_guide *g;
    if (fl_grammar_guide_new(gbnf, &g) != FL_OK) __builtin_trap();
    if (fl_grammar_guide_allows(g, t, m) != 1 || fl_grammar_guide_feed(g, t, m) != FL_OK) {
        fl_grammar_guide_free(g);
        return NULL;
    }
    return g;
}

static void keys_agree(const char *gbnf, const char *t, size_t n) {
    enum { MAXP = 40 };
    uint8_t key[MAXP + 1][16];
    bool have[MAXP + 1] = {0};
    for (size_t m = 0; m <= n && m <= MAXP; m++) {
        fl_grammar_guide *g = fed(gbnf, t, m);
        if (!g) break;
        fl_grammar_guide_key(g, key[m]);
        have[m] = true;
        fl_grammar_guide_free(g);
    }
    for (size_t i = 0; i <= MAXP; i++)
        for (size_t j = i + 1; j <= MAXP && have[i]; j++) {
            if (!have[j] || memcmp(key[i], key[j], 16)) continue;
            /* the rest after j, after either prefix */
            fl_grammar_guide *a = fed(gbnf, t, i), *b = fed(gbnf, t, j);
            const int ra = answer(a, t + j, n - j, n - j), rb = answer(b, t + j, n - j, n - j);
            fl_grammar_guide_free(a);
            fl_grammar_guide_free(b);
            if (ra >= 0 && rb >= 0 && ra != rb) __builtin_trap();
        }
}

static void walk_agrees(const char *gbnf, const char *t, size_t n) {
    enum { MAXV = 256 };
    static char text[MAXV * 4];
    int64_t off[MAXV + 1];
    int32_t nv = 0, order[MAXV];
    off[0] = 0;
    for (size_t i = 0; i < n && i < 48 && nv < MAXV - 8; i++)
        for (size_t l = 1; l <= 4 && i + l <= n && nv < MAXV - 8; l++) {
            memcpy(text + off[nv], t + i, l);
            off[nv + 1] = off[nv] + (int64_t)l;
            nv++;
        }
    static const char *const extra[] = {"", "\xCE", "a\xFF", "\xE2\x9C\x93"};
    for (size_t k = 0; k < sizeof extra / sizeof *extra; k++) {
        memcpy(text + off[nv], extra[k], strlen(extra[k]));
        off[nv + 1] = off[nv] + (int64_t)strlen(extra[k]);
        nv++;
    }
    uint64_t bits[MAXV / 64];
    if (fl_grammar_vocab_order(text, off, nv, order) != FL_OK) __builtin_trap();
    for (size_t m = 0; m <= n && m <= 8; m++) {
        fl_grammar_guide *g = fed(gbnf, t, m);
        if (!g) return;
        if (fl_grammar_guide_mask(g, text, off, order, nv, bits) == FL_OK)
            for (int32_t v = 0; v < nv; v++) {
                const int64_t len = off[v + 1] - off[v];
                const int want = len ? fl_grammar_guide_allows(g, text + off[v], (size_t)len) : 0;
                if (want >= 0 && want != (int)((bits[v >> 6] >> (v & 63)) & 1)) __builtin_trap();
            }
        fl_grammar_guide_free(g);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 4096) return 0;
    const size_t split = data[0];
    const char *body = (const char *)data + 1;
    const size_t rest = size - 1;
    const char *nul = memchr(body, 0, rest);
    if (!nul) return 0;
    char *gbnf = malloc((size_t)(nul - body) + 1);
    memcpy(gbnf, body, (size_t)(nul - body) + 1);
    const char *t = nul + 1;
    const size_t n = rest - (size_t)(nul - body) - 1;
    fl_grammar_guide *g = (fl_grammar_guide *)&g;
    const fl_status st = fl_grammar_guide_new(gbnf, &g);
    if (st != FL_OK) {
        if (g || !fl_last_error()[0]) __builtin_trap(); /* refused with a reason, nothing left */
    } else {
        fl_grammar_guide_free(g);
        const size_t cut = n ? split % (n + 1) : 0;
        if (fl_grammar_guide_new(gbnf, &g) != FL_OK) __builtin_trap();
        const int whole = answer(g, t, n, n);
        fl_grammar_guide_free(g);
        if (fl_grammar_guide_new(gbnf, &g) != FL_OK) __builtin_trap();
        const int pieces = answer(g, t, n, cut);
        fl_grammar_guide_free(g);
        if (whole >= 0 && pieces >= 0 && whole != pieces) __builtin_trap();
        keys_agree(gbnf, t, n);
        walk_agrees(gbnf, t, n);
    }
    free(gbnf);
    if (!fl_mem_all_zero()) __builtin_trap(); /* nothing leaked */
    return 0;
}
