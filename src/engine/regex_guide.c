/* A regular expression that the whole output must match (regex_guide.h): PCRE2's DFA state
 * carried over the text, else rescans on the JIT-compiled (?:PATTERN)\z or the DFA. */
#include "engine/regex_guide.h"
#include "core/alloc.h"
#include "core/status.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>
#include <xxhash.h>

/* The DFA's workspace (allocated where the DFA matches): room for the states that are alive at once (PCRE2 asks for at least 20;
 * a pattern that needs more than this fails its request with a clear error, not silently). */
#define WS_INTS 4096

struct fl_regex_guide {
    pcre2_general_context *gctx;
    pcre2_match_context *mctx;
    pcre2_code *code;   /* the pattern: the DFA runs it, and its checks are made on it */
    pcre2_code *anchored; /* (?:pattern)\z, JIT-compiled, or NULL (then the DFA matches) */
    pcre2_match_data *md;
    int *ws;
    char *text; /* the text so far, then room for a candidate */
    size_t len, cap;
    fl_status err; /* the last RX_ERROR's */
    /* Carried state (RS_*): the DFA's workspace after the text so far (wsr, copied to wst per
     * candidate), so a check reads only the candidate's bytes; off for patterns that look back
     * and once a pass needs more workspace than RS_INTS or fails (the checks then rescan). */
    bool carry;
    int rs;
    int *wsr, *wst;
    XXH128_hash_t phash; /* the pattern's (fl_regex_guide_key) */
    int count_cap;       /* 1 + the largest number written in the pattern (fl_regex_guide_key) */
};

enum { RS_EMPTY, RS_OPEN, RS_SHUT }; /* no text yet; the text can go on (wsr holds it); it cannot */

enum { RX_NONE, RX_OPEN, RX_MATCH, RX_ERROR }; /* no match; the prefix of one; a match; error */

/* The anchored form's backtracking is bounded: a pattern that needs more for one check fails its
 * request with an error rather than holding the engine (the DFA cannot backtrack). */
#define MATCH_LIMIT 200000
/* and so is the memory of its backtracking frames (kept in the match data: ~20 KiB to start) */
#define HEAP_LIMIT_KIB 1024
/* The carried state's workspace (ints): a copy per candidate, so small; a pattern with more
 * states alive at once than it holds goes back to rescanning. */
#define RS_INTS FL_REGEX_STATE_INTS

static int rx_error(fl_regex_guide *g, int rc) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(rc, msg, sizeof msg);
    g->err = rc == PCRE2_ERROR_NOMEMORY ? fl_set_error(FL_ERR_NOMEM, "regex: out of memory while matching")
                                        : fl_set_error(FL_ERR_INVALID, "regex: cannot match: %s", (const char *)msg);
    return RX_ERROR;
}

static bool rx_no_match(int rc) { return rc == PCRE2_ERROR_NOMATCH || (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21); }

/* text[0, n) against the pattern, anchored at its start: RX_MATCH where the longest match is
 * all of it, RX_OPEN where the matcher ran out of text with more wanted (partial: only with
 * PCRE2_PARTIAL_HARD in opt), else RX_NONE (text that is not UTF-8, a character cut at the
 * end included); RX_ERROR (set) for a limit (the backtracking bound, the DFA workspace) or no
 * memory. */
static int rx_match(fl_regex_guide *g, size_t n, uint32_t opt) {
    const int rc = g->anchored ? pcre2_match(g->anchored, (PCRE2_SPTR)g->text, n, 0, PCRE2_ANCHORED | opt, g->md, g->mctx)
                               : pcre2_dfa_match(g->code, (PCRE2_SPTR)g->text, n, 0, PCRE2_ANCHORED | opt, g->md, g->mctx, g->ws, WS_INTS);
    if (rc == PCRE2_ERROR_PARTIAL) return RX_OPEN;
    /* (\z ends the anchored form's matches at n; the DFA gives its longest match first) */
    if (rc >= 0) return g->anchored || pcre2_get_ovector_pointer(g->md)[1] == n ? RX_MATCH : RX_NONE;
    return rx_no_match(rc) ? RX_NONE : rx_error(g, rc);
}

/* The carried state run on s[0, n) after the text so far (PCRE2_DFA_RESTART: the DFA goes on
 * from the workspace ws of the text's last partial match, as if the text had been given whole):
 * RX_OPEN where a path reached the end wanting more (on the anchored form a complete match too:
 * its \z at the end of a segment waits for more), RX_NONE where none lives; RX_MATCH where a
 * match was found and no path goes on (the DFA alone): whether it ends at the end the offsets
 * of a restarted match do not say, so the caller asks a rescan.  -1 where the carried state
 * cannot answer (its workspace too small, an error): off from then on. */
static int rs_run(fl_regex_guide *g, const char *s, size_t n, int *ws) {
    const uint32_t opt = PCRE2_ANCHORED | PCRE2_PARTIAL_HARD | (g->rs == RS_OPEN ? PCRE2_DFA_RESTART : 0);
    /* on the anchored form where there is one: its \z ends every match at the end of the text,
     * so a match that ended inside the candidate dies there rather than being reported */
    const int rc = pcre2_dfa_match(g->anchored ? g->anchored : g->code, (PCRE2_SPTR)s, n, 0, opt, g->md, g->mctx, ws, RS_INTS);
    if (rc == PCRE2_ERROR_PARTIAL) return RX_OPEN;
    if (rc >= 0) return RX_MATCH;
    if (rx_no_match(rc)) return RX_NONE;
    g->carry = false;
    return -1;
}

static bool reserve(fl_regex_guide *g, size_t need) {
    if (need <= g->cap) return true;
    size_t nc = g->cap ? g->cap : 256;
    while (nc < need) nc *= 2;
    char *t = fl_realloc(FL_MEM_GUIDE, g->text, g->cap, nc, 0);
    if (!t) return false;
    g->text = t;
    g->cap = nc;
    return true;
}

enum { FIND_DFA_UNSUPPORTED, FIND_ASSERTION };

/* The first place in p, outside \Q..\E, classes and escapes' arguments, that holds what:
 *   FIND_DFA_UNSUPPORTED: a recursion, subroutine call or condition ("(?R", "(?1", "(?+1",
 *     "(?-1", "(?&", "(?P>", "(?(", "\g<", "\g'"), which a DFA runs none of (and says so
 *     only when the match reaches one);
 *   FIND_ASSERTION: an assertion (^, $, \b, \B, \A, \z, \Z, \G, \K, lookaround), a verb, an
 *     atomic group or a possessive quantifier, whose answers across a token's edges the carried
 *     DFA state does not keep (conservative: a named group, or a comment or an extended-mode
 *     text holding such characters, counts too).
 * NULL if none. */
static const char *pattern_find(const char *p, int what) {
    const bool dfa = what == FIND_DFA_UNSUPPORTED;
    bool cls = false;
    for (; *p; p++) {
        if (p[0] == '\\' && p[1] == 'Q') { /* literal up to \E */
            const char *e = strstr(p + 2, "\\E");
            if (!e) return NULL;
            p = e + 1;
        } else if (p[0] == '\\') {
            if (!p[1]) return NULL;
            if (!cls && (dfa ? p[1] == 'g' && (p[2] == '<' || p[2] == '\'') : strchr("bBAzZGK", p[1]) != NULL)) return p;
            p++;
            if (strchr("pPxoNgk", p[0]) && p[1] == '{') { /* \p{..}, \x{..}, ...: its argument */
                const char *e = strchr(p, '}');
                if (!e) return dfa ? NULL : p;
                p = e;
            } else if (p[0] == 'c' && p[1]) p++; /* \cX */
        } else if (cls) {
            if (p[0] == '[' && p[1] == ':') { /* [:alpha:] */
                const char *e = strstr(p + 2, ":]");
                if (e) p = e + 1;
            } else if (p[0] == ']') cls = false;
        } else if (p[0] == '[') {
            cls = true;
            if (p[1] == '^') p++;
            if (p[1] == ']') p++; /* a leading ] is a member */
        } else if (dfa) {
            const char c = p[1] == '?' ? p[2] : 0;
            if (p[0] == '(' && (c == 'R' || c == '&' || c == '(' || (c >= '0' && c <= '9') ||
                                ((c == '+' || c == '-') && p[3] >= '0' && p[3] <= '9') || (c == 'P' && p[3] == '>')))
                return p;
        } else if (p[0] == '^' || p[0] == '$' ||
                   (p[0] == '(' && (p[1] == '*' || (p[1] == '?' && p[2] && strchr("=!<>*", p[2])))) ||
                   ((p[0] == '*' || p[0] == '+' || p[0] == '?' || p[0] == '}') && p[1] == '+')) {
            return p; /* (a possessive quantifier; "(?+" is refused already) */
        }
    }
    return NULL;
}

/* A leading ^ and a trailing $ (unescaped, outside \Q..\E) say what a whole match means
 * already (at the text's start ^ holds, at its end $ does): the body between them is [*b, *e)
 * of p[0, n).  Patterns written as ^...$ so keep the carried DFA state, which anchors refuse. */
void fl_regex_strip_anchors(const char *p, size_t n, size_t *b, size_t *e) {
    *b = n > 0 && p[0] == '^';
    *e = n;
    if (n <= *b || p[n - 1] != '$') return;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\' && i + 1 < n && p[i + 1] == 'Q') {
            const char *q = strstr(p + i + 2, "\\E");
            if (!q || (size_t)(q - p) >= n) return; /* (the $ is a literal of an open \Q) */
            i = (size_t)(q - p) + 1;
        } else if (p[i] == '\\') {
            if (++i == n - 1) return; /* (an escaped $) */
        }
    }
    *e = n - 1;
}

fl_status fl_regex_guide_new(const char *pattern, fl_regex_guide **out) {
    *out = NULL;
    const size_t full = strlen(pattern);
    if (full > FL_REGEX_MAX_PATTERN) return fl_set_error(FL_ERR_INVALID, "regex: %zu bytes; at most %d", full, FL_REGEX_MAX_PATTERN);
    size_t b, e;
    fl_regex_strip_anchors(pattern, full, &b, &e);
    const size_t plen = e - b, at0 = b; /* the body: what is compiled; offsets in messages are the pattern's */
    fl_regex_guide *g = fl_calloc(FL_MEM_GUIDE, 1, sizeof *g);
    char *body = fl_alloc(FL_MEM_GUIDE, plen + 1, 0);
    if (!g || !body) {
        fl_free(FL_MEM_GUIDE, g, g ? sizeof *g : 0);
        fl_free(FL_MEM_GUIDE, body, body ? plen + 1 : 0);
        return fl_set_error(FL_ERR_NOMEM, "regex: out of memory");
    }
    memcpy(body, pattern + b, plen);
    body[plen] = 0;
    pattern = body;
    fl_status st = FL_OK;
    pcre2_compile_context *cctx = NULL;
    if (!(g->gctx = pcre2_general_context_create(fl_mem_malloc_ctx, fl_mem_free_ctx, fl_mem_ctx(FL_MEM_GUIDE))) || !(cctx = pcre2_compile_context_create(g->gctx)) ||
        !(g->mctx = pcre2_match_context_create(g->gctx))) {
        st = fl_set_error(FL_ERR_NOMEM, "regex: out of memory");
        goto done;
    }
    int err = 0;
    PCRE2_SIZE off = 0;
    g->phash = XXH3_128bits(pattern, plen);
    g->count_cap = 2; /* (+ is a count against 1) */
    for (const char *q = pattern; *q; q++) { /* every run of digits, bounds or not (more is safe) */
        long v = 0;
        for (; *q >= '0' && *q <= '9'; q++) v = v < 100000 ? v * 10 + (*q - '0') : v;
        if (v + 1 > g->count_cap) g->count_cap = (int)v + 1;
        if (!*q) break;
    }
    g->code = pcre2_compile((PCRE2_SPTR)pattern, plen, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_NEVER_BACKSLASH_C, &err, &off, cctx);
    if (!g->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        st = err == PCRE2_ERROR_HEAP_FAILED || err == PCRE2_ERROR_NOMEMORY ? fl_set_error(FL_ERR_NOMEM, "regex: out of memory")
                                         : fl_set_error(FL_ERR_INVALID, "regex at offset %zu: %s", (size_t)off + at0, (const char *)msg);
        goto done;
    }
    uint32_t backref = 0;
    pcre2_pattern_info(g->code, PCRE2_INFO_BACKREFMAX, &backref);
    if (backref) {
        st = fl_set_error(FL_ERR_INVALID, "regex: backreferences are not supported (the output is matched as a DFA)");
        goto done;
    }
    const char *un = pattern_find(pattern, FIND_DFA_UNSUPPORTED);
    if (un) {
        st = fl_set_error(FL_ERR_INVALID, "regex at offset %zu: recursion, subroutine calls and conditions are not supported (the output is matched as a DFA)",
                          (size_t)(un - pattern) + at0);
        goto done;
    }
    /* Rescans run on the JIT-compiled (?:pattern)\z, 3-4x faster than the DFA (a 270-byte text:
     * 0.41 against 1.50 us), and the carried DFA state runs on it too (its \z).  The wrapping
     * compiles exactly where the pattern ends outside a comment and a \Q..\E (where it does not,
     * ")\z" would be eaten and "(?:" left open: an error) or other verbs stay at its start; else
     * the plain pattern on the DFA does both. */
    char *w = fl_alloc(FL_MEM_GUIDE, plen + 8, 0);
    if (!w) {
        st = fl_set_error(FL_ERR_NOMEM, "regex: out of memory");
        goto done;
    }
    memcpy(w, "(?:", 3);
    memcpy(w + 3, pattern, plen);
    memcpy(w + 3 + plen, ")\\z", 3);
    g->anchored = pcre2_compile((PCRE2_SPTR)w, plen + 6, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_NEVER_BACKSLASH_C, &err, &off, cctx);
    fl_free(FL_MEM_GUIDE, w, plen + 8);
    if (g->anchored) {
        (void)pcre2_jit_compile(g->anchored, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD); /* (else its interpreter) */
        pcre2_set_match_limit(g->mctx, MATCH_LIMIT);
        pcre2_set_heap_limit(g->mctx, HEAP_LIMIT_KIB);
    } else if (err == PCRE2_ERROR_HEAP_FAILED || !(g->ws = fl_alloc(FL_MEM_GUIDE, WS_INTS * sizeof(int), 0))) { /* (the DFA's only) */
        st = fl_set_error(FL_ERR_NOMEM, "regex: out of memory");
        goto done;
    }
    /* the carried state: where no assertion looks across a token's edges (a lookbehind or \b
     * would need the text before it, a lookahead or an anchor the text after) and nothing is
     * atomic (fuzz_regex found "((?!|a))" and "(a+)++c" answered otherwise carried) */
    uint32_t lookbehind = 0;
    pcre2_pattern_info(g->code, PCRE2_INFO_MAXLOOKBEHIND, &lookbehind);
    if (lookbehind == 0 && !pattern_find(pattern, FIND_ASSERTION)) {
        if (!(g->wsr = fl_alloc(FL_MEM_GUIDE, 2 * RS_INTS * sizeof(int), 0))) {
            st = fl_set_error(FL_ERR_NOMEM, "regex: out of memory");
            goto done;
        }
        g->wst = g->wsr + RS_INTS;
        g->carry = true;
    }
    if (!(g->md = pcre2_match_data_create_from_pattern(g->code, g->gctx))) {
        st = fl_set_error(FL_ERR_NOMEM, "regex: out of memory");
        goto done;
    }
    /* what the matcher cannot run shows on the empty text (the carried DFA state meeting such a
     * thing later turns itself off: rescans) */
    if (!reserve(g, 64)) {
        st = fl_set_error(FL_ERR_NOMEM, "regex: out of memory");
        goto done;
    }
    if (rx_match(g, 0, PCRE2_PARTIAL_HARD) == RX_ERROR) st = g->err;
done:
    if (cctx) pcre2_compile_context_free(cctx);
    fl_free(FL_MEM_GUIDE, body, plen + 1);
    if (st) fl_regex_guide_free(g);
    else *out = g;
    return st;
}

void fl_regex_guide_free(fl_regex_guide *g) {
    if (!g) return;
    if (g->md) pcre2_match_data_free(g->md);
    if (g->code) pcre2_code_free(g->code);
    if (g->anchored) pcre2_code_free(g->anchored);
    if (g->mctx) pcre2_match_context_free(g->mctx);
    if (g->gctx) pcre2_general_context_free(g->gctx);
    fl_free(FL_MEM_GUIDE, g->ws, g->ws ? WS_INTS * sizeof(int) : 0);
    fl_free(FL_MEM_GUIDE, g->wsr, g->wsr ? 2 * RS_INTS * sizeof(int) : 0);
    fl_free(FL_MEM_GUIDE, g->text, g->cap);
    fl_free(FL_MEM_GUIDE, g, sizeof *g);
}

int fl_regex_guide_allows(fl_regex_guide *g, const char *s, size_t n) {
    if (n == 0) return 1; /* (the text so far was allowed; PCRE2 reports no partial match of an empty text) */
    if (g->carry) {
        if (g->rs == RS_SHUT) return 0;
        if (g->rs == RS_OPEN) memcpy(g->wst, g->wsr, RS_INTS * sizeof(int));
        const int m = rs_run(g, s, n, g->wst);
        if (m == RX_OPEN || m == RX_NONE) return m == RX_OPEN; /* (RX_MATCH, -1: the rescan below) */
    }
    if (!reserve(g, g->len + n)) {
        fl_set_error(FL_ERR_NOMEM, "regex: out of memory");
        return -1;
    }
    memcpy(g->text + g->len, s, n);
    const int m = rx_match(g, g->len + n, PCRE2_PARTIAL_HARD);
    return m == RX_ERROR ? -1 : m != RX_NONE;
}

fl_status fl_regex_guide_feed(fl_regex_guide *g, const char *s, size_t n) {
    if (!reserve(g, g->len + n)) return fl_set_error(FL_ERR_NOMEM, "regex: out of memory");
    if (g->carry && n > 0 && g->rs != RS_SHUT) { /* the carried state goes on through s */
        const int m = rs_run(g, s, n, g->wsr);
        if (m >= 0) g->rs = m == RX_OPEN ? RS_OPEN : RS_SHUT; /* (no path lives on past a match or none) */
    }
    memcpy(g->text + g->len, s, n);
    g->len += n;
    return FL_OK;
}

bool fl_regex_guide_complete(fl_regex_guide *g) { return rx_match(g, g->len, 0) == RX_MATCH; }

size_t fl_regex_guide_len(const fl_regex_guide *g) { return g->len; }

bool fl_regex_guide_on_dfa(const fl_regex_guide *g) { return g->anchored == NULL; }

bool fl_regex_guide_carries(const fl_regex_guide *g) { return g->carry; }

/* The carried state as PCRE2's DFA restarts from it (pcre2_dfa_match.c, 10.3x-10.4x): the
 * workspace past its first two ints is two halves of (RS_INTS - 2) / 6 states each; ws[0] says
 * which half holds the states alive after the text (0 the first, 1 the second), ws[1] how many.
 * A state is 3 ints: an offset into the compiled pattern, a repeat count, and data that is read
 * only where the offset is negative (characters still to skip), none of them a position in the
 * text.  A restart reads nothing else.  The key takes each state's offset, its count clamped to
 * count_cap (counts are compared only with 0 and with repeat bounds, which are numbers written
 * in the pattern: past the largest, counts answer alike), and its data where it is read; so two
 * texts with equal keys get the same answer to every check.  A workspace that does not look
 * like this gives no key (the checks go on as before). */
bool fl_regex_guide_key(const fl_regex_guide *g, uint8_t key[16]) {
    enum { HALF = (RS_INTS - 2) / 6 };
    int buf[4 + 2 + 3 * HALF];
    if (!g->carry) return false;
    memcpy(buf, &g->phash, sizeof g->phash);
    buf[4] = g->rs;
    int n = 0;
    if (g->rs == RS_OPEN) {
        const int half = g->wsr[0], count = g->wsr[1];
        if ((half != 0 && half != 1) || count < 0 || count > HALF) return false;
        const int *st = g->wsr + 2 + (half ? 3 * HALF : 0);
        buf[5] = count;
        for (int i = 0; i < count; i++) {
            const int off = st[3 * i], c = st[3 * i + 1];
            buf[6 + 3 * i] = off;
            buf[6 + 3 * i + 1] = c < g->count_cap ? c : g->count_cap;
            buf[6 + 3 * i + 2] = off < 0 ? st[3 * i + 2] : 0;
        }
        n = 1 + 3 * count;
    }
    const XXH128_hash_t h = XXH3_128bits(buf, (size_t)(5 + n) * sizeof(int));
    XXH128_canonicalFromHash((XXH128_canonical_t *)key, h);
    return true;
}

void fl_regex_guide_set_carry(fl_regex_guide *g, bool on) { g->carry = on && g->wsr && g->len == 0; }

/* ---- a JSON string's pattern (JSON Schema "pattern"), on the DFA a character at a time ---- */

struct fl_regex_str {
    pcre2_general_context *gctx;
    pcre2_match_context *mctx;
    pcre2_code *code; /* (?:PATTERN)\x{10FFFF}: the string, then the end mark */
    pcre2_match_data *md;
};

/* U+10FFFF in UTF-8: the end mark, which the strings themselves may not hold (fl_regex_str_step) */
static const char END_MARK[4] = {(char)0xF4, (char)0x8F, (char)0xBF, (char)0xBF};

fl_status fl_regex_str_new(const char *pattern, fl_regex_str **out) {
    *out = NULL;
    const size_t full = strlen(pattern);
    if (full > FL_REGEX_MAX_PATTERN) return fl_set_error(FL_ERR_INVALID, "pattern: %zu bytes; at most %d", full, FL_REGEX_MAX_PATTERN);
    size_t b, e;
    fl_regex_strip_anchors(pattern, full, &b, &e);
    fl_regex_str *x = fl_calloc(FL_MEM_GUIDE, 1, sizeof *x);
    char *w = fl_alloc(FL_MEM_GUIDE, e - b + 16, 0);
    fl_status st = FL_OK;
    pcre2_compile_context *cctx = NULL;
    if (!x || !w || !(x->gctx = pcre2_general_context_create(fl_mem_malloc_ctx, fl_mem_free_ctx, fl_mem_ctx(FL_MEM_GUIDE))) ||
        !(cctx = pcre2_compile_context_create(x->gctx)) || !(x->mctx = pcre2_match_context_create(x->gctx))) {
        st = fl_set_error(FL_ERR_NOMEM, "pattern: out of memory");
        goto done;
    }
    memcpy(w, pattern + b, e - b); /* the body alone first, for the scans */
    w[e - b] = 0;
    const char *at = pattern_find(w, FIND_ASSERTION);
    if (at) {
        st = fl_set_error(FL_ERR_INVALID, "pattern at offset %zu: assertions (other than a leading ^ and a trailing $), atomic groups and possessive quantifiers are not supported",
                          (size_t)(at - w) + b);
        goto done;
    }
    if ((at = pattern_find(w, FIND_DFA_UNSUPPORTED))) {
        st = fl_set_error(FL_ERR_INVALID, "pattern at offset %zu: recursion, subroutine calls and conditions are not supported", (size_t)(at - w) + b);
        goto done;
    }
    int err = 0;
    PCRE2_SIZE off = 0;
    /* the body alone first: its errors at its own offsets, its backreferences */
    for (int wrapped = 0; wrapped < 2; wrapped++) {
        if (wrapped) {
            memcpy(w, "(?:", 3);
            memcpy(w + 3, pattern + b, e - b);
            memcpy(w + 3 + (e - b), ")\\x{10FFFF}", 12);
        }
        x->code = pcre2_compile((PCRE2_SPTR)w, wrapped ? e - b + 14 : e - b, PCRE2_UTF | PCRE2_NEVER_BACKSLASH_C, &err, &off, cctx);
        if (!x->code) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            st = err == PCRE2_ERROR_HEAP_FAILED || err == PCRE2_ERROR_NOMEMORY
                     ? fl_set_error(FL_ERR_NOMEM, "pattern: out of memory")
                     : wrapped ? fl_set_error(FL_ERR_INVALID, "pattern: does not end outside a comment or \\Q..\\E (%s)", (const char *)msg)
                               : fl_set_error(FL_ERR_INVALID, "pattern at offset %zu: %s", (size_t)off + b, (const char *)msg);
            goto done;
        }
        uint32_t backref = 0;
        pcre2_pattern_info(x->code, PCRE2_INFO_BACKREFMAX, &backref);
        if (backref) {
            st = fl_set_error(FL_ERR_INVALID, "pattern: backreferences are not supported (strings are matched as a DFA)");
            goto done;
        }
        if (!wrapped) {
            pcre2_code_free(x->code);
            x->code = NULL;
        }
    }
    if (!(x->md = pcre2_match_data_create(1, x->gctx))) st = fl_set_error(FL_ERR_NOMEM, "pattern: out of memory");
done:
    if (cctx) pcre2_compile_context_free(cctx);
    fl_free(FL_MEM_GUIDE, w, w ? e - b + 16 : 0);
    if (st) fl_regex_str_free(x);
    else *out = x;
    return st;
}

void fl_regex_str_free(fl_regex_str *x) {
    if (!x) return;
    if (x->md) pcre2_match_data_free(x->md);
    if (x->code) pcre2_code_free(x->code);
    if (x->mctx) pcre2_match_context_free(x->mctx);
    if (x->gctx) pcre2_general_context_free(x->gctx);
    fl_free(FL_MEM_GUIDE, x, sizeof *x);
}

int fl_regex_str_step(fl_regex_str *x, fl_regex_state *s, const char *ch, size_t n) {
    if (s->rs == RS_SHUT) return 0;
    if (n == 4 && !memcmp(ch, END_MARK, 4)) return 0; /* (the end mark is no character of a string) */
    const uint32_t opt = PCRE2_ANCHORED | PCRE2_PARTIAL_HARD | (s->rs == RS_OPEN ? PCRE2_DFA_RESTART : 0);
    const int rc = pcre2_dfa_match(x->code, (PCRE2_SPTR)ch, n, 0, opt, x->md, x->mctx, s->ws, RS_INTS);
    if (rc == PCRE2_ERROR_PARTIAL) {
        s->rs = RS_OPEN;
        return 1;
    }
    if (rc >= 0 || rx_no_match(rc)) { /* (a match would have taken the end mark) */
        s->rs = RS_SHUT;
        return 0;
    }
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(rc, msg, sizeof msg);
    fl_set_error(rc == PCRE2_ERROR_NOMEMORY ? FL_ERR_NOMEM : FL_ERR_INVALID, "pattern: cannot match: %s", (const char *)msg);
    return -1;
}

bool fl_regex_str_complete(fl_regex_str *x, const fl_regex_state *s) {
    if (s->rs == RS_SHUT) return false;
    int ws[RS_INTS];
    if (s->rs == RS_OPEN) memcpy(ws, s->ws, sizeof ws);
    const uint32_t opt = PCRE2_ANCHORED | (s->rs == RS_OPEN ? PCRE2_DFA_RESTART : 0);
    return pcre2_dfa_match(x->code, (PCRE2_SPTR)END_MARK, 4, 0, opt, x->md, x->mctx, ws, RS_INTS) >= 0;
}
