/* The paged KV cache under the real model (stories260K): prefix-cache hits are invisible.
 *
 * Oracle: each prompt is run cold (a fresh cache, whole prompt in one batch, then greedy
 * decoding) and warm (one cache with prefix caching: earlier prompts left their full blocks
 * behind, fl_kv_seq_add reuses the longest cached chain, only the rest is prefilled, and two
 * sequences are prefilled and decoded together in one batch).  The logits of every computed
 * prompt position and of every decode step, and the greedy tokens, must be bitwise equal.
 * That needs each row of every step to be computed independently of the batch's size and
 * composition (matmul per-row results independent of M, attention bits dependent only on the
 * position and the cached K/V).  Runs with f32 weights (f32 matmul) and q8_0 weights (the int8
 * activation path; each prompt alone there, see test_oracle_q8_weights), f16 and q8_0 KV. */
#include "test.h"

#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/matmul.h"
#include "kv/kv_cache.h"
#include "model/llama.h"
#include "model/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N_PROMPT = 4, MAXTOK = 96, GEN = 12, BS = 8 };

static const char *prompts[N_PROMPT] = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends.",
    "Once upon a time, there was a little girl named Lily. She had a red ball and a small dog named Max.",
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day",
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends.",
};

typedef struct result {
    int32_t n;                    /* prompt tokens */
    int32_t toks[MAXTOK];
    float *plog;                  /* [n][V] logits of every prompt position */
    int32_t gen[GEN];
    float *glog;                  /* [GEN][V] logits after each generated token's step (the last unused) */
} result;

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static fl_kv_cache *new_cache(const fl_hparams *hp, int32_t type, bool prefix) {
    fl_kv_config c = {.n_layer = hp->n_layer, .n_head = hp->n_head_local, .n_head_kv = hp->n_head_kv_local,
                      .head_dim = hp->head_dim, .type = type, .block_size = BS, .n_blocks = 1 + 3 * (MAXTOK + GEN) / BS + 8,
                      .n_seq_max = 4, .n_rot = hp->rope_dim, .rope_base = hp->rope_freq_base, .prefix_cache = prefix};
    fl_kv_cache *kv = fl_kv_new(&c);
    assert_non_null(kv);
    return kv;
}

/* Cold run of r (toks, n set): fresh cache, whole prompt in one batch, GEN greedy steps. */
static void run_cold(fl_model *m, int32_t type, result *r) {
    const fl_hparams *hp = fl_model_hparams(m);
    const int32_t V = hp->n_vocab;
    fl_kv_cache *kv = new_cache(hp, type, false);
    fl_kv_iface ifc = fl_kv_iface_get();
    int32_t pos[MAXTOK], sid[MAXTOK] = {0};
    int8_t want[MAXTOK];
    for (int32_t i = 0; i < r->n; i++) pos[i] = i, want[i] = 1;
    fl_batch b = {r->n, r->toks, pos, sid, want};
    assert_int_equal(fl_model_forward(m, &b, &ifc, kv, r->plog), FL_OK);
    int32_t t = argmax(r->plog + (size_t)(r->n - 1) * V, V);
    for (int32_t g = 0; g < GEN; g++) {
        r->gen[g] = t;
        int32_t p = r->n + g, s = 0;
        fl_batch d = {1, &t, &p, &s, NULL};
        assert_int_equal(fl_model_forward(m, &d, &ifc, kv, r->glog + (size_t)g * V), FL_OK);
        t = argmax(r->glog + (size_t)g * V, V);
    }
    fl_kv_free(kv);
}

/* Warm: prompts 0 and 1 alone one after the other (1 hits 0's blocks), then 2 and 3 together
 * in one batch per step (both hit 0's blocks; 3 is 0 again: everything but its last token). */
static void run_warm(fl_model *m, int32_t type, bool together, result *r, int32_t *n_hit) {
    const fl_hparams *hp = fl_model_hparams(m);
    const int32_t V = hp->n_vocab;
    fl_kv_cache *kv = new_cache(hp, type, true);
    fl_kv_iface ifc = fl_kv_iface_get();
    const int32_t groups_together[3][2] = {{0, -1}, {1, -1}, {2, 3}}, groups_alone[4][2] = {{0, -1}, {1, -1}, {2, -1}, {3, -1}};
    const int32_t(*groups)[2] = together ? groups_together : groups_alone;
    const int n_groups = together ? 3 : 4;
    int32_t toks[2 * MAXTOK], pos[2 * MAXTOK], sid[2 * MAXTOK];
    float *lg = fl_alloc(FL_MEM_ACT, sizeof(float) * 2 * MAXTOK * (size_t)V, 64);
    assert_non_null(lg);
    *n_hit = 0;
    for (int gi = 0; gi < n_groups; gi++) {
        int32_t nc[2] = {0, 0}, n = 0;
        for (int k = 0; k < 2 && groups[gi][k] >= 0; k++) {
            const result *x = &r[groups[gi][k]];
            assert_int_equal(fl_kv_seq_add(kv, k, x->toks, x->n, &nc[k]), FL_OK);
            *n_hit += nc[k];
            for (int32_t i = nc[k]; i < x->n; i++, n++) toks[n] = x->toks[i], pos[n] = i, sid[n] = k;
        }
        fl_batch b = {n, toks, pos, sid, NULL};
        int8_t want[2 * MAXTOK];
        memset(want, 1, sizeof want);
        b.logits = want;
        assert_int_equal(fl_model_forward(m, &b, &ifc, kv, lg), FL_OK);
        int32_t row = 0, next[2] = {0, 0}, nk = 0;
        for (int k = 0; k < 2 && groups[gi][k] >= 0; k++, nk++) {
            const result *x = &r[groups[gi][k]];
            for (int32_t i = nc[k]; i < x->n; i++, row++)
                if (memcmp(lg + (size_t)row * V, x->plog + (size_t)i * V, sizeof(float) * (size_t)V))
                    fail_msg("prompt %d position %d (cached %d): warm logits differ from cold", groups[gi][k], i, nc[k]);
            next[k] = argmax(lg + (size_t)(row - 1) * V, V);
        }
        for (int32_t g = 0; g < GEN; g++) {
            for (int k = 0; k < nk; k++) {
                const result *x = &r[groups[gi][k]];
                if (next[k] != x->gen[g]) fail_msg("prompt %d step %d: warm token %d, cold %d", groups[gi][k], g, next[k], x->gen[g]);
                toks[k] = next[k], pos[k] = x->n + g, sid[k] = k;
            }
            fl_batch d = {nk, toks, pos, sid, want};
            assert_int_equal(fl_model_forward(m, &d, &ifc, kv, lg), FL_OK);
            for (int k = 0; k < nk; k++) {
                const result *x = &r[groups[gi][k]];
                if (memcmp(lg + (size_t)k * V, x->glog + (size_t)g * V, sizeof(float) * (size_t)V))
                    fail_msg("prompt %d decode step %d: warm logits differ from cold", groups[gi][k], g);
                next[k] = argmax(lg + (size_t)k * V, V);
            }
        }
        for (int k = 0; k < nk; k++) fl_kv_seq_free(kv, k);
        assert_int_equal(fl_kv_check(kv), FL_OK);
    }
    fl_free(FL_MEM_ACT, lg, sizeof(float) * 2 * MAXTOK * (size_t)V);
    fl_kv_free(kv);
}

static void oracle(const char *model, int32_t kv_type, bool together) {
    fl_model *m = NULL;
    assert_int_equal(fl_model_load(FL_SHARED_PATH(model), NULL, &m), FL_OK);
    const fl_hparams *hp = fl_model_hparams(m);
    const int32_t V = hp->n_vocab;
    fl_tokenizer *tok = NULL;
    assert_int_equal(fl_tokenizer_new(fl_model_gguf(m), &tok), FL_OK);
    assert_int_equal(fl_model_workspace_new(m, 2 * MAXTOK, 2 * MAXTOK), FL_OK);
    result r[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) {
        int64_t n = 0;
        assert_int_equal(fl_tokenize(tok, prompts[i], strlen(prompts[i]), true, false, r[i].toks, MAXTOK, &n), FL_OK);
        assert_true(n > 2 * BS && n <= MAXTOK);
        r[i].n = (int32_t)n;
        r[i].plog = fl_alloc(FL_MEM_ACT, sizeof(float) * (size_t)n * (size_t)V, 64);
        r[i].glog = fl_alloc(FL_MEM_ACT, sizeof(float) * GEN * (size_t)V, 64);
        assert_true(r[i].plog && r[i].glog);
        run_cold(m, kv_type, &r[i]);
    }
    /* prompts 0 and 3 are the same text: their cold runs must agree too */
    assert_int_equal(r[0].n, r[3].n);
    assert_memory_equal(r[0].plog, r[3].plog, sizeof(float) * (size_t)r[0].n * (size_t)V);
    int32_t n_hit = 0;
    run_warm(m, kv_type, together, r, &n_hit);
    /* 1 and 2 share at least two full blocks with 0; 3 gets all of 0's full blocks */
    assert_true(n_hit >= 2 * BS + 2 * BS + (r[3].n - 1) / BS * BS);
    printf("%s, %s KV: %d prompt tokens cached, warm == cold bitwise (logits of %d prompt positions, %d decode steps)\n",
           model, kv_type == FL_TYPE_F16 ? "f16" : "q8_0", n_hit, r[0].n + r[1].n + r[2].n + r[3].n - n_hit, 4 * GEN);
    for (int i = 0; i < N_PROMPT; i++) {
        fl_free(FL_MEM_ACT, r[i].plog, sizeof(float) * (size_t)r[i].n * (size_t)V);
        fl_free(FL_MEM_ACT, r[i].glog, sizeof(float) * GEN * (size_t)V);
    }
    fl_tokenizer_free(tok);
    fl_model_free(m);
}

static void test_oracle_f32_weights(void **state) {
    (void)state;
    NEED_SHARED();
    oracle("models/stories260K.gguf", FL_TYPE_F16, true);
    oracle("models/stories260K.gguf", FL_TYPE_Q8_0, true);
    fl_test_mem_zero();
}

static void test_oracle_q8_weights(void **state) {
    (void)state;
    NEED_SHARED();
    /* Known limit: the int8 matmul path computes a 1-token step (on AVX2 steps of up to
     * fl_matmul_gemv_max_tokens) with the GEMV and larger steps with the tile kernels, whose
     * block summation orders differ, so a decode row's bits depend on whether it shares its
     * step with other sequences (kernels/matmul.c).  Prefix hits change only the prefill's M:
     * with the GEMV kept to one token (fl_matmul_set_few_token_gemv(false)) a prefill of 2 tokens
     * or more takes the tile kernels either way, and that part is bitwise. */
    fl_matmul_set_few_token_gemv(false);
    oracle("models/stories260K-q8_0.gguf", FL_TYPE_F16, false);
    fl_matmul_set_few_token_gemv(true);
    fl_test_mem_zero();
}

/* Streaming with the real model: after fl_kv_seq_stream the kept layer-0 keys (which depend
 * only on the token and its position) equal those of a fresh cache fed the kept tokens at
 * their new positions, up to rounding of the re-rotation; layer-0 values are bitwise equal.
 * This ties the cache's re-rotation convention to the model's RoPE. */
static void test_stream_rerope_matches_model(void **state) {
    (void)state;
    NEED_SHARED();
    fl_model *m = NULL;
    assert_int_equal(fl_model_load(FL_SHARED_PATH("models/stories260K.gguf"), NULL, &m), FL_OK);
    const fl_hparams *hp = fl_model_hparams(m);
    fl_tokenizer *tok = NULL;
    assert_int_equal(fl_tokenizer_new(fl_model_gguf(m), &tok), FL_OK);
    assert_int_equal(fl_model_workspace_new(m, MAXTOK, MAXTOK), FL_OK);
    int32_t t[MAXTOK], kept[MAXTOK], pos[MAXTOK], sid[MAXTOK] = {0};
    int64_t n = 0;
    assert_int_equal(fl_tokenize(tok, prompts[2], strlen(prompts[2]), true, false, t, MAXTOK, &n), FL_OK);
    const int32_t S = 4, W = 13, L = (int32_t)n;
    assert_true(L > S + W + 5);
    fl_kv_iface ifc = fl_kv_iface_get();
    float *lg = fl_alloc(FL_MEM_ACT, sizeof(float) * (size_t)hp->n_vocab, 64);
    fl_kv_cache *a = new_cache(hp, FL_TYPE_F32, false), *b = new_cache(hp, FL_TYPE_F32, false);
    for (int32_t i = 0; i < L; i++) pos[i] = i;
    fl_batch ba = {L, t, pos, sid, NULL};
    assert_int_equal(fl_model_forward(m, &ba, &ifc, a, lg), FL_OK);
    assert_int_equal(fl_kv_seq_stream(a, 0, S, W), FL_OK);
    assert_int_equal(fl_kv_seq_len(a, 0), S + W);
    for (int32_t i = 0; i < S + W; i++) kept[i] = i < S ? t[i] : t[L - W + (i - S)];
    fl_batch bb = {S + W, kept, pos, sid, NULL};
    assert_int_equal(fl_model_forward(m, &bb, &ifc, b, lg), FL_OK);
    const int32_t nr = hp->n_head_kv_local * hp->head_dim;
    float ka[512], kb[512], va[512], vb[512];
    double worst = 0;
    for (int32_t p = 0; p < S + W; p++) {
        assert_int_equal(fl_kv_seq_read(a, 0, 0, p, ka, va), FL_OK);
        assert_int_equal(fl_kv_seq_read(b, 0, 0, p, kb, vb), FL_OK);
        assert_memory_equal(va, vb, sizeof(float) * (size_t)nr);
        double mx = 0;
        for (int32_t i = 0; i < nr; i++) mx = fabs(kb[i]) > mx ? fabs(kb[i]) : mx;
        const double d = fl_test_max_abs_diff(ka, kb, nr) / (mx > 0 ? mx : 1);
        worst = d > worst ? d : worst;
        if (p < S) assert_memory_equal(ka, kb, sizeof(float) * (size_t)nr); /* sinks did not move */
    }
    printf("stream: layer-0 keys after the shift vs fresh at new positions: max rel diff %.2g\n", worst);
    assert_true(worst < 1e-5);
    /* and the streamed sequence keeps decoding */
    int32_t nt = kept[S + W - 1], np = S + W, ns = 0;
    fl_batch d = {1, &nt, &np, &ns, NULL};
    assert_int_equal(fl_model_forward(m, &d, &ifc, a, lg), FL_OK);
    for (int32_t v = 0; v < hp->n_vocab; v++) assert_true(isfinite(lg[v]));
    fl_kv_free(a);
    fl_kv_free(b);
    fl_free(FL_MEM_ACT, lg, sizeof(float) * (size_t)hp->n_vocab);
    fl_tokenizer_free(tok);
    fl_model_free(m);
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle_f32_weights),
        cmocka_unit_test(test_oracle_q8_weights),
        cmocka_unit_test(test_stream_rerope_matches_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
