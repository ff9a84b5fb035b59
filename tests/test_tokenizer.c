/* Tests for src/model/tokenizer: llama.cpp's test vectors (shared/vocab), round trips,
 * stories260K / llama-2-tiny-random references, special tokens, bad input. */
#include "test.h"

#include "core/status.h"
#include "formats/gguf.h"
#include "model/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
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
        cmocka_unit_test(test_vocab_mpt),           cmocka_unit_test(test_vocab_refact),
        cmocka_unit_test(test_vocab_llama_bpe),     cmocka_unit_test(test_war_and_peace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
