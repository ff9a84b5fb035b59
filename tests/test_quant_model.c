/* Whole-model checks of the quant/matmul module through the llama forward (src/model):
 *  - synth256-T.gguf with f32 activations matches llama.cpp's dequantized-weight logits
 *    (shared/reference/synth256/synth256-T-dequant.logits.jsonl) within 1e-3, every type T;
 *  - the default int8-activation path for Q8_0 / Q4_0 stays close to llama.cpp's own
 *    (q8_0-activation) logits;
 *  - stories260K-q8_0 / -q5_0 follow the reference greedy tokens (prompt 0: its first 32 at
 *    least; how many of the 12 prompts agree for all 200 steps is printed: llama.cpp quantizes
 *    the activations of Q5_0 to q8_0 where we keep f32, and sums Q8_0 blocks in another order).
 * Skips when the model module is not in the tree (this file builds on the quant branch alone). */
#include "test.h"

#if __has_include("model/llama.h") && __has_include("kv/kv_contig.h")
#include "core/status.h"
#include "core/threads.h"
#include "kernels/matmul.h"
#include "kv/kv_contig.h"
#include "model/llama.h"

#include <cjson/cJSON.h>
#include <string.h>

typedef struct runner { fl_model *m; fl_kv_contig *kv; float *logits; int32_t n_vocab, rows; } runner;

static void runner_init(runner *r, const char *model, int32_t rows) {
    memset(r, 0, sizeof *r);
    if (fl_model_load(FL_SHARED_PATH(model), NULL, &r->m)) fail_msg("load %s: %s", model, fl_last_error());
    const fl_hparams *hp = fl_model_hparams(r->m);
    fl_kv_contig_params kp = {hp->n_layer, hp->n_head_local, hp->n_head_kv_local, hp->head_dim, 512, 1, hp->n_swa, FL_TYPE_F16}; /* llama.cpp default KV type */
    assert_int_equal(fl_kv_contig_new(&kp, &r->kv), FL_OK);
    assert_int_equal(fl_model_workspace_new(r->m, 256, rows), FL_OK);
    r->n_vocab = hp->n_vocab;
    r->rows = rows;
    r->logits = fl_alloc(FL_MEM_ACT, (size_t)rows * (size_t)r->n_vocab * 4, 64);
}

static void runner_free(runner *r) {
    fl_free(FL_MEM_ACT, r->logits, (size_t)r->rows * (size_t)r->n_vocab * 4);
    fl_kv_contig_free(r->kv);
    fl_model_free(r->m);
}

static void eval(runner *r, const int32_t *tok, int32_t n, int32_t pos0, int all) {
    int32_t pos[256], sid[256];
    int8_t lg[256];
    assert_true(n <= 256);
    for (int32_t i = 0; i < n; i++) { pos[i] = pos0 + i; sid[i] = 0; lg[i] = all || i == n - 1; }
    fl_batch b = {n, tok, pos, sid, lg};
    if (fl_model_forward(r->m, &b, fl_kv_contig_iface(), r->kv, r->logits)) fail_msg("forward: %s", fl_last_error());
}

static int32_t ids(const cJSON *arr, int32_t *out, int32_t cap) {
    int32_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) { assert_true(n < cap); out[n++] = (int32_t)e->valuedouble; }
    return n;
}

/* Max |ours - reference| over every prompt position of every line of a logits file. */
static double logits_diff(const char *model, const char *ref_rel) {
    runner r;
    runner_init(&r, model, 256);
    size_t len;
    char *txt = fl_test_read_file(FL_SHARED_PATH(ref_rel), &len);
    assert_non_null(txt);
    double worst = 0;
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        int32_t tok[256];
        const int32_t n = ids(cJSON_GetObjectItem(o, "tokens"), tok, 256);
        fl_kv_contig_clear(r.kv);
        eval(&r, tok, n, 0, 1);
        const cJSON *rows = cJSON_GetObjectItem(o, "logits"), *row;
        int32_t i = 0;
        cJSON_ArrayForEach(row, rows) {
            int32_t j = 0;
            const cJSON *v;
            cJSON_ArrayForEach(v, row) {
                const double d = fabs(v->valuedouble - r.logits[(size_t)i * r.n_vocab + j]);
                if (d > worst) worst = d;
                j++;
            }
            assert_int_equal(j, r.n_vocab);
            i++;
        }
        assert_int_equal(i, n);
        cJSON_Delete(o);
    }
    fl_test_free_file(txt, len);
    runner_free(&r);
    return worst;
}

static const char *synth_types[] = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                    "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL"};

/* With f32 activations and the contiguous f16 cache the forward follows llama.cpp's arithmetic
 * (its summation orders and f16 roundings), so every dequantized type must agree within 1e-3
 * (a wrong layout or scale gives errors of 0.1 and more). */
static void test_synth256_dequant_logits(void **state) {
    (void)state;
    NEED_SHARED();
    fl_matmul_set_f32_act(true);
    const double base = logits_diff("models/synth256/synth256-F32.gguf", "reference/synth256/synth256-F32.logits.jsonl");
    fprintf(stderr, "synth256-F32     baseline (forward vs llama.cpp): max |logit diff| %.2e\n", base);
    assert_true(base < 1e-3);
    for (size_t i = 1; i < sizeof synth_types / sizeof synth_types[0]; i++) {
        char model[128], ref[160];
        snprintf(model, sizeof model, "models/synth256/synth256-%s.gguf", synth_types[i]);
        snprintf(ref, sizeof ref, "reference/synth256/synth256-%s-dequant.logits.jsonl", synth_types[i]);
        const double d = logits_diff(model, ref);
        fprintf(stderr, "synth256-%-7s f32 activations: max |logit diff| vs llama.cpp dequant %.2e\n", synth_types[i], d);
        if (!(d < 1e-3)) fail_msg("synth256-%s: max logit diff %.3g (F32 baseline %.3g)", synth_types[i], d, base);
    }
    fl_matmul_set_f32_act(false);
    fl_test_mem_zero();
}

/* llama.cpp quantizes activations to q8_0 for these types; ours are 8-bit per block too
 * (f32 scales), so the logits agree closely but not exactly. */
static void test_synth256_int8_logits(void **state) {
    (void)state;
    NEED_SHARED();
    fl_matmul_set_f32_act(false);
    const char *types[2] = {"Q8_0", "Q4_0"};
    for (int i = 0; i < 2; i++) {
        char model[128], ref[160];
        snprintf(model, sizeof model, "models/synth256/synth256-%s.gguf", types[i]);
        snprintf(ref, sizeof ref, "reference/synth256/synth256-%s.logits.jsonl", types[i]);
        const double d = logits_diff(model, ref);
        fprintf(stderr, "synth256-%-7s int8 activations: max |logit diff| vs llama.cpp (q8_0 activations) %.2e\n", types[i], d);
        /* llama.cpp's own q8_0-activation logits differ from its dequant logits by 0.23 (Q8_0)
         * and 0.22 (Q4_0) max: rounding flips of 8-bit codes; ours must be no further away */
        if (!(d < 0.25)) fail_msg("synth256-%s int8 path: max logit diff %.3g", types[i], d);
        /* in llama.cpp's summation order the same 8-bit codes give its logits (to print precision) */
        fl_matmul_set_llama_order(true);
        const double dl = logits_diff(model, ref);
        fl_matmul_set_llama_order(false);
        fprintf(stderr, "synth256-%-7s llama.cpp-order int8: max |logit diff| %.2e\n", types[i], dl);
        if (!(dl < 1e-4)) fail_msg("synth256-%s llama-order int8 path: max logit diff %.3g", types[i], dl);
    }
    fl_test_mem_zero();
}

/* With llama.cpp's integer arithmetic (fl_matmul_set_llama_order: q8_0 activations for Q8_0 and
 * Q5_0 weights, ggml's 8-lane summation order) the quantized stories260K files give llama.cpp's
 * greedy tokens: 9 of 12 prompts for all 200 steps on each file (measured; the other three part
 * after 61-154 steps, with no near-tie in the reference there: some arithmetic outside the
 * matmuls still differs by an ulp now and then, and 8-bit activations turn that into a
 * different code), prompt 0 always. */
static void test_stories_quant_greedy(void **state) {
    (void)state;
    NEED_SHARED();
    fl_matmul_set_llama_order(true);
    const char *names[2] = {"q8_0", "q5_0"};
    int diverged[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        char model[128], ref[160];
        snprintf(model, sizeof model, "models/stories260K-%s.gguf", names[k]);
        snprintf(ref, sizeof ref, "reference/stories260K-%s.greedy.jsonl", names[k]);
        runner r;
        runner_init(&r, model, 1);
        size_t len;
        char *txt = fl_test_read_file(FL_SHARED_PATH(ref), &len);
        assert_non_null(txt);
        int lines = 0;
        for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n"), lines++) {
            cJSON *o = cJSON_Parse(line);
            int32_t prompt[256], want[256];
            const int32_t np = ids(cJSON_GetObjectItem(o, "prompt_tokens"), prompt, 256);
            int32_t nw = ids(cJSON_GetObjectItem(o, "greedy_tokens"), want, 256);

            fl_kv_contig_clear(r.kv);
            eval(&r, prompt, np, 0, 0);
            for (int32_t i = 0; i < nw; i++) {
                int32_t best = 0;
                for (int32_t j = 1; j < r.n_vocab; j++)
                    if (r.logits[j] > r.logits[best]) best = j;
                if (best != want[i]) {
                    /* how close was it: our logit of the reference's token vs our top logit */
                    fprintf(stderr, "stories260K-%s prompt %2d: same tokens as llama.cpp for %d of %d steps "
                            "(there our top logit leads the reference token's by %.4f)\n", names[k], lines, i, nw,
                            (double)(r.logits[best] - r.logits[want[i]]));
                    if (lines == 0) fail_msg("stories260K-%s prompt 0 step %d: token %d, reference %d", names[k], i, best, want[i]);
                    diverged[k]++;
                    break;
                }
                eval(&r, &best, 1, np + i, 0);
            }
            cJSON_Delete(o);
        }
        assert_int_equal(lines, 12);
        fprintf(stderr, "stories260K-%s: %d of 12 prompts give llama.cpp's 200 greedy tokens exactly\n", names[k], 12 - diverged[k]);
        if (diverged[k] > 3) fail_msg("stories260K-%s: only %d of 12 prompts follow llama.cpp's greedy tokens", names[k], 12 - diverged[k]);
        fl_test_free_file(txt, len);
        runner_free(&r);
    }
    fl_matmul_set_llama_order(false);
    fl_test_mem_zero();
}

int main(void) {
    fl_mem_install_cjson_hooks();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synth256_dequant_logits),
        cmocka_unit_test(test_synth256_int8_logits),
        cmocka_unit_test(test_stories_quant_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
static void test_skip(void **state) {
    (void)state;
    fprintf(stderr, "SKIP: model module (src/model/llama.h) not in this tree\n");
    skip();
}
int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_skip)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
