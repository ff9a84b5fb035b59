/* The batched llama forward and its workspace (see llama.h for the buffers and the contract). */
#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/llama_impl.h"

#include <math.h>
#include <string.h>

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t fl_model_workspace_bytes(const fl_hparams *hp, int32_t max_tokens, int32_t max_logit_rows) {
    const size_t T = (size_t)(max_tokens > 0 ? max_tokens : 0), R = (size_t)(max_logit_rows > 0 ? max_logit_rows : 0);
    const size_t f = sizeof(float), E = (size_t)hp->n_embd, D = (size_t)hp->head_dim;
    const size_t HQ = (size_t)hp->n_head_local * D, HKV = (size_t)hp->n_head_kv_local * D;
    const size_t F = (size_t)hp->n_ff_local;
    return round64(T * E * f) * 3  /* x, xn, out */
           + round64(T * HQ * f) * 2 /* q, att */
           + round64(T * HKV * f) * 2 /* k, v */
           + round64(T * F * f) * 2  /* gate, up */
           + round64(R * E * f);     /* xl */
}

fl_status fl_model_workspace_new(fl_model *m, int32_t max_tokens, int32_t max_logit_rows) {
    if (max_tokens < 1 || max_logit_rows < 1 || max_logit_rows > max_tokens)
        return fl_set_error(FL_ERR_INVALID, "%s: need 1 <= max_logit_rows (%d) <= max_tokens (%d)", __func__,
                            max_logit_rows, max_tokens);
    fl_model_workspace_free(m);
    const fl_hparams *hp = &m->hp;
    fl_model_ws *w = &m->ws;
    const size_t lora_bytes = fl_lora_workspace_bytes(m->lora_rank_max, m->lora_n_max, max_tokens);
    w->bytes = fl_model_workspace_bytes(hp, max_tokens, max_logit_rows) + lora_bytes;
    w->block = fl_alloc(FL_MEM_ACT, w->bytes, 64);
    if (!w->block) return fl_last_error()[0] ? FL_ERR_BUDGET : FL_ERR_NOMEM;
    w->max_tokens = max_tokens;
    w->max_logit_rows = max_logit_rows;
    const size_t T = (size_t)max_tokens, f = sizeof(float), E = (size_t)hp->n_embd, D = (size_t)hp->head_dim;
    const size_t HQ = (size_t)hp->n_head_local * D, HKV = (size_t)hp->n_head_kv_local * D, F = (size_t)hp->n_ff_local;
    unsigned char *p = w->block;
#define CARVE(field, n) (w->field = (float *)p, p += round64((n) * f))
    CARVE(x, T * E);
    CARVE(xn, T * E);
    CARVE(out, T * E);
    CARVE(q, T * HQ);
    CARVE(att, T * HQ);
    CARVE(k, T * HKV);
    CARVE(v, T * HKV);
    CARVE(gate, T * F);
    CARVE(up, T * F);
    CARVE(xl, (size_t)max_logit_rows * E);
    if (lora_bytes) {
        CARVE(lora_xa, T * (size_t)m->lora_rank_max);
        CARVE(lora_xg, T * (size_t)m->lora_rank_max);
        CARVE(lora_out, T * (size_t)m->lora_n_max);
    }
#undef CARVE
    FL_ASSERT((size_t)(p - w->block) == w->bytes);
    m->have_ws = true;
    return FL_OK;
}

void fl_model_workspace_free(fl_model *m) {
    if (!m->have_ws) return;
    fl_free(FL_MEM_ACT, m->ws.block, m->ws.bytes);
    memset(&m->ws, 0, sizeof m->ws);
    m->have_ws = false;
}

/* ---- row-parallel helpers: each thread takes a contiguous range of tokens ---- */

typedef enum { ROW_RMSNORM, ROW_ROPE, ROW_SWIGLU, ROW_ADD } row_op;

typedef struct row_task {
    row_op op;
    float *out;
    const float *a, *b; /* inputs (rmsnorm: inp, weight; swiglu: gate, up; add: a, b) */
    int64_t n_rows, C;
    float eps;
    const int32_t *pos;             /* rope */
    int64_t n_head, head_dim, rope_dim;
    float freq_base, freq_scale;
} row_task;

static void row_fn(void *p, int ith, int nth) {
    const row_task *t = p;
    int64_t lo, hi;
    fl_split_range(t->n_rows, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    const int64_t n = hi - lo;
    switch (t->op) {
    case ROW_RMSNORM: fl_rmsnorm_forward(t->out + lo * t->C, t->a + lo * t->C, t->b, n, t->C, t->eps); break;
    case ROW_ROPE:
        fl_rope_forward(t->out + lo * t->C, t->a + lo * t->C, t->pos + lo, n, t->n_head, t->head_dim, t->rope_dim,
                        t->freq_base, t->freq_scale);
        break;
    case ROW_SWIGLU: fl_swiglu_forward(t->out + lo * t->C, t->a + lo * t->C, t->b + lo * t->C, n * t->C); break;
    case ROW_ADD: fl_add_forward(t->out + lo * t->C, t->a + lo * t->C, t->b + lo * t->C, n * t->C); break;
    }
}

/* Small steps run on one thread: waking the team costs more than the work. */
static void run_rows(row_task *t) {
    if (t->n_rows * t->C < 4096) row_fn(t, 0, 1);
    else fl_parallel(row_fn, t);
}

static void rmsnorm_rows(float *out, const float *inp, const float *w, int64_t N, int64_t C, float eps) {
    row_task t = {.op = ROW_RMSNORM, .out = out, .a = inp, .b = w, .n_rows = N, .C = C, .eps = eps};
    run_rows(&t);
}

static void rope_rows(float *x, const int32_t *pos, int64_t N, int64_t n_head, const fl_hparams *hp) {
    row_task t = {.op = ROW_ROPE, .out = x, .a = x, .n_rows = N, .C = n_head * hp->head_dim, .pos = pos,
                  .n_head = n_head, .head_dim = hp->head_dim, .rope_dim = hp->rope_dim,
                  .freq_base = hp->rope_freq_base, .freq_scale = hp->rope_freq_scale};
    run_rows(&t);
}

static void binary_rows(row_op op, float *out, const float *a, const float *b, int64_t N, int64_t C) {
    row_task t = {.op = op, .out = out, .a = a, .b = b, .n_rows = N, .C = C};
    run_rows(&t);
}

/* out (n, N) = xs (n, r) B^T for an adapter's B (N rows of r): F32 B and 32 rows or more through
 * the small-K kernel (ops.h mm_smallk; the matmul's row dots reduce a vector per output, dearer
 * than the r products), the threads taking blocks of 16 rows; else fl_matmul.  TinyLlama Q4_0, a
 * rank-16 F32 adapter on every matrix, `fitllm run -f` of 412 tokens, two alternated pairs:
 * prefill 319-326 -> 378-398 tok/s; for one token the kernel ran 0.78x (its gathers per block of
 * 16 rows outweigh one row's products), for 4 0.88x, so fewer rows keep fl_matmul. */
typedef struct smallk_task {
    const float *x, *W;
    float *y;
    int64_t M, N, K;
} smallk_task;

static void smallk_fn(void *p, int ith, int nth) {
    const smallk_task *t = p;
    int64_t lo, hi;
    fl_split_range((t->N + 15) / 16, ith, nth, &lo, &hi);
    const int64_t c0 = lo * 16, c1 = hi * 16 < t->N ? hi * 16 : t->N;
    if (c0 < c1) fl_ops_kernels_get()->mm_smallk(t->y + c0, t->N, t->x, t->M, t->W + c0 * t->K, c1 - c0, t->K);
}

static void lora_b(const fl_lora_slot *s, const float *xs, int64_t n, float *out) {
    const int64_t r = s->b.ne[0], N = s->b.ne[1];
    if (s->b.type != FL_TYPE_F32 || r > 64 || n < 32) { /* (a few rows: the kernel's gathers cost more than it saves) */
        fl_matmul(&s->b, xs, out, n);
        return;
    }
    smallk_task t = {xs, s->b.data, out, n, N, r};
    if (n * N * r < 65536) smallk_fn(&t, 0, 1); /* (waking the team costs more) */
    else fl_parallel(smallk_fn, &t);
}

/* Token t's weight for adapter a (1-based): its mix's scale for a, 1 where it names a, 0 where it
 * does not apply a. */
static inline float tok_weight(const fl_model *m, const fl_batch *b, int64_t t, int32_t a) {
    if (b->lora_mix) return b->lora[t] ? b->lora_mix[(size_t)(b->lora[t] - 1) * (size_t)m->params.n_loras + (size_t)(a - 1)] : 0.0f;
    return (b->lora ? b->lora[t] : m->params.lora_default) == a ? 1.0f : 0.0f;
}

/* The scale token t of b applies adapter a with, slot s of it (alpha / r on a mix's scale; the
 * loaded scale where it names a); 0: not applied. */
static inline float tok_scale(const fl_model *m, const fl_batch *b, int64_t t, int32_t a, const fl_lora_slot *s) {
    return tok_weight(m, b, t, a) * (b->lora_mix ? s->unit : s->scale);
}

/* y (T, N) += sum over adapters a of s_a(t) B_a (A_a x) for matrix k of layer il, each token
 * through its own adapter or mix of adapters (fl_batch.lora, .lora_mix; model/lora.h); x is
 * (T, K).  Per adapter of the step, two matmuls however its tokens interleave with others': x A^T
 * over the span of its tokens (r x K per token: cheap, and no gathered copy of x), then its rows,
 * each scaled by its token's scale (and gathered where others' sit between), through B, added
 * back to theirs. */
static void lora_add(fl_model *m, const fl_batch *b, int32_t il, int k, const float *x, int64_t K, float *y, int64_t N) {
    if (!m->loras) return;
    const int64_t T = b->n_tokens;
    fl_model_ws *w = &m->ws;
    for (int32_t a = 1; a <= m->params.n_loras; a++) {
        /* the slot is read only when a token applies it (slots no token applies may be changing:
         * fl_model_lora_put) */
        int64_t u = 0;
        while (u < T && tok_weight(m, b, u, a) == 0.0f) u++;
        if (u == T || !m->loras[a - 1]) continue;
        const fl_lora_slot *s = fl_lora_get(m->loras[a - 1], il, k);
        if (!s) continue;
        int64_t t0 = 0, t1 = T - 1, n = 0;
        while (t0 < T && tok_scale(m, b, t0, a, s) == 0.0f) t0++;
        if (t0 == T) continue; /* no token of this step applies it */
        while (tok_scale(m, b, t1, a, s) == 0.0f) t1--;
        for (int64_t t = t0; t <= t1; t++) n += tok_scale(m, b, t, a, s) != 0.0f;
        const int64_t r = s->a.ne[1], span = t1 - t0 + 1;
        fl_matmul(&s->a, x + t0 * K, w->lora_xa, span); /* (span, r) */
        if (n == span) { /* one run: in place */
            for (int64_t t = t0; t <= t1; t++) {
                const float sc = tok_scale(m, b, t, a, s);
                float *row = w->lora_xa + (t - t0) * r;
                for (int64_t c = 0; c < r; c++) row[c] *= sc;
            }
            lora_b(s, w->lora_xa, n, w->lora_out); /* (n, N) */
            binary_rows(ROW_ADD, y + t0 * N, y + t0 * N, w->lora_out, n, N);
            continue;
        }
        for (int64_t t = t0, j = 0; t <= t1; t++) {
            const float sc = tok_scale(m, b, t, a, s);
            if (sc == 0.0f) continue;
            for (int64_t c = 0; c < r; c++) w->lora_xg[j * r + c] = sc * w->lora_xa[(t - t0) * r + c];
            j++;
        }
        lora_b(s, w->lora_xg, n, w->lora_out); /* (n, N) */
        for (int64_t t = t0, j = 0; t <= t1; t++)
            if (tok_scale(m, b, t, a, s) != 0.0f) {
                float *yt = y + t * N;
                const float *o = w->lora_out + j++ * N;
                for (int64_t c = 0; c < N; c++) yt[c] += o[c];
            }
    }
}

fl_status fl_model_forward(fl_model *m, const fl_batch *b, const fl_kv_iface *kv, void *kv_ctx, float *logits_out) {
    const fl_hparams *hp = &m->hp;
    fl_status st = fl_batch_validate(b, hp->n_vocab);
    if (st) return st;
    const int32_t n_logits = fl_batch_n_logits(b);
    if (!m->have_ws)
        return fl_set_error(FL_ERR_INVALID, "%s: no workspace (call fl_model_workspace_new first)", __func__);
    fl_model_ws *w = &m->ws;
    if (b->n_tokens > w->max_tokens || n_logits > w->max_logit_rows)
        return fl_set_error(FL_ERR_INVALID, "%s: batch of %d tokens / %d logit rows exceeds the workspace (%d / %d)",
                            __func__, b->n_tokens, n_logits, w->max_tokens, w->max_logit_rows);
    if (b->lora_mix && (!b->lora || b->n_lora_mix < 1))
        return fl_set_error(FL_ERR_INVALID, "%s: %d adapter mixes (at least one, with each token's mix in lora)", __func__, b->n_lora_mix);
    const int32_t lora_hi = b->lora_mix ? b->n_lora_mix : m->params.n_loras;
    for (int32_t i = 0; b->lora && i < b->n_tokens; i++)
        if (b->lora[i] < 0 || b->lora[i] > lora_hi)
            return fl_set_error(FL_ERR_INVALID, "%s: token %d asks for LoRA %s %d; the %s has %d", __func__, i,
                                b->lora_mix ? "mix" : "adapter", b->lora[i], b->lora_mix ? "batch" : "model", lora_hi);
    for (int64_t i = 0; b->lora_mix && i < (int64_t)b->n_lora_mix * m->params.n_loras; i++)
        if (!isfinite(b->lora_mix[i]))
            return fl_set_error(FL_ERR_INVALID, "%s: adapter mix %lld: scale %g", __func__, (long long)(i / m->params.n_loras + 1),
                                (double)b->lora_mix[i]);
    if ((st = kv->prepare(kv_ctx, b))) return st;

    const int64_t T = b->n_tokens, E = hp->n_embd, F = hp->n_ff_local, D = hp->head_dim;
    const int64_t n_head = hp->n_head_local, n_head_kv = hp->n_head_kv_local;
    const fl_allreduce_fn allreduce = m->params.allreduce;

    /* x = token_embd[tokens]                                   (T, E) */
    if (m->params.embed) m->params.embed(m->params.embed_ud, b->tokens, T, w->x); /* [dist/tp] vocab-parallel */
    else fl_embed_forward(w->x, &m->tok_embd, b->tokens, T);

    for (int32_t il = 0; il < hp->n_layer; il++) {
        const fl_layer *L = &m->layers[il];
        /* attention block */
        rmsnorm_rows(w->xn, w->x, L->attn_norm.data, T, E, hp->rms_eps); /* xn (T, E) */
        {   /* q (T, n_head, D), k and v (T, n_head_kv, D): one call where they can share it */
            const fl_tensor *wqkv[3] = {&L->wq, &L->wk, &L->wv};
            float *qkv[3] = {w->q, w->k, w->v};
            fl_matmul_n(3, wqkv, qkv, w->xn, T);
            lora_add(m, b, il, FL_LORA_Q, w->xn, E, w->q, n_head * D);
            lora_add(m, b, il, FL_LORA_K, w->xn, E, w->k, n_head_kv * D);
            lora_add(m, b, il, FL_LORA_V, w->xn, E, w->v, n_head_kv * D);
        }
        rope_rows(w->q, b->pos, T, n_head, hp);
        rope_rows(w->k, b->pos, T, n_head_kv, hp);
        kv->store(kv_ctx, il, b, w->k, w->v);
        kv->attend(kv_ctx, il, b, w->q, w->att);                          /* att (T, n_head, D) */
        fl_matmul(&L->wo, w->att, w->out, T);                             /* out (T, E) */
        lora_add(m, b, il, FL_LORA_O, w->att, n_head * D, w->out, E);
        if (allreduce) allreduce(m->params.allreduce_ud, w->out, T * E);
        binary_rows(ROW_ADD, w->x, w->x, w->out, T, E);                   /* x += out */
        /* feed-forward block */
        rmsnorm_rows(w->xn, w->x, L->ffn_norm.data, T, E, hp->rms_eps);
        {   /* gate, up (T, F) */
            const fl_tensor *w13[2] = {&L->w1, &L->w3};
            float *gu[2] = {w->gate, w->up};
            fl_matmul_n(2, w13, gu, w->xn, T);
            lora_add(m, b, il, FL_LORA_GATE, w->xn, E, w->gate, F);
            lora_add(m, b, il, FL_LORA_UP, w->xn, E, w->up, F);
        }
        binary_rows(ROW_SWIGLU, w->gate, w->gate, w->up, T, F);           /* gate = silu(gate) * up */
        fl_matmul(&L->w2, w->gate, w->out, T);                            /* out (T, E) */
        lora_add(m, b, il, FL_LORA_DOWN, w->gate, F, w->out, E);
        if (allreduce) allreduce(m->params.allreduce_ud, w->out, T * E);
        binary_rows(ROW_ADD, w->x, w->x, w->out, T, E);
    }

    /* final norm of the rows that get logits, then the output projection (R, n_vocab) */
    int64_t r = 0;
    for (int64_t i = 0; i < T; i++) {
        const bool want = b->logits ? b->logits[i] != 0 : i == T - 1;
        if (want) memcpy(w->xl + r++ * E, w->x + i * E, (size_t)E * sizeof(float));
    }
    rmsnorm_rows(w->xl, w->xl, m->output_norm.data, r, E, hp->rms_eps);
    if (r > 0 && logits_out) fl_matmul(&m->output, w->xl, logits_out, r);
    if (b->hidden && b->hidden_out) { /* the final hidden states asked for (embeddings), normed as the logits' rows */
        int64_t h = 0;
        for (int64_t i = 0; i < T; i++)
            if (b->hidden[i]) memcpy(b->hidden_out + h++ * E, w->x + i * E, (size_t)E * sizeof(float));
        rmsnorm_rows(b->hidden_out, b->hidden_out, m->output_norm.data, h, E, hp->rms_eps);
    }
    return FL_OK;
}
