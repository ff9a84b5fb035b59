/* Tests for model/lora: a LoRA adapter applied at run time gives the logits of the model with
 * W + s B A merged into its weights (fitllm's file and llama.cpp's, F32 and F16, all or some
 * matrices), scale 0 gives the base model's bits, the plan counts the adapter exactly, and bad
 * adapters are refused with a clear error and nothing leaked. */
#include "test.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "fitllm.h"
#include "formats/gguf.h"
#include "kv/kv_contig.h"
#include "model/llama.h"
#include "model/lora.h"
#include "plan/plan_engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MODEL "models/stories260K.gguf"
static const char *const names[FL_LORA_TARGETS] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

/* Target k's input and output widths for stories260K's hyperparameters. */
static void shape_of(const fl_hparams *hp, int k, int64_t *K, int64_t *N) {
    const int64_t E = hp->n_embd, HQ = (int64_t)hp->n_head * hp->head_dim, HKV = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t Ks[FL_LORA_TARGETS] = {E, E, E, HQ, E, E, hp->n_ff}, Ns[FL_LORA_TARGETS] = {HQ, HKV, HKV, E, hp->n_ff, hp->n_ff, E};
    *K = Ks[k];
    *N = Ns[k];
}

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* An adapter for every (layer, target) where want(layer, target): A and B random (B scaled so
 * the adapter moves the logits visibly), kept as f32 in a[] / b[] (what the file holds, after
 * f16 rounding) for the merge. */
typedef struct adapter {
    int32_t rank;
    float alpha;
    float *a[8][FL_LORA_TARGETS], *b[8][FL_LORA_TARGETS]; /* [layer][target], NULL: none */
} adapter;

static void adapter_free(adapter *ad) {
    for (int l = 0; l < 8; l++)
        for (int k = 0; k < FL_LORA_TARGETS; k++) {
            free(ad->a[l][k]);
            free(ad->b[l][k]);
        }
}

static void fill(float *x, int64_t n, float amp, uint64_t *s, bool f16) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = amp * frand(s);
        if (f16) x[i] = fl_f16_to_f32(fl_f32_to_f16(x[i]));
    }
}

/* fitllm's file: lora.<name>.a [K, r, L] / .b [r, N, L], every layer of the targets in mask. */
static void write_fitllm(const char *path, const fl_hparams *hp, adapter *ad, unsigned mask, uint64_t seed) {
    fl_gguf_writer *w = fl_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(fl_gguf_writer_set_str(w, "general.architecture", "llama"), FL_OK);
    assert_int_equal(fl_gguf_writer_set_u32(w, "lora.rank", (uint32_t)ad->rank), FL_OK);
    assert_int_equal(fl_gguf_writer_set_f32(w, "lora.alpha", ad->alpha), FL_OK);
    float *bufs[2 * FL_LORA_TARGETS] = {0};
    const int32_t L = hp->n_layer, r = ad->rank;
    for (int k = 0; k < FL_LORA_TARGETS; k++) {
        if (!(mask >> k & 1)) continue;
        int64_t K, N;
        shape_of(hp, k, &K, &N);
        float *A = bufs[2 * k] = malloc((size_t)(L * r * K) * 4), *B = bufs[2 * k + 1] = malloc((size_t)(L * r * N) * 4);
        for (int l = 0; l < L; l++) {
            ad->a[l][k] = malloc((size_t)(r * K) * 4);
            ad->b[l][k] = malloc((size_t)(r * N) * 4);
            fill(ad->a[l][k], r * K, 0.5f, &seed, false);
            fill(ad->b[l][k], r * N, 0.3f, &seed, false);
            memcpy(A + (size_t)l * r * K, ad->a[l][k], (size_t)(r * K) * 4);
            memcpy(B + (size_t)l * r * N, ad->b[l][k], (size_t)(r * N) * 4);
        }
        char na[64];
        const int64_t nea[3] = {K, r, L}, neb[3] = {r, N, L};
        snprintf(na, sizeof na, "lora.%s.a", names[k]);
        assert_int_equal(fl_gguf_writer_add_tensor(w, na, FL_TYPE_F32, 3, nea, A), FL_OK);
        snprintf(na, sizeof na, "lora.%s.b", names[k]);
        assert_int_equal(fl_gguf_writer_add_tensor(w, na, FL_TYPE_F32, 3, neb, B), FL_OK);
    }
    assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_OK);
    fl_gguf_writer_free(w);
    for (int i = 0; i < 2 * FL_LORA_TARGETS; i++) free(bufs[i]);
}

/* llama.cpp's file: blk.<l>.<name>.weight.lora_a [K, r] / .lora_b [r, N] in F16, for the (layer,
 * target) pairs listed; extra: one more tensor name (an adapter of nothing), or NULL. */
static void write_llama_cpp(const char *path, const fl_hparams *hp, adapter *ad, const int (*pairs)[2], int n_pairs,
                            const char *extra, uint64_t seed) {
    fl_gguf_writer *w = fl_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(fl_gguf_writer_set_str(w, "general.architecture", "llama"), FL_OK);
    assert_int_equal(fl_gguf_writer_set_str(w, "general.type", "adapter"), FL_OK);
    assert_int_equal(fl_gguf_writer_set_str(w, "adapter.type", "lora"), FL_OK);
    assert_int_equal(fl_gguf_writer_set_f32(w, "adapter.lora.alpha", ad->alpha), FL_OK);
    uint16_t *bufs[32] = {0};
    const int32_t r = ad->rank;
    for (int i = 0; i < n_pairs; i++) {
        const int l = pairs[i][0], k = pairs[i][1];
        int64_t K, N;
        shape_of(hp, k, &K, &N);
        ad->a[l][k] = malloc((size_t)(r * K) * 4);
        ad->b[l][k] = malloc((size_t)(r * N) * 4);
        fill(ad->a[l][k], r * K, 0.5f, &seed, true);
        fill(ad->b[l][k], r * N, 0.3f, &seed, true);
        uint16_t *A = bufs[2 * i] = malloc((size_t)(r * K) * 2), *B = bufs[2 * i + 1] = malloc((size_t)(r * N) * 2);
        for (int64_t j = 0; j < r * K; j++) A[j] = fl_f32_to_f16(ad->a[l][k][j]);
        for (int64_t j = 0; j < r * N; j++) B[j] = fl_f32_to_f16(ad->b[l][k][j]);
        char na[96];
        const int64_t nea[2] = {K, r}, neb[2] = {r, N};
        snprintf(na, sizeof na, "blk.%d.%s.weight.lora_a", l, names[k]);
        assert_int_equal(fl_gguf_writer_add_tensor(w, na, FL_TYPE_F16, 2, nea, A), FL_OK);
        snprintf(na, sizeof na, "blk.%d.%s.weight.lora_b", l, names[k]);
        assert_int_equal(fl_gguf_writer_add_tensor(w, na, FL_TYPE_F16, 2, neb, B), FL_OK);
    }
    static uint16_t junk[64 * 2];
    if (extra) {
        const int64_t ne[2] = {64, 2};
        assert_int_equal(fl_gguf_writer_add_tensor(w, extra, FL_TYPE_F16, 2, ne, junk), FL_OK);
    }
    assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_OK);
    fl_gguf_writer_free(w);
    for (int i = 0; i < 32; i++) free(bufs[i]);
}

/* Logits of every position of a fixed 12-token sequence through the base model with the adapters
 * paths[0..n_paths) loaded at scale: applied by the model's default (adapter 1) or, with mix, every
 * token through that one mix of them (fl_batch.lora_mix); merges[i] added into the weights by hand
 * as W += s_merge[i] B A first. */
static void logits_gen(const char *const *paths, int n_paths, float scale, const float *mix, const adapter *const *merges,
                       const float *s_merge, int n_merge, float *out) {
    fl_model_params mp = fl_model_default_params();
    mp.no_mmap = true; /* (the merge writes into the weights) */
    const float scales[2] = {scale, scale};
    mp.lora_paths = paths;
    mp.lora_scales = scales;
    mp.n_loras = n_paths;
    mp.lora_default = n_paths && !mix ? 1 : 0;
    fl_model *m;
    if (fl_model_load(FL_SHARED_PATH(MODEL), &mp, &m)) fail_msg("load: %s", fl_last_error());
    const fl_hparams *hp = fl_model_hparams(m);
    if (n_merge) assert_int_equal(fl_gguf_set_writable((fl_gguf *)fl_model_gguf(m), true), FL_OK);
    for (int i = 0; i < n_merge; i++)
        for (int l = 0; l < hp->n_layer; l++) {
            const adapter *merge = merges[i];
            const fl_layer *L = fl_model_layer(m, l);
            const fl_tensor *W[FL_LORA_TARGETS] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w3, &L->w2};
            for (int k = 0; k < FL_LORA_TARGETS; k++) {
                if (!merge->a[l][k]) continue;
                assert_int_equal(W[k]->type, FL_TYPE_F32);
                int64_t K, N;
                shape_of(hp, k, &K, &N);
                float *w = W[k]->data;
                for (int64_t n = 0; n < N; n++)
                    for (int64_t c = 0; c < K; c++) {
                        double acc = 0;
                        for (int j = 0; j < merge->rank; j++) acc += (double)merge->b[l][k][n * merge->rank + j] * merge->a[l][k][j * K + c];
                        w[n * K + c] += (float)(s_merge[i] * acc);
                    }
            }
        }
    fl_kv_contig_params kp = {hp->n_layer, hp->n_head_local, hp->n_head_kv_local, hp->head_dim, 64, 1, hp->n_swa, FL_TYPE_F32};
    fl_kv_contig *kv;
    assert_int_equal(fl_kv_contig_new(&kp, &kv), FL_OK);
    assert_int_equal(fl_model_workspace_new(m, 16, 12), FL_OK);
    int32_t tok[12], pos[12], sid[12], lora[12];
    int8_t lg[12];
    for (int i = 0; i < 12; i++) {
        tok[i] = i ? 3 + (i * 37) % 500 : 1;
        pos[i] = i;
        sid[i] = 0;
        lg[i] = 1;
        lora[i] = 1;
    }
    fl_batch b = {12, tok, pos, sid, lg};
    if (mix) {
        b.lora = lora;
        b.lora_mix = mix;
        b.n_lora_mix = 1;
    }
    if (fl_model_forward(m, &b, fl_kv_contig_iface(), kv, out)) fail_msg("forward: %s", fl_last_error());
    fl_kv_contig_free(kv);
    fl_model_free(m);
}

/* The same through adapter_path (NULL: none) at scale, or with merge added by hand at s_merge. */
static void logits_of(const char *adapter_path, float scale, const adapter *merge, float s_merge, float *out) {
    logits_gen(adapter_path ? &adapter_path : NULL, adapter_path ? 1 : 0, scale, NULL, merge ? &merge : NULL, &s_merge, merge ? 1 : 0, out);
}

static double max_diff(const float *a, const float *b, int64_t n, double *scale) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    if (scale) *scale = s;
    return d;
}

static fl_hparams hparams(void) {
    fl_gguf *g;
    assert_int_equal(fl_gguf_open(FL_SHARED_PATH(MODEL), &g), FL_OK);
    fl_hparams hp;
    assert_int_equal(fl_hparams_from_gguf(g, &hp), FL_OK);
    fl_gguf_free(g);
    return hp;
}

#define NV (12 * 512)

static void test_fitllm_file_equals_merged(void **state) {
    NEED_SHARED();
    (void)state;
    const fl_hparams hp = hparams();
    char path[64];
    snprintf(path, sizeof path, "/tmp/fl_lora_%d_a.gguf", (int)getpid());
    adapter ad = {.rank = 4, .alpha = 8};
    write_fitllm(path, &hp, &ad, 0x7f, 11);
    float *base = malloc(NV * 4), *got = malloc(NV * 4), *want = malloc(NV * 4);
    logits_of(NULL, 1, NULL, 0, base);
    logits_of(path, 0.5f, NULL, 0, got);
    logits_of(NULL, 1, &ad, 0.5f * 8 / 4, want); /* s = scale x alpha / r */
    double sc, d = max_diff(got, want, NV, &sc);
    const double moved = max_diff(base, want, NV, NULL);
    fprintf(stderr, "fitllm file: max |lora - merged| %.3g (logits up to %.3g, moved %.3g by the adapter)\n", d, sc, moved);
    assert_true(moved > 0.5);
    assert_true(d < 2e-4 * sc);
    /* scale 0: the base model's bits */
    logits_of(path, 0.0f, NULL, 0, got);
    assert_memory_equal(got, base, NV * 4);
    unlink(path);
    adapter_free(&ad);
    free(base);
    free(got);
    free(want);
    fl_test_mem_zero();
}

static void test_llama_cpp_file_some_matrices(void **state) {
    NEED_SHARED();
    (void)state;
    const fl_hparams hp = hparams();
    char path[64];
    snprintf(path, sizeof path, "/tmp/fl_lora_%d_b.gguf", (int)getpid());
    adapter ad = {.rank = 2, .alpha = 4};
    const int pairs[4][2] = {{0, FL_LORA_Q}, {0, FL_LORA_DOWN}, {2, FL_LORA_V}, {4, FL_LORA_UP}};
    write_llama_cpp(path, &hp, &ad, pairs, 4, NULL, 5);
    float *got = malloc(NV * 4), *want = malloc(NV * 4), *base = malloc(NV * 4);
    logits_of(NULL, 1, NULL, 0, base);
    logits_of(path, 1.0f, NULL, 0, got);
    logits_of(NULL, 1, &ad, 4.0f / 2, want);
    double sc, d = max_diff(got, want, NV, &sc);
    const double moved = max_diff(base, want, NV, NULL);
    fprintf(stderr, "llama.cpp file (f16, 4 of 35 matrices): max |lora - merged| %.3g (logits up to %.3g, moved %.3g)\n", d, sc, moved);
    assert_true(moved > 0.1);
    assert_true(d < 2e-3 * sc); /* (x A^T rounded to f16 before B: the matmul's f16 activations) */
    fl_lora *lo;
    assert_int_equal(fl_lora_open(path, &hp, 1.0f, false, &lo), FL_OK);
    assert_int_equal(lo->n_pairs, 4);
    assert_int_equal(lo->rank_max, 2);
    assert_int_equal(lo->n_max, hp.n_ff);
    assert_non_null(fl_lora_get(lo, 2, FL_LORA_V));
    assert_null(fl_lora_get(lo, 2, FL_LORA_Q));
    fl_lora_free(lo);
    unlink(path);
    adapter_free(&ad);
    free(base);
    free(got);
    free(want);
    fl_test_mem_zero();
}

/* Two adapters mixed in one batch (llama.cpp's per-request "lora" scales) give the model with
 * both merged at their scales; a mix of one adapter is, bit for bit, that adapter applied at the
 * same loaded scale; an all-zero mix is the base model. */
static void test_mix_equals_merged(void **state) {
    NEED_SHARED();
    (void)state;
    const fl_hparams hp = hparams();
    char p1[64], p2[64];
    snprintf(p1, sizeof p1, "/tmp/fl_lora_%d_m1.gguf", (int)getpid());
    snprintf(p2, sizeof p2, "/tmp/fl_lora_%d_m2.gguf", (int)getpid());
    adapter a1 = {.rank = 4, .alpha = 8}, a2 = {.rank = 2, .alpha = 4};
    write_fitllm(p1, &hp, &a1, 0x7f, 31);
    const int pairs[4][2] = {{0, FL_LORA_Q}, {1, FL_LORA_DOWN}, {2, FL_LORA_V}, {4, FL_LORA_UP}};
    write_llama_cpp(p2, &hp, &a2, pairs, 4, NULL, 32);
    const char *paths[2] = {p1, p2};
    float *base = malloc(NV * 4), *got = malloc(NV * 4), *want = malloc(NV * 4), *one = malloc(NV * 4);
    logits_of(NULL, 1, NULL, 0, base);
    const float mix[2] = {0.5f, -1.5f};
    logits_gen(paths, 2, 1.0f, mix, NULL, NULL, 0, got);
    const adapter *both[2] = {&a1, &a2};
    const float s_both[2] = {0.5f * 8 / 4, -1.5f * 4 / 2}; /* s = scale x alpha / r */
    logits_gen(NULL, 0, 1.0f, NULL, both, s_both, 2, want);
    double sc, d = max_diff(got, want, NV, &sc);
    const double moved = max_diff(base, want, NV, NULL);
    fprintf(stderr, "mix of two adapters: max |mix - both merged| %.3g (logits up to %.3g, moved %.3g)\n", d, sc, moved);
    assert_true(moved > 0.5);
    assert_true(d < 2e-3 * sc); /* (the llama.cpp file is f16: x A^T rounded to f16 before B) */
    /* the second adapter counts: the first alone is far from the mix */
    logits_gen(NULL, 0, 1.0f, NULL, both, s_both, 1, one);
    assert_true(max_diff(one, want, NV, NULL) > 0.05);
    /* a mix of one adapter at 0.5 = that adapter loaded at 0.5, bit for bit */
    const float mix1[2] = {0.5f, 0.0f};
    logits_gen(paths, 2, 1.0f, mix1, NULL, NULL, 0, got);
    logits_of(p1, 0.5f, NULL, 0, one);
    assert_memory_equal(got, one, NV * 4);
    const float none[2] = {0.0f, 0.0f};
    logits_gen(paths, 2, 1.0f, none, NULL, NULL, 0, got);
    assert_memory_equal(got, base, NV * 4);
    unlink(p1);
    unlink(p2);
    adapter_free(&a1);
    adapter_free(&a2);
    free(base);
    free(got);
    free(want);
    free(one);
    fl_test_mem_zero();
}

/* Refused with a clear error and nothing leaked. */
static void test_bad_adapters(void **state) {
    NEED_SHARED();
    (void)state;
    const fl_hparams hp = hparams();
    char path[64];
    snprintf(path, sizeof path, "/tmp/fl_lora_%d_c.gguf", (int)getpid());
    fl_lora *lo = NULL;
    /* an adapter of the embeddings: fitllm applies none, so it refuses it */
    adapter ad = {.rank = 2, .alpha = 2};
    const int pairs[1][2] = {{1, FL_LORA_K}};
    write_llama_cpp(path, &hp, &ad, pairs, 1, "token_embd.weight.lora_a", 1);
    assert_int_equal(fl_lora_open(path, &hp, 1.0f, false, &lo), FL_ERR_FORMAT);
    assert_non_null(strstr(fl_last_error(), "adapters of q, k, v"));
    adapter_free(&ad);
    /* A without B */
    memset(&ad, 0, sizeof ad);
    ad.rank = 2;
    write_llama_cpp(path, &hp, &ad, pairs, 1, "blk.3.ffn_up.weight.lora_a", 1);
    assert_int_equal(fl_lora_open(path, &hp, 1.0f, false, &lo), FL_ERR_FORMAT);
    assert_non_null(strstr(fl_last_error(), "blk.3.ffn_up.weight.lora_a has no blk.3.ffn_up.weight.lora_b"));
    adapter_free(&ad);
    /* an adapter for another model: the shapes name the tensor */
    memset(&ad, 0, sizeof ad);
    ad.rank = 4;
    ad.alpha = 4;
    fl_hparams other = hp;
    other.n_embd = 96;
    write_fitllm(path, &other, &ad, 1u << FL_LORA_O, 2);
    assert_int_equal(fl_lora_open(path, &hp, 1.0f, false, &lo), FL_ERR_FORMAT);
    assert_non_null(strstr(fl_last_error(), "lora.attn_output.a"));
    adapter_free(&ad);
    /* the base model is no adapter; a missing file */
    assert_int_equal(fl_lora_open(FL_SHARED_PATH(MODEL), &hp, 1.0f, false, &lo), FL_ERR_FORMAT);
    assert_non_null(strstr(fl_last_error(), "not a LoRA adapter"));
    assert_true(fl_lora_open("/nonexistent/x.gguf", &hp, 1.0f, false, &lo) != FL_OK);
    assert_null(lo);
    /* through fl_model_load: the model fails whole */
    fl_model_params mp = fl_model_default_params();
    const char *not_adapter = FL_SHARED_PATH(MODEL);
    mp.lora_paths = &not_adapter;
    mp.n_loras = mp.lora_default = 1;
    fl_model *m = NULL;
    assert_int_equal(fl_model_load(FL_SHARED_PATH(MODEL), &mp, &m), FL_ERR_FORMAT);
    assert_null(m);
    unlink(path);
    fl_test_mem_zero();
}

/* The engine's plan counts the adapter: its file (MAPPED), its tables (MISC), its buffers (ACT). */
static void test_plan_counts_adapter(void **state) {
    NEED_SHARED();
    (void)state;
    const fl_hparams hp = hparams();
    char path[64];
    snprintf(path, sizeof path, "/tmp/fl_lora_%d_d.gguf", (int)getpid());
    adapter ad = {.rank = 8, .alpha = 16};
    write_fitllm(path, &hp, &ad, 0x7f, 3);
    fl_plan_engine_in in = {.model_path = FL_SHARED_PATH(MODEL), .weights_type = -1, .kv_type = FL_TYPE_F16, .kv_block = 16,
                            .n_ctx = 256, .max_seqs = 4, .max_batch_tokens = 64, .n_threads = 1, .kv_mem = 1 << 20,
                            .prefix_cache = 1, .max_logprobs = -1};
    fl_plan_engine_out a, b;
    assert_int_equal(fl_plan_engine(&in, &a), FL_OK);
    const char *paths[1] = {path};
    in.lora_paths = paths;
    in.n_loras = 1;
    assert_int_equal(fl_plan_engine(&in, &b), FL_OK);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    const long fsz = ftell(f);
    fclose(f);
    assert_int_equal(b.bytes[FL_MEM_MAPPED] - a.bytes[FL_MEM_MAPPED], (uint64_t)fsz);
    assert_int_equal(b.bytes[FL_MEM_ACT] - a.bytes[FL_MEM_ACT], fl_lora_workspace_bytes(8, hp.n_ff, 64 + 4));
    /* MISC: what opening the adapter holds, measured */
    const size_t m0 = fl_mem_current(FL_MEM_MISC);
    fl_lora *lo;
    assert_int_equal(fl_lora_open(path, &hp, 1.0f, false, &lo), FL_OK);
    const size_t held = fl_mem_current(FL_MEM_MISC) - m0;
    assert_int_equal(fl_lora_misc_bytes(lo), held); /* (what a run-time slot checks against its reservation) */
    fl_lora_free(lo);
    assert_int_equal(b.bytes[FL_MEM_MISC] - a.bytes[FL_MEM_MISC], held + sizeof(fl_lora *)); /* + the model's table */
    assert_true(held >= fl_lora_table_bytes(hp.n_layer));
    /* run-time slots: each reserves the largest adapter of its rank (file, index); the buffers
     * take any matrix's output */
    in.n_loras = 0;
    in.lora_slots = 2;
    in.max_lora_rank = 8;
    assert_int_equal(fl_plan_engine(&in, &b), FL_OK);
    size_t fc, mc;
    fl_lora_slot_caps(&hp, 8, &fc, &mc);
    assert_true(fc >= (size_t)fsz && mc >= held);
    assert_int_equal(b.bytes[FL_MEM_MAPPED] - a.bytes[FL_MEM_MAPPED], 2 * fc);
    assert_int_equal(b.bytes[FL_MEM_MISC] - a.bytes[FL_MEM_MISC], 2 * (mc + sizeof(fl_lora *)));
    assert_int_equal(b.bytes[FL_MEM_ACT] - a.bytes[FL_MEM_ACT], fl_lora_workspace_bytes(8, fl_lora_n_bound(&hp), 64 + 4));
    unlink(path);
    adapter_free(&ad);
    fl_test_mem_zero();
}

/* Greedy tokens of prompt through the bare model with the adapters paths[0..n_paths) loaded (scale
 * 1), applied by the model's default (adapter 1) or, with mix, through that mix of them. */
static void greedy_gen(const char *const *paths, int n_paths, const float *mix, const int32_t *prompt, int32_t n_prompt,
                       int32_t n_gen, int32_t *out) {
    fl_model_params mp = fl_model_default_params();
    mp.lora_paths = paths;
    mp.n_loras = n_paths;
    mp.lora_default = n_paths && !mix ? 1 : 0;
    fl_model *m;
    if (fl_model_load(FL_SHARED_PATH(MODEL), &mp, &m)) fail_msg("load: %s", fl_last_error());
    const fl_hparams *hp = fl_model_hparams(m);
    fl_kv_contig_params kp = {hp->n_layer, hp->n_head_local, hp->n_head_kv_local, hp->head_dim, 128, 1, hp->n_swa, FL_TYPE_F32};
    fl_kv_contig *kv;
    assert_int_equal(fl_kv_contig_new(&kp, &kv), FL_OK);
    assert_int_equal(fl_model_workspace_new(m, 64, 1), FL_OK);
    float *lg = malloc((size_t)hp->n_vocab * 4);
    int32_t tok[64], pos[64], sid[64] = {0}, lora[64];
    for (int32_t i = 0; i < n_prompt; i++) {
        tok[i] = prompt[i];
        pos[i] = i;
    }
    for (int32_t i = 0; i < 64; i++) lora[i] = 1;
    int32_t n = n_prompt, p0 = 0;
    for (int32_t g = 0; g < n_gen; g++) {
        fl_batch b = {n, tok, pos, sid, NULL};
        if (mix) {
            b.lora = lora;
            b.lora_mix = mix;
            b.n_lora_mix = 1;
        }
        if (fl_model_forward(m, &b, fl_kv_contig_iface(), kv, lg)) fail_msg("forward: %s", fl_last_error());
        int32_t best = 0;
        for (int32_t v = 1; v < hp->n_vocab; v++)
            if (lg[v] > lg[best]) best = v;
        out[g] = best;
        p0 += n;
        tok[0] = best;
        pos[0] = p0;
        n = 1;
    }
    free(lg);
    fl_kv_contig_free(kv);
    fl_model_free(m);
}

static void greedy_ref(const char *adapter_path, const int32_t *prompt, int32_t n_prompt, int32_t n_gen, int32_t *out) {
    greedy_gen(adapter_path ? &adapter_path : NULL, adapter_path ? 1 : 0, NULL, prompt, n_prompt, n_gen, out);
}

enum { NG = 10 }; /* tokens each engine test request generates */

/* Step e until the n requests id0.. finish, their tokens into got[i] (n_got[i] of them). */
static void run_requests(fl_engine *e, int64_t id0, int n, int32_t (*got)[NG], int32_t *n_got) {
    fl_request_output ev[16];
    for (int done = 0, guard = 0; done < n; guard++) {
        assert_true(guard < 1000);
        int32_t active;
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        int32_t k;
        while ((k = fl_engine_poll(e, ev, 16)) > 0)
            for (int32_t j = 0; j < k; j++) {
                const int i = (int)(ev[j].request_id - id0);
                memcpy(got[i] + n_got[i], ev[j].new_tokens, (size_t)ev[j].n_new * 4);
                n_got[i] += ev[j].n_new;
                done += ev[j].finish != FL_FINISH_NONE;
            }
    }
}

/* Run rp (one token) through e alone: the prompt tokens the prefix cache served. */
static int32_t cached_prompt(fl_engine *e, fl_request_params *rp) {
    fl_request_output ev[16];
    fl_sampling_params_default(&rp->sampling);
    int64_t id;
    assert_int_equal(fl_engine_add(e, rp, &id), FL_OK);
    int32_t cached = -1;
    for (int guard = 0; cached < 0; guard++) {
        assert_true(guard < 100);
        int32_t active;
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        int32_t n;
        while ((n = fl_engine_poll(e, ev, 16)) > 0)
            for (int32_t k = 0; k < n; k++)
                if (ev[k].request_id == id && ev[k].finish != FL_FINISH_NONE) cached = ev[k].n_cached_prompt;
    }
    return cached;
}

/* The engine the adapter tests run: stories260K, one thread, 6 sequences of 128 tokens, f32 KV. */
static void small_engine_params(fl_engine_params *ep) {
    fl_engine_params_default(ep);
    ep->model_path = FL_SHARED_PATH(MODEL);
    ep->n_threads = 1;
    ep->n_ctx = 128;
    ep->max_seqs = 6;
    ep->kv_mem = 1 << 20;
    ep->kv_type = "f32";
}

/* Two adapter files (fitllm's over every matrix, rank 4; llama.cpp's over three, rank 2) written
 * from seed and seed + 1 to p1 / p2 (named by tag), and an engine over them loaded at loaded[]
 * (NULL: 1 each). */
static fl_engine *two_adapter_engine(const char *tag, uint64_t seed, const float *loaded, char (*p1)[64], char (*p2)[64],
                                     adapter *a1, adapter *a2) {
    const fl_hparams hp = hparams();
    snprintf(*p1, sizeof *p1, "/tmp/fl_lora_%d_%s1.gguf", (int)getpid(), tag);
    snprintf(*p2, sizeof *p2, "/tmp/fl_lora_%d_%s2.gguf", (int)getpid(), tag);
    *a1 = (adapter){.rank = 4, .alpha = 4};
    *a2 = (adapter){.rank = 2, .alpha = 2};
    write_fitllm(*p1, &hp, a1, 0x7f, seed);
    const int pairs[3][2] = {{0, FL_LORA_Q}, {1, FL_LORA_DOWN}, {3, FL_LORA_GATE}};
    write_llama_cpp(*p2, &hp, a2, pairs, 3, NULL, seed + 1);
    const char *paths[2] = {*p1, *p2};
    fl_engine_params ep;
    small_engine_params(&ep);
    ep.lora_paths = paths;
    ep.lora_scales = loaded;
    ep.n_loras = 2;
    fl_engine *e;
    if (fl_engine_new(&ep, &e)) fail_msg("engine: %s", fl_last_error());
    return e;
}

static void two_adapter_free(fl_engine *e, const char *p1, const char *p2, adapter *a1, adapter *a2) {
    fl_engine_free(e);
    unlink(p1);
    unlink(p2);
    adapter_free(a1);
    adapter_free(a2);
    fl_test_mem_zero();
}

/* An engine over two adapters and the base: requests picking each, batched together, generate
 * what each gives alone through its adapter; a prompt's cached blocks serve only its adapter. */
static void test_engine_adapters_per_request(void **state) {
    NEED_SHARED();
    (void)state;
    char p1[64], p2[64];
    adapter a1, a2;
    fl_engine *e = two_adapter_engine("e", 21, NULL, &p1, &p2, &a1, &a2);
    const char *paths[2] = {p1, p2};
    enum { NR = 6 };
    const int32_t which[NR] = {0, 1, 2, 1, 0, 2};
    int32_t prompts[NR][8], got[NR][NG], n_got[NR] = {0};
    int64_t ids[NR];
    for (int i = 0; i < NR; i++) {
        prompts[i][0] = 1;
        for (int j = 1; j < 8; j++) prompts[i][j] = 3 + (i * 61 + j * 17) % 500;
        fl_request_params rp = {.prompt = prompts[i], .n_prompt = 8, .max_tokens = NG, .ignore_eos = 1, .lora = which[i]};
        fl_sampling_params_default(&rp.sampling);
        rp.sampling.temperature = 0;
        assert_int_equal(fl_engine_add(e, &rp, &ids[i]), FL_OK);
    }
    fl_request_params bad = {.prompt = prompts[0], .n_prompt = 8, .max_tokens = 2, .lora = 3};
    int64_t bid;
    assert_int_equal(fl_engine_add(e, &bad, &bid), FL_ERR_INVALID);
    run_requests(e, ids[0], NR, got, n_got);
    int differ = 0;
    for (int i = 0; i < NR; i++) {
        int32_t want[NG];
        greedy_ref(which[i] ? paths[which[i] - 1] : NULL, prompts[i], 8, NG, want);
        assert_int_equal(n_got[i], NG);
        if (memcmp(got[i], want, sizeof want)) fail_msg("request %d (adapter %d): the engine's tokens differ from its adapter alone", i, which[i]);
        int32_t base[NG];
        greedy_ref(NULL, prompts[i], 8, NG, base);
        differ += which[i] && memcmp(base, want, sizeof base) != 0;
    }
    assert_true(differ >= 2); /* the adapters change what is generated */
    /* the prefix cache: 40 prompt tokens (2 full blocks) under adapter 1, then 2, then 1 again */
    int32_t longp[40];
    for (int j = 0; j < 40; j++) longp[j] = j ? 3 + (j * 29) % 500 : 1;
    const int32_t seq[3] = {1, 2, 1}, want_cached[3] = {0, 0, 32};
    for (int q = 0; q < 3; q++) {
        fl_request_params rp = {.prompt = longp, .n_prompt = 40, .max_tokens = 1, .lora = seq[q]};
        assert_int_equal(cached_prompt(e, &rp), want_cached[q]);
    }
    two_adapter_free(e, p1, p2, &a1, &a2);
}

/* Requests with adapter mixes (fl_request_params.lora_scales), batched with one that names an
 * adapter and one with none, each generate what that mix gives alone; the prompt's cached blocks
 * are shared by equal mixes however asked for, and by no other. */
static void test_engine_adapter_mixes(void **state) {
    NEED_SHARED();
    (void)state;
    const float loaded[2] = {1.0f, 2.0f};
    char p1[64], p2[64];
    adapter a1, a2;
    fl_engine *e = two_adapter_engine("x", 41, loaded, &p1, &p2, &a1, &a2);
    const char *paths[2] = {p1, p2};
    enum { NR = 6 };
    /* the mixes asked for; index 2 of "which" asks for adapter 2 by name (at its loaded 2) */
    const float mixes[NR][2] = {{1, 0}, {0.5f, 2}, {0, 0}, {0, 2}, {-1, 1}, {0.7f, 0.3f}};
    const int32_t which[NR] = {0, 0, 0, 2, 0, 0};
    int32_t prompts[NR][8], got[NR][NG], n_got[NR] = {0};
    int64_t ids[NR];
    for (int i = 0; i < NR; i++) {
        prompts[i][0] = 1;
        for (int j = 1; j < 8; j++) prompts[i][j] = 3 + (i * 53 + j * 19) % 500;
        fl_request_params rp = {.prompt = prompts[i], .n_prompt = 8, .max_tokens = NG, .ignore_eos = 1, .lora = which[i]};
        if (!which[i]) rp.lora_scales = mixes[i];
        fl_sampling_params_default(&rp.sampling);
        rp.sampling.temperature = 0;
        assert_int_equal(fl_engine_add(e, &rp, &ids[i]), FL_OK);
    }
    /* refused: an adapter and scales together; a scale that is not finite or too large */
    const float nan_mix[2] = {NAN, 0}, big_mix[2] = {0, 2e6f};
    fl_request_params bad = {.prompt = prompts[0], .n_prompt = 8, .max_tokens = 2, .lora = 1, .lora_scales = mixes[0]};
    int64_t bid;
    assert_int_equal(fl_engine_add(e, &bad, &bid), FL_ERR_INVALID);
    bad.lora = 0;
    bad.lora_scales = nan_mix;
    assert_int_equal(fl_engine_add(e, &bad, &bid), FL_ERR_INVALID);
    bad.lora_scales = big_mix;
    assert_int_equal(fl_engine_add(e, &bad, &bid), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "scale"));
    run_requests(e, ids[0], NR, got, n_got);
    int differ = 0;
    for (int i = 0; i < NR; i++) {
        int32_t want[NG], base[NG];
        greedy_gen(paths, 2, mixes[i], prompts[i], 8, NG, want);
        assert_int_equal(n_got[i], NG);
        if (memcmp(got[i], want, sizeof want)) fail_msg("request %d: the engine's tokens differ from its mix alone", i);
        greedy_ref(NULL, prompts[i], 8, NG, base);
        if (i == 2) assert_memory_equal(got[i], base, sizeof base); /* the all-zero mix: the base model */
        differ += memcmp(base, want, sizeof base) != 0;
    }
    assert_true(differ >= 3); /* the mixes change what is generated */
    /* the prefix cache: 40 prompt tokens (2 full blocks) under adapter 2 at 2 asked by scales, then
     * by name (the same mix: served), then at 2.5 (another mix: computed) */
    int32_t longp[40];
    for (int j = 0; j < 40; j++) longp[j] = j ? 3 + (j * 31) % 500 : 1;
    const float m_a[2] = {0, 2}, m_b[2] = {0, 2.5f};
    const float *seq_mix[3] = {m_a, NULL, m_b};
    const int32_t want_cached[3] = {0, 32, 0};
    for (int q = 0; q < 3; q++) {
        fl_request_params rp = {.prompt = longp, .n_prompt = 40, .max_tokens = 1, .lora = seq_mix[q] ? 0 : 2, .lora_scales = seq_mix[q]};
        assert_int_equal(cached_prompt(e, &rp), want_cached[q]);
    }
    two_adapter_free(e, p1, p2, &a1, &a2);
}

/* Adapters loaded and unloaded at run time (fl_engine_lora_load / _unload, vLLM's
 * /v1/load_lora_adapter): requests apply them as they would adapters given at creation; an
 * adapter unloaded while a request applies it stays until that request finishes, then its slot
 * is empty (its file unmapped) and takes another; what exceeds a slot's reservation is refused. */
static void test_engine_runtime_adapters(void **state) {
    NEED_SHARED();
    (void)state;
    const fl_hparams hp = hparams();
    char p1[64], p2[64], big[64];
    snprintf(p1, sizeof p1, "/tmp/fl_lora_%d_r1.gguf", (int)getpid());
    snprintf(p2, sizeof p2, "/tmp/fl_lora_%d_r2.gguf", (int)getpid());
    snprintf(big, sizeof big, "/tmp/fl_lora_%d_r3.gguf", (int)getpid());
    adapter a1 = {.rank = 4, .alpha = 4}, a2 = {.rank = 2, .alpha = 2}, a3 = {.rank = 8, .alpha = 8};
    write_fitllm(p1, &hp, &a1, 0x7f, 51);
    const int pairs[3][2] = {{0, FL_LORA_Q}, {1, FL_LORA_DOWN}, {3, FL_LORA_GATE}};
    write_llama_cpp(p2, &hp, &a2, pairs, 3, NULL, 52);
    write_fitllm(big, &hp, &a3, 0x7f, 53);
    const char *paths[2] = {p1, p2};
    fl_engine_params ep;
    small_engine_params(&ep);
    ep.lora_slots = 2;
    ep.max_lora_rank = 4;
    fl_engine *e;
    if (fl_engine_new(&ep, &e)) fail_msg("engine: %s", fl_last_error());
    assert_int_equal(fl_engine_n_loras(e), 2);
    int32_t prompt[8] = {1, 3, 50, 77, 9, 400, 12, 5};
    fl_request_params rp = {.prompt = prompt, .n_prompt = 8, .max_tokens = NG, .ignore_eos = 1, .lora = 1};
    fl_sampling_params_default(&rp.sampling);
    rp.sampling.temperature = 0;
    int64_t id;
    assert_int_equal(fl_engine_add(e, &rp, &id), FL_ERR_INVALID); /* nothing loaded yet */
    int32_t k1, k2, k3;
    const size_t mapped0 = fl_mem_current(FL_MEM_MAPPED);
    assert_int_equal(fl_engine_lora_load(e, big, 1.0f, &k3), FL_ERR_BUDGET); /* rank 8 > 4: its file exceeds the slot */
    assert_int_equal(fl_engine_lora_load(e, p1, 1.0f, &k1), FL_OK);
    assert_int_equal(fl_engine_lora_load(e, p2, 1.0f, &k2), FL_OK);
    assert_int_equal(fl_engine_lora_load(e, p1, 1.0f, &k3), FL_ERR_BUDGET); /* no slot left */
    assert_int_equal(k1, 1);
    assert_int_equal(k2, 2);
    float sc = 0;
    assert_int_equal(fl_engine_lora_loaded(e, 2, &sc), 1);
    assert_true(sc == 1.0f);
    /* four requests batched: adapter 1, adapter 2, a mix of both, none */
    enum { NR = 4 };
    const float mixes[NR][2] = {{1, 0}, {0, 1}, {0.5f, -1}, {0, 0}};
    int32_t got[NR][NG], n_got[NR] = {0};
    int64_t ids[NR];
    for (int i = 0; i < NR; i++) {
        rp.lora = i < 2 ? i + 1 : 0;
        rp.lora_scales = i < 2 ? NULL : mixes[i];
        assert_int_equal(fl_engine_add(e, &rp, &ids[i]), FL_OK);
    }
    run_requests(e, ids[0], NR, got, n_got);
    int32_t base[NG];
    greedy_ref(NULL, prompt, 8, NG, base);
    for (int i = 0; i < NR; i++) {
        int32_t want[NG];
        greedy_gen(paths, 2, mixes[i], prompt, 8, NG, want);
        assert_int_equal(n_got[i], NG);
        if (memcmp(got[i], want, sizeof want)) fail_msg("request %d: the engine's tokens differ from its adapters alone", i);
        if (i < 3 && !memcmp(want, base, sizeof base)) fail_msg("request %d: its adapters change nothing", i);
    }
    /* unloading adapter 1 while a request applies it: new requests are refused, the running one
     * finishes through it; then the slot is free (the file unmapped) and loads another */
    rp.lora = 1;
    rp.lora_scales = NULL;
    int64_t id1;
    assert_int_equal(fl_engine_add(e, &rp, &id1), FL_OK);
    int32_t active;
    assert_int_equal(fl_engine_step(e, &active), FL_OK);
    assert_int_equal(fl_engine_lora_unload(e, 1), FL_OK);
    assert_int_equal(fl_engine_lora_unload(e, 1), FL_ERR_INVALID); /* (already unloading) */
    assert_int_equal(fl_engine_lora_loaded(e, 1, NULL), 0);
    assert_int_equal(fl_engine_add(e, &rp, &id), FL_ERR_INVALID);
    const float only1[2] = {1, 0};
    int32_t late[1][NG], n_late[1] = {0}, want1[NG];
    run_requests(e, id1, 1, late, n_late);
    greedy_gen(paths, 2, only1, prompt, 8, NG, want1);
    assert_int_equal(n_late[0], NG);
    assert_memory_equal(late[0], want1, sizeof want1);
    assert_int_equal(fl_engine_step(e, &active), FL_OK); /* (the slot is freed at a step's start) */
    struct stat sb;
    assert_int_equal(stat(p2, &sb), 0);
    assert_int_equal(fl_mem_current(FL_MEM_MAPPED), mapped0 + (size_t)sb.st_size); /* adapter 2's file alone */
    assert_int_equal(fl_engine_lora_load(e, p2, 0.5f, &k3), FL_OK);
    assert_int_equal(k3, 1);
    assert_int_equal(fl_engine_lora_unload(e, 1), FL_OK); /* (no request applies it: freed at once) */
    assert_int_equal(fl_engine_lora_unload(e, 2), FL_OK);
    assert_int_equal(fl_mem_current(FL_MEM_MAPPED), mapped0);
    fl_engine_free(e);
    /* an engine without slots loads nothing */
    ep.lora_slots = 0;
    if (fl_engine_new(&ep, &e)) fail_msg("engine: %s", fl_last_error());
    assert_int_equal(fl_engine_lora_load(e, p1, 1.0f, &k1), FL_ERR_UNSUPPORTED);
    fl_engine_free(e);
    unlink(p1);
    unlink(p2);
    unlink(big);
    adapter_free(&a1);
    adapter_free(&a2);
    adapter_free(&a3);
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fitllm_file_equals_merged),
        cmocka_unit_test(test_llama_cpp_file_some_matrices),
        cmocka_unit_test(test_mix_equals_merged),
        cmocka_unit_test(test_bad_adapters),
        cmocka_unit_test(test_plan_counts_adapter),
        cmocka_unit_test(test_engine_adapters_per_request),
        cmocka_unit_test(test_engine_adapter_mixes),
        cmocka_unit_test(test_engine_runtime_adapters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
