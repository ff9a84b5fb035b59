/* The regex constraint (engine/regex_guide.c): what a pattern lets through byte by byte, checked
 * on hand-written texts and against glibc's POSIX regex (another implementation) on
 * every short text; refusals; out of memory. */
#include "test.h"

#include "engine/grammar.h"
#include "engine/regex_gbnf.h"
#include "engine/regex_guide.h"

#include <regex.h>
#include <stdlib.h>
#include <string.h>

static bool g_carry = true; /* guides made with the carried state (else every check rescans) */

static fl_regex_guide *guide(const char *pattern) {
    fl_regex_guide *g = NULL;
    if (fl_regex_guide_new(pattern, &g) != FL_OK) fail_msg("refused: %s: %s", pattern, fl_last_error());
    if (!g_carry) fl_regex_guide_set_carry(g, false);
    return g;
}

/* t fed whole: 1 = a match, 0 = the prefix of one, -1 = neither; the answer checked the same
 * whichever split the text came in (allows before each feed), and the same on the DFA (the
 * pattern with an empty \Q at its end, which the wrapped form cannot take) */
static int check(const char *pattern, const char *t) {
    const size_t n = strlen(t);
    int first = -2;
    char dfa[256];
    snprintf(dfa, sizeof dfa, "%s\\Q", pattern);
    for (size_t cut = 0; cut <= 2 * n + 1; cut++) {
        const bool on_dfa = cut > n;
        fl_regex_guide *g = guide(on_dfa ? dfa : pattern);
        assert_int_equal(fl_regex_guide_on_dfa(g), on_dfa);
        const bool carried = fl_regex_guide_carries(g);
        if (on_dfa) cut -= n + 1;
        int r;
        if (fl_regex_guide_allows(g, t, cut) != 1) r = -1;
        else {
            assert_int_equal(fl_regex_guide_feed(g, t, cut), FL_OK);
            const int ok = fl_regex_guide_allows(g, t + cut, n - cut);
            assert_true(ok >= 0);
            if (!ok) r = -1;
            else {
                assert_int_equal(fl_regex_guide_feed(g, t + cut, n - cut), FL_OK);
                assert_int_equal(fl_regex_guide_len(g), n);
                r = fl_regex_guide_complete(g) ? 1 : 0;
            }
        }
        assert_int_equal(fl_regex_guide_carries(g), carried); /* (a carried state stayed in use) */
        fl_regex_guide_free(g);
        if (on_dfa) cut += n + 1;
        /* a split can only fail earlier: a prefix that is no prefix of a match stops there */
        if (cut == n || cut == 2 * n + 1 || r != -1) {
            if (first == -2) first = r;
            else if (r != first) fail_msg("'%s' on '%s': split at %zu says %d, whole %d", pattern, t, cut, r, first);
        }
    }
    return first;
}

static void texts(void) {
    /* anchored at both ends */
    assert_int_equal(check("a", "a"), 1);
    assert_int_equal(check("a", "ab"), -1);
    assert_int_equal(check("a", "ba"), -1);
    assert_int_equal(check("a", ""), 0);
    assert_int_equal(check("a+", "aaa"), 1); /* a match that more a's extend */
    assert_int_equal(check("a|ab", "a"), 1);
    assert_int_equal(check("a|ab", "ab"), 1); /* the longer alternative, not the first found */
    assert_int_equal(check("ab?c", "ac"), 1);
    assert_int_equal(check("ab?c", "ab"), 0);
    assert_int_equal(check("ab?c", "abb"), -1);
    /* the kind of pattern guided_regex is for */
    const char *phone = "\\(\\d{3}\\) \\d{3}-\\d{4}";
    assert_int_equal(check(phone, "(555) 123-4567"), 1);
    assert_int_equal(check(phone, "(555) 12"), 0);
    assert_int_equal(check(phone, "(555) 12a"), -1);
    assert_int_equal(check(phone, "(555) 123-45678"), -1);
    const char *date = "(19|20)\\d\\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])";
    assert_int_equal(check(date, "2026-12-05"), 1);
    assert_int_equal(check(date, "2026-13"), -1);
    assert_int_equal(check(date, "20"), 0);
    assert_int_equal(check("(yes|no|maybe)", "may"), 0);
    assert_int_equal(check("(yes|no|maybe)", "nope"), -1);
    assert_int_equal(check("[a-z]+@[a-z]+\\.(com|org)", "ab@cd.org"), 1);
    assert_int_equal(check("[a-z]+@[a-z]+\\.(com|org)", "ab@cd.c"), 0);
    assert_int_equal(check("\\w+( \\w+){0,2}\\.", "one two three."), 1);
    assert_int_equal(check("\\w+( \\w+){0,2}\\.", "one two three four"), -1);
    /* a leading ^ and a trailing $ say what a whole match is already: dropped (the state stays
     * carried); an escaped $ and one inside an open \Q stay literals */
    assert_int_equal(check("^[ab]+x?$", "abx"), 1);
    assert_int_equal(check("^[ab]+x?$", "ab"), 1);
    assert_int_equal(check("^[ab]+x?$", "xa"), -1);
    assert_int_equal(check("^a|b$", "a"), 1);
    assert_int_equal(check("^a|b$", "b"), 1);
    assert_int_equal(check("^a|b$", "ab"), -1);
    assert_int_equal(check("^a$", "a\n"), -1); /* (kept, the $ let a newline through after a match: a dead end) */
    assert_int_equal(check("a\\$", "a$"), 1);
    assert_int_equal(check("a\\$", "a"), 0);
    assert_int_equal(check("\\Qa\\E$", "a"), 1);
    {
        fl_regex_guide *h = guide("\\Qa$"); /* (an open \Q: its matches run on the DFA) */
        assert_int_equal(fl_regex_guide_allows(h, "a$", 2), 1);
        assert_int_equal(fl_regex_guide_feed(h, "a$", 2), FL_OK);
        assert_true(fl_regex_guide_complete(h));
        fl_regex_guide_free(h);
    }
    assert_int_equal(check("^", ""), 1);
    /* a $ is the end of the output, never the place before a final newline (fuzz_regex found "$$"
     * taking "\n" for the start of a match, where "$" does not) */
    for (int k = 0; k < 4; k++) {
        static const char *const dollars[4] = {"$", "$$", "^$$", "a$\n?"};
        fl_regex_guide *h = guide(dollars[k]);
        assert_int_equal(fl_regex_guide_allows(h, "\n", 1), 0);
        fl_regex_guide_free(h);
    }
    {
        fl_regex_guide *h = guide("^[ab]+x?$");
        assert_int_equal(fl_regex_guide_carries(h), g_carry);
        fl_regex_guide_free(h);
    }
    /* UTF-8: a character is one unit; a text ending inside a character is not offered */
    assert_int_equal(check("caf.", "caf\xc3\xa9"), 1);
    assert_int_equal(check("caf.", "caf\xc3\xa9x"), -1);
    assert_int_equal(check("[\xc3\xa0-\xc3\xbc]x", "\xc3\xa9x"), 1);
    assert_int_equal(check("[\xc3\xa0-\xc3\xbc]x", "ex"), -1);
    fl_regex_guide *g = guide("caf.");
    assert_int_equal(fl_regex_guide_allows(g, "caf\xc3", 4), 0);   /* cut inside a character */
    assert_int_equal(fl_regex_guide_allows(g, "caf\xa9", 4), 0);   /* not UTF-8 */
    assert_int_equal(fl_regex_guide_allows(g, "caf\xe2\x82\xac", 6), 1);
    fl_regex_guide_free(g);
    /* the empty pattern: only the empty text */
    g = guide("");
    assert_true(fl_regex_guide_complete(g));
    assert_int_equal(fl_regex_guide_allows(g, "x", 1), 0);
    fl_regex_guide_free(g);
    /* a pattern ending in a comment runs on the DFA: the same answers */
    g = guide("(?x) a b+ # then nothing");
    assert_true(fl_regex_guide_on_dfa(g));
    assert_int_equal(fl_regex_guide_allows(g, "abb", 3), 1);
    assert_int_equal(fl_regex_guide_allows(g, "a b", 3), 0);
    assert_int_equal(fl_regex_guide_feed(g, "ab", 2), FL_OK);
    assert_true(fl_regex_guide_complete(g));
    fl_regex_guide_free(g);
    /* catastrophic backtracking: the carried DFA state says no at once; rescanning on the anchored
     * form, an error, not a hang */
    char as[64];
    memset(as, 'a', sizeof as);
    for (int carry = 1; carry >= 0; carry--) {
        g = guide("(a+)+b");
        assert_false(fl_regex_guide_on_dfa(g));
        fl_regex_guide_set_carry(g, carry);
        assert_int_equal(fl_regex_guide_carries(g), carry);
        const size_t na = carry ? 16 : 40; /* (past ~40 states alive the carried workspace is full: rescans) */
        assert_int_equal(fl_regex_guide_allows(g, as, na), 1); /* (a hard partial match comes at once) */
        assert_int_equal(fl_regex_guide_feed(g, as, na), FL_OK);
        assert_int_equal(fl_regex_guide_allows(g, "c", 1), carry ? 0 : -1);
        if (!carry) assert_non_null(strstr(fl_last_error(), "match limit"));
        assert_int_equal(fl_regex_guide_allows(g, "ab", 2), 1);
        assert_int_equal(fl_regex_guide_carries(g), carry);
        fl_regex_guide_free(g);
    }
    /* a pattern with more states alive than the carried workspace holds: rescans from then on */
    g = guide("(a+)+b");
    assert_int_equal(fl_regex_guide_feed(g, as, 40), FL_OK);
    assert_int_equal(fl_regex_guide_carries(g), false);
    assert_int_equal(fl_regex_guide_allows(g, "b", 1), 1);
    fl_regex_guide_free(g);
    /* what looks back is not carried (the text before a token would be needed) */
    g = guide("\\bx+");
    assert_false(fl_regex_guide_carries(g));
    fl_regex_guide_free(g);
    g = guide("(?<=a)b|a");
    assert_false(fl_regex_guide_carries(g));
    fl_regex_guide_free(g);
}

/* the hand-written texts with the carried state and rescanning */
static void test_texts(void **state) {
    (void)state;
    for (int carry = 1; carry >= 0; carry--) {
        g_carry = carry;
        texts();
    }
    g_carry = true;
    fl_test_mem_zero();
}

static void test_refused(void **state) {
    (void)state;
    static const struct { const char *pattern, *msg; } bad[] = {
        {"a(b", "regex at offset 3: missing closing parenthesis"},
        {"^a(b$", "regex at offset 4: missing closing parenthesis"}, /* (offsets are the pattern's, anchors and all) */
        {"^a(?R)?b$", "regex at offset 2: recursion"},
        {"[z-a]", "range out of order"},
        {"(a)\\1", "backreferences are not supported"},
        {"a(?R)?b", "regex at offset 1: recursion"}, /* not in a DFA */
        {"(a)(?1)", "regex at offset 3: recursion"},
        {"(?(?=a)ab|c)", "regex at offset 0: recursion"}, /* a condition */
        {"(?<n>a)\\g<n>", "offset 7: recursion"},
        {"\\C", "regex at offset"},             /* one code unit of a character */
        {"\xff", "regex at offset"},            /* not UTF-8 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fl_regex_guide *g = (fl_regex_guide *)&g;
        assert_int_equal(fl_regex_guide_new(bad[i].pattern, &g), FL_ERR_INVALID);
        assert_null(g);
        if (!strstr(fl_last_error(), bad[i].msg)) fail_msg("'%s': '%s' lacks '%s'", bad[i].pattern, fl_last_error(), bad[i].msg);
    }
    char *big = malloc(FL_REGEX_MAX_PATTERN + 2);
    memset(big, 'a', FL_REGEX_MAX_PATTERN + 1);
    big[FL_REGEX_MAX_PATTERN + 1] = 0;
    fl_regex_guide *g = NULL;
    assert_int_equal(fl_regex_guide_new(big, &g), FL_ERR_INVALID);
    big[FL_REGEX_MAX_PATTERN] = 0;
    assert_int_equal(fl_regex_guide_new(big, &g), FL_OK);
    fl_regex_guide_free(g);
    free(big);
    fl_test_mem_zero();
}

/* Every text of up to 3 bytes over a small alphabet, against glibc's POSIX regex (anchored
 * ^(...)$): the guide lets a text through exactly where some text of up to 6 bytes that starts
 * with it is a POSIX match (the patterns complete any prefix of a match within 3 bytes), calls
 * it complete exactly where it is one; on the anchored form and on the DFA (the pattern with an
 * empty \Q at its end), each with the carried state and rescanning. */
#define ALPHA "ab01-.x"
#define NA 7
#define MAXLEN 6

static uint32_t key_of(const char *t, size_t n) { /* (length, bytes) -> a distinct index */
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++) k = k * 8 + (uint32_t)(strchr(ALPHA, t[i]) - ALPHA) + 1;
    return k;
}

static void enumerate(const regex_t *re, char *t, size_t n, uint8_t *full, uint8_t *prefix) {
    t[n] = 0;
    if (regexec(re, t, 0, NULL, 0) == 0) {
        full[key_of(t, n)] = 1;
        for (size_t m = 0; m <= n; m++) prefix[key_of(t, m)] = 1;
    }
    if (n == MAXLEN) return;
    for (int c = 0; c < NA; c++) {
        t[n] = ALPHA[c];
        enumerate(re, t, n + 1, full, prefix);
    }
    t[n] = 0;
}

static bool g_walk_carry; /* what walk's guides carry */

static void walk(const char *pat, fl_regex_guide *g, char *t, size_t n, const uint8_t *full, const uint8_t *prefix) {
    const uint32_t k = key_of(t, n);
    assert_int_equal(fl_regex_guide_complete(g), full[k]);
    bool more = false;
    for (int c = 0; c < NA; c++) {
        t[n] = ALPHA[c];
        const int ok = fl_regex_guide_allows(g, t + n, 1);
        const uint8_t want = prefix[key_of(t, n + 1)];
        t[n + 1] = 0;
        if (ok != want) fail_msg("'%s' on '%s': guide %d, POSIX %d", pat, t, ok, want);
        more |= want;
        if (ok && n + 1 <= 3) {
            fl_regex_guide *h = guide(pat);
            assert_int_equal(fl_regex_guide_feed(h, t, n + 1), FL_OK);
            walk(pat, h, t, n + 1, full, prefix);
            fl_regex_guide_free(h);
        }
    }
    t[n] = 0;
    (void)more;
    assert_int_equal(fl_regex_guide_carries(g), g_walk_carry); /* (the carried state stayed in use) */
}

static void test_against_posix(void **state) {
    (void)state;
    static const char *const pats[] = {"(ab|a0)+x?", "-?(0|1[01]*)(\\.[01]{1,2})?", "a{1,2}(b|-)x", "(x|ab|b0)*-?", "[ab]+\\.[01]",
                                       "(a|b)?(0|1)?", "[^ab.]{1,2}(a|-)", "^(x|ab|b0)*-?$"};
    const size_t keys = (size_t)1 << (3 * (MAXLEN + 1));
    uint8_t *full = malloc(keys), *prefix = malloc(keys);
    for (size_t p = 0; p < sizeof pats / sizeof *pats; p++) {
        char anchored[128], t[MAXLEN + 2];
        snprintf(anchored, sizeof anchored, "^(%s)$", pats[p]);
        regex_t re;
        assert_int_equal(regcomp(&re, anchored, REG_EXTENDED | REG_NOSUB), 0);
        memset(full, 0, keys);
        memset(prefix, 0, keys);
        enumerate(&re, t, 0, full, prefix);
        for (int mode = 0; mode < 4; mode++) { /* anchored form or DFA, carried state or rescans */
            const int dfa = mode & 1;
            g_carry = mode < 2;
            char pat[128];
            snprintf(pat, sizeof pat, "%s%s", pats[p], dfa ? "\\Q" : "");
            fl_regex_guide *g = guide(pat);
            assert_int_equal(fl_regex_guide_on_dfa(g), dfa);
            /* (with \Q after it the $ is no longer last: kept, an anchor, the checks rescan) */
            g_walk_carry = g_carry && !(dfa && pats[p][0] == '^');
            assert_int_equal(fl_regex_guide_carries(g), g_walk_carry);
            walk(pat, g, t, 0, full, prefix);
            fl_regex_guide_free(g);
        }
        g_carry = true;
        regfree(&re);
    }
    free(full);
    free(prefix);
    fl_test_mem_zero();
}

/* fl_regex_guide_key: texts with equal keys allow the same continuations.  Every text of up to
 * 4 bytes over the alphabet that the guide lets through, keyed; within each key every
 * continuation of up to 3 bytes gets the same answer and so does complete.  Counted repeats
 * (whose counts the key clamps) and states met again (which must share a key for the engine's
 * mask cache to help) are both in the patterns. */
typedef struct keyed {
    uint8_t key[16];
    uint8_t sig[1 + 7 + 49 + 343]; /* complete, then each continuation's answer */
    char text[8];
} keyed;

static int keyed_cmp(const void *a, const void *b) { return memcmp(((const keyed *)a)->key, ((const keyed *)b)->key, 16); }

static void collect(const char *pat, char *t, size_t n, keyed *out, size_t *n_out) {
    fl_regex_guide *g = guide(pat);
    assert_int_equal(fl_regex_guide_feed(g, t, n), FL_OK);
    keyed *k = &out[(*n_out)++];
    if (!fl_regex_guide_key(g, k->key)) fail_msg("%s: no key after %.*s (carries %d)", pat, (int)n, t, fl_regex_guide_carries(g));
    memcpy(k->text, t, n);
    k->text[n] = 0;
    for (size_t cut = 1; cut < n; cut++) { /* the same key however the text came (in two pieces) */
        fl_regex_guide *h = guide(pat);
        assert_int_equal(fl_regex_guide_feed(h, t, cut), FL_OK);
        assert_int_equal(fl_regex_guide_feed(h, t + cut, n - cut), FL_OK);
        uint8_t kk[16];
        assert_true(fl_regex_guide_key(h, kk));
        if (memcmp(kk, k->key, 16)) fail_msg("'%s': '%s' fed at %zu keys otherwise than whole", pat, k->text, cut);
        fl_regex_guide_free(h);
    }
    size_t j = 0;
    k->sig[j++] = fl_regex_guide_complete(g);
    char c[3];
    for (int len = 1; len <= 3; len++)
        for (int v = 0; v < (len == 1 ? 7 : len == 2 ? 49 : 343); v++) {
            for (int i = 0, x = v; i < len; i++, x /= NA) c[i] = ALPHA[x % NA];
            const int ok = fl_regex_guide_allows(g, c, (size_t)len);
            assert_true(ok >= 0);
            k->sig[j++] = (uint8_t)ok;
        }
    fl_regex_guide_free(g);
    if (n == 4) return;
    for (int ci = 0; ci < NA; ci++) {
        t[n] = ALPHA[ci];
        fl_regex_guide *h = guide(pat);
        assert_int_equal(fl_regex_guide_feed(h, t, n), FL_OK);
        const int ok = fl_regex_guide_allows(h, t + n, 1);
        fl_regex_guide_free(h);
        if (ok == 1) collect(pat, t, n + 1, out, n_out);
    }
}

static void key_of_text(const char *pat, const char *t, uint8_t key[16]) {
    fl_regex_guide *g = guide(pat);
    assert_int_equal(fl_regex_guide_feed(g, t, strlen(t)), FL_OK);
    assert_true(fl_regex_guide_key(g, key));
    fl_regex_guide_free(g);
}

static void test_keys(void **state) {
    (void)state;
    static const char *const pats[] = {"(ab|a0)+x?", "-?(0|1[01]*)(\\.[01]{1,2})?", "a{1,2}(b|-)x", "(x|ab|b0)*-?", "[ab]+\\.[01]",
                                       "[01]{3}-", "a{2,}b?", "(a|b){2,3}[x.]+0", "x[^a]{1,3}"};
    keyed *ks = malloc(3000 * sizeof *ks);
    for (size_t p = 0; p < sizeof pats / sizeof *pats; p++)
        for (int dfa = 0; dfa < 2; dfa++) {
            char pat[64], t[8];
            snprintf(pat, sizeof pat, "%s%s", pats[p], dfa ? "\\Q" : "");
            size_t n = 0;
            collect(pat, t, 0, ks, &n);
            qsort(ks, n, sizeof *ks, keyed_cmp);
            size_t groups = 1;
            for (size_t i = 1; i < n; i++) {
                if (keyed_cmp(&ks[i - 1], &ks[i])) {
                    groups++;
                    continue;
                }
                if (memcmp(ks[i - 1].sig, ks[i].sig, sizeof ks[i].sig))
                    fail_msg("'%s': '%s' and '%s' share a key but not their answers", pat, ks[i - 1].text, ks[i].text);
            }
            if (n > 3 && groups == n && p != 2 && p != 5) fail_msg("'%s': %zu texts, every key distinct", pat, n);
        }
    free(ks);
    /* keys met again, keys kept apart */
    uint8_t a[16], b[16];
    key_of_text("[ab]+\\.[01]", "ab", a); /* (the count of [ab]+ is clamped past 1 + 1) */
    key_of_text("[ab]+\\.[01]", "abba", b);
    assert_memory_equal(a, b, 16);
    key_of_text("[ab]+\\.[01]", "ab.", b);
    assert_memory_not_equal(a, b, 16);
    key_of_text("[ab]+\\.[0-1]", "ab", b); /* the same states of another pattern */
    assert_memory_not_equal(a, b, 16);
    key_of_text("[01]{3}-", "0", a);
    key_of_text("[01]{3}-", "01", b);
    assert_memory_not_equal(a, b, 16);
    key_of_text("a{2,}b?", "aaa", a);
    key_of_text("a{2,}b?", "aaaaaa", b);
    assert_memory_equal(a, b, 16);
    key_of_text("a{2,}b?7777777777777777777777", "aaa", a); /* (a run of digits past any bound: compiled) */
    /* no key where the checks rescan */
    fl_regex_guide *g = guide("\\ba+");
    assert_false(fl_regex_guide_key(g, a));
    fl_regex_guide_free(g);
    fl_test_mem_zero();
}

static void test_out_of_memory(void **state) {
    (void)state;
    int ok = 0;
    for (int k = 0; k < 100 && !ok; k++) {
        fl_mem_fail_after(k);
        fl_regex_guide *g = NULL;
        const fl_status st = fl_regex_guide_new("[a-z]+ \\d{2,4}", &g);
        fl_mem_fail_after(-1);
        if (st == FL_OK) {
            ok = k + 1;
            /* the text's buffer grows as it goes: a failed growth is an error, the text unchanged
             * (a check on the carried state needs no buffer; a rescan does) */
            char big[1000];
            memset(big, 'q', sizeof big);
            fl_mem_fail_after(0);
            assert_int_equal(fl_regex_guide_allows(g, big, sizeof big), 1);
            fl_regex_guide *h = NULL;
            fl_mem_fail_after(-1);
            assert_int_equal(fl_regex_guide_new("[a-z]+ \\d{2,4}", &h), FL_OK);
            fl_regex_guide_set_carry(h, false);
            fl_mem_fail_after(0);
            assert_int_equal(fl_regex_guide_allows(h, big, sizeof big), -1);
            fl_mem_fail_after(-1);
            fl_regex_guide_free(h);
            fl_mem_fail_after(0);
            assert_int_equal(fl_regex_guide_feed(g, big, sizeof big), FL_ERR_NOMEM);
            fl_mem_fail_after(-1);
            assert_int_equal(fl_regex_guide_len(g), 0);
            assert_int_equal(fl_regex_guide_feed(g, big, sizeof big), FL_OK);
            assert_int_equal(fl_regex_guide_allows(g, " 12", 3), 1);
            fl_regex_guide_free(g);
        } else {
            assert_int_equal(st, FL_ERR_NOMEM);
            assert_null(g);
        }
        fl_test_mem_zero();
    }
    assert_true(ok > 3);
}

/* ---- patterns of the common subset as grammars (regex_gbnf.c): the same answers as PCRE2 ---- */

/* 1 a match, 0 the prefix of one, -1 neither: on PCRE2 (rescanning: no limit of its carried
 * state) and on the grammar the pattern was rewritten as */
static int pcre2_says(const char *pattern, const char *t) {
    fl_regex_guide *g = guide(pattern);
    fl_regex_guide_set_carry(g, false);
    int r = -1;
    if (fl_regex_guide_allows(g, t, strlen(t)) == 1) {
        assert_int_equal(fl_regex_guide_feed(g, t, strlen(t)), FL_OK);
        r = fl_regex_guide_complete(g) ? 1 : 0;
    }
    fl_regex_guide_free(g);
    return r;
}
static int grammar_says(const char *gbnf, const char *t) {
    fl_grammar_guide *g = NULL;
    if (fl_grammar_guide_new(gbnf, &g) != FL_OK) fail_msg("%s: %s", gbnf, fl_last_error());
    int r = -1;
    if (fl_grammar_guide_allows(g, t, strlen(t)) == 1) {
        assert_int_equal(fl_grammar_guide_feed(g, t, strlen(t)), FL_OK);
        r = fl_grammar_guide_complete(g) ? 1 : 0;
    }
    fl_grammar_guide_free(g);
    return r;
}

static void test_as_grammar(void **state) {
    (void)state;
    static const char *const patterns[] = {
        "^a(b|_)*[0-9]?$", "\\d{1,2}-\\w+", "[^\\d\\s]{2,}x?", "a.b|\\.", "(?:a|b )+?1{0,2}", "(?<n>ab|a)(?P<m>b?)\\s*",
        "[\\]\\-a]+\\n?", "\\x{e9}+|\\xe9a", "[a-c\\x{e9}_.-]{2}", "\\S\\W", "(a|)(b|)", "a{2,}|b{3}", "[\\s\\b]*1",
        "\\(\\)\\[\\{\\}\\*\\+\\?\\|\\^\\$",
    };
    static const char *const alpha[] = {"a", "b", "1", " ", "\n", "\r", "_", "\xC3\xA9", "-", "."};
    enum { NB = sizeof alpha / sizeof *alpha };
    int sentences = 0;
    for (size_t i = 0; i < sizeof patterns / sizeof *patterns; i++) {
        char *gbnf = NULL;
        size_t len = 0;
        if (fl_regex_to_gbnf(patterns[i], &gbnf, &len) != FL_OK) fail_msg("'%s' not rewritten", patterns[i]);
        for (int code = 0; code < (NB + 1) * (NB + 1) * (NB + 1) * (NB + 1); code++) {
            char t[32] = "";
            bool canon = true;
            for (int c = code; c; c /= NB + 1) {
                if (!(c % (NB + 1))) canon = false;
                else strcat(t, alpha[c % (NB + 1) - 1]);
            }
            if (!canon) continue;
            const int want = pcre2_says(patterns[i], t), got = grammar_says(gbnf, t);
            if (want != got) fail_msg("'%s' on '%s': PCRE2 %d, as a grammar %d (%s)", patterns[i], t, want, got, gbnf);
            sentences += got == 1;
        }
        fl_free(FL_MEM_GUIDE, gbnf, len + 1);
    }
    assert_true(sentences > 100);
    /* outside the subset: PCRE2 keeps them */
    static const char *const others[] = {"\\bab", "a(?=b)", "a(?!b)", "(?<=a)b", "(?>ab)", "a++", "a*+", "(a)\\1", "\\p{Lu}",
                                         "[[:alpha:]]", "(?i)ab", "\\Qa.b\\E", "a\\z", "^a|^b", "a$|b", "\\h", "\\v", "\\R",
                                         "x{,3}", "{1}a", "\\101", "(?#c)a", "\\N", "a{20000}"};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        char *gbnf = (char *)1;
        size_t len = 0;
        if (fl_regex_to_gbnf(others[i], &gbnf, &len) != FL_ERR_UNSUPPORTED) fail_msg("'%s' rewritten", others[i]);
        assert_null(gbnf);
    }
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_texts),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_against_posix),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_as_grammar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
