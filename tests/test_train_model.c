/* Tests of the trainable model (src/train/model.c) on stories260K:
 *   - forward logits match the float64 reference of stories260K.reference.json
 *   - whole-model gradients vs double-precision finite differences on random parameters
 *   - checkpointing every k layers gives bit-identical gradients to keeping everything
 *   - gradient accumulation over micro-batches equals the big batch
 *   - a backward handing its gradients over a bucket at a time (ZeRO-2) gives the same bits
 *   - packed documents (block-diagonal attention, positions restarting) give the same loss as
 *     the documents run one by one
 *   - bf16 compute stays close to f32; export -> reload round trip */
#include "test.h"

#include "core/threads.h"
#include "core/dtype.h"
#include "core/status.h"
#include "formats/gguf.h"
#include "kv/kv_contig.h"
#include "model/llama.h"
#include "plan/plan.h"
#include "train/model.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static fl_train_model *load_stories(void) {
    fl_gguf *g;
    assert_int_equal(fl_gguf_open(FL_SHARED_PATH("models/stories260K.gguf"), &g), FL_OK);
    fl_train_model *m;
    assert_int_equal(fl_train_model_load_gguf(g, &m), FL_OK);
    fl_gguf_free(g);
    return m;
}

/* batch from one token list per sequence; targets = next token in the same sequence */
typedef struct tbatch {
    int32_t tok[256], tgt[256], pos[256], cu[17];
    fl_train_batch b;
} tbatch;

static void make_batch(tbatch *t, const int32_t *const *seqs, const int *lens, int n_seq) {
    int64_t n = 0;
    t->cu[0] = 0;
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < lens[s]; i++, n++) {
            t->tok[n] = seqs[s][i];
            t->tgt[n] = i + 1 < lens[s] ? seqs[s][i + 1] : -1;
            t->pos[n] = i;
        }
        t->cu[s + 1] = (int32_t)n;
    }
    t->b = (fl_train_batch){t->tok, t->tgt, t->pos, t->cu, n, n_seq};
}

static const int32_t seq_a[] = {1, 403, 407, 261, 378, 300, 270, 290, 311, 33, 450};
static const int32_t seq_b[] = {1, 50, 51, 52, 499, 2, 7};
static const int32_t seq_c[] = {1, 403, 9, 9, 420};
static const int32_t seq_d[] = {1, 17, 260, 261, 262, 263, 264, 265, 266};

/* ---------------------------------------------------------------- logits vs reference */
static void test_forward_reference_logits(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_model *m = load_stories();
    assert_int_equal(fl_train_model_reserve(m, 64, 0, FL_TRAIN_F32), FL_OK);
    size_t len;
    char *js = fl_test_read_file(FL_SHARED_PATH("models/stories260K.reference.json"), &len);
    assert_non_null(js);
    cJSON *root = cJSON_Parse(js);
    assert_non_null(root);
    cJSON *posarr = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "prompt_logits"), "positions");
    tbatch t;
    const int32_t *s[1] = {seq_a};
    int lens[1] = {5};
    make_batch(&t, s, lens, 1);
    assert_int_equal(fl_train_model_forward(m, &t.b, NULL, NULL), FL_OK);
    const float *logits = fl_train_model_logits(m);
    double worst = 0;
    for (int p = 0; p < 5; p++) {
        cJSON *row = cJSON_GetArrayItem(posarr, p);
        assert_int_equal(cJSON_GetArraySize(row), 512);
        for (int j = 0; j < 512; j++) {
            double d = fabs(logits[p * 512 + j] - cJSON_GetArrayItem(row, j)->valuedouble);
            if (d > worst) worst = d;
        }
    }
    if (worst > 2e-4) fail_msg("logits differ from the float64 reference by %g", worst);
    cJSON_Delete(root);
    fl_test_free_file(js, len);
    fl_train_model_free(m);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- double reference model */
/* A plain double-precision forward of the same model (sum of token losses), from llama.cpp
 * semantics, written independently of ops_train.c. */
static double ref_loss(const fl_train_config *c, const fl_train_model *m, const double *P, const fl_train_batch *b) {
    const int C = c->n_embd, H = c->n_head, Hkv = c->n_head_kv, hd = c->head_dim, F = c->n_ff, V = c->n_vocab;
    const int N = (int)b->n_tokens, Q = H * hd, KV = Hkv * hd;
#define PT(p, l) (P + (fl_train_model_tensor(m, m->params, (p), (l)) - m->params))
    double *x = calloc((size_t)N * C, 8), *xn = calloc((size_t)N * C, 8), *q = calloc((size_t)N * Q, 8);
    double *k = calloc((size_t)N * KV, 8), *v = calloc((size_t)N * KV, 8), *att = calloc((size_t)N * Q, 8);
    double *gg = calloc((size_t)N * F, 8), *sc = calloc((size_t)N, 8);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < C; j++) x[i * C + j] = PT(FL_TP_TOK_EMBD, 0)[b->tokens[i] * C + j];
    for (int l = 0; l < c->n_layer; l++) {
        for (int half = 0; half < 2; half++) {
            const double *nw = PT(half ? FL_TP_FFN_NORM : FL_TP_ATTN_NORM, l);
            for (int i = 0; i < N; i++) {
                double ss = 0;
                for (int j = 0; j < C; j++) ss += x[i * C + j] * x[i * C + j];
                double r = 1 / sqrt(ss / C + c->rms_eps);
                for (int j = 0; j < C; j++) xn[i * C + j] = x[i * C + j] * r * nw[j];
            }
            if (!half) {
                const double *wq = PT(FL_TP_WQ, l), *wk = PT(FL_TP_WK, l), *wv = PT(FL_TP_WV, l), *wo = PT(FL_TP_WO, l);
                for (int i = 0; i < N; i++) {
                    for (int o = 0; o < Q; o++) { double s = 0; for (int j = 0; j < C; j++) s += xn[i * C + j] * wq[o * C + j]; q[i * Q + o] = s; }
                    for (int o = 0; o < KV; o++) {
                        double s1 = 0, s2 = 0;
                        for (int j = 0; j < C; j++) { s1 += xn[i * C + j] * wk[o * C + j]; s2 += xn[i * C + j] * wv[o * C + j]; }
                        k[i * KV + o] = s1; v[i * KV + o] = s2;
                    }
                    for (int hh = 0; hh < H + Hkv; hh++) {
                        double *z = hh < H ? q + i * Q + hh * hd : k + i * KV + (hh - H) * hd;
                        for (int e = 0; e < c->rope_dim / 2; e++) {
                            double th = b->pos[i] * pow(c->rope_base, -2.0 * e / c->rope_dim);
                            double a0 = z[2 * e], a1 = z[2 * e + 1];
                            z[2 * e] = a0 * cos(th) - a1 * sin(th);
                            z[2 * e + 1] = a0 * sin(th) + a1 * cos(th);
                        }
                    }
                }
                for (int s = 0; s < b->n_seq; s++)
                    for (int h = 0; h < H; h++)
                        for (int i = b->cu_seqlens[s]; i < b->cu_seqlens[s + 1]; i++) {
                            double mx = -1e300, sum = 0;
                            const int hk = h / (H / Hkv);
                            for (int j = b->cu_seqlens[s]; j <= i; j++) {
                                double d = 0;
                                for (int e = 0; e < hd; e++) d += q[i * Q + h * hd + e] * k[j * KV + hk * hd + e];
                                sc[j] = d / sqrt((double)hd);
                                if (sc[j] > mx) mx = sc[j];
                            }
                            for (int j = b->cu_seqlens[s]; j <= i; j++) sum += (sc[j] = exp(sc[j] - mx));
                            for (int e = 0; e < hd; e++) {
                                double o = 0;
                                for (int j = b->cu_seqlens[s]; j <= i; j++) o += sc[j] / sum * v[j * KV + hk * hd + e];
                                att[i * Q + h * hd + e] = o;
                            }
                        }
                for (int i = 0; i < N; i++)
                    for (int o = 0; o < C; o++) { double s = 0; for (int j = 0; j < Q; j++) s += att[i * Q + j] * wo[o * Q + j]; x[i * C + o] += s; }
            } else {
                const double *w1 = PT(FL_TP_FFN_GATE, l), *w3 = PT(FL_TP_FFN_UP, l), *w2 = PT(FL_TP_FFN_DOWN, l);
                for (int i = 0; i < N; i++) {
                    for (int f = 0; f < F; f++) {
                        double a = 0, u = 0;
                        for (int j = 0; j < C; j++) { a += xn[i * C + j] * w1[f * C + j]; u += xn[i * C + j] * w3[f * C + j]; }
                        gg[i * F + f] = a / (1 + exp(-a)) * u;
                    }
                    for (int o = 0; o < C; o++) { double s = 0; for (int f = 0; f < F; f++) s += gg[i * F + f] * w2[o * F + f]; x[i * C + o] += s; }
                }
            }
        }
    }
    double loss = 0;
    const double *nw = PT(FL_TP_OUT_NORM, 0), *wout = PT(FL_TP_OUTPUT, 0);
    double *lg = calloc((size_t)V, 8);
    for (int i = 0; i < N; i++) {
        if (b->targets[i] < 0) continue;
        double ss = 0;
        for (int j = 0; j < C; j++) ss += x[i * C + j] * x[i * C + j];
        double r = 1 / sqrt(ss / C + c->rms_eps), mx = -1e300, sum = 0;
        for (int o = 0; o < V; o++) {
            double s = 0;
            for (int j = 0; j < C; j++) s += x[i * C + j] * r * nw[j] * wout[o * C + j];
            lg[o] = s;
            if (s > mx) mx = s;
        }
        for (int o = 0; o < V; o++) sum += exp(lg[o] - mx);
        loss += mx + log(sum) - lg[b->targets[i]];
    }
#undef PT
    free(x); free(xn); free(q); free(k); free(v); free(att); free(gg); free(sc); free(lg);
    return loss;
}

static void test_whole_model_gradcheck(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_model *m = load_stories();
    assert_int_equal(fl_train_model_reserve(m, 64, 0, FL_TRAIN_F32), FL_OK);
    tbatch t;
    const int32_t *s[2] = {seq_a, seq_b};
    int lens[2] = {11, 7};
    make_batch(&t, s, lens, 2);
    double loss;
    int64_t n;
    fl_train_model_zero_grad(m);
    assert_int_equal(fl_train_model_forward(m, &t.b, &loss, &n), FL_OK);
    assert_int_equal(n, 16);
    assert_int_equal(fl_train_model_backward(m, &t.b, 1.0f), FL_OK);
    double *P = malloc((size_t)m->n_params * sizeof(double));
    for (int64_t i = 0; i < m->n_params; i++) P[i] = m->params[i];
    const double l0 = ref_loss(&m->cfg, m, P, &t.b);
    CHECK_NEAR(loss, l0, 1e-3 * fabs(l0));
    /* spot check: 4 random parameters of every tensor (for per-layer tensors, random layers) */
    uint64_t r = 12345;
    int checked = 0;
    for (int p = 0; p < FL_TP_COUNT; p++) {
        for (int rep = 0; rep < 4; rep++) {
            int64_t idx;
            do {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                idx = m->offset[p] + (int64_t)((r >> 17) % (uint64_t)fl_train_param_numel(&m->cfg, (fl_train_param)p));
            } while (p == FL_TP_TOK_EMBD && fabsf(m->grads[idx]) == 0.0f && rep < 2); /* embeddings: mostly unused rows */
            const double h = 1e-4, x0 = P[idx];
            P[idx] = x0 + h;
            const double lp = ref_loss(&m->cfg, m, P, &t.b);
            P[idx] = x0 - h;
            const double lm = ref_loss(&m->cfg, m, P, &t.b);
            P[idx] = x0;
            const double fd = (lp - lm) / (2 * h), g = m->grads[idx];
            if (!(fabs(fd - g) <= 2e-3 * fabs(fd) + 2e-4))
                fail_msg("param %d idx %lld: analytic %.7g vs finite diff %.7g", p, (long long)idx, g, fd);
            checked++;
        }
    }
    assert_int_equal(checked, 4 * FL_TP_COUNT);
    free(P);
    fl_train_model_free(m);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- checkpointing */
static void grads_for(fl_train_model *m, int k, const fl_train_batch *b, float *out) {
    assert_int_equal(fl_train_model_reserve(m, 64, k, FL_TRAIN_F32), FL_OK);
    fl_train_model_zero_grad(m);
    double loss;
    int64_t n;
    assert_int_equal(fl_train_model_forward(m, b, &loss, &n), FL_OK);
    assert_int_equal(fl_train_model_backward(m, b, 1.0f / (float)n), FL_OK);
    memcpy(out, m->grads, (size_t)m->n_params * sizeof(float));
}

static void test_checkpointing_equal(void **state) {
    (void)state;
    NEED_SHARED();
    fl_threads_set(2);
    fl_train_model *m = load_stories();
    tbatch t;
    const int32_t *s[3] = {seq_a, seq_b, seq_c};
    int lens[3] = {11, 7, 5};
    make_batch(&t, s, lens, 3);
    const size_t nb = (size_t)m->n_params * sizeof(float);
    float *g0 = fl_alloc(FL_MEM_MISC, nb, 64), *gk = fl_alloc(FL_MEM_MISC, nb, 64);
    grads_for(m, 0, &t.b, g0);
    size_t act0 = m->acts_bytes;
    double norm = 0;
    for (int64_t i = 0; i < m->n_params; i++) norm += (double)g0[i] * g0[i];
    assert_true(norm > 0);
    const int ks[4] = {1, 2, 3, 5};
    for (int i = 0; i < 4; i++) {
        grads_for(m, ks[i], &t.b, gk);
        if (memcmp(g0, gk, nb)) fail_msg("gradients with checkpointing every %d layers differ", ks[i]);
        if (ks[i] == 1) assert_true(m->acts_bytes < act0);
    }
    /* the plain reference attention of ops_train.c gives the same gradients as flash */
    m->ref_attn = true;
    grads_for(m, 2, &t.b, gk);
    double gmax = 0;
    for (int64_t i = 0; i < m->n_params; i++) gmax = fmax(gmax, fabsf(g0[i]));
    for (int64_t i = 0; i < m->n_params; i++)
        if (!(fabs(g0[i] - gk[i]) <= 1e-5 * gmax)) fail_msg("ref vs flash attention grad %lld: %g vs %g", (long long)i, g0[i], gk[i]);
    fl_free(FL_MEM_MISC, g0, nb);
    fl_free(FL_MEM_MISC, gk, nb);
    fl_train_model_free(m);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- grad accumulation */
static void test_grad_accumulation(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_model *m = load_stories();
    assert_int_equal(fl_train_model_reserve(m, 64, 2, FL_TRAIN_F32), FL_OK);
    const size_t nb = (size_t)m->n_params * sizeof(float);
    float *big = fl_alloc(FL_MEM_MISC, nb, 64);
    tbatch t, t1, t2;
    const int32_t *s[4] = {seq_a, seq_b, seq_c, seq_d};
    int lens[4] = {11, 7, 5, 9};
    make_batch(&t, s, lens, 4);
    make_batch(&t1, s, lens, 2);
    make_batch(&t2, s + 2, lens + 2, 2);
    double loss, l1, l2;
    int64_t n, n1, n2;
    fl_train_model_zero_grad(m);
    assert_int_equal(fl_train_model_forward(m, &t.b, &loss, &n), FL_OK);
    assert_int_equal(fl_train_model_backward(m, &t.b, 1.0f / (float)n), FL_OK);
    memcpy(big, m->grads, nb);
    fl_train_model_zero_grad(m);
    assert_int_equal(fl_train_model_forward(m, &t1.b, &l1, &n1), FL_OK);
    assert_int_equal(fl_train_model_backward(m, &t1.b, 1.0f / (float)n), FL_OK);
    assert_int_equal(fl_train_model_forward(m, &t2.b, &l2, &n2), FL_OK);
    assert_int_equal(fl_train_model_backward(m, &t2.b, 1.0f / (float)n), FL_OK);
    assert_int_equal(n1 + n2, n);
    CHECK_NEAR(l1 + l2, loss, 1e-4 * loss);
    double gmax = 0;
    for (int64_t i = 0; i < m->n_params; i++) gmax = fmax(gmax, fabsf(big[i]));
    for (int64_t i = 0; i < m->n_params; i++)
        if (!(fabs(big[i] - m->grads[i]) <= 1e-5 * gmax)) fail_msg("grad %lld: big %.8g vs accumulated %.8g", (long long)i, big[i], m->grads[i]);
    fl_free(FL_MEM_MISC, big, nb);
    fl_train_model_free(m);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- bucketed gradients */
typedef struct sink_rec {
    float *full;       /* the buckets put back in place */
    int order[64], n;  /* the buckets, in the order they came */
    int fail_at;       /* return an error at this bucket (-2: never) */
} sink_rec;

static fl_status rec_sink(void *ud, const fl_train_model *m, int bucket, const float *stage) {
    sink_rec *r = ud;
    if (r->n < 64) r->order[r->n] = bucket;
    r->n++;
    if (bucket == r->fail_at) return fl_set_error(FL_ERR_IO, "test sink refuses bucket %d", bucket);
    int64_t off, soff, n;
    for (int i = 0; fl_train_grad_bucket_tensor(m, bucket, i, &off, &soff, &n); i++)
        for (int64_t j = 0; j < n; j++) r->full[off + j] += stage[soff + j];
    return FL_OK;
}

/* A backward that hands its gradients over a bucket at a time (ZeRO-2's) gives the whole
 * gradient's bits, each parameter in exactly one bucket, in the order head, layers from the
 * last, token_embd, holding one bucket (FL_MEM_GRAD) instead of the whole. */
static void test_bucketed_grads(void **state) {
    (void)state;
    NEED_SHARED();
    fl_threads_set(2);
    fl_train_model *m = load_stories();
    tbatch t;
    const int32_t *s[3] = {seq_a, seq_b, seq_c};
    int lens[3] = {11, 7, 5};
    make_batch(&t, s, lens, 3);
    const int64_t np = m->n_params;
    const size_t nb = (size_t)np * sizeof(float);
    float *g0 = fl_alloc(FL_MEM_MISC, nb, 64);
    grads_for(m, 0, &t.b, g0);
    sink_rec r = {.full = fl_calloc(FL_MEM_MISC, (size_t)np, sizeof(float)), .fail_at = -2};
    /* every parameter in exactly one bucket */
    int64_t covered = 0, mx = 0;
    const int nl = m->cfg.n_layer;
    for (int b = FL_TRAIN_BUCKET_HEAD; b <= nl; b++) {
        int64_t off, soff, n, end = 0;
        for (int i = 0; fl_train_grad_bucket_tensor(m, b, i, &off, &soff, &n); i++) {
            assert_int_equal(soff, end);
            end += n;
            for (int64_t j = 0; j < n; j++) r.full[off + j] += 1.0f;
        }
        covered += end;
        if (end > mx) mx = end;
    }
    assert_int_equal(covered, np);
    for (int64_t i = 0; i < np; i++) assert_true(r.full[i] == 1.0f);
    assert_int_equal(mx, fl_train_grad_bucket_max(&m->cfg));
    int64_t off, soff, n;
    assert_false(fl_train_grad_bucket_tensor(m, nl + 1, 0, &off, &soff, &n));
    assert_false(fl_train_grad_bucket_tensor(m, 0, 9, &off, &soff, &n));
    memset(r.full, 0, nb);
    /* with checkpointing every 2 layers, whose recompute runs between the buckets */
    fl_train_model_set_grad_sink(m, rec_sink, &r);
    const size_t grad_before = fl_mem_current(FL_MEM_GRAD);
    assert_int_equal(fl_train_model_reserve(m, 64, 2, FL_TRAIN_F32), FL_OK);
    assert_null(m->grads);
    assert_int_equal(grad_before, nb); /* the whole gradient, then one bucket */
    assert_int_equal(fl_mem_current(FL_MEM_GRAD), (size_t)mx * sizeof(float));
    double loss;
    int64_t nt;
    assert_int_equal(fl_train_model_forward(m, &t.b, &loss, &nt), FL_OK);
    assert_int_equal(fl_train_model_backward(m, &t.b, 1.0f / (float)nt), FL_OK);
    assert_int_equal(r.n, nl + 2);
    assert_int_equal(r.order[0], FL_TRAIN_BUCKET_HEAD);
    for (int l = 0; l < nl; l++) assert_int_equal(r.order[1 + l], nl - 1 - l);
    assert_int_equal(r.order[nl + 1], nl);
    if (memcmp(r.full, g0, nb)) fail_msg("bucketed gradients differ from the whole gradient");
    /* a sink's error ends the backward with it */
    r.n = 0;
    r.fail_at = 2;
    assert_int_equal(fl_train_model_forward(m, &t.b, &loss, &nt), FL_OK);
    assert_int_equal(fl_train_model_backward(m, &t.b, 1.0f / (float)nt), FL_ERR_IO);
    assert_int_equal(r.n, 1 + (nl - 2));
    /* buckets without a sink are refused, not dropped */
    fl_train_model_set_grad_sink(m, NULL, NULL);
    assert_int_equal(fl_train_model_forward(m, &t.b, &loss, &nt), FL_OK);
    assert_int_equal(fl_train_model_backward(m, &t.b, 1.0f / (float)nt), FL_ERR_INVALID);
    fl_clear_error();
    fl_free(FL_MEM_MISC, r.full, nb);
    fl_free(FL_MEM_MISC, g0, nb);
    fl_train_model_free(m);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- packing */
static void test_packing_equals_separate(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_model *m = load_stories();
    assert_int_equal(fl_train_model_reserve(m, 64, 0, FL_TRAIN_F32), FL_OK);
    const int32_t *s[3] = {seq_a, seq_b, seq_d};
    int lens[3] = {11, 7, 9};
    tbatch t;
    make_batch(&t, s, lens, 3); /* one packed row, three documents */
    double packed;
    int64_t np;
    assert_int_equal(fl_train_model_forward(m, &t.b, &packed, &np), FL_OK);
    double sep = 0;
    int64_t ns = 0;
    for (int i = 0; i < 3; i++) {
        tbatch one;
        make_batch(&one, s + i, lens + i, 1);
        double l;
        int64_t n;
        assert_int_equal(fl_train_model_forward(m, &one.b, &l, &n), FL_OK);
        sep += l;
        ns += n;
    }
    assert_int_equal(np, ns);
    CHECK_NEAR(packed / np, sep / ns, 1e-5);
    /* without the block-diagonal mask and position restart the loss differs */
    tbatch bad = t;
    int32_t one_cu[2] = {0, (int32_t)t.b.n_tokens};
    for (int i = 0; i < t.b.n_tokens; i++) bad.pos[i] = i;
    bad.b = (fl_train_batch){bad.tok, bad.tgt, bad.pos, one_cu, t.b.n_tokens, 1};
    double lb;
    assert_int_equal(fl_train_model_forward(m, &bad.b, &lb, NULL), FL_OK);
    assert_true(fabs(lb - packed) > 1e-3);
    /* invalid batches are errors */
    int32_t badcu[3] = {0, 30, 27};
    fl_train_batch e = t.b;
    e.cu_seqlens = badcu;
    e.n_seq = 2;
    assert_int_equal(fl_train_model_forward(m, &e, NULL, NULL), FL_ERR_INVALID);
    e = t.b;
    t.tok[3] = 9999;
    assert_int_equal(fl_train_model_forward(m, &e, NULL, NULL), FL_ERR_INVALID);
    fl_train_model_free(m);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- precision + export */
static void test_bf16_and_export(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_model *m = load_stories();
    const int32_t *s[2] = {seq_a, seq_d};
    int lens[2] = {11, 9};
    tbatch t;
    make_batch(&t, s, lens, 2);
    const size_t nb = (size_t)m->n_params * sizeof(float);
    float *g32 = fl_alloc(FL_MEM_MISC, nb, 64);
    double l32, l16;
    int64_t n;
    assert_int_equal(fl_train_model_reserve(m, 64, 0, FL_TRAIN_F32), FL_OK);
    fl_train_model_zero_grad(m);
    assert_int_equal(fl_train_model_forward(m, &t.b, &l32, &n), FL_OK);
    assert_int_equal(fl_train_model_backward(m, &t.b, 1.0f / (float)n), FL_OK);
    memcpy(g32, m->grads, nb);
    assert_int_equal(fl_train_model_reserve(m, 64, 1, FL_TRAIN_BF16), FL_OK);
    assert_true(fl_mem_current(FL_MEM_WEIGHTS) >= 2 * nb); /* master + compute copy */
    fl_train_model_zero_grad(m);
    assert_int_equal(fl_train_model_forward(m, &t.b, &l16, &n), FL_OK);
    assert_int_equal(fl_train_model_backward(m, &t.b, 1.0f / (float)n), FL_OK);
    CHECK_NEAR(l16 / n, l32 / n, 0.02 * l32 / n);
    assert_true(l16 != l32);
    double dot = 0, a = 0, b = 0;
    for (int64_t i = 0; i < m->n_params; i++) {
        dot += (double)g32[i] * m->grads[i];
        a += (double)g32[i] * g32[i];
        b += (double)m->grads[i] * m->grads[i];
    }
    assert_true(dot / sqrt(a * b) > 0.99);
    /* export and reload: same parameters */
    char path[512];
    snprintf(path, sizeof path, "%s/test_train_export.gguf", FL_BINARY_DIR);
    fl_gguf *tok;
    assert_int_equal(fl_gguf_open(FL_SHARED_PATH("models/stories260K.gguf"), &tok), FL_OK);
    assert_int_equal(fl_train_model_save_gguf(m, path, tok), FL_OK);
    fl_gguf_free(tok);
    fl_gguf *g;
    assert_int_equal(fl_gguf_open(path, &g), FL_OK);
    assert_non_null(fl_gguf_get_arr(g, "tokenizer.ggml.tokens"));
    fl_train_model *m2;
    assert_int_equal(fl_train_model_load_gguf(g, &m2), FL_OK);
    fl_gguf_free(g);
    assert_int_equal(m2->n_params, m->n_params);
    assert_memory_equal(m2->params, m->params, nb);
    fl_train_model_free(m2);
    remove(path);
    fl_free(FL_MEM_MISC, g32, nb);
    fl_train_model_free(m);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- inference loads exports */
/* A model trained from scratch (random init here) exported to GGUF loads in the inference
 * model (src/model) and gives the training forward's logits. */
static void test_export_loads_in_inference(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_config c = {.n_vocab = 512, .n_ctx = 64, .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                         .head_dim = 16, .n_ff = 96, .rope_dim = 16, .rope_base = 10000.0f, .rms_eps = 1e-5f};
    fl_train_model *m;
    assert_int_equal(fl_train_model_new(&c, &m), FL_OK);
    fl_train_model_init_random(m, 5);
    for (int64_t i = 0; i < m->n_params; i++) m->params[i] *= 10.0f; /* larger weights: peaky logits */
    assert_int_equal(fl_train_model_reserve(m, 32, 0, FL_TRAIN_F32), FL_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/test_train_scratch.gguf", FL_BINARY_DIR);
    fl_gguf *tok;
    assert_int_equal(fl_gguf_open(FL_SHARED_PATH("models/stories260K.gguf"), &tok), FL_OK);
    assert_int_equal(fl_train_model_save_gguf(m, path, tok), FL_OK);
    fl_gguf_free(tok);
    tbatch t;
    const int32_t *s[1] = {seq_a};
    int lens[1] = {11};
    make_batch(&t, s, lens, 1);
    assert_int_equal(fl_train_model_forward(m, &t.b, NULL, NULL), FL_OK);
    const float *want = fl_train_model_logits(m);
    fl_model_params mp = fl_model_default_params();
    fl_model *im;
    assert_int_equal(fl_model_load(path, &mp, &im), FL_OK);
    const fl_hparams *hp = fl_model_hparams(im);
    assert_int_equal(hp->n_layer, 2);
    fl_kv_contig_params kp = {hp->n_layer, hp->n_head_local, hp->n_head_kv_local, hp->head_dim, 64, 1, 0, FL_TYPE_F32};
    fl_kv_contig *kv;
    assert_int_equal(fl_kv_contig_new(&kp, &kv), FL_OK);
    assert_int_equal(fl_model_workspace_new(im, 32, 32), FL_OK);
    int32_t pos[11], sid[11];
    int8_t lg[11];
    for (int i = 0; i < 11; i++) {
        pos[i] = i;
        sid[i] = 0;
        lg[i] = 1;
    }
    float *logits = fl_alloc(FL_MEM_MISC, 11 * 512 * sizeof(float), 64);
    fl_batch b = {11, seq_a, pos, sid, lg};
    assert_int_equal(fl_model_forward(im, &b, fl_kv_contig_iface(), kv, logits), FL_OK);
    double worst = 0, mx = 0;
    for (int i = 0; i < 11 * 512; i++) {
        worst = fmax(worst, fabs(logits[i] - want[i]));
        mx = fmax(mx, fabs(want[i]));
    }
    if (!(worst <= 1e-4 * fmax(1.0, mx))) fail_msg("inference logits differ from training by %g (max %g)", worst, mx);
    fl_free(FL_MEM_MISC, logits, 11 * 512 * sizeof(float));
    fl_kv_contig_free(kv);
    fl_model_free(im);
    fl_train_model_free(m);
    remove(path);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- planner */
/* The planner's training prediction (src/plan) vs the measured peaks of a real step: weights,
 * gradients, optimizer (fp32 AdamW: 8 bytes per parameter) and activations + temporaries. */
static void test_planner_prediction(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_model *m = load_stories();
    const int64_t ctx = 128, batch = 2;
    int32_t tok[256], tgt[256], pos[256], cu[3] = {0, 128, 256};
    for (int i = 0; i < 256; i++) {
        tok[i] = 3 + (i * 37) % 500;
        pos[i] = i % 128;
    }
    for (int i = 0; i < 256; i++) tgt[i] = (i % 128) == 127 ? -1 : tok[i + 1];
    fl_train_batch b = {tok, tgt, pos, cu, 256, 2};
    fl_model_shape s;
    memset(&s, 0, sizeof s);
    s.n_vocab = m->cfg.n_vocab; s.n_embd = m->cfg.n_embd; s.n_ff = m->cfg.n_ff; s.n_layer = m->cfg.n_layer;
    s.n_head = m->cfg.n_head; s.n_head_kv = m->cfg.n_head_kv; s.head_dim = m->cfg.head_dim; s.n_ctx_train = 512;
    for (int k = 0; k <= 2; k++) {
        assert_int_equal(fl_train_model_reserve(m, ctx * batch, k, FL_TRAIN_F32), FL_OK);
        fl_mem_reset_peaks();
        double l;
        fl_train_model_zero_grad(m);
        assert_int_equal(fl_train_model_forward(m, &b, &l, NULL), FL_OK);
        assert_int_equal(fl_train_model_backward(m, &b, 1.0f), FL_OK);
        const double act = (double)(fl_mem_peak(FL_MEM_ACT) + fl_mem_peak(FL_MEM_SCRATCH));
        fl_plan_input in;
        fl_plan_input_default(&in, &s);
        assert_int_equal(fl_plan_parse_wtype("f32", &in.weights), FL_OK);
        in.weights_from_file = false;
        in.train = true;
        in.n_ctx = ctx;
        in.n_seq = batch;
        in.ckpt_every = k;
        in.n_threads = fl_threads_get();
        fl_plan_result r;
        assert_int_equal(fl_plan_compute(&s, &in, &r), FL_OK);
        const double pact = (double)(r.dev[0].bytes[FL_MEM_ACT] + r.dev[0].bytes[FL_MEM_SCRATCH]);
        if (fabs(pact - act) > 0.10 * act) fail_msg("k=%d: planner act+scratch %.0f vs measured %.0f", k, pact, act);
        const double w = (double)m->n_params * 4;
        CHECK_NEAR((double)r.dev[0].bytes[FL_MEM_WEIGHTS], w, 0.01 * w);
        CHECK_NEAR((double)r.dev[0].bytes[FL_MEM_GRAD], w, 0.01 * w);
        CHECK_NEAR((double)r.dev[0].bytes[FL_MEM_OPTIM], 2 * w, 0.01 * w);
        const double total = 4 * w + act, ptotal = (double)r.dev[0].total;
        if (fabs(ptotal - total) > 0.05 * total) fail_msg("k=%d: planner total %.0f vs measured %.0f", k, ptotal, total);
    }
    fl_train_model_free(m);
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_reference_logits), cmocka_unit_test(test_whole_model_gradcheck),
        cmocka_unit_test(test_checkpointing_equal),      cmocka_unit_test(test_grad_accumulation),
        cmocka_unit_test(test_bucketed_grads),
        cmocka_unit_test(test_packing_equals_separate),  cmocka_unit_test(test_bf16_and_export),
        cmocka_unit_test(test_export_loads_in_inference), cmocka_unit_test(test_planner_prediction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
