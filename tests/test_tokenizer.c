/* Tests for src/model/tokenizer: llama.cpp's test vectors (shared/vocab), round trips,
 * stories260K / llama-2-tiny-random references, special tokens, bad input. */
#include "test.h"

#include "core/status.h"
#include "formats/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h" /* spm_split switch for the chunking check */

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>

#define SEP "\n__ggml_vocab_test__\n"

static fl_tokenizer *load_gguf_tok(const char *rel) {
    fl_gguf *g = NULL;
    fl_status st = fl_gguf_open(FL_SHARED_PATH(rel), &g);
    if (st) fail_msg("open %s: %s", rel, fl_last_error());
    fl_tokenizer *t = NULL;
    st = fl_tokenizer_new(g, &t);
    if (st) fail_msg("tokenizer %s: %s", rel, fl_last_error());
    fl_gguf_free(g); /* the tokenizer keeps its own copies */
    return t;
}

/* Tokenize into a fresh buffer (caller frees with free()). */
static int32_t *tok(const fl_tokenizer *t, const char *s, size_t n, bool add_special, bool parse_special, int64_t *n_out) {
    int64_t cap = (int64_t)n + 8;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    assert_non_null(ids);
    fl_status st = fl_tokenize(t, s, n, add_special, parse_special, ids, cap, n_out);
    if (st) fail_msg("fl_tokenize: %s", fl_last_error());
    assert_true(*n_out <= cap);
    return ids;
}

/* Does the input contain something llama.cpp's clean_spaces rewrites? */
static bool has_clean_pattern(const char *s, size_t n) {
    for (size_t i = 1; i < n; i++)
        if (s[i - 1] == ' ' && (s[i] == '?' || s[i] == '!' || s[i] == '.' || s[i] == ',' || s[i] == '\'')) return true;
    return false;
}

/* Run one .inp/.out pair: every case must give exactly the expected ids (add_special=false,
 * parse_special=false).  Also checks the round trips: the concatenated pieces must give the
 * input back for every case, and fl_detokenize too except where clean_spaces rewrites it. */
static void run_vectors(const fl_tokenizer *t, const char *name) {
    char rel[256];
    size_t inp_len = 0, out_len = 0;
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf.inp", name);
    char *inp = fl_test_read_file(FL_SHARED_PATH(rel), &inp_len);
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf.out", name);
    char *out = fl_test_read_file(FL_SHARED_PATH(rel), &out_len);
    assert_non_null(inp);
    assert_non_null(out);
    int n_case = 0, n_pass = 0, n_rt_pieces = 0, n_rt_detok = 0;
    char *p = inp, *line = out;
    char dbuf[8192], pbuf[8192];
    for (;;) {
        char *e = strstr(p, SEP);
        if (!e) break;
        size_t n = (size_t)(e - p);
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = 0;
        /* expected ids */
        int32_t want[1024];
        int n_want = 0;
        for (char *q = line; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[n_want++] = (int32_t)v;
            q = end;
        }
        int64_t n_got = 0;
        int32_t *got = tok(t, p, n, false, false, &n_got);
        bool ok = n_got == n_want;
        for (int i = 0; ok && i < n_want; i++) ok = got[i] == want[i];
        if (ok) n_pass++;
        else {
            fprintf(stderr, "  %s case %d FAILED: '%.*s'\n    want:", name, n_case, (int)n, p);
            for (int i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n    got: ");
            for (int64_t i = 0; i < n_got; i++) fprintf(stderr, " %d", got[i]);
            fprintf(stderr, "\n");
        }
        /* round trip through the pieces (first one without the SPM prefix space) */
        size_t pl = 0;
        for (int64_t i = 0; i < n_got; i++) {
            char piece[512];
            int32_t k = fl_token_to_piece(t, got[i], piece, sizeof piece, false);
            assert_true(k >= 0);
            const char *s = piece;
            if (i == 0 && strcmp(fl_tokenizer_kind(t), "llama") == 0 && k > 0 && piece[0] == ' ') s++, k--;
            memcpy(pbuf + pl, s, (size_t)k);
            pl += (size_t)k;
        }
        if (pl == n && memcmp(pbuf, p, n) == 0) n_rt_pieces++;
        else fprintf(stderr, "  %s case %d: pieces do not round-trip\n", name, n_case);
        int64_t dl = fl_detokenize(t, got, n_got, dbuf, sizeof dbuf, true, false);
        assert_true(dl >= 0);
        if ((size_t)dl == n && memcmp(dbuf, p, n) == 0) n_rt_detok++;
        else {
            fprintf(stderr, "  %s case %d: detokenize differs (clean_spaces rewrites '%.*s' -> '%.*s')\n", name, n_case,
                    (int)n, p, (int)dl, dbuf);
            assert_true(has_clean_pattern(p, n)); /* the only allowed reason */
        }
        free(got);
        n_case++;
        p = e + strlen(SEP);
        line = nl + 1;
    }
    fprintf(stderr, "vocab %-15s: %d/%d cases pass; round trip: pieces %d/%d, fl_detokenize %d/%d\n", name, n_pass, n_case,
            n_rt_pieces, n_case, n_rt_detok, n_case);
    assert_int_equal(n_case, 46);
    assert_int_equal(n_pass, n_case);
    assert_int_equal(n_rt_pieces, n_case);
    fl_test_free_file(inp, inp_len);
    fl_test_free_file(out, out_len);
}

static void vectors_gguf(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", name);
    fl_tokenizer *t = load_gguf_tok(rel);
    run_vectors(t, name);
    fl_tokenizer_free(t);
    fl_test_mem_zero();
}

/* Falcon's vocabulary has no token for 28 bytes, among them the control character 0x03 (its
 * GPT-2 character U+0103 is not a token).  llama.cpp's BPE looks a symbol that is not a token up
 * byte by byte and leaves out the bytes that are not tokens either; so must we (found by
 * fuzz_tokenize, whose round-trip check allows exactly these bytes to go missing). */
static void test_falcon_lacking_bytes(void **state) {
    (void)state;
    NEED_SHARED();
    fl_tokenizer *t = load_gguf_tok("vocab/ggml-vocab-falcon.gguf");
    assert_int_equal(fl_tokenizer_find(t, "\xC4\x83", 2), -1);   /* U+0103, the byte 0x03 */
    assert_true(fl_tokenizer_find(t, "\xC4\x87", 2) >= 0);       /* U+0107, the byte 0x07 */
    int64_t n_a = 0, n_c = 0;
    int32_t *a = tok(t, "ab\x03" "cd", 5, false, false, &n_a);
    int32_t *c = tok(t, "\x03", 1, false, false, &n_c);
    assert_int_equal(n_c, 0); /* the byte alone: no ids */
    /* "ab" and "cd" come through; the byte between them leaves nothing */
    char buf[64];
    int64_t k = fl_detokenize(t, a, n_a, buf, sizeof buf, true, false);
    assert_int_equal(k, 4);
    assert_memory_equal(buf, "abcd", 4);
    free(a), free(c);
    fl_tokenizer_free(t);
    fl_test_mem_zero();
}

static void test_vocab_llama_spm(void **state) { (void)state; NEED_SHARED(); vectors_gguf("llama-spm"); }
static void test_vocab_phi3(void **state) { (void)state; NEED_SHARED(); vectors_gguf("phi-3"); }
static void test_vocab_gpt2(void **state) { (void)state; NEED_SHARED(); vectors_gguf("gpt-2"); }
static void test_vocab_starcoder(void **state) { (void)state; NEED_SHARED(); vectors_gguf("starcoder"); }
static void test_vocab_falcon(void **state) { (void)state; NEED_SHARED(); vectors_gguf("falcon"); }
static void test_vocab_deepseek_coder(void **state) { (void)state; NEED_SHARED(); vectors_gguf("deepseek-coder"); }
static void test_vocab_deepseek_llm(void **state) { (void)state; NEED_SHARED(); vectors_gguf("deepseek-llm"); }
static void test_vocab_mpt(void **state) { (void)state; NEED_SHARED(); vectors_gguf("mpt"); }
static void test_vocab_refact(void **state) { (void)state; NEED_SHARED(); vectors_gguf("refact"); }

static void test_vocab_llama_bpe(void **state) {
    (void)state;
    NEED_SHARED();
    fl_tokenizer *t = NULL;
    fl_status st = fl_tokenizer_new_bpe_files(FL_SHARED_PATH("vocab/llama3.2-bpe/encoder.json"),
                                              FL_SHARED_PATH("vocab/llama3.2-bpe/vocab.bpe"), "llama-bpe", &t);
    if (st) fail_msg("%s", fl_last_error());
    assert_int_equal(fl_tokenizer_n_vocab(t), 128000);
    assert_string_equal(fl_tokenizer_pre(t), "llama-bpe");
    run_vectors(t, "llama-bpe");
    fl_tokenizer_free(t);
    /* bad inputs */
    assert_int_equal(fl_tokenizer_new_bpe_files("/nonexistent.json", FL_SHARED_PATH("vocab/llama3.2-bpe/vocab.bpe"), "llama-bpe", &t),
                     FL_ERR_IO);
    assert_null(t);
    assert_int_equal(fl_tokenizer_new_bpe_files(FL_SHARED_PATH("vocab/llama3.2-bpe/encoder.json"),
                                                FL_SHARED_PATH("vocab/llama3.2-bpe/vocab.bpe"), "no-such-pre", &t),
                     FL_ERR_UNSUPPORTED);
    assert_non_null(strstr(fl_last_error(), "no-such-pre"));
    fl_test_mem_zero();
}

static void check_ids(const fl_tokenizer *t, const char *s, bool add_special, const int32_t *want, int n_want) {
    int64_t n = 0;
    int32_t *got = tok(t, s, strlen(s), add_special, false, &n);
    assert_int_equal(n, n_want);
    for (int i = 0; i < n_want; i++) assert_int_equal(got[i], want[i]);
    free(got);
}

/* stories260K: the llama.cpp prompt_tokens of every reference prompt, and the greedy text
 * equals the concatenated pieces of the greedy tokens. */
static void test_stories260k(void **state) {
    (void)state;
    NEED_SHARED();
    fl_tokenizer *t = load_gguf_tok("models/stories260K.gguf");
    assert_int_equal(fl_tokenizer_n_vocab(t), 512);
    assert_int_equal(fl_tokenizer_bos(t), 1);
    assert_int_equal(fl_tokenizer_eos(t), 2);
    assert_true(fl_tokenizer_add_bos(t));
    assert_true(fl_tokenizer_is_eog(t, 2));
    assert_false(fl_tokenizer_is_eog(t, 1));
    static const int32_t once[] = {1, 403, 407, 261, 378};
    check_ids(t, "Once upon a time", true, once, 5);
    check_ids(t, "Once upon a time", false, once + 1, 4);

    size_t len = 0;
    char *js = fl_test_read_file(FL_SHARED_PATH("reference/stories260K.greedy.jsonl"), &len);
    assert_non_null(js);
    fl_mem_install_cjson_hooks();
    int n_prompts = 0;
    for (char *line = js; *line;) {
        char *nl = strchr(line, '\n');
        size_t ll = nl ? (size_t)(nl - line) : strlen(line);
        if (ll == 0) break;
        cJSON *o = cJSON_ParseWithLength(line, ll);
        assert_non_null(o);
        const char *prompt = cJSON_GetStringValue(cJSON_GetObjectItem(o, "prompt"));
        const cJSON *pt = cJSON_GetObjectItem(o, "prompt_tokens");
        assert_non_null(prompt);
        int64_t n = 0;
        int32_t *got = tok(t, prompt, strlen(prompt), true, false, &n);
        assert_int_equal(n, cJSON_GetArraySize(pt));
        for (int i = 0; i < n; i++) assert_int_equal(got[i], cJSON_GetArrayItem(pt, i)->valueint);
        /* the prompt round-trips through fl_detokenize (BOS skipped, prefix space dropped) */
        char buf[4096];
        int64_t dl = fl_detokenize(t, got, n, buf, sizeof buf, true, false);
        assert_int_equal(dl, (int64_t)strlen(prompt));
        assert_string_equal(buf, prompt);
        free(got);
        /* greedy_text is the pieces of greedy_tokens (special tokens rendered) */
        const cJSON *gt = cJSON_GetObjectItem(o, "greedy_tokens");
        const char *gtext = cJSON_GetStringValue(cJSON_GetObjectItem(o, "greedy_text"));
        int ng = cJSON_GetArraySize(gt);
        int32_t *ids = malloc((size_t)(ng + 1) * sizeof(int32_t));
        for (int i = 0; i < ng; i++) ids[i] = cJSON_GetArrayItem(gt, i)->valueint;
        char *text = malloc(65536);
        dl = fl_detokenize(t, ids, ng, text, 65536, false, true); /* llama.cpp printed <s> */
        assert_true(dl >= 0);
        assert_string_equal(text, gtext);
        free(text);
        free(ids);
        cJSON_Delete(o);
        n_prompts++;
        if (!nl) break;
        line = nl + 1;
    }
    assert_int_equal(n_prompts, 12);
    fprintf(stderr, "stories260K: %d/12 reference prompts tokenize exactly; greedy texts match\n", n_prompts);
    fl_test_free_file(js, len);
    fl_tokenizer_free(t);
    fl_test_mem_zero();
}

/* Fill-in-the-middle tokens: by their texts in StarCoder's, DeepSeek-Coder's and Refact's
 * vocabularies (control tokens then: parse_special reads them, plain text does not), none in
 * Llama 2's. */
static void check_fim(const char *rel, const char *const texts[FL_FIM_COUNT]) {
    fl_tokenizer *t = load_gguf_tok(rel);
    for (int w = 0; w < FL_FIM_COUNT; w++) {
        const int32_t id = fl_tokenizer_fim(t, (fl_fim_token)w);
        if (!texts[w]) {
            if (id >= 0) fail_msg("%s: FIM token %d is %d, want none", rel, w, id);
            continue;
        }
        if (id < 0 || id != fl_tokenizer_find(t, texts[w], strlen(texts[w]))) fail_msg("%s: FIM token %d (%s) is %d", rel, w, texts[w], id);
        assert_true(fl_tokenizer_is_control(t, id));
        int64_t n = 0;
        int32_t *got = tok(t, texts[w], strlen(texts[w]), false, true, &n);
        assert_int_equal(n, 1);
        assert_int_equal(got[0], id);
        free(got);
        got = tok(t, texts[w], strlen(texts[w]), false, false, &n);
        assert_true(n > 1);
        free(got);
    }
    assert_int_equal(fl_tokenizer_fim(t, FL_FIM_COUNT), -1);
    fl_tokenizer_free(t);
}

static void test_fim_tokens(void **state) {
    (void)state;
    NEED_SHARED();
    static const char *const sc[FL_FIM_COUNT] = {"<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<repo_name>", "<file_sep>"};
    check_fim("vocab/ggml-vocab-starcoder.gguf", sc);
    static const char *const ds[FL_FIM_COUNT] = {"<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
                                                 "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
                                                 "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", NULL, NULL, NULL};
    check_fim("vocab/ggml-vocab-deepseek-coder.gguf", ds);
    static const char *const none[FL_FIM_COUNT] = {NULL};
    check_fim("vocab/ggml-vocab-llama-spm.gguf", none);
    fl_test_mem_zero();
}

static void test_tiny_random_and_special(void **state) {
    (void)state;
    NEED_SHARED();
    fl_tokenizer *t = load_gguf_tok("models/llama-2-tiny-random.gguf");
    static const int32_t once[] = {1, 9038, 2501, 263, 931};
    check_ids(t, "Once upon a time", true, once, 5);
    /* parse_special: "<s>" is BOS only when asked */
    int64_t n = 0;
    const char *s = "<s>Hello</s>";
    int32_t *got = tok(t, s, strlen(s), false, true, &n);
    assert_true(n >= 3);
    assert_int_equal(got[0], 1);
    assert_int_equal(got[n - 1], 2);
    char buf[256];
    assert_int_equal(fl_detokenize(t, got, n, buf, sizeof buf, false, true), (int64_t)strlen("<s> Hello</s>"));
    assert_string_equal(buf, "<s> Hello</s>"); /* the SPM prefix space after a special token */
    assert_int_equal(fl_detokenize(t, got, n, buf, sizeof buf, false, false), 6);
    assert_string_equal(buf, " Hello");
    /* remove_leading_space passes over a leading BOS and strips the next token's space */
    assert_int_equal(fl_detokenize(t, got, n, buf, sizeof buf, true, true), (int64_t)strlen(s));
    assert_string_equal(buf, s);
    assert_int_equal(fl_detokenize(t, got, n, buf, sizeof buf, true, false), 5);
    assert_string_equal(buf, "Hello");
    free(got);
    got = tok(t, s, strlen(s), false, false, &n);
    for (int64_t i = 0; i < n; i++) assert_true(got[i] != 1 && got[i] != 2);
    free(got);
    /* pieces: control tokens render only on request; byte tokens give their byte */
    assert_int_equal(fl_token_to_piece(t, 1, buf, sizeof buf, false), 0);
    assert_int_equal(fl_token_to_piece(t, 1, buf, sizeof buf, true), 3);
    assert_string_equal(buf, "<s>");
    int32_t nl_id = fl_tokenizer_find(t, "<0x0A>", 6);
    assert_true(nl_id > 0);
    assert_int_equal(fl_token_to_piece(t, nl_id, buf, sizeof buf, false), 1);
    assert_int_equal(buf[0], '\n');
    assert_int_equal(fl_token_to_piece(t, -1, buf, sizeof buf, false), -1);
    assert_int_equal(fl_token_to_piece(t, 1 << 30, buf, sizeof buf, false), -1);
    /* truncation: returns what was written, NUL-terminated */
    assert_int_equal(fl_token_to_piece(t, 9038, buf, 3, false), 2); /* "▁Once" -> " Once" */
    assert_string_equal(buf, " O");
    /* detokenize: buffer too small and bad ids are errors */
    static const int32_t ids[] = {9038, 2501};
    assert_int_equal(fl_detokenize(t, ids, 2, buf, 4, false, false), -1);
    static const int32_t bad[] = {9038, -5};
    assert_int_equal(fl_detokenize(t, bad, 2, buf, sizeof buf, false, false), -1);
    fl_tokenizer_free(t);
    fl_test_mem_zero();
}

static void test_bad_input(void **state) {
    (void)state;
    NEED_SHARED();
    fl_tokenizer *t = load_gguf_tok("vocab/ggml-vocab-llama-spm.gguf");
    int32_t ids[64];
    int64_t n = -1;
    static const char *const bad[] = {
        "abc\xff", "\xc0\xaf", "\xe0\x80\x80", "\xed\xa0\x80" /* surrogate */, "\xf4\x90\x80\x80" /* > U+10FFFF */,
        "ok\xe2\x82", /* truncated */ "\x80",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fl_status st = fl_tokenize(t, bad[i], strlen(bad[i]), true, false, ids, 64, &n);
        assert_int_equal(st, FL_ERR_INVALID);
        assert_non_null(strstr(fl_last_error(), "invalid UTF-8"));
        assert_int_equal(n, 0);
    }
    assert_int_equal(fl_tokenize(t, "abc\xff", 4, false, false, ids, 64, &n), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "offset 3"));
    /* empty text: nothing, or just BOS with add_special */
    assert_int_equal(fl_tokenize(t, "", 0, false, false, ids, 64, &n), FL_OK);
    assert_int_equal(n, 0);
    assert_int_equal(fl_tokenize(t, NULL, 0, true, false, ids, 64, &n), FL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    /* a small buffer gets the count of ids needed */
    assert_int_equal(fl_tokenize(t, "Hello world, this is a test", 27, true, false, ids, 2, &n), FL_OK);
    assert_true(n > 2);
    int64_t n2 = 0;
    assert_int_equal(fl_tokenize(t, "Hello world, this is a test", 27, true, false, ids, 64, &n2), FL_OK);
    assert_int_equal(n2, n);
    /* streaming helper: hold back an incomplete UTF-8 tail */
    assert_int_equal(fl_utf8_complete_prefix("ab", 2), 2);
    assert_int_equal(fl_utf8_complete_prefix("a\xc3", 2), 1);
    assert_int_equal(fl_utf8_complete_prefix("a\xc3\xa9", 3), 3);
    assert_int_equal(fl_utf8_complete_prefix("\xf0\x9f\xa6", 3), 0);
    assert_int_equal(fl_utf8_complete_prefix("\xf0\x9f\xa6\x99", 4), 4);
    assert_int_equal(fl_utf8_complete_prefix("x\xe6\x88", 3), 1);
    assert_int_equal(fl_utf8_complete_prefix("", 0), 0);
    /* valid multi-byte text, embedded NUL */
    assert_int_equal(fl_tokenize(t, "a\0b", 3, false, false, ids, 64, &n), FL_OK);
    char buf[64];
    assert_int_equal(fl_detokenize(t, ids, n, buf, sizeof buf, true, false), 3);
    assert_memory_equal(buf, "a\0b", 3);
    fl_tokenizer_free(t);

    /* a GGUF without tokenizer metadata */
    fl_gguf_writer *w = fl_gguf_writer_new();
    assert_int_equal(fl_gguf_writer_set_str(w, "general.architecture", "llama"), FL_OK);
    char path[256];
    snprintf(path, sizeof path, "%s/test_tokenizer_empty.gguf", FL_BINARY_DIR);
    assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_OK);
    fl_gguf_writer_free(w);
    fl_gguf *g = NULL;
    assert_int_equal(fl_gguf_open(path, &g), FL_OK);
    assert_int_equal(fl_tokenizer_new(g, &t), FL_ERR_FORMAT);
    assert_null(t);
    assert_non_null(strstr(fl_last_error(), "tokenizer.ggml.model"));
    fl_gguf_free(g);
    remove(path);
    fl_test_mem_zero();
}

/* Write a small vocabulary GGUF: model kind, tokens, optional scores/types/merges/pre. */
static const char *write_vocab(const char *file, const char *model, const char *const *toks, int n, const float *scores,
                               const int32_t *types, const char *const *merges, int n_merges, const char *pre, bool add_eos) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", FL_BINARY_DIR, file);
    fl_gguf_writer *w = fl_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(fl_gguf_writer_set_str(w, "general.architecture", "llama"), FL_OK);
    if (model) assert_int_equal(fl_gguf_writer_set_str(w, "tokenizer.ggml.model", model), FL_OK);
    if (toks) assert_int_equal(fl_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n), FL_OK);
    if (scores) assert_int_equal(fl_gguf_writer_set_arr(w, "tokenizer.ggml.scores", FL_GGUF_F32, scores, (uint64_t)n), FL_OK);
    if (types) assert_int_equal(fl_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", FL_GGUF_I32, types, (uint64_t)n), FL_OK);
    if (merges) assert_int_equal(fl_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges), FL_OK);
    if (pre) assert_int_equal(fl_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre), FL_OK);
    if (add_eos) assert_int_equal(fl_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true), FL_OK);
    assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_OK);
    fl_gguf_writer_free(w);
    return path;
}

static fl_status open_vocab(const char *path, fl_tokenizer **t) {
    fl_gguf *g = NULL;
    assert_int_equal(fl_gguf_open(path, &g), FL_OK);
    fl_status st = fl_tokenizer_new(g, t);
    fl_gguf_free(g);
    remove(path);
    return st;
}

static void expect(const fl_tokenizer *t, const char *s, bool add_special, bool parse_special, const int32_t *want, int n_want) {
    int64_t n = 0;
    int32_t *got = tok(t, s, strlen(s), add_special, parse_special, &n);
    if (n != n_want) fail_msg("'%s': %lld ids, want %d", s, (long long)n, n_want);
    for (int i = 0; i < n_want; i++)
        if (got[i] != want[i]) fail_msg("'%s': id %d is %d, want %d", s, i, got[i], want[i]);
    free(got);
}

/* A hand-made SPM vocabulary: the score order decides merges, stale pairs are skipped, no
 * byte tokens means <unk> per byte, user-defined tokens are cut out even without
 * parse_special and the text after a special token gets the space prefix. */
static void test_synthetic_spm(void **state) {
    (void)state;
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "ab", "\xe2\x96\x81" "a", "", "[x]"};
    static const float scores[] = {0, 0, 0, -1.0f, -2.0f, -2.0f, -0.5f, -0.1f, 0, 0};
    static const int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 5, 4};
    fl_tokenizer *t = NULL;
    assert_int_equal(open_vocab(write_vocab("tok_spm.gguf", "llama", toks, 10, scores, types, NULL, 0, NULL, true), &t), FL_OK);
    assert_int_equal(fl_tokenizer_n_vocab(t), 10);
    assert_true(fl_tokenizer_add_bos(t));
    assert_true(fl_tokenizer_add_eos(t));
    expect(t, "ab", false, false, (const int32_t[]){7, 5}, 2);                 /* "▁a" (-0.1) beats "ab" (-0.5) */
    expect(t, "ab", true, false, (const int32_t[]){1, 7, 5, 2}, 4);            /* BOS ... EOS */
    expect(t, "b ab", false, false, (const int32_t[]){3, 5, 7, 5}, 4);         /* stale "ab" skipped */
    expect(t, "\xc3\xa9", false, false, (const int32_t[]){3, 0, 0}, 3);        /* é: <unk> per byte */
    expect(t, "[x]a", false, false, (const int32_t[]){9, 7}, 2);               /* user-defined always */
    expect(t, "<s>a", false, false, (const int32_t[]){3, 0, 0, 0, 4}, 5);      /* control stays text */
    expect(t, "<s>a", false, true, (const int32_t[]){1, 7}, 2);
    expect(t, "a</s><s>", false, true, (const int32_t[]){7, 2, 1}, 3);
    const char *x;
    assert_int_equal(fl_tokenizer_token_text(t, 8, &x), (int32_t)strlen("[EMPTY_8]")); /* empty text renamed */
    char buf[64];
    assert_int_equal(fl_token_to_piece(t, 8, buf, sizeof buf, true), 0); /* unused: renders as nothing */
    assert_int_equal(fl_token_to_piece(t, 9, buf, sizeof buf, false), 3); /* user-defined: always */
    assert_int_equal(fl_token_to_piece(t, 0, buf, sizeof buf, false), 0); /* unknown: only if special */
    assert_int_equal(fl_token_to_piece(t, 0, buf, sizeof buf, true), 5);
    fl_tokenizer_free(t);
    fl_test_mem_zero();
}

/* A hand-made byte-level BPE vocabulary: merges by rank, the GPT-2 byte map, specials. */
static void test_synthetic_bpe(void **state) {
    (void)state;
    /* "Ġ" is the byte map of ' ' */
    static const char *const toks[] = {"a", "b", "c", "\xc4\xa0", "ab", "bc", "\xc4\xa0" "a", "<|end|>"};
    static const int32_t types[] = {1, 1, 1, 1, 1, 1, 1, 3};
    static const char *const merges[] = {"b c", "a b", "\xc4\xa0 a"};
    fl_tokenizer *t = NULL;
    assert_int_equal(open_vocab(write_vocab("tok_bpe.gguf", "gpt2", toks, 8, NULL, types, merges, 3, "gpt-2", false), &t), FL_OK);
    assert_string_equal(fl_tokenizer_kind(t), "gpt2");
    assert_false(fl_tokenizer_add_bos(t));
    assert_true(fl_tokenizer_is_eog(t, 7)); /* recognized by its text */
    expect(t, "abc", false, false, (const int32_t[]){0, 5}, 2);      /* "b c" has rank 0 */
    expect(t, "ab", false, false, (const int32_t[]){4}, 1);
    expect(t, "ab abc", false, false, (const int32_t[]){4, 6, 5}, 3); /* " abc" -> Ġa + bc */
    expect(t, "a<|end|>", false, true, (const int32_t[]){0, 7}, 2);
    char buf[64];
    int32_t ids[] = {6, 5, 7};
    assert_int_equal(fl_detokenize(t, ids, 3, buf, sizeof buf, false, false), 4);
    assert_string_equal(buf, " abc");
    assert_int_equal(fl_detokenize(t, ids, 3, buf, sizeof buf, false, true), 11);
    assert_string_equal(buf, " abc<|end|>");
    fl_tokenizer_free(t);
    fl_test_mem_zero();
}

/* Broken tokenizer metadata is an error with a message, never a crash. */
static void test_bad_metadata(void **state) {
    (void)state;
    static const char *const toks[] = {"a", "b"};
    static const float scores[] = {0, 0};
    static const int32_t types[] = {1, 1};
    fl_tokenizer *t = NULL;
    assert_int_equal(open_vocab(write_vocab("tok_bad.gguf", "bert", toks, 2, scores, types, NULL, 0, NULL, false), &t), FL_ERR_UNSUPPORTED);
    assert_non_null(strstr(fl_last_error(), "bert"));
    assert_int_equal(open_vocab(write_vocab("tok_bad.gguf", "llama", NULL, 0, NULL, NULL, NULL, 0, NULL, false), &t), FL_ERR_FORMAT);
    assert_non_null(strstr(fl_last_error(), "tokenizer.ggml.tokens"));
    /* scores of the wrong length: write 2 scores for 1 token */
    {
        char path[512];
        snprintf(path, sizeof path, "%s/tok_bad.gguf", FL_BINARY_DIR);
        fl_gguf_writer *w = fl_gguf_writer_new();
        fl_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
        fl_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 1);
        fl_gguf_writer_set_arr(w, "tokenizer.ggml.scores", FL_GGUF_F32, scores, 2);
        assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_OK);
        fl_gguf_writer_free(w);
        assert_int_equal(open_vocab(path, &t), FL_ERR_FORMAT);
        assert_non_null(strstr(fl_last_error(), "scores"));
    }
    assert_int_equal(open_vocab(write_vocab("tok_bad.gguf", "gpt2", toks, 2, NULL, types, NULL, 0, "gpt-2", false), &t), FL_ERR_FORMAT);
    assert_non_null(strstr(fl_last_error(), "merges"));
    static const char *const merges[] = {"a b"};
    assert_int_equal(open_vocab(write_vocab("tok_bad.gguf", "gpt2", toks, 2, NULL, types, merges, 1, "no-such-pre", false), &t),
                     FL_ERR_UNSUPPORTED);
    assert_non_null(strstr(fl_last_error(), "no-such-pre"));
    assert_null(t);
    fl_test_mem_zero();
}

/* Random strings built from tricky pieces (spaces, tabs, newlines, digits, apostrophes,
 * accents, combining marks, CJK, emoji, Khmer, ZWJ) round-trip through the pieces on every
 * vocab kind, and tokenizing from several threads at once gives the same ids. */
static const char *const PIECES[] = {
    " ", "  ", "\t", "\n", "\r\n", "a", "Hello", "world", "'s", "'ll", "3", "333", "12345", ".", ",", "!?", "--",
    "\xc3\xa9", "e\xcc\x81", "\xe6\x88\x91", "\xe5\xb7\xa5\xe4\xbd\x9c", "\xf0\x9f\xa6\x99", "\xe2\x80\x8d",
    "\xe1\x9e\x80\xe1\x9e\xb6", "\xd0\xbd\xd0\xb5", "\xef\xbd\x9e", "\xe3\x80\x80", "<s>", "\x01",
}; /* not "▁" (U+2581): SPM reads it as an escaped space, so it comes back as ' ' */

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static size_t random_text(uint64_t *rng, char *buf, size_t cap) {
    size_t n = 0;
    int k = (int)(rng_next(rng) % 24);
    for (int i = 0; i < k; i++) {
        const char *p = PIECES[rng_next(rng) % (sizeof PIECES / sizeof PIECES[0])];
        size_t l = strlen(p);
        if (n + l >= cap) break;
        memcpy(buf + n, p, l);
        n += l;
    }
    buf[n] = 0;
    return n;
}

static void roundtrip_random(const fl_tokenizer *t, uint64_t seed, int n_iter) {
    uint64_t rng = seed;
    char text[1024], back[4096];
    for (int it = 0; it < n_iter; it++) {
        size_t n = random_text(&rng, text, sizeof text);
        int64_t n_ids = 0;
        int32_t *ids = tok(t, text, n, false, false, &n_ids);
        size_t pl = 0;
        for (int64_t i = 0; i < n_ids; i++) {
            char piece[512];
            int32_t k = fl_token_to_piece(t, ids[i], piece, sizeof piece, false);
            assert_true(k >= 0);
            const char *p = piece;
            if (i == 0 && !strcmp(fl_tokenizer_kind(t), "llama") && k > 0 && piece[0] == ' ') p++, k--;
            assert_true(pl + (size_t)k < sizeof back);
            memcpy(back + pl, p, (size_t)k);
            pl += (size_t)k;
        }
        if (pl != n || memcmp(back, text, n) != 0) fail_msg("no round trip for '%s' -> '%.*s'", text, (int)pl, back);
        free(ids);
    }
}

typedef struct thr_job {
    const fl_tokenizer *t;
    const char *text;
    size_t len;
    int32_t *ids;
    int64_t n;
    fl_status st;
} thr_job;

static void *thr_tokenize(void *p) {
    thr_job *j = p;
    for (int r = 0; r < 3 && !j->st; r++) j->st = fl_tokenize(j->t, j->text, j->len, true, true, j->ids, (int64_t)j->len + 8, &j->n);
    return NULL;
}

static void test_random_roundtrip_threads(void **state) {
    (void)state;
    NEED_SHARED();
    static const char *const names[] = {"llama-spm", "gpt-2", "falcon", "deepseek-llm"};
    size_t len = 0;
    char *text = fl_test_read_file(FL_SHARED_PATH("data/tinystories_val.txt"), &len);
    assert_non_null(text);
    const size_t file_len = len;
    if (len > 60000) len = 60000;
    while (len > 0 && (text[len] & 0xc0) == 0x80) len--; /* cut on a character boundary */
    for (size_t v = 0; v < sizeof names / sizeof names[0]; v++) {
        char rel[256];
        snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", names[v]);
        fl_tokenizer *t = load_gguf_tok(rel);
        roundtrip_random(t, 0x9e3779b97f4a7c15ull + v, 300);
        thr_job jobs[3];
        pthread_t th[3];
        for (int i = 0; i < 3; i++) {
            jobs[i] = (thr_job){t, text, len, malloc((len + 8) * sizeof(int32_t)), 0, FL_OK};
            pthread_create(&th[i], NULL, thr_tokenize, &jobs[i]);
        }
        for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 3; i++) {
            assert_int_equal(jobs[i].st, FL_OK);
            assert_int_equal(jobs[i].n, jobs[0].n);
            assert_memory_equal(jobs[i].ids, jobs[0].ids, (size_t)jobs[0].n * sizeof(int32_t));
        }
        int64_t n1 = 0;
        int32_t *one = tok(t, text, len, true, true, &n1);
        assert_int_equal(n1, jobs[0].n);
        assert_memory_equal(one, jobs[0].ids, (size_t)n1 * sizeof(int32_t));
        free(one);
        for (int i = 0; i < 3; i++) free(jobs[i].ids);
        fl_tokenizer_free(t);
    }
    fl_test_free_file(text, file_len);
    fl_test_mem_zero();
}

/* Allocation failures anywhere in construction or tokenization give an error and leave no
 * memory behind; the first run without a failure gives the normal result. */
static void test_alloc_failures(void **state) {
    (void)state;
    NEED_SHARED();
    static const char *const files[] = {"models/stories260K.gguf", "vocab/ggml-vocab-gpt-2.gguf"};
    const char *text = "Hello world! It's 2024, <s> and 12345 \xf0\x9f\xa6\x99 caf\xc3\xa9.";
    for (int f = 0; f < 2; f++) {
        fl_gguf *g = NULL;
        assert_int_equal(fl_gguf_open(FL_SHARED_PATH(files[f]), &g), FL_OK);
        const size_t base = fl_mem_current_total();
        fl_tokenizer *t = NULL;
        int k;
        for (k = 0; k < 200; k++) {
            fl_mem_fail_after(k);
            fl_status st = fl_tokenizer_new(g, &t);
            fl_mem_fail_after(-1);
            if (st == FL_OK) break;
            assert_true(st == FL_ERR_NOMEM || st == FL_ERR_BUDGET || st == FL_ERR_INTERNAL);
            assert_null(t);
            assert_int_equal(fl_mem_current_total(), base);
        }
        assert_non_null(t);
        int32_t want[128], got[128];
        int64_t n_want = 0, n_got = 0;
        assert_int_equal(fl_tokenize(t, text, strlen(text), true, true, want, 128, &n_want), FL_OK);
        const size_t with_tok = fl_mem_current_total();
        int fails = 0;
        for (k = 0; k < 200; k++) {
            fl_mem_fail_after(k);
            fl_status st = fl_tokenize(t, text, strlen(text), true, true, got, 128, &n_got);
            fl_mem_fail_after(-1);
            assert_int_equal(fl_mem_current_total(), with_tok);
            if (st == FL_OK) break;
            assert_int_equal(n_got, 0);
            fails++;
        }
        assert_true(fails > 0);
        assert_int_equal(n_got, n_want);
        assert_memory_equal(got, want, (size_t)n_want * sizeof(int32_t));
        fl_tokenizer_free(t);
        fl_gguf_free(g);
    }
    fl_test_mem_zero();
}

/* War and Peace through the Llama-2 SPM vocab: tokenizes and round-trips (time printed for
 * information only; speed claims come from fitllm bench). */
static void test_war_and_peace(void **state) {
    (void)state;
    NEED_SHARED();
    fl_tokenizer *t = load_gguf_tok("vocab/ggml-vocab-llama-spm.gguf");
    size_t len = 0;
    char *text = fl_test_read_file(FL_SHARED_PATH("data/war-and-peace.txt"), &len);
    assert_non_null(text);
    int64_t cap = (int64_t)len, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fl_status st = fl_tokenize(t, text, len, false, false, ids, cap, &n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st) fail_msg("%s", fl_last_error());
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "war-and-peace: %zu bytes -> %lld tokens in %.2f s (llama-spm)\n", len, (long long)n, sec);
    assert_true(n > (int64_t)len / 8 && n < (int64_t)len);
    /* merging in chunks (cut before "▁" runs) gives what merging the whole text gives */
    assert_true(t->spm_split);
    size_t part = 200000;
    while (part < len && text[part] != '\n') part++;
    int64_t n_a = 0, n_b = 0;
    int32_t *a = tok(t, text, part, false, false, &n_a);
    t->spm_split = false;
    int32_t *b = tok(t, text, part, false, false, &n_b);
    t->spm_split = true;
    assert_int_equal(n_a, n_b);
    assert_memory_equal(a, b, (size_t)n_a * sizeof(int32_t));
    free(a);
    free(b);
    char *back = malloc(len + 16);
    int64_t dl = fl_detokenize(t, ids, n, back, (int64_t)len + 16, true, false);
    assert_int_equal(dl, (int64_t)len);
    assert_memory_equal(back, text, len);
    free(back);
    free(ids);
    fl_test_free_file(text, len);
    fl_tokenizer_free(t);
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),         cmocka_unit_test(test_tiny_random_and_special),
        cmocka_unit_test(test_bad_input),           cmocka_unit_test(test_vocab_llama_spm),
        cmocka_unit_test(test_vocab_phi3),          cmocka_unit_test(test_vocab_gpt2),
        cmocka_unit_test(test_vocab_starcoder),     cmocka_unit_test(test_vocab_falcon),
        cmocka_unit_test(test_vocab_deepseek_coder), cmocka_unit_test(test_vocab_deepseek_llm),
        cmocka_unit_test(test_vocab_mpt),           cmocka_unit_test(test_vocab_refact), cmocka_unit_test(test_fim_tokens),
        cmocka_unit_test(test_vocab_llama_bpe),     cmocka_unit_test(test_war_and_peace),
        cmocka_unit_test(test_synthetic_spm),       cmocka_unit_test(test_synthetic_bpe),
        cmocka_unit_test(test_bad_metadata),        cmocka_unit_test(test_random_roundtrip_threads),
        cmocka_unit_test(test_alloc_failures),      cmocka_unit_test(test_falcon_lacking_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
