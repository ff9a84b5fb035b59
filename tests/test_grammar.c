/* The GBNF constraint (engine/grammar.c): what a grammar lets through, checked on hand-written
 * texts, against hand-written recognizers and glibc's POSIX regex (other implementations) on
 * every short text; the token walk against token-by-token checks; keys; refusals; out of memory. */
#include "test.h"

#include "engine/grammar.h"

#include <regex.h>
#include <stdlib.h>
#include <string.h>

static fl_grammar_guide *grammar(const char *text) {
    fl_grammar_guide *g = NULL;
    if (fl_grammar_guide_new(text, &g) != FL_OK) fail_msg("refused: %s: %s", text, fl_last_error());
    return g;
}

/* t fed whole: 1 = a sentence, 0 = the prefix of one, -1 = neither; the same answer whichever
 * two pieces the text came in (a cut may fall inside a character) */
static int check(const char *gbnf, const char *t) {
    const size_t n = strlen(t);
    int first = -2;
    for (size_t cut = 0; cut <= n; cut++) {
        fl_grammar_guide *g = grammar(gbnf);
        int r;
        if (fl_grammar_guide_allows(g, t, cut) != 1) r = -1;
        else {
            assert_int_equal(fl_grammar_guide_feed(g, t, cut), FL_OK);
            const int ok = fl_grammar_guide_allows(g, t + cut, n - cut);
            assert_true(ok >= 0);
            if (!ok) r = -1;
            else {
                assert_int_equal(fl_grammar_guide_feed(g, t + cut, n - cut), FL_OK);
                r = fl_grammar_guide_complete(g) ? 1 : 0;
            }
        }
        fl_grammar_guide_free(g);
        if (first == -2) first = r;
        else if (r != first) fail_msg("'%s' on '%s': %d whole, %d cut at %zu", gbnf, t, first, r, cut);
    }
    return first;
}

static void test_texts(void **state) {
    (void)state;
    static const struct {
        const char *g, *t;
        int want;
    } cases[] = {
        {"root ::= \"yes\" | \"no\"", "yes", 1},
        {"root ::= \"yes\" | \"no\"", "ye", 0},
        {"root ::= \"yes\" | \"no\"", "", 0},
        {"root ::= \"yes\" | \"no\"", "yes.", -1},
        {"root ::= \"yes\" | \"no\"", "n", 0},
        {"root ::= \"yes\" | \"no\"", "x", -1},
        /* classes, ranges, negation, any, escapes */
        {"root ::= [a-c0-9_]+", "b7_", 1},
        {"root ::= [a-c0-9_]+", "d", -1},
        {"root ::= [^\"\\\\]* \"\\\"\"", "ab\"", 1},
        {"root ::= [^\"\\\\]* \"\\\"\"", "a\\", -1},
        {"root ::= . . \"!\"", "\xCE\xB1\xE2\x9C\x93!", 1}, /* two characters of two and three bytes */
        {"root ::= \"\\x41\\u00e9\\U0001F600\\n\\t\"", "A\xC3\xA9\xF0\x9F\x98\x80\n\t", 1},
        {"root ::= [\\u03b1-\\u03c9]+", "\xCE\xB2\xCE\xB3", 1},
        {"root ::= [\\u03b1-\\u03c9]+", "b", -1},
        {"root ::= [\\]\\[\\-]+", "[-]", 1},
        {"root ::= [a-]+", "a-a", 1}, /* a - before ] is itself */
        /* repeats */
        {"root ::= \"ab\"{2} \"c\"?", "abab", 1},
        {"root ::= \"ab\"{2} \"c\"?", "ababc", 1},
        {"root ::= \"ab\"{2} \"c\"?", "ab", 0},
        {"root ::= \"ab\"{2} \"c\"?", "abababc", -1},
        {"root ::= [0-9]{2,4}", "1", 0},
        {"root ::= [0-9]{2,4}", "123", 1},
        {"root ::= [0-9]{2,4}", "12345", -1},
        {"root ::= [0-9]{2,}", "1234567", 1},
        {"root ::= [0-9]{ 0 , 1 } \"x\"", "x", 1},
        {"root ::= (\"a\" | \"b\" \"c\")+", "abca", 1},
        {"root ::= (\"a\" | \"b\" \"c\")+", "", 0},
        {"root ::= (\"a\" | \"b\" \"c\")+", "ab", 0},
        {"root ::= (\"a\" | \"b\" \"c\")+", "acb", -1},
        /* rules, layout, comments, recursion */
        {"root ::= list   # a comment\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | list\n", "[1,[2,[]],34]", 1},
        {"root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | list", "[1,[2,[]]", 0},
        {"root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | list", "[1,]", -1},
        {"root ::=\n  \"a\" (\n  \"b\" |\n   \"c\")\n\n# the end\n", "ac", 1},
        {"root ::= \"a\"\n  \"b\"", "ab", -2}, /* (refused: a rule ends with its line outside parentheses) */
        {"root ::= a-b_c\na-b_c ::= \"x\" |\n \"y\"", "y", 1},
        {"root ::= \"\"", "", 1},
        {"root ::= \"\"", "a", -1},
        {"root ::= \"a\" root | \"b\"", "aaab", 1},
        {"root ::= \"a\" root \"b\" | \"\"", "aabb", 1},
        {"root ::= \"a\" root \"b\" | \"\"", "aab", 0},
        {"root ::= \"a\" root \"b\" | \"\"", "abb", -1},
        {"root ::= x x\nx ::= \"a\"?", "a", 1}, /* nullable rules in sequence */
        {"root ::= x x\nx ::= \"a\"?", "aaa", -1},
        {"root ::= \"a\"\r\nfoo ::= \"b\"\r\n", "a", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (cases[i].want == -2) {
            fl_grammar_guide *g = NULL;
            assert_int_equal(fl_grammar_guide_new(cases[i].g, &g), FL_ERR_INVALID);
            continue;
        }
        const int got = check(cases[i].g, cases[i].t);
        if (got != cases[i].want) fail_msg("case %zu: '%s' on '%s': %d, want %d", i, cases[i].g, cases[i].t, got, cases[i].want);
    }
}

/* ---- texts that end inside a character ---- */
static void test_partial_characters(void **state) {
    (void)state;
    /* U+2713 is E2 9C 93: its first bytes are allowed, other beginnings are not */
    fl_grammar_guide *g = grammar("root ::= \"\\u2713\" [a-c]");
    assert_int_equal(fl_grammar_guide_allows(g, "\xE2", 1), 1);
    assert_int_equal(fl_grammar_guide_allows(g, "\xE2\x9C", 2), 1);
    assert_int_equal(fl_grammar_guide_allows(g, "\xE2\x9D", 2), 0);
    assert_int_equal(fl_grammar_guide_allows(g, "\xC3", 1), 0);
    assert_int_equal(fl_grammar_guide_allows(g, "\xFF", 1), 0);
    assert_int_equal(fl_grammar_guide_allows(g, "\xE2\x9C\x93\xE2", 4), 0); /* [a-c] next, no E2 .. */
    uint8_t k0[16], k1[16], k2[16];
    fl_grammar_guide_key(g, k0);
    assert_int_equal(fl_grammar_guide_feed(g, "\xE2", 1), FL_OK);
    fl_grammar_guide_key(g, k1);
    assert_memory_not_equal(k0, k1, 16); /* the same stacks, a byte pending: another state */
    assert_false(fl_grammar_guide_complete(g));
    assert_int_equal(fl_grammar_guide_allows(g, "", 0), 1); /* (nothing more: the pending byte alone, still alive) */
    assert_int_equal(fl_grammar_guide_allows(g, "\x9C", 1), 1);
    assert_int_equal(fl_grammar_guide_allows(g, "\x93", 1), 0); /* 93 cannot follow E2 here */
    assert_int_equal(fl_grammar_guide_allows(g, "a", 1), 0);
    assert_int_equal(fl_grammar_guide_feed(g, "\x9C", 1), FL_OK);
    fl_grammar_guide_key(g, k2);
    assert_memory_not_equal(k1, k2, 16);
    assert_int_equal(fl_grammar_guide_feed(g, "\x93" "b", 2), FL_OK);
    assert_true(fl_grammar_guide_finished(g));
    fl_grammar_guide_free(g);
    /* a negated class: E2 begins only U+2000..2FFF, all excluded; E3 begins others */
    g = grammar("root ::= [^\\u2000-\\u2fff]");
    assert_int_equal(fl_grammar_guide_allows(g, "\xE2", 1), 0);
    assert_int_equal(fl_grammar_guide_allows(g, "\xE3", 1), 1);
    assert_int_equal(fl_grammar_guide_allows(g, "\xE1\xBF", 2), 1);
    fl_grammar_guide_free(g);
    g = grammar("root ::= [^\\u2000-\\u27ff\\u2800-\\u2fff] | \"x\""); /* covered by two ranges together */
    assert_int_equal(fl_grammar_guide_allows(g, "\xE2", 1), 0);
    assert_int_equal(fl_grammar_guide_allows(g, "\xE2\xA0", 2), 0);
    fl_grammar_guide_free(g);
    /* a vocabulary of the 256 single bytes only: the walk and the feed spell every character byte
     * by byte; taking the lowest allowed token each step makes a sentence */
    char text[256];
    int64_t off[257];
    int32_t order[256];
    for (int t = 0; t < 256; t++) text[t] = (char)t, off[t] = t;
    off[256] = 256;
    assert_int_equal(fl_grammar_vocab_order(text, off, 256, order), FL_OK);
    g = grammar("root ::= \"\\u2713 \\u00e9\" [\\u03b1-\\u03c9]{2} \"\\U0001F600\"?");
    char out[64];
    int n = 0;
    uint64_t bits[4];
    while (!fl_grammar_guide_finished(g) && n < 40) {
        assert_int_equal(fl_grammar_guide_mask(g, text, off, order, 256, bits), FL_OK);
        int t = 0;
        while (t < 256 && !((bits[t >> 6] >> (t & 63)) & 1)) t++;
        if (t == 256) break;
        for (int u = 0; u < 256; u++) /* the walk agrees with the check per token */
            assert_int_equal((int)((bits[u >> 6] >> (u & 63)) & 1), fl_grammar_guide_allows(g, text + u, 1));
        assert_int_equal(fl_grammar_guide_feed(g, text + t, 1), FL_OK);
        out[n++] = (char)t;
        if (fl_grammar_guide_complete(g)) break; /* (the smiley is optional: the first sentence) */
    }
    assert_int_equal(n, 10);
    assert_memory_equal(out, "\xE2\x9C\x93 \xC3\xA9\xCE\xB1\xCE\xB1", 10);
    fl_grammar_guide_free(g);
    fl_test_mem_zero();
}

/* ---- every short text against recognizers written another way ---- */

/* balanced parentheses: 1 a sentence, 0 a prefix (never below zero), -1 neither */
static int dyck(const char *t) {
    int d = 0;
    for (; *t; t++) {
        d += *t == '(' ? 1 : *t == ')' ? -1 : -1000;
        if (d < 0) return -1;
    }
    return d == 0 ? 1 : 0;
}

/* expr ::= term ("+" term)*; term ::= factor ("*" factor)*; factor ::= [0-9]+ | "(" expr ")",
 * by recursive descent: the position after one expr at *p, or NULL */
static const char *rd_expr(const char *p);
static const char *rd_factor(const char *p) {
    if (*p >= '0' && *p <= '9') {
        while (*p >= '0' && *p <= '9') p++;
        return p;
    }
    if (*p != '(') return NULL;
    p = rd_expr(p + 1);
    return p && *p == ')' ? p + 1 : NULL;
}
static const char *rd_term(const char *p) {
    p = rd_factor(p);
    while (p && *p == '*') p = rd_factor(p + 1);
    return p;
}
static const char *rd_expr(const char *p) {
    p = rd_term(p);
    while (p && *p == '+') p = rd_term(p + 1);
    return p;
}
static bool arith(const char *t) {
    const char *e = rd_expr(t);
    return e && !*e;
}

static const char *const DYCK = "root ::= \"(\" root \")\" root | \"\"";
static const char *const ARITH = "root ::= expr\n"
                                 "expr ::= term (\"+\" term)*\n"
                                 "term ::= factor (\"*\" factor)*\n"
                                 "factor ::= [0-9]+ | \"(\" expr \")\"\n";

/* every text over alpha of up to maxlen characters, fed a character at a time: the guide's
 * answer beside the reference's (want(t): 1 / 0 / -1, or only sentences where prefix is NULL) */
static void every_text(const char *gbnf, const char *alpha, int maxlen, int (*want)(const char *), bool (*sentence)(const char *)) {
    const int na = (int)strlen(alpha);
    char t[16];
    int64_t total = 1;
    for (int l = 0; l < maxlen; l++) total *= na + 1;
    int n_sent = 0;
    for (int64_t code = 0; code < total; code++) {
        int64_t c = code, l = 0;
        bool canon = true; /* digits 1..na, no 0 inside: each text once */
        while (c) {
            const int d = (int)(c % (na + 1));
            if (!d) canon = false;
            t[l++] = d ? alpha[d - 1] : '?';
            c /= na + 1;
        }
        t[l] = 0;
        if (!canon) continue;
        fl_grammar_guide *g = grammar(gbnf);
        int got = 1;
        for (int64_t i = 0; i < l && got; i++) {
            got = fl_grammar_guide_allows(g, t + i, 1);
            assert_true(got >= 0);
            if (got) assert_int_equal(fl_grammar_guide_feed(g, t + i, 1), FL_OK);
        }
        const int ans = !got ? -1 : fl_grammar_guide_complete(g) ? 1 : 0;
        fl_grammar_guide_free(g);
        if (want) {
            if (ans != want(t)) fail_msg("'%s': %d, the reference %d", t, ans, want(t));
        } else if ((ans == 1) != sentence(t))
            fail_msg("'%s': %d, the reference says %s", t, ans, sentence(t) ? "a sentence" : "none");
        n_sent += ans == 1;
    }
    assert_true(n_sent > 3);
}

static regex_t g_re;
static bool posix(const char *t) { return regexec(&g_re, t, 0, NULL, 0) == 0; }

static void test_every_text(void **state) {
    (void)state;
    every_text(DYCK, "()", 10, dyck, NULL);
    every_text(ARITH, "1+*()", 6, NULL, arith);
    /* a prefix of a sentence is allowed (every prefix of the sentences up to 7 characters) */
    const char *const s[] = {"(1+2)*3", "((1))", "1*(2+3)", "12+3*45"};
    for (size_t i = 0; i < sizeof s / sizeof *s; i++) assert_int_equal(check(ARITH, s[i]), 1);
    assert_int_equal(check(ARITH, "(1+"), 0);
    assert_int_equal(check(ARITH, "1+)"), -1);
    /* regular grammars against POSIX EREs */
    static const char *const pairs[][2] = {
        {"root ::= [a-c]{2,3} (\"x\" | \"yz\")* \".\"?", "^[a-c]{2,3}(x|yz)*[.]?$"},
        {"root ::= (\"ab\" | \"a\") (\"b\" \"c\"? | \"\")", "^(ab|a)(bc?|)$"},
        {"root ::= a+ b?\na ::= \"x\" | \"yy\"\nb ::= [^xy]", "^(x|yy)+[^xy]?$"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        assert_int_equal(regcomp(&g_re, pairs[i][1], REG_EXTENDED | REG_NOSUB), 0);
        every_text(pairs[i][0], "abcxyz.", 5, NULL, posix);
        regfree(&g_re);
    }
    fl_test_mem_zero();
}

/* ---- keys: the state after the text, canonical ---- */
static void key_of(const char *gbnf, const char *t, uint8_t key[16]) {
    fl_grammar_guide *g = grammar(gbnf);
    assert_int_equal(fl_grammar_guide_feed(g, t, strlen(t)), FL_OK);
    fl_grammar_guide_key(g, key);
    fl_grammar_guide_free(g);
}

static void test_keys(void **state) {
    (void)state;
    uint8_t a[16], b[16];
    key_of(DYCK, "", a);
    key_of(DYCK, "()(())", b);
    assert_memory_equal(a, b, 16); /* the same state: nothing open */
    key_of(DYCK, "(", b);
    assert_memory_not_equal(a, b, 16);
    key_of(DYCK, "(()", a);
    assert_memory_equal(a, b, 16); /* one open: the inner root's end is a tail, so no frame is left of it */
    key_of(DYCK, "((", a);
    assert_memory_not_equal(a, b, 16);
    key_of("root ::= [a-z]+", "ab", a);
    key_of("root ::= [a-z]+", "abcdef", b);
    assert_memory_equal(a, b, 16);
    key_of("root ::= [a-z]+ ", "ab", b); /* another grammar (its text): another key */
    assert_memory_not_equal(a, b, 16);
    /* texts with equal keys answer every continuation of up to 3 characters alike */
    const char *alpha = "1+*()";
    char texts[200][8];
    uint8_t keys[200][16];
    int n = 0;
    for (int code = 0; code < 6 * 6 * 6 * 6 && n < 200; code++) {
        char t[8];
        int l = 0, c = code;
        while (c) t[l++] = alpha[c % 6 ? c % 6 - 1 : 0], c /= 6;
        t[l] = 0;
        fl_grammar_guide *g = grammar(ARITH);
        if (fl_grammar_guide_allows(g, t, (size_t)l) == 1) {
            fl_grammar_guide_feed(g, t, (size_t)l);
            fl_grammar_guide_key(g, keys[n]);
            strcpy(texts[n++], t);
        }
        fl_grammar_guide_free(g);
    }
    int same = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            if (memcmp(keys[i], keys[j], 16)) continue;
            same++;
            fl_grammar_guide *gi = grammar(ARITH), *gj = grammar(ARITH);
            fl_grammar_guide_feed(gi, texts[i], strlen(texts[i]));
            fl_grammar_guide_feed(gj, texts[j], strlen(texts[j]));
            assert_int_equal(fl_grammar_guide_complete(gi), fl_grammar_guide_complete(gj));
            for (int code = 0; code < 6 * 6 * 6; code++) {
                char u[4];
                int l = 0, c = code;
                while (c) u[l++] = alpha[c % 6 ? c % 6 - 1 : 0], c /= 6;
                if (fl_grammar_guide_allows(gi, u, (size_t)l) != fl_grammar_guide_allows(gj, u, (size_t)l))
                    fail_msg("'%s' and '%s' share a key but answer '%.*s' apart", texts[i], texts[j], l, u);
            }
            fl_grammar_guide_free(gi);
            fl_grammar_guide_free(gj);
        }
    assert_true(n > 50 && same > 20);
    fl_test_mem_zero();
}

/* ---- the token walk against a check per token ---- */
static void test_mask(void **state) {
    (void)state;
    /* a vocabulary of random pieces over a small alphabet (with a two-byte character, a lone lead
     * byte, and empty pieces), sorted once */
    static const char *const atoms[] = {"1", "+", "*", "(", ")", "2", " ", "\xCE\xB1", "\xCE", "a", "[", "]", ","};
    enum { NV = 3000 };
    char *text = malloc(NV * 12);
    int64_t off[NV + 1];
    uint64_t rng = 7;
    off[0] = 0;
    for (int t = 0; t < NV; t++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const int len = t < 5 ? 0 : 1 + (int)((rng >> 33) % 5);
        int64_t o = off[t];
        for (int k = 0; k < len; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const char *a = atoms[(rng >> 35) % (sizeof atoms / sizeof *atoms)];
            memcpy(text + o, a, strlen(a));
            o += (int64_t)strlen(a);
        }
        off[t + 1] = o;
    }
    int32_t *order = fl_alloc(FL_MEM_MISC, NV * sizeof *order, 0);
    assert_int_equal(fl_grammar_vocab_order(text, off, NV, order), FL_OK);
    for (int i = 1; i < NV; i++) { /* sorted bytewise */
        const int64_t na = off[order[i - 1] + 1] - off[order[i - 1]], nb = off[order[i] + 1] - off[order[i]];
        const int c = memcmp(text + off[order[i - 1]], text + off[order[i]], (size_t)(na < nb ? na : nb));
        assert_true(c < 0 || (c == 0 && na <= nb));
    }
    const char *const grammars[] = {ARITH, "root ::= [1-2]+ (\" \" [\\u03b1a]+)*", "root ::= \"[\" (v (\",\" \" \"? v)*)? \"]\"\nv ::= [12]+ | root"};
    const char *const feeds[][4] = {{"", "(", "1+", "(2*("}, {"", "1", "12 ", "1 \xCE\xB1"}, {"", "[", "[1, [", "[[2]"}};
    uint64_t bits[(NV + 63) / 64];
    int64_t total_allowed = 0;
    for (int gi = 0; gi < 3; gi++)
        for (int f = 0; f < 4; f++) {
            fl_grammar_guide *g = grammar(grammars[gi]);
            fl_grammar_guide_set_budget(g, 1 << 20); /* (these walks read far less) */
            assert_int_equal(fl_grammar_guide_feed(g, feeds[gi][f], strlen(feeds[gi][f])), FL_OK);
            for (int round = 0; round < 2; round++) { /* twice: the walk's levels are reused */
                assert_int_equal(fl_grammar_guide_mask(g, text, off, order, NV, bits), FL_OK);
                int allowed = 0;
                for (int t = 0; t < NV; t++) {
                    const int64_t n = off[t + 1] - off[t];
                    const int want = n ? fl_grammar_guide_allows(g, text + off[t], (size_t)n) : 0;
                    const int got = (int)((bits[t >> 6] >> (t & 63)) & 1);
                    if (want != got) fail_msg("grammar %d after '%s': token %d '%.*s': walk %d, check %d", gi, feeds[gi][f], t, (int)n, text + off[t], got, want);
                    allowed += got;
                }
                assert_true(allowed > 0 && allowed < NV / 2);
                total_allowed += allowed;
            }
            fl_grammar_guide_free(g);
        }
    assert_true(total_allowed > 500);
    fl_free(FL_MEM_MISC, order, NV * sizeof *order);
    free(text);
    fl_test_mem_zero();
}

/* The walk's kept transitions tell characters apart: one state, 2000 characters that keep it
 * and one that ends it (the kept transitions share 256 places, so many of the 2000 meet the
 * dead one's place) */
static void test_mask_transitions(void **state) {
    (void)state;
    enum { NC = 2001 };
    char *text = malloc(NC * 3);
    int64_t off[NC + 1];
    int32_t order[NC];
    off[0] = 0;
    text[0] = 'x';
    off[1] = 1;
    for (int i = 1; i < NC; i++) { /* U+4E00 .. : three bytes each */
        const uint32_t c = 0x4E00 + (uint32_t)i;
        char *o = text + off[i];
        o[0] = (char)(0xE0 | (c >> 12)), o[1] = (char)(0x80 | ((c >> 6) & 0x3F)), o[2] = (char)(0x80 | (c & 0x3F));
        off[i + 1] = off[i] + 3;
    }
    assert_int_equal(fl_grammar_vocab_order(text, off, NC, order), FL_OK);
    fl_grammar_guide *g = grammar("root ::= [^x]*");
    uint64_t bits[(NC + 63) / 64];
    for (int round = 0; round < 2; round++) {
        assert_int_equal(fl_grammar_guide_mask(g, text, off, order, NC, bits), FL_OK);
        assert_false(bits[0] & 1); /* x */
        for (int t = 1; t < NC; t++)
            if (!((bits[t >> 6] >> (t & 63)) & 1)) fail_msg("round %d: token %d (U+%04X) ruled out", round, t, 0x4E00 + t);
    }
    fl_grammar_guide_free(g);
    free(text);
    fl_test_mem_zero();
}

/* ---- the walk's bound: an ambiguous grammar fails the mask instead of stalling ---- */
static void test_walk_budget(void **state) {
    (void)state;
    fl_grammar_guide *g = grammar("root ::= s\ns ::= \"a\" s \"b\" | \"a\" s | \"\"");
    char a[300];
    memset(a, 'a', sizeof a);
    assert_int_equal(fl_grammar_guide_feed(g, a, sizeof a), FL_OK);
    assert_true(fl_grammar_guide_n_stacks(g) > 300); /* (0 .. 300 b's to come, each with its next a) */
    char text[512];
    int64_t off[129];
    int32_t order[128], nv = 0;
    off[0] = 0;
    for (int len = 1; len <= 5; len++) /* every a/b string of 1 to 5 letters */
        for (int code = 0; code < 1 << len && nv < 62; code++, nv++) {
            for (int i = 0; i < len; i++) text[off[nv] + i] = (code >> i) & 1 ? 'b' : 'a';
            off[nv + 1] = off[nv] + len;
        }
    assert_int_equal(fl_grammar_vocab_order(text, off, nv, order), FL_OK);
    uint64_t bits[2];
    fl_grammar_guide_set_budget(g, 100000);
    assert_int_equal(fl_grammar_guide_mask(g, text, off, order, nv, bits), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "too ambiguous"));
    fl_grammar_guide_set_budget(g, FL_GRAMMAR_WALK_BUDGET);
    assert_int_equal(fl_grammar_guide_mask(g, text, off, order, nv, bits), FL_OK);
    for (int t = 0; t < nv; t++) assert_int_equal((int)((bits[t >> 6] >> (t & 63)) & 1), fl_grammar_guide_allows(g, text + off[t], (size_t)(off[t + 1] - off[t])));
    fl_grammar_guide_free(g);
    fl_test_mem_zero();
}

/* ---- refusals, bounds, out of memory ---- */
static void refused(const char *gbnf, const char *what) {
    fl_grammar_guide *g = NULL;
    assert_int_equal(fl_grammar_guide_new(gbnf, &g), FL_ERR_INVALID);
    assert_null(g);
    if (!strstr(fl_last_error(), what)) fail_msg("'%s': '%s', not '%s'", gbnf, fl_last_error(), what);
}

static void test_refusals(void **state) {
    (void)state;
    refused("", "no rule 'root'");
    refused("start ::= \"a\"", "no rule 'root'");
    refused("root ::= value", "line 1, column 10: rule 'value' is used but not defined");
    refused("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice");
    refused("root := \"a\"", "expected '::='");
    refused("root ::= \"abc", "line 1, column 10: a literal without its closing");
    refused("root ::= [abc", "a class without its closing");
    refused("root ::= (\"a\" | \"b\"", "expected ')'");
    refused("root ::= \"a\" )", "unexpected ')'");
    refused("root ::= \"\\q\"", "unknown escape '\\q'");
    refused("root ::= \"\\x4\"", "needs 2 hex digits");
    refused("root ::= \"\\U00110000\"", "past U+10FFFF");
    refused("root ::= [z-a]", "ends below its start");
    refused("root ::= \"a\"**", "unexpected '*'");
    refused("root ::= *", "unexpected '*'");
    refused("root ::= \"\"*", "nothing to repeat");
    refused("root ::= \"a\"{3,2}", "below the minimum");
    refused("root ::= \"a\"{20000}", "above 10000");
    refused("root ::= \"a\"{2", "expected '}'");
    refused("root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive");
    refused("root ::= x\nx ::= y? \"a\"\ny ::= x", "left-recursive");
    refused("root ::= (\"a\"?)*", "left-recursive"); /* a repeat of what can be empty */
    refused("root ::= \"\xff\"", "not UTF-8");
    /* the bounds: nesting deeper than a stack holds fails the check, not the process */
    fl_grammar_guide *g = grammar(DYCK);
    char deep[FL_GRAMMAR_MAX_DEPTH + 8];
    memset(deep, '(', sizeof deep);
    int ok = 1;
    size_t i = 0;
    for (; i < sizeof deep && ok == 1; i++)
        if ((ok = fl_grammar_guide_allows(g, deep + i, 1)) == 1) assert_int_equal(fl_grammar_guide_feed(g, deep + i, 1), FL_OK);
    assert_int_equal(ok, -1);
    assert_non_null(strstr(fl_last_error(), "deep"));
    assert_true(i > 500);
    fl_grammar_guide_free(g);
    /* out of memory anywhere in compiling: an error, nothing leaked */
    for (int k = 0; k < 400; k++) {
        fl_mem_fail_after(k);
        fl_grammar_guide *h = NULL;
        const fl_status st = fl_grammar_guide_new(ARITH, &h);
        fl_mem_fail_after(-1);
        if (st == FL_OK) {
            assert_true(k > 10);
            assert_int_equal(fl_grammar_guide_feed(h, "(1+2)", 5), FL_OK);
            fl_grammar_guide_free(h);
            break;
        }
        assert_int_equal(st, FL_ERR_NOMEM);
        assert_null(h);
    }
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_texts), cmocka_unit_test(test_partial_characters), cmocka_unit_test(test_every_text), cmocka_unit_test(test_keys),
        cmocka_unit_test(test_mask),  cmocka_unit_test(test_mask_transitions), cmocka_unit_test(test_walk_budget), cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
