/* Tests of the training loop (src/train/trainer.c, data.c) and LoRA/QLoRA (model.c):
 *   - resume from a checkpoint continues bit-identically (AdamW + packing, 8-bit AdamW + buckets)
 *   - grad accumulation K x B/K rows equals one step of B rows
 *   - packing / bucketing batch contents
 *   - LoRA gradients equal the chain rule of the full gradient; LoRA equals its merged model
 *   - QLoRA (NF4 base) trains and exports; fp16 loss scaling skips overflowing steps */
#include "test.h"

#include "core/dtype.h"
#include "core/threads.h"
#include "formats/gguf.h"
#include "plan/plan.h"
#include "train/optim.h"
#include "train/data.h"
#include "train/model.h"
#include "train/trainer.h"

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

/* 12 synthetic documents [BOS .. EOS] of varying length over the 512-token vocabulary */
static void make_data(fl_train_data *d) {
    static int32_t buf[12][40];
    const int32_t *docs[12];
    int64_t lens[12];
    uint64_t r = 99;
    for (int i = 0; i < 12; i++) {
        lens[i] = 5 + (i * 7) % 31;
        buf[i][0] = 1;
        for (int j = 1; j < lens[i] - 1; j++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            buf[i][j] = 3 + (int32_t)((r >> 33) % 500);
        }
        buf[i][lens[i] - 1] = 2;
        docs[i] = buf[i];
    }
    assert_int_equal(fl_train_data_from_ids(docs, lens, 12, 1, 2, d), FL_OK);
}

static fl_trainer_opts small_opts(int optim8, int bucket) {
    fl_trainer_opts o = fl_trainer_default_opts();
    o.ctx = 24;
    o.batch = 2;
    o.grad_accum = 2;
    o.steps = 6;
    o.warmup = 2;
    o.lr = 2e-3f;
    o.ckpt_every = 2;
    o.optim.kind = optim8 ? FL_OPTIMIZER_ADAMW8BIT : FL_OPTIMIZER_ADAMW;
    o.batch_mode = bucket ? FL_BATCH_BUCKET : FL_BATCH_PACK;
    return o;
}

static void run_steps(fl_trainer *t, int n) {
    for (int i = 0; i < n; i++) {
        fl_step_stats s;
        assert_int_equal(fl_trainer_step(t, &s), FL_OK);
        assert_false(s.skipped);
        assert_true(isfinite(s.loss) && s.loss > 0);
    }
}

static fl_train_model *load_model_for(int lora) {
    fl_train_model *m = load_stories();
    if (lora) {
        assert_int_equal(fl_train_model_enable_lora(m, 4, 8.0f, 11), FL_OK);
        assert_int_equal(fl_train_model_quantize_base_nf4(m), FL_OK);
    }
    return m;
}

static void resume_case(int optim8, int bucket, int lora) {
    fl_train_data d;
    make_data(&d);
    const fl_trainer_opts o = small_opts(optim8, bucket);
    char path[512];
    snprintf(path, sizeof path, "%s/test_train_resume.ckpt", FL_BINARY_DIR);
    /* uninterrupted */
    fl_train_model *a = load_model_for(lora);
    fl_trainer *ta;
    assert_int_equal(fl_trainer_new(a, &d, &o, &ta), FL_OK);
    run_steps(ta, 6);
    /* interrupted after 3 steps, everything rebuilt from the files */
    fl_train_model *b = load_model_for(lora);
    fl_trainer *tb;
    assert_int_equal(fl_trainer_new(b, &d, &o, &tb), FL_OK);
    run_steps(tb, 3);
    assert_int_equal(fl_trainer_save(tb, path), FL_OK);
    run_steps(tb, 1); /* progress after the checkpoint is lost by the "kill" */
    fl_trainer_free(tb);
    fl_train_model_free(b);
    b = load_model_for(lora);
    assert_int_equal(fl_trainer_new(b, &d, &o, &tb), FL_OK);
    assert_int_equal(fl_trainer_load(tb, path), FL_OK);
    assert_int_equal(fl_trainer_step_count(tb), 3);
    run_steps(tb, 3);
    float *pa, *pb, *ga, *gb;
    int64_t na, nb;
    fl_train_model_trainable(a, &pa, &ga, &na);
    fl_train_model_trainable(b, &pb, &gb, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(pa, pb, (size_t)na * sizeof(float));
    /* the states too: the next step is still identical */
    run_steps(ta, 1);
    run_steps(tb, 1);
    assert_memory_equal(pa, pb, (size_t)na * sizeof(float));
    /* a checkpoint from another optimizer is refused */
    fl_trainer_opts o2 = o;
    o2.optim.kind = optim8 ? FL_OPTIMIZER_ADAMW : FL_OPTIMIZER_ADAMW8BIT;
    fl_train_model *c = load_model_for(lora);
    fl_trainer *tc;
    assert_int_equal(fl_trainer_new(c, &d, &o2, &tc), FL_OK);
    assert_int_equal(fl_trainer_load(tc, path), FL_ERR_INVALID);
    fl_trainer_free(tc);
    fl_train_model_free(c);
    fl_trainer_free(ta);
    fl_trainer_free(tb);
    fl_train_model_free(a);
    fl_train_model_free(b);
    fl_train_data_free(&d);
    remove(path);
}

static void test_resume_bit_identical(void **state) {
    (void)state;
    NEED_SHARED();
    resume_case(0, 0, 0);
    resume_case(1, 1, 0);
    resume_case(0, 0, 1); /* QLoRA: adapters + their optimizer states */
    fl_test_mem_zero();
}

static void test_trainer_grad_accum(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_data d;
    make_data(&d);
    fl_trainer_opts o1 = small_opts(0, 0), o2 = o1;
    o1.batch = 4;
    o1.grad_accum = 1;
    o2.batch = 2;
    o2.grad_accum = 2;
    o1.clip = o2.clip = 0.0f; /* compare raw updates */
    fl_train_model *a = load_stories(), *b = load_stories();
    fl_trainer *ta, *tb;
    assert_int_equal(fl_trainer_new(a, &d, &o1, &ta), FL_OK);
    assert_int_equal(fl_trainer_new(b, &d, &o2, &tb), FL_OK);
    fl_step_stats sa, sb;
    assert_int_equal(fl_trainer_step(ta, &sa), FL_OK);
    assert_int_equal(fl_trainer_step(tb, &sb), FL_OK);
    assert_int_equal(sa.scored, sb.scored);
    CHECK_NEAR(sa.loss, sb.loss, 1e-6 * sa.loss);
    CHECK_NEAR(sa.grad_norm, sb.grad_norm, 1e-5 * sa.grad_norm);
    /* The same update up to rounding: the f32 GEMM sums a micro-batch's tokens as one block
     * (kernels/sgemm.h), so 4 rows and 2 + 2 round dW differently (measured 1.4e-6 here), against
     * a first step that moves parameters by up to lr / 2 = 1e-3. */
    double mx = 0;
    for (int64_t i = 0; i < a->n_params; i++) mx = fmax(mx, fabs(a->params[i] - b->params[i]));
    assert_true(mx < 1e-5);
    fl_trainer_free(ta);
    fl_trainer_free(tb);
    fl_train_model_free(a);
    fl_train_model_free(b);
    fl_train_data_free(&d);
    fl_test_mem_zero();
}

static void test_batchers(void **state) {
    (void)state;
    fl_train_data d;
    make_data(&d);
    fl_batcher b;
    fl_train_batch x;
    /* pack: rows of 24 tokens, a new sequence at every BOS, positions restart, no target is BOS */
    assert_int_equal(fl_batcher_init(&b, &d, FL_BATCH_PACK, 24, 2, 5), FL_OK);
    for (int it = 0; it < 20; it++) {
        fl_batcher_next(&b, &x);
        assert_int_equal(x.n_tokens, 48);
        assert_int_equal(x.cu_seqlens[0], 0);
        assert_int_equal(x.cu_seqlens[x.n_seq], 48);
        for (int s = 0; s < x.n_seq; s++) {
            const int32_t s0 = x.cu_seqlens[s], s1 = x.cu_seqlens[s + 1];
            assert_true(s1 > s0);
            assert_true(s0 % 24 == 0 || x.tokens[s0] == 1);
            for (int i = s0; i < s1; i++) {
                assert_int_equal(x.pos[i], i - s0);
                if (i > s0) assert_true(x.tokens[i] != 1);
            }
        }
        for (int i = 0; i < 48; i++) {
            assert_true(x.targets[i] != 1);
            if (x.tokens[i] == 2) assert_int_equal(x.targets[i], -1); /* EOS -> next doc's BOS: not scored */
        }
    }
    assert_true(b.epoch >= 1);
    fl_batcher_deinit(&b);
    /* bucket: one document per sequence, each document exactly once per epoch */
    assert_int_equal(fl_batcher_init(&b, &d, FL_BATCH_BUCKET, 24, 3, 5), FL_OK);
    int seen[12] = {0};
    int64_t nb = b.n_batches;
    for (int64_t it = 0; it < nb; it++) {
        fl_batcher_next(&b, &x);
        assert_true(x.n_tokens <= 72 && x.n_seq <= 3);
        for (int s = 0; s < x.n_seq; s++) {
            assert_int_equal(x.tokens[x.cu_seqlens[s]], 1);
            const int32_t len = x.cu_seqlens[s + 1] - x.cu_seqlens[s];
            for (int doc = 0; doc < 12; doc++) {
                int64_t dl = d.doc_off[doc + 1] - d.doc_off[doc] - 1;
                if (dl > 24) dl = 24;
                if (dl == len && !memcmp(x.tokens + x.cu_seqlens[s], d.ids + d.doc_off[doc], (size_t)len * 4)) seen[doc]++;
            }
        }
    }
    for (int doc = 0; doc < 12; doc++) assert_int_equal(seen[doc], 1);
    assert_int_equal(b.epoch, 1);
    fl_batcher_deinit(&b);
    /* split: last documents held out */
    fl_train_data h;
    assert_int_equal(fl_train_data_split(&d, 0.25, &h), FL_OK);
    assert_int_equal(d.n_docs, 9);
    assert_int_equal(h.n_docs, 3);
    assert_int_equal(h.ids[0], 1);
    assert_true(isfinite(fl_train_unigram_loss(&d, &h, 512, 0)));
    fl_train_data_free(&h);
    fl_train_data_free(&d);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- LoRA */
typedef struct tbatch {
    int32_t tok[40], tgt[40], pos[40], cu[3];
    fl_train_batch b;
} tbatch;

static void lora_batch(tbatch *t) {
    static const int32_t s[20] = {1, 403, 407, 261, 378, 300, 270, 290, 311, 33, 1, 50, 51, 52, 499, 2, 7, 9, 9, 420};
    for (int i = 0; i < 20; i++) {
        t->tok[i] = s[i];
        t->tgt[i] = (i == 9 || i == 19) ? -1 : s[i + 1];
        t->pos[i] = i < 10 ? i : i - 10;
    }
    t->cu[0] = 0;
    t->cu[1] = 10;
    t->cu[2] = 20;
    t->b = (fl_train_batch){t->tok, t->tgt, t->pos, t->cu, 20, 2};
}

static void test_lora_chain_rule(void **state) {
    (void)state;
    NEED_SHARED();
    tbatch t;
    lora_batch(&t);
    fl_train_model *m = load_stories();
    assert_int_equal(fl_train_model_enable_lora(m, 4, 8.0f, 3), FL_OK);
    for (int64_t i = 0; i < m->n_lora; i++) /* nonzero B so that every path is exercised */
        if (m->lora[i] == 0.0f) m->lora[i] = 0.05f * sinf((float)i);
    assert_int_equal(fl_train_model_reserve(m, 64, 1, FL_TRAIN_F32), FL_OK);
    assert_int_equal(fl_mem_current(FL_MEM_GRAD), (size_t)m->n_lora * sizeof(float)); /* base frozen */
    double l_lora;
    int64_t n;
    fl_train_model_zero_grad(m);
    assert_int_equal(fl_train_model_forward(m, &t.b, &l_lora, &n), FL_OK);
    assert_int_equal(fl_train_model_backward(m, &t.b, 1.0f), FL_OK);
    /* the merged model W' = W + s B A gives the same loss, and its full gradient dW' gives
     * dB = s dW' A^T, dA = s B^T dW' */
    float *full;
    size_t fb;
    assert_int_equal(fl_train_model_merged(m, &full, &fb), FL_OK);
    fl_train_model *mm;
    assert_int_equal(fl_train_model_new(&m->cfg, &mm), FL_OK);
    memcpy(mm->params, full, fb);
    assert_int_equal(fl_train_model_reserve(mm, 64, 0, FL_TRAIN_F32), FL_OK);
    double l_merged;
    fl_train_model_zero_grad(mm);
    assert_int_equal(fl_train_model_forward(mm, &t.b, &l_merged, NULL), FL_OK);
    assert_int_equal(fl_train_model_backward(mm, &t.b, 1.0f), FL_OK);
    CHECK_NEAR(l_lora, l_merged, 1e-5 * l_merged);
    const float s = 8.0f / 4.0f;
    double worst = 0, gmax = 0;
    for (int p = FL_TP_WQ; p <= FL_TP_FFN_DOWN; p++) {
        if (!fl_train_param_is_matrix((fl_train_param)p)) continue;
        int64_t ne[2];
        fl_train_param_shape(&m->cfg, (fl_train_param)p, ne);
        for (int l = 0; l < m->cfg.n_layer; l++) {
            const float *dW = fl_train_model_tensor(mm, mm->grads, (fl_train_param)p, l);
            const float *A = m->lora + m->lora_off[p][0] + (int64_t)l * 4 * ne[0];
            const float *B = m->lora + m->lora_off[p][1] + (int64_t)l * 4 * ne[1];
            const float *dA = m->grads + m->lora_off[p][0] + (int64_t)l * 4 * ne[0];
            const float *dB = m->grads + m->lora_off[p][1] + (int64_t)l * 4 * ne[1];
            for (int j = 0; j < 4; j++) {
                for (int64_t o = 0; o < ne[1]; o++) { /* dB[o][j] = s sum_i dW[o][i] A[j][i] */
                    double e = 0;
                    for (int64_t i = 0; i < ne[0]; i++) e += (double)dW[o * ne[0] + i] * A[j * ne[0] + i];
                    e *= s;
                    worst = fmax(worst, fabs(e - dB[o * 4 + j]));
                    gmax = fmax(gmax, fabs(e));
                }
                for (int64_t i = 0; i < ne[0]; i++) { /* dA[j][i] = s sum_o B[o][j] dW[o][i] */
                    double e = 0;
                    for (int64_t o = 0; o < ne[1]; o++) e += (double)B[o * 4 + j] * dW[o * ne[0] + i];
                    e *= s;
                    worst = fmax(worst, fabs(e - dA[j * ne[0] + i]));
                    gmax = fmax(gmax, fabs(e));
                }
            }
        }
    }
    if (!(worst <= 1e-4 * gmax)) fail_msg("LoRA grads differ from the chain rule by %g (max %g)", worst, gmax);
    assert_true(gmax > 0);
    fl_free(FL_MEM_MISC, full, fb);
    fl_train_model_free(mm);
    fl_train_model_free(m);
    fl_test_mem_zero();
}

static void test_qlora_nf4_trains(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_data d;
    make_data(&d);
    fl_train_model *m = load_stories();
    const size_t w32 = fl_mem_current(FL_MEM_WEIGHTS);
    tbatch t;
    lora_batch(&t);
    assert_int_equal(fl_train_model_reserve(m, 64, 0, FL_TRAIN_F32), FL_OK);
    double l32;
    assert_int_equal(fl_train_model_forward(m, &t.b, &l32, NULL), FL_OK);
    assert_int_equal(fl_train_model_quantize_base_nf4(m), FL_ERR_INVALID); /* needs LoRA (and no reserve) */
    fl_train_model_free(m);
    m = load_stories();
    assert_int_equal(fl_train_model_enable_lora(m, 4, 8.0f, 3), FL_OK);
    assert_int_equal(fl_train_model_quantize_base_nf4(m), FL_OK);
    /* quantized matrices at ~4.1 bits per weight; the whole model shrinks */
    assert_true(m->frozen_bytes[FL_TP_WQ] * 6 < (size_t)fl_train_param_numel(&m->cfg, FL_TP_WQ) * sizeof(float));
    assert_true(fl_mem_current(FL_MEM_WEIGHTS) < w32 * 2 / 3);
    assert_int_equal(m->frozen_type[FL_TP_WQ], FL_TYPE_NF4);
    assert_int_equal(m->frozen_type[FL_TP_FFN_DOWN], FL_TYPE_F32); /* 172-wide rows stay f32 */
    assert_int_equal(fl_train_model_reserve(m, 64, 1, FL_TRAIN_F32), FL_OK);
    double lq;
    assert_int_equal(fl_train_model_forward(m, &t.b, &lq, NULL), FL_OK);
    CHECK_NEAR(lq, l32, 0.05 * l32); /* NF4 base close to the f32 one */
    fl_train_model_free(m);
    /* a few QLoRA steps on the same batch lower its loss */
    m = load_stories();
    assert_int_equal(fl_train_model_enable_lora(m, 4, 8.0f, 3), FL_OK);
    assert_int_equal(fl_train_model_quantize_base_nf4(m), FL_OK);
    fl_trainer_opts o = small_opts(0, 0);
    o.steps = 8;
    o.lr = 1e-2f;
    o.warmup = 0;
    fl_trainer *tr;
    assert_int_equal(fl_trainer_new(m, &d, &o, &tr), FL_OK);
    double first = 0, last = 0;
    for (int i = 0; i < 8; i++) {
        fl_step_stats s;
        assert_int_equal(fl_trainer_step(tr, &s), FL_OK);
        if (i == 0) first = s.loss;
        last = s.loss;
    }
    double ev;
    assert_int_equal(fl_train_eval(m, &d, 24, 2, 0, &ev, NULL), FL_OK);
    assert_true(ev < first);
    (void)last;
    /* export merges the adapters into a plain f32 GGUF; adapters saved separately */
    char path[512], lpath[512];
    snprintf(path, sizeof path, "%s/test_train_qlora.gguf", FL_BINARY_DIR);
    snprintf(lpath, sizeof lpath, "%s/test_train_qlora.lora.gguf", FL_BINARY_DIR);
    assert_int_equal(fl_train_model_save_gguf(m, path, NULL), FL_OK);
    assert_int_equal(fl_train_model_save_lora(m, lpath), FL_OK);
    fl_gguf *g;
    assert_int_equal(fl_gguf_open(path, &g), FL_OK);
    fl_train_model *m2;
    assert_int_equal(fl_train_model_load_gguf(g, &m2), FL_OK);
    fl_gguf_free(g);
    assert_int_equal(fl_train_model_reserve(m2, 64, 0, FL_TRAIN_F32), FL_OK);
    double l2, l1;
    assert_int_equal(fl_train_model_forward(m2, &t.b, &l2, NULL), FL_OK);
    assert_int_equal(fl_train_model_forward(m, &t.b, &l1, NULL), FL_OK);
    CHECK_NEAR(l2, l1, 1e-4 * l1);
    fl_gguf *ga;
    assert_int_equal(fl_gguf_open(lpath, &ga), FL_OK);
    assert_non_null(fl_gguf_find_tensor(ga, "lora.attn_q.a"));
    fl_gguf_free(ga);
    remove(path);
    remove(lpath);
    fl_train_model_free(m2);
    fl_trainer_free(tr);
    fl_train_model_free(m);
    fl_train_data_free(&d);
    fl_test_mem_zero();
}

/* QLoRA from a GGUF: fl_train_model_load_gguf_nf4 freezes each base matrix as it is read
 * (the same bytes as loading in f32 and quantizing), and its WEIGHTS never reach the f32 model's
 * size; the export merges one matrix at a time (MISC never holds the f32 model) into the same
 * file as merging a whole f32 copy. */
static void test_qlora_load_and_export_stream(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_model *ref = load_stories();
    const size_t w32 = (size_t)ref->n_full * sizeof(float);
    assert_int_equal(fl_train_model_enable_lora(ref, 4, 8.0f, 3), FL_OK);
    assert_int_equal(fl_train_model_quantize_base_nf4(ref), FL_OK);
    assert_int_equal(fl_train_model_quantize_base_nf4(ref), FL_ERR_INVALID); /* (already frozen) */
    fl_gguf *g;
    assert_int_equal(fl_gguf_open(FL_SHARED_PATH("models/stories260K.gguf"), &g), FL_OK);
    fl_mem_reset_peaks();
    const size_t w0 = fl_mem_current(FL_MEM_WEIGHTS);
    fl_train_model *m;
    assert_int_equal(fl_train_model_load_gguf_nf4(g, &m), FL_OK);
    const size_t wpeak = fl_mem_peak(FL_MEM_WEIGHTS) - w0;
    assert_true(wpeak < w32 / 2); /* stories260K's matrices are most of it */
    assert_int_equal(wpeak, fl_mem_current(FL_MEM_WEIGHTS) - w0); /* nothing transient in WEIGHTS */
    assert_int_equal(m->n_params, ref->n_params);
    assert_int_equal(m->n_full, ref->n_full);
    assert_memory_equal(m->params, ref->params, (size_t)m->n_params * sizeof(float));
    for (int p = 0; p < FL_TP_COUNT; p++) {
        assert_int_equal(m->frozen_bytes[p], ref->frozen_bytes[p]);
        assert_int_equal(m->frozen_type[p], ref->frozen_type[p]);
        if (m->frozen[p]) assert_memory_equal(m->frozen[p], ref->frozen[p], m->frozen_bytes[p]);
    }
    assert_int_equal(fl_train_model_read_params(m, g), FL_ERR_INVALID); /* (a frozen base is read at load only) */
    fl_train_model_free(ref);
    /* adapters with B != 0, then the export against the whole merged copy */
    assert_int_equal(fl_train_model_enable_lora(m, 4, 8.0f, 3), FL_OK);
    for (int64_t i = 0; i < m->n_lora; i++) m->lora[i] += 0.01f * (float)((i * 7919) % 13 - 6);
    float *full;
    size_t full_bytes;
    assert_int_equal(fl_train_model_merged(m, &full, &full_bytes), FL_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/test_train_qlora_stream.gguf", FL_BINARY_DIR);
    fl_mem_reset_peaks();
    const size_t misc0 = fl_mem_current(FL_MEM_MISC);
    assert_int_equal(fl_train_model_save_gguf(m, path, g), FL_OK);
    assert_true(fl_mem_peak(FL_MEM_MISC) - misc0 < w32 / 4); /* one matrix at a time */
    fl_gguf *ge;
    assert_int_equal(fl_gguf_open(path, &ge), FL_OK);
    fl_train_model *m2;
    assert_int_equal(fl_train_model_load_gguf(ge, &m2), FL_OK);
    fl_gguf_free(ge);
    assert_int_equal((size_t)m2->n_params * sizeof(float), full_bytes);
    assert_memory_equal(m2->params, full, full_bytes);
    remove(path);
    fl_free(FL_MEM_MISC, full, full_bytes);
    fl_train_model_free(m2);
    fl_train_model_free(m);
    fl_gguf_free(g);
    fl_test_mem_zero();
}

/* The training plan of shape s (2 x 64 tokens, checkpoints every k, weights wt, LoRA rank
 * lora on an f32 or NF4 base) */
static fl_plan_input train_plan_input(const fl_model_shape *s, const char *wt, int k) {
    fl_plan_input in;
    fl_plan_input_default(&in, s);
    assert_int_equal(fl_plan_parse_wtype(wt, &in.weights), FL_OK);
    in.weights_from_file = false;
    in.train = true;
    in.n_ctx = 64;
    in.n_seq = 2;
    in.train_seqs = 2; /* the batch below: two sequences, not the bound of one per token */
    in.ckpt_every = k;
    return in;
}

/* ... against what the trainer m (reserved for 2 x 64 tokens, its optimizer o made) allocates
 * through a step (forward, backward, optimizer update of 2 sequences of 64 tokens): every
 * category to the byte, at its peak: weights, grads, optimizer states, the saved activations
 * (ACT), the backward's temporaries and the attention kernels' workspace (SCRATCH), the model
 * and optimizer objects (MISC: the batch here is on the stack); *grad: the planned grads */
static void check_train_plan(fl_train_model *m, fl_optim *o, const fl_model_shape *s, const char *wt, int k, int lora,
                             int nf4, uint64_t *grad) {
    fl_plan_input in = train_plan_input(s, wt, k);
    in.lora_rank = lora;
    in.lora_nf4 = nf4;
    in.n_threads = fl_threads_get(); /* the attention kernels' tiles are per thread */
    fl_plan_result r;
    if (fl_plan_compute(s, &in, &r) != FL_OK) fail_msg("plan: %s", fl_last_error());
    int32_t tok[128], tgt[128], pos[128], cu[3] = {0, 64, 128};
    for (int i = 0; i < 128; i++) {
        tok[i] = (i * 37 + 11) % (int32_t)s->n_vocab;
        pos[i] = i % 64;
    }
    for (int i = 0; i < 128; i++) tgt[i] = i % 64 == 63 ? -1 : tok[i + 1];
    const fl_train_batch b = {tok, tgt, pos, cu, 128, 2};
    fl_mem_reset_peaks();
    double loss;
    int64_t n;
    fl_train_model_zero_grad(m);
    assert_int_equal(fl_train_model_forward(m, &b, &loss, &n), FL_OK);
    assert_int_equal(fl_train_model_backward(m, &b, 1.0f / (float)n), FL_OK);
    float *tp, *tg;
    int64_t n_train;
    fl_train_model_trainable(m, &tp, &tg, &n_train);
    fl_optim_step(o, tp, tg, 1e-4f);
    const uint64_t *pb = r.dev[0].bytes;
    static const fl_mem_cat cats[] = {FL_MEM_WEIGHTS, FL_MEM_GRAD, FL_MEM_OPTIM, FL_MEM_ACT, FL_MEM_SCRATCH, FL_MEM_MISC};
    for (size_t c = 0; c < sizeof cats / sizeof cats[0]; c++)
        if (pb[cats[c]] != fl_mem_peak(cats[c]))
            fail_msg("%s k %d lora %d nf4 %d: %s planned %llu, peak %zu", wt, k, lora, nf4, fl_mem_cat_name(cats[c]),
                     (unsigned long long)pb[cats[c]], fl_mem_peak(cats[c]));
    *grad = pb[FL_MEM_GRAD];
}

/* `fitllm plan --train --lora-rank R [--weights nf4]` against the trainer's allocations for the
 * same shape, every category to the byte (see check_train_plan). */
static void test_train_plan_matches_trainer(void **state) {
    (void)state;
    const fl_train_config c = {.n_vocab = 512, .n_ctx = 64, .n_embd = 128, .n_layer = 3, .n_head = 4, .n_head_kv = 2,
                               .head_dim = 32, .n_ff = 320, .rope_dim = 32, .rope_base = 10000.0f, .rms_eps = 1e-5f};
    fl_model_shape s;
    memset(&s, 0, sizeof s);
    s.n_vocab = c.n_vocab, s.n_embd = c.n_embd, s.n_ff = c.n_ff, s.n_layer = c.n_layer, s.n_head = c.n_head;
    s.n_head_kv = c.n_head_kv, s.head_dim = c.head_dim, s.n_ctx_train = c.n_ctx;
    for (int nf4 = 0; nf4 < 2; nf4++)
        for (int k = 0; k < 2; k++) {
            fl_train_model *m;
            assert_int_equal(fl_train_model_new(&c, &m), FL_OK);
            fl_train_model_init_random(m, 1);
            assert_int_equal(fl_train_model_enable_lora(m, 4, 8.0f, 1), FL_OK);
            if (nf4) assert_int_equal(fl_train_model_quantize_base_nf4(m), FL_OK);
            assert_int_equal(fl_train_model_reserve(m, 2 * 64, k, FL_TRAIN_F32), FL_OK);
            fl_optimizer_config oc = fl_optim_default();
            fl_optim *o;
            assert_int_equal(fl_optim_new(&oc, m->n_lora, NULL, -1, &o), FL_OK);
            uint64_t lora_grad, full_grad;
            check_train_plan(m, o, &s, "f32", k, 4, nf4, &lora_grad);
            /* the same plan without LoRA is the full training's: more grads and optimizer states */
            fl_plan_input in = train_plan_input(&s, "f32", k);
            fl_plan_result full;
            assert_int_equal(fl_plan_compute(&s, &in, &full), FL_OK);
            full_grad = full.dev[0].bytes[FL_MEM_GRAD];
            assert_true(full_grad > 20 * lora_grad);
            fl_optim_free(o);
            fl_train_model_free(m);
        }
    /* full training, fp32 and mixed precision (an f32 copy rounded to bf16 values): the plan
     * of --weights f32 / bf16 against the trainer's allocations */
    for (int mixed = 0; mixed < 2; mixed++) {
        fl_threads_set(mixed ? 1 : 3); /* (3 threads: the per-thread workspace counted as many times) */
        fl_train_model *m;
        assert_int_equal(fl_train_model_new(&c, &m), FL_OK);
        fl_train_model_init_random(m, 1);
        assert_int_equal(fl_train_model_reserve(m, 2 * 64, 1, mixed ? FL_TRAIN_BF16 : FL_TRAIN_F32), FL_OK);
        fl_optimizer_config oc = fl_optim_default();
        fl_optim *o;
        assert_int_equal(fl_optim_new(&oc, m->n_params, NULL, -1, &o), FL_OK);
        uint64_t grad;
        check_train_plan(m, o, &s, mixed ? "bf16" : "f32", 1, 0, 0, &grad);
        fl_optim_free(o);
        fl_train_model_free(m);
    }
    fl_threads_set(1);
    fl_test_mem_zero();
}

static void test_fp16_loss_scaling(void **state) {
    (void)state;
    NEED_SHARED();
    fl_train_data d;
    make_data(&d);
    fl_train_model *m = load_stories();
    fl_trainer_opts o = small_opts(0, 0);
    o.precision = FL_TRAIN_FP16;
    o.loss_scale_init = 1e9f; /* certain overflow in fp16 */
    fl_trainer *t;
    assert_int_equal(fl_trainer_new(m, &d, &o, &t), FL_OK);
    const size_t nb = (size_t)m->n_params * sizeof(float);
    float *before = fl_alloc(FL_MEM_MISC, nb, 64);
    memcpy(before, m->params, nb);
    fl_step_stats s;
    assert_int_equal(fl_trainer_step(t, &s), FL_OK);
    assert_true(s.skipped);
    assert_memory_equal(before, m->params, nb); /* skipped: no update */
    int skipped = 1, done = 0;
    float scale = s.loss_scale;
    bool prev_skipped = true;
    for (int i = 0; i < 40 && done < 2; i++) { /* the scale halves until steps go through */
        assert_int_equal(fl_trainer_step(t, &s), FL_OK);
        if (prev_skipped) CHECK_NEAR(s.loss_scale, scale * 0.5f, 1e-6 * scale);
        if (s.skipped) skipped++;
        else done++;
        prev_skipped = s.skipped;
        scale = s.loss_scale;
    }
    assert_int_equal(done, 2);
    assert_true(skipped > 5);
    assert_true(memcmp(before, m->params, nb) != 0);
    if (!(isfinite(s.loss) && s.loss < 30)) fail_msg("loss %g scale %g skipped %d", s.loss, (double)s.loss_scale, skipped);
    fl_free(FL_MEM_MISC, before, nb);
    fl_trainer_free(t);
    fl_train_model_free(m);
    fl_train_data_free(&d);
    fl_test_mem_zero();
}

int main(void) {
    fl_threads_set(1); /* tiny shapes: threads would only spin (determinism across threads is tested in test_train_model) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batchers),          cmocka_unit_test(test_resume_bit_identical),
        cmocka_unit_test(test_trainer_grad_accum), cmocka_unit_test(test_lora_chain_rule),
        cmocka_unit_test(test_qlora_nf4_trains),  cmocka_unit_test(test_qlora_load_and_export_stream),
        cmocka_unit_test(test_train_plan_matches_trainer), cmocka_unit_test(test_fp16_loss_scaling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
