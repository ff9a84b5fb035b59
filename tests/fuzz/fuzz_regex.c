/*
 * fuzz_regex.c - libFuzzer target for guided_regex (src/engine/regex_guide.c) on arbitrary
 * patterns and texts.
 *
 * Input: a split byte, the pattern up to the first NUL byte, then the text.
 * Invariants checked on every input:
 *   - compiling never crashes or leaks; a refusal leaves no guide and says why;
 *   - the text fed in two pieces (cut at a position taken from the split byte, each piece
 *     allowed before it is fed) is answered as the text allowed whole, and with the DFA state
 *     carried from piece to piece as with every check rescanning the text;
 *   - where the pattern has no assertion (anchors, \b, lookaround, verbs) and no possessive
 *     quantifier or atomic group (which PCRE2's DFA runs differently), the two matchers
 *     agree: the JIT-compiled (?:PATTERN)\z and the DFA (the same pattern with an empty \Q at its
 *     end, which the wrapped form cannot take) allow the same text and call it complete alike,
 *     unless either meets a limit;
 *   - two prefixes of the text with the same fl_regex_guide_key (the engine's mask cache takes
 *     them for one state) answer the rest of the text alike: allowed, and complete after it;
 *   - ^PATTERN$ answers as PATTERN;
 *   - a pattern of the common subset, rewritten as a grammar (regex_gbnf.c), answers a valid
 *     UTF-8 text as PCRE2 does.
 */
#include "engine/grammar.h"
#include "engine/regex_gbnf.h"
#include "engine/regex_guide.h"

#include "core/alloc.h"
#include "core/status.h"
#include "core/utf8.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 1 allowed whole (2: and complete), 0 not, -1 an error; fed in two pieces at cut */
static int answer(fl_regex_guide *g, const char *t, size_t n, size_t cut) {
    const int a = fl_regex_guide_allows(g, t, cut);
    if (a != 1) return a;
    if (fl_regex_guide_feed(g, t, cut) != FL_OK) return -1;
    const int b = fl_regex_guide_allows(g, t + cut, n - cut);
    if (b != 1) return b;
    if (fl_regex_guide_feed(g, t + cut, n - cut) != FL_OK) return -1;
    return fl_regex_guide_complete(g) ? 2 : 1;
}

static int run(const char *pattern, const char *t, size_t n, size_t cut, bool *refused, bool *dfa) {
    fl_regex_guide *g = (fl_regex_guide *)&g;
    const fl_status st = fl_regex_guide_new(pattern, &g);
    *refused = st != FL_OK;
    if (st != FL_OK) {
        if (g || !fl_last_error()[0]) __builtin_trap(); /* invariant: refused with a reason, nothing left */
        return -2;
    }
    *dfa = fl_regex_guide_on_dfa(g);
    const int whole = answer(g, t, n, n);
    fl_regex_guide_free(g);
    if (fl_regex_guide_new(pattern, &g) != FL_OK) __builtin_trap();
    const int split = answer(g, t, n, cut);
    fl_regex_guide_free(g);
    /* the carried state answers as the rescans do */
    if (fl_regex_guide_new(pattern, &g) != FL_OK) __builtin_trap();
    fl_regex_guide_set_carry(g, false);
    const int rescan = answer(g, t, n, cut);
    fl_regex_guide_free(g);
    if (split >= 0 && rescan >= 0 && split != rescan) __builtin_trap();
    /* a piece alone can fail where the whole text would be allowed only if it is no prefix of a
     * match, so the answers agree unless one of them met a limit */
    if (whole >= 0 && split >= 0 && whole != split) __builtin_trap();
    return whole;
}

/* The guide after t[0, m) fed whole (NULL where not allowed or on an error) */
static fl_regex_guide *fed(const char *pattern, const char *t, size_t m) {
    fl_regex_guide *g;
    if (fl_regex_guide_new(pattern, &g) != FL_OK) __builtin_trap();
    if (fl_regex_guide_allows(g, t, m) != 1 || fl_regex_guide_feed(g, t, m) != FL_OK) {
        fl_regex_guide_free(g);
        return NULL;
    }
    return g;
}

/* Prefixes of t (whole characters, up to 48 bytes) with equal keys answer t's rest alike */
static void keys_agree(const char *pattern, const char *t, size_t n) {
    enum { MAXP = 48 };
    uint8_t keys[MAXP + 1][16];
    size_t at[MAXP + 1];
    int nk = 0;
    for (size_t m = 0; m <= n && m <= MAXP; m++) {
        if (m < n && ((unsigned char)t[m] & 0xC0) == 0x80) continue;
        fl_regex_guide *g = fed(pattern, t, m);
        if (!g) break;
        const bool keyed = fl_regex_guide_key(g, keys[nk]);
        fl_regex_guide_free(g);
        if (!keyed) return;
        at[nk++] = m;
    }
    for (int j = 1; j < nk; j++)
        for (int i = 0; i < j; i++) {
            if (memcmp(keys[i], keys[j], 16)) continue;
            fl_regex_guide *a = fed(pattern, t, at[i]), *b = fed(pattern, t, at[j]);
            if (!a || !b) __builtin_trap();
            const char *rest = t + at[j];
            const size_t nr = n - at[j];
            const int ra = fl_regex_guide_allows(a, rest, nr), rb = fl_regex_guide_allows(b, rest, nr);
            if (ra >= 0 && rb >= 0 && ra != rb) __builtin_trap(); /* invariant: one key, one answer */
            if (ra == 1 && rb == 1 && fl_regex_guide_feed(a, rest, nr) == FL_OK && fl_regex_guide_feed(b, rest, nr) == FL_OK &&
                fl_regex_guide_complete(a) != fl_regex_guide_complete(b))
                __builtin_trap();
            fl_regex_guide_free(a);
            fl_regex_guide_free(b);
        }
}

static bool has_assertion(const char *p) {
    static const char *const marks[] = {"^", "$", "\\b", "\\B", "\\A", "\\z", "\\Z", "\\G", "\\K", "(?=", "(?!", "(?<", "(?*", "(*", "(?C", "\\Q"};
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++)
        if (strstr(p, marks[i])) return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 4096) return 0;
    const size_t splitb = data[0];
    const char *p = (const char *)data + 1;
    const size_t rest = size - 1;
    const char *nul = memchr(p, 0, rest);
    if (!nul) return 0;
    const size_t plen = (size_t)(nul - p);
    char *pattern = malloc(plen + 3);
    if (!pattern) return 0;
    memcpy(pattern, p, plen);
    pattern[plen] = 0;
    const char *t = nul + 1;
    const size_t n = rest - plen - 1;
    size_t cut = n ? splitb % (n + 1) : 0;
    while (cut > 0 && cut < n && ((unsigned char)t[cut] & 0xC0) == 0x80) cut--; /* (the engine feeds whole characters) */
    bool refused, dfa;
    const int a = run(pattern, t, n, cut, &refused, &dfa);
    if (!refused) keys_agree(pattern, t, n);
    if (!refused && a >= 0 && fl_utf8_is_valid(t, n)) { /* the grammar it rewrites to (if any) answers alike */
        char *gb = NULL;
        size_t gl = 0;
        if (fl_regex_to_gbnf(pattern, &gb, &gl) == FL_OK) {
            fl_grammar_guide *g = NULL;
            if (fl_grammar_guide_new(gb, &g) == FL_OK) {
                int r = fl_grammar_guide_allows(g, t, n);
                if (r == 1) {
                    if (fl_grammar_guide_feed(g, t, n) != FL_OK) __builtin_trap();
                    r = fl_grammar_guide_complete(g) ? 2 : 1;
                }
                if (r >= 0 && r != a) __builtin_trap(); /* invariant: the rewrite says what PCRE2 says */
                fl_grammar_guide_free(g);
            }
            fl_free(FL_MEM_GUIDE, gb, gl + 1);
        }
    }
    /* ^PATTERN$ says what PATTERN does (the output is one whole match): the same answer, where the
     * $ is an anchor (not after a backslash, not in an open \Q) */
    if (!refused && plen > 0 && pattern[plen - 1] != '\\' && !strstr(pattern, "\\Q")) {
        char *anch = malloc(plen + 3);
        if (anch) {
            anch[0] = '^';
            memcpy(anch + 1, pattern, plen);
            memcpy(anch + 1 + plen, "$", 2);
            bool refused3, dfa3;
            const int c = run(anch, t, n, cut, &refused3, &dfa3);
            if (!refused3 && a >= 0 && c >= 0 && a != c) __builtin_trap(); /* invariant: anchors change nothing */
            free(anch);
        }
    }
    /* (a possessive quantifier or an atomic group: PCRE2's DFA can refuse a prefix the
     * backtracking matcher takes, e.g. ()++.+.ab on "aaaa": a difference of the two matchers,
     * docs/SERVER.md) */
    const bool atomic = strstr(pattern, "++") || strstr(pattern, "*+") || strstr(pattern, "?+") || strstr(pattern, "}+") ||
                        strstr(pattern, "(?>");
    if (!refused && !dfa && !has_assertion(pattern) && !atomic) {
        memcpy(pattern + plen, "\\Q", 3);
        bool refused2, dfa2;
        const int b = run(pattern, t, n, cut, &refused2, &dfa2);
        if (!refused2 && !dfa2) __builtin_trap(); /* the same pattern, on the DFA (or past its workspace: refused) */
        if (!refused2 && a >= 0 && b >= 0 && a != b) __builtin_trap(); /* invariant: the two matchers agree */
    }
    free(pattern);
    if (!fl_mem_all_zero()) __builtin_trap();
    return 0;
}
