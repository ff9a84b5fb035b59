/*
 * fuzz_tools.c - libFuzzer target for the server's tool calling and reasoning split
 * (src/server/tools.c, src/server/reasoning.c): the input is a selector byte, a request body
 * (tools, tool_choice, ...), a NUL byte and a model output.
 *
 * Invariants checked on every input:
 *   - reading the body never fails but with FL_ERR_INVALID (a message set) or FL_ERR_NOMEM, and a
 *     constraint comes back exactly for tool_choice "required" or a named function;
 *   - the GBNF grammar built for "required" over several tools always compiles (it is ours);
 *   - what streams as content is a prefix of the output (all of it without tools);
 *   - the calls read out of an output are well formed (an id "call_" + 24 hex digits, type
 *     "function", a non-empty name, arguments as text), and the content beside them is no longer
 *     than the output;
 *   - the reasoning split's offsets are in order inside the output, decided once the output is
 *     whole, and a streamed prefix never hands out reasoning past what the whole output has;
 *   - a body's "messages" render in each template family (or are refused with a message); without
 *     the generation prompt the text is a prefix of the one with it, and (but for DeepSeek-R1's,
 *     which drops a closed answer's thinking) the last message left open a prefix of both;
 *   - --chat-template's resolution of the output as an argument gives NULL or text;
 *   - "required" calls read piece by piece: pieces in order inside the output, headers numbered
 *     0, 1, ..., arguments only of the last call begun, and the same pieces' text whether the
 *     output comes whole or in two parts; "auto" calls likewise from where the hold stops, once
 *     they start there (srv_tools_auto_start);
 *   - "auto"'s lazy grammar (srv_tools_lazy) always compiles, and so do its triggers; a body's
 *     structural_tag is read or refused with a message, and its grammar compiles;
 *   - the triggers of the auto grammar, looking past the reasoning or not, fire inside the output,
 *     and where they fire on a prefix given a byte at a time, the whole output (valid UTF-8) fires
 *     no later.
 */
#include "core/utf8.h"
#include "engine/grammar.h"
#include "engine/triggers.h"
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                                       \
    do {                                                                                                               \
        if (!(c)) __builtin_trap();                                                                                    \
    } while (0)

/* Read out's calls piece by piece, the output given up to cut first (then whole): a digest of the
 * pieces (each call's name and arguments, and the end state) into d, 0 on overflow. */
static size_t scan_digest(const srv_call_scan *c0, const char *out, size_t n, size_t cut, char *d, size_t cap) {
    srv_call_scan c = *c0;
    size_t dn = 0, last = 0;
    int32_t calls = 0;
    for (int pass = 0; pass < 2; pass++) {
        const size_t m = pass ? n : cut;
        int32_t k;
        size_t a, e;
        srv_call_piece p;
        while ((p = srv_calls_next(&c, out, m, pass == 1, &k, &a, &e)) != SRV_CALL_NONE) {
            CHECK(a <= e && e <= m && a >= last);
            last = e;
            if (p == SRV_CALL_HEADER) CHECK(k == calls++ && e > a);
            else CHECK(k == calls - 1);
            if (dn + (e - a) + 2 > cap) return 0;
            d[dn++] = p == SRV_CALL_HEADER ? '\x01' : '\x02';
            memcpy(d + dn, out + a, e - a);
            dn += e - a;
        }
    }
    if (dn + 1 > cap) return 0;
    d[dn++] = srv_calls_done(&c) ? 'D' : srv_calls_off(&c) ? 'O' : 'P';
    return dn;
}

/* a grammar the server built compiles (it is ours), but for want of memory */
static void grammar_compiles(const char *gbnf) {
    fl_grammar_guide *g = NULL;
    const fl_status gs = fl_grammar_guide_new(gbnf, &g);
    CHECK(gs == FL_OK || gs == FL_ERR_NOMEM || gs == FL_ERR_BUDGET);
    fl_grammar_guide_free(g);
}

static void check_calls(const cJSON *calls, size_t content_len, size_t n) {
    CHECK(content_len <= n);
    if (!calls) return;
    CHECK(cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0);
    const cJSON *x;
    cJSON_ArrayForEach(x, calls) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(x, "id"), *ty = cJSON_GetObjectItemCaseSensitive(x, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(x, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name"), *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        CHECK(cJSON_IsString(id) && strlen(id->valuestring) == 29 && !strncmp(id->valuestring, "call_", 5));
        for (int i = 5; i < 29; i++) CHECK(strchr("0123456789abcdef", id->valuestring[i]) != NULL);
        CHECK(cJSON_IsString(ty) && !strcmp(ty->valuestring, "function"));
        CHECK(cJSON_IsString(nm) && nm->valuestring[0]);
        CHECK(cJSON_IsString(a));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t sel = data[0];
    const char *body = (const char *)data + 1;
    const size_t rest = size - 1;
    const char *nul = memchr(body, 0, rest);
    const size_t blen = nul ? (size_t)(nul - body) : rest;
    const char *out = nul ? nul + 1 : "";
    const size_t n = nul ? rest - blen - 1 : 0;

    /* the request */
    srv_tools t;
    cJSON *j = cJSON_ParseWithLength(body, blen);
    if (j) {
        const cJSON *tools = NULL;
        char *constraint = NULL, err[256] = "";
        bool gr = false;
        const fl_status st = srv_tools_read(j, sel & 1, &t, &tools, &constraint, &gr, err, sizeof err);
        CHECK(st == FL_OK || st == FL_ERR_NOMEM || (st == FL_ERR_INVALID && err[0]));
        if (st == FL_OK) {
            CHECK((constraint != NULL) == (t.mode == SRV_TOOLS_REQUIRED || t.mode == SRV_TOOLS_NAMED));
            CHECK(t.mode == SRV_TOOLS_NONE || tools != NULL);
            if (gr) grammar_compiles(constraint);
            char *lz = NULL;
            fl_grammar_trigger trig[SRV_TOOLS_TRIGGERS];
            int32_t nt = 0;
            const fl_status ls = srv_tools_lazy(&t, tools, &lz, trig, &nt);
            CHECK(ls == FL_OK || ls == FL_ERR_NOMEM);
            if (ls == FL_OK) CHECK((lz != NULL) == (t.mode == SRV_TOOLS_AUTO && tools) && nt >= 0 && nt <= SRV_TOOLS_TRIGGERS);
            if (lz) {
                grammar_compiles(lz);
                fl_triggers *x = NULL;
                const fl_status ts = fl_triggers_new(trig, nt, 100, (sel >> 5) % 3, &x);
                CHECK(ts == FL_OK || ts == FL_ERR_NOMEM);
                fl_triggers_free(x);
            }
            cJSON_free(lz);
        }
        cJSON_free(constraint);
        const cJSON *stag = cJSON_GetObjectItemCaseSensitive(j, "structural_tag");
        if (stag) {
            char *sg = NULL, serr[256] = "";
            fl_grammar_trigger trig[FL_MAX_TRIGGERS];
            int32_t nt = 0;
            const fl_status ss = srv_structural_tag(stag, &sg, trig, &nt, serr, sizeof serr);
            CHECK(ss == FL_OK || ss == FL_ERR_NOMEM || (ss == FL_ERR_INVALID && serr[0] && !sg));
            if (ss == FL_OK) {
                CHECK(sg && nt >= 1 && nt <= FL_MAX_TRIGGERS);
                grammar_compiles(sg);
            }
            cJSON_free(sg);
        }
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
        if (msgs) {
            static const char *const tmpls[] = {NULL, "<|im_start|>", "<|start_header_id|>", "<|user|><|end|>", "[INST]",
                                                "<\xEF\xBD\x9CUser\xEF\xBD\x9C><\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>"};
            const char *tm = tmpls[(sel >> 1) % 6];
            srv_buf r[3] = {{0}};
            static const unsigned fl[3] = {0, SRV_CHAT_NO_GEN_PROMPT, SRV_CHAT_NO_GEN_PROMPT | SRV_CHAT_CONTINUE};
            fl_status rs[3];
            for (int k = 0; k < 3; k++) {
                const char *e = NULL;
                rs[k] = srv_chat_render_ex(tm, msgs, NULL, fl[k], &r[k], &e);
                CHECK(rs[k] == FL_OK || rs[k] == FL_ERR_NOMEM || (rs[k] == FL_ERR_INVALID && e && e[0]));
            }
            if (rs[0] == FL_OK && rs[1] == FL_OK) CHECK(r[1].len <= r[0].len && (!r[1].len || !memcmp(r[1].p, r[0].p, r[1].len)));
            if (rs[1] == FL_OK && rs[2] == FL_OK && (sel >> 1) % 6 != 5)
                CHECK(r[2].len <= r[1].len && (!r[2].len || !memcmp(r[2].p, r[1].p, r[2].len)));
            if (rs[0] == FL_ERR_INVALID) CHECK(rs[1] != FL_OK); /* the flags refuse more, never less */
            for (int k = 0; k < 3; k++) srv_buf_free(&r[k]);
        }
        cJSON_Delete(j);
    }
    {
        char arg[64];
        const size_t an = n < sizeof arg - 1 ? n : sizeof arg - 1;
        memcpy(arg, out, an);
        arg[an] = 0;
        bool known = false;
        const char *tx = srv_chat_template_resolve(arg, &known);
        CHECK(!tx || tx[0]);
    }

    /* the output, read in each mode */
    static const srv_tool_mode modes[] = {SRV_TOOLS_NONE, SRV_TOOLS_AUTO, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED};
    t = (srv_tools){.mode = modes[(sel >> 1) & 3], .json_style = sel & 1, .parallel = true};
    strcpy(t.named, "f");
    const size_t h = srv_tools_hold(&t, out, n, 0);
    CHECK(h <= n);
    if (t.mode == SRV_TOOLS_NONE) CHECK(h == n);
    const size_t hp = srv_tools_hold(&t, out, n ? (size_t)(sel >> 4) * n / 15 : 0, 0); /* a prefix's: streamed */
    CHECK(srv_tools_hold(&t, out, n, hp) == h); /* resumed there: the same */
    for (int trim = 0; trim < 2; trim++) {
        srv_buf content = {0};
        cJSON *calls = srv_tools_parse(&t, out, n, (uint64_t)sel * 77, trim, &content);
        check_calls(calls, content.len, n);
        if (t.mode == SRV_TOOLS_NAMED) CHECK(calls != NULL && cJSON_GetArraySize(calls) == 1);
        cJSON_Delete(calls);
        srv_buf_free(&content);
    }

    /* "required" calls piece by piece (and "auto" ones where they start at the hold): whole, and
     * in two parts, the same (arguments may come in more pieces: their markers are dropped before
     * comparing) */
    srv_call_scan c0;
    memset(&c0, 0, sizeof c0);
    const int started = t.mode == SRV_TOOLS_AUTO && h < n ? srv_tools_auto_start(&t, out, n, h, &c0) : 0;
    CHECK(started >= -1 && started <= 1);
    if (t.mode == SRV_TOOLS_REQUIRED || started > 0) {
        static char d1[1 << 16], d2[1 << 16];
        const size_t cut = n ? (size_t)(sel >> 4) * n / 15 : 0;
        const size_t l1 = scan_digest(&c0, out, n, n, d1, sizeof d1), l2 = scan_digest(&c0, out, n, cut, d2, sizeof d2);
        if (l1 && l2) {
            size_t w1 = 0, w2 = 0;
            for (size_t q = 0; q < l1; q++)
                if (d1[q] != '\x02') d1[w1++] = d1[q];
            for (size_t q = 0; q < l2; q++)
                if (d2[q] != '\x02') d2[w2++] = d2[q];
            CHECK(w1 == w2 && !memcmp(d1, d2, w1));
        }
    }

    /* the auto grammar's triggers: a byte at a time up to cut, then whole */
    if (t.mode == SRV_TOOLS_AUTO) {
        char *lz = NULL;
        fl_grammar_trigger trig[SRV_TOOLS_TRIGGERS];
        int32_t nt = 0;
        cJSON *one = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]");
        if (one && srv_tools_lazy(&t, one, &lz, trig, &nt) == FL_OK && lz) {
            fl_triggers *x = NULL, *y = NULL;
            const int32_t after = (sel >> 5) % 3;
            if (fl_triggers_new(trig, nt, 100, after, &x) == FL_OK && fl_triggers_new(trig, nt, 100, after, &y) == FL_OK) {
                const size_t cut = n ? (size_t)(sel >> 4) * n / 15 : 0;
                int64_t at = -1;
                for (size_t m = 1; m <= cut && at == -1; m++) at = fl_triggers_find(x, out, m, 1, 0);
                const int64_t whole = fl_triggers_find(y, out, n, n, 0);
                CHECK(at >= -2 && (at < 0 || (size_t)at <= cut));
                CHECK(whole >= -2 && (whole < 0 || (size_t)whole <= n));
                /* (a full pattern cannot span an invalid UTF-8 sequence: one that came later stops it) */
                if (at >= 0 && fl_utf8_is_valid(out, n)) CHECK(whole >= 0 && whole <= at);
            }
            fl_triggers_free(x);
            fl_triggers_free(y);
        }
        cJSON_free(lz);
        cJSON_Delete(one);
    }

    /* the reasoning split, whole and for a prefix */
    const bool open = (sel >> 3) & 1;
    size_t r0, r1, c;
    const srv_think th = srv_think_scan(out, n, open, true, 0, &r0, &r1, &c);
    CHECK(th == SRV_THINK_NONE || th == SRV_THINK_DONE);
    if (th == SRV_THINK_DONE) CHECK(r0 <= r1 && r1 <= c && c <= n);
    const size_t cut = n ? (size_t)(sel >> 4) * n / 15 : 0;
    size_t p0, p1, pc;
    const srv_think tp = srv_think_scan(out, cut, open, false, 0, &p0, &p1, &pc);
    if (tp == SRV_THINK_IN || tp == SRV_THINK_DONE) {
        CHECK(p0 <= p1 && p1 <= cut);
        CHECK(th == SRV_THINK_DONE && p0 == r0 && p1 <= r1);
    }
    if (tp == SRV_THINK_NONE) CHECK(th == SRV_THINK_NONE);
    if (tp == SRV_THINK_IN) { /* resumed from what the prefix handed out: the same answer as from the start */
        size_t q0, q1, qc;
        CHECK(srv_think_scan(out, n, open, true, p1, &q0, &q1, &qc) == th && q0 == r0 && q1 == r1 && qc == c);
    }
    return 0;
}
