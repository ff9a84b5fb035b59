/* f32 forward/backward ops for training (see ops_train.h for the maths and shapes). */
#include "train/ops_train.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/sgemm.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* ---------------------------------------------------------------- embedding */

void fl_train_embed_forward(float *out, const int32_t *tokens, const float *wte, int64_t N, int64_t C) {
    for (int64_t i = 0; i < N; i++) memcpy(out + i * C, wte + (int64_t)tokens[i] * C, (size_t)C * sizeof(float));
}

void fl_train_embed_backward(float *dwte, const float *dout, const int32_t *tokens, int64_t N, int64_t C) {
    for (int64_t i = 0; i < N; i++) {
        float *d = dwte + (int64_t)tokens[i] * C;
        const float *g = dout + i * C;
        for (int64_t c = 0; c < C; c++) d[c] += g[c];
    }
}

/* ---------------------------------------------------------------- rmsnorm */

void fl_train_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int64_t N, int64_t C,
                              float eps) {
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C;
        float ss = 0.0f;
        for (int64_t c = 0; c < C; c++) ss += x[c] * x[c];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[i] = r;
        float *o = out + i * C;
        for (int64_t c = 0; c < C; c++) o[c] = x[c] * r * w[c];
    }
}

/* y_c = x_c r w_c, r = (mean x^2 + eps)^-1/2, dr/dx_j = -r^3 x_j / C
 * dx_j = r w_j dy_j - (r^3 / C) x_j sum_c dy_c w_c x_c ;  dw_c += dy_c x_c r */
void fl_train_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                               const float *rstd, int64_t N, int64_t C) {
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C, *dy = dout + i * C;
        float *dx = dinp + i * C;
        const float r = rstd[i];
        float dot = 0.0f;
        for (int64_t c = 0; c < C; c++) dot += dy[c] * w[c] * x[c];
        const float k = r * r * r * dot / (float)C;
        for (int64_t c = 0; c < C; c++) {
            dx[c] += r * w[c] * dy[c] - k * x[c];
            if (dw) dw[c] += dy[c] * x[c] * r;
        }
    }
}

/* ---------------------------------------------------------------- matmul */

/* The three products of y = x W^T, through the f32 GEMM (kernels/sgemm.h; its scratch is
 * counted by fl_train_gemm_scratch_bytes). */
void fl_train_matmul_forward(float *out, const float *inp, const float *w, int64_t N, int64_t I, int64_t O) {
    fl_sgemm(FL_SGEMM_TB, N, O, I, inp, I, w, I, out, O); /* (N, O) = (N, I) (O, I)^T */
}

void fl_train_matmul_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                              int64_t N, int64_t I, int64_t O) {
    if (dinp) fl_sgemm(FL_SGEMM_ACC, N, I, O, dout, O, w, I, dinp, I);                /* (N, I) += (N, O) (O, I) */
    if (dw) fl_sgemm(FL_SGEMM_TA | FL_SGEMM_ACC, O, I, N, dout, O, inp, I, dw, I);   /* (O, I) += (N, O)^T (N, I) */
}

/* ---------------------------------------------------------------- vector helpers (attention) */

static float dotf(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpyf(float *y, float a, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* ---------------------------------------------------------------- rope */

static void rope_apply(float *out, const float *inp, const int32_t *pos, int64_t N, int n_head, int head_dim,
                       int rope_dim, float base, float sign) {
    const int64_t row = (int64_t)n_head * head_dim;
    for (int64_t t = 0; t < N; t++) {
        const float tscale = powf(base, -2.0f / (float)rope_dim);
        float theta = (float)pos[t]; /* theta_i = pos * tscale^i, by repeated f32 products (as fl_rope_forward) */
        for (int i = 0; i < rope_dim / 2; i++, theta *= tscale) {
            const float cs = cosf(theta), sn = sign * sinf(theta);
            for (int h = 0; h < n_head; h++) {
                const float *x = inp + t * row + (int64_t)h * head_dim + 2 * i;
                float *y = out + t * row + (int64_t)h * head_dim + 2 * i;
                const float x0 = x[0], x1 = x[1];
                y[0] = x0 * cs - x1 * sn;
                y[1] = x0 * sn + x1 * cs;
            }
        }
        if (out != inp && rope_dim < head_dim)
            for (int h = 0; h < n_head; h++)
                memcpy(out + t * row + (int64_t)h * head_dim + rope_dim, inp + t * row + (int64_t)h * head_dim + rope_dim,
                       (size_t)(head_dim - rope_dim) * sizeof(float));
    }
}

void fl_train_rope_forward(float *out, const float *inp, const int32_t *pos, int64_t N, int n_head, int head_dim,
                           int rope_dim, float base) {
    rope_apply(out, inp, pos, N, n_head, head_dim, rope_dim, base, 1.0f);
}

/* The rotation is orthogonal: its transpose is the rotation by -theta. */
void fl_train_rope_backward(float *dinp, const float *dout, const int32_t *pos, int64_t N, int n_head,
                            int head_dim, int rope_dim, float base) {
    rope_apply(dinp, dout, pos, N, n_head, head_dim, rope_dim, base, -1.0f);
}

/* ---------------------------------------------------------------- swiglu, residual */

void fl_train_swiglu_forward(float *out, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* silu(g) = g s(g), silu'(g) = s (1 + g (1 - s)) */
void fl_train_swiglu_backward(float *dg, float *du, const float *dout, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float d = dout[i], s = 1.0f / (1.0f + expf(-g[i]));
        du[i] = d * g[i] * s;
        dg[i] = d * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
}

void fl_train_residual_forward(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void fl_train_residual_backward(float *da, float *db, const float *dout, int64_t n) {
    if (da)
        for (int64_t i = 0; i < n; i++) da[i] += dout[i];
    if (db)
        for (int64_t i = 0; i < n; i++) db[i] += dout[i];
}

/* ---------------------------------------------------------------- attention */

typedef struct attn_ctx {
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *o;
    const int32_t *cu;
    int n_seq, H, Hkv, hd;
    float scale;
    float *scratch; /* nth x 2 x max_len */
    int64_t max_len;
    atomic_int next;
} attn_ctx;

/* Forward task: one (sequence, q head) pair at a time from an atomic counter.
 * For query row i of the sequence: s_j = scale q_i.k_j (j <= i), out_i = sum_j softmax(s)_j v_j. */
static void attn_fwd_task(void *p, int ith, int nth) {
    attn_ctx *c = p;
    const int H = c->H, hd = c->hd, grp = c->H / c->Hkv;
    const int64_t qs = (int64_t)H * hd, ks = (int64_t)c->Hkv * hd;
    float *s = c->scratch + (int64_t)ith * 2 * c->max_len;
    (void)nth;
    for (;;) {
        int task = atomic_fetch_add(&c->next, 1);
        if (task >= c->n_seq * H) break;
        const int seq = task / H, h = task % H, hk = h / grp;
        const int64_t t0 = c->cu[seq], len = c->cu[seq + 1] - t0;
        for (int64_t i = 0; i < len; i++) {
            const float *qi = c->q + (t0 + i) * qs + (int64_t)h * hd;
            float mx = -INFINITY;
            for (int64_t j = 0; j <= i; j++) {
                s[j] = c->scale * dotf(qi, c->k + (t0 + j) * ks + (int64_t)hk * hd, hd);
                if (s[j] > mx) mx = s[j];
            }
            float sum = 0.0f;
            for (int64_t j = 0; j <= i; j++) {
                s[j] = expf(s[j] - mx);
                sum += s[j];
            }
            float *oi = c->out + (t0 + i) * qs + (int64_t)h * hd;
            memset(oi, 0, (size_t)hd * sizeof(float));
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j <= i; j++) axpyf(oi, s[j] * inv, c->v + (t0 + j) * ks + (int64_t)hk * hd, hd);
            c->lse[(t0 + i) * H + h] = mx + logf(sum);
        }
    }
}

/* Backward task: one (sequence, kv head) pair (it owns dk, dv of that head), all q heads of the
 * group.  p_ij = exp(s_ij - lse_i); D_i = dout_i.out_i; dp_ij = dout_i.v_j;
 * ds_ij = p_ij (dp_ij - D_i); dq_i = scale sum_j ds_ij k_j; dk_j += scale ds_ij q_i; dv_j += p_ij dout_i */
static void attn_bwd_task(void *p, int ith, int nth) {
    attn_ctx *c = p;
    const int H = c->H, hd = c->hd, grp = c->H / c->Hkv;
    const int64_t qs = (int64_t)H * hd, ks = (int64_t)c->Hkv * hd;
    float *pr = c->scratch + (int64_t)ith * 2 * c->max_len;
    (void)nth;
    for (;;) {
        int task = atomic_fetch_add(&c->next, 1);
        if (task >= c->n_seq * c->Hkv) break;
        const int seq = task / c->Hkv, hk = task % c->Hkv;
        const int64_t t0 = c->cu[seq], len = c->cu[seq + 1] - t0;
        for (int64_t j = 0; j < len; j++) {
            memset(c->dk + (t0 + j) * ks + (int64_t)hk * hd, 0, (size_t)hd * sizeof(float));
            memset(c->dv + (t0 + j) * ks + (int64_t)hk * hd, 0, (size_t)hd * sizeof(float));
        }
        for (int h = hk * grp; h < (hk + 1) * grp; h++) {
            for (int64_t i = 0; i < len; i++) {
                const int64_t ti = t0 + i;
                const float *qi = c->q + ti * qs + (int64_t)h * hd;
                const float *doi = c->dout + ti * qs + (int64_t)h * hd;
                const float Di = dotf(doi, c->o + ti * qs + (int64_t)h * hd, hd);
                const float lse = c->lse[ti * H + h];
                float *dqi = c->dq + ti * qs + (int64_t)h * hd;
                memset(dqi, 0, (size_t)hd * sizeof(float));
                for (int64_t j = 0; j <= i; j++) {
                    const float *kj = c->k + (t0 + j) * ks + (int64_t)hk * hd;
                    const float *vj = c->v + (t0 + j) * ks + (int64_t)hk * hd;
                    const float pij = expf(c->scale * dotf(qi, kj, hd) - lse);
                    const float ds = pij * (dotf(doi, vj, hd) - Di) * c->scale;
                    axpyf(dqi, ds, kj, hd);
                    axpyf(c->dk + (t0 + j) * ks + (int64_t)hk * hd, ds, qi, hd);
                    axpyf(c->dv + (t0 + j) * ks + (int64_t)hk * hd, pij, doi, hd);
                }
            }
        }
    }
    (void)pr;
}

static fl_status attn_prepare(attn_ctx *c, const int32_t *cu, int n_seq, int H, int Hkv, int hd, int *nth,
                              size_t *bytes) {
    if (n_seq <= 0 || H <= 0 || Hkv <= 0 || H % Hkv || hd <= 0)
        return fl_set_error(FL_ERR_INVALID, "%s: bad attention shape (n_seq %d, heads %d/%d, hd %d)", __func__, n_seq,
                            H, Hkv, hd);
    int64_t mx = 1;
    for (int s = 0; s < n_seq; s++) {
        if (cu[s + 1] < cu[s]) return fl_set_error(FL_ERR_INVALID, "%s: cu_seqlens not increasing", __func__);
        if (cu[s + 1] - cu[s] > mx) mx = cu[s + 1] - cu[s];
    }
    c->max_len = mx;
    *nth = fl_threads_get();
    *bytes = (size_t)(*nth) * 2 * (size_t)mx * sizeof(float);
    c->scratch = fl_alloc(FL_MEM_SCRATCH, *bytes, 64);
    if (!c->scratch) return FL_ERR_NOMEM;
    atomic_init(&c->next, 0);
    return FL_OK;
}

fl_status fl_train_attn_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                const int32_t *cu_seqlens, int n_seq, int n_head, int n_head_kv, int hd,
                                float scale) {
    attn_ctx c = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .cu = cu_seqlens, .n_seq = n_seq, .H = n_head,
                  .Hkv = n_head_kv, .hd = hd, .scale = scale};
    int nth;
    size_t bytes;
    fl_status st = attn_prepare(&c, cu_seqlens, n_seq, n_head, n_head_kv, hd, &nth, &bytes);
    if (st) return st;
    fl_parallel_n(attn_fwd_task, &c, nth);
    fl_free(FL_MEM_SCRATCH, c.scratch, bytes);
    return FL_OK;
}

fl_status fl_train_attn_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                 const float *k, const float *v, const float *out, const float *lse,
                                 const int32_t *cu_seqlens, int n_seq, int n_head, int n_head_kv, int hd,
                                 float scale) {
    attn_ctx c = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .q = q, .k = k, .v = v, .o = out, .lse = (float *)lse,
                  .cu = cu_seqlens, .n_seq = n_seq, .H = n_head, .Hkv = n_head_kv, .hd = hd, .scale = scale};
    int nth;
    size_t bytes;
    fl_status st = attn_prepare(&c, cu_seqlens, n_seq, n_head, n_head_kv, hd, &nth, &bytes);
    if (st) return st;
    fl_parallel_n(attn_bwd_task, &c, nth);
    fl_free(FL_MEM_SCRATCH, c.scratch, bytes);
    return FL_OK;
}

/* ---------------------------------------------------------------- cross-entropy */

typedef struct ce_ctx {
    float *losses, *lse, *dlogits;
    const float *logits, *dloss;
    const int32_t *targets;
    int64_t N, V;
} ce_ctx;

static void ce_fwd_task(void *p, int ith, int nth) {
    const ce_ctx *c = p;
    int64_t lo, hi;
    fl_split_range(c->N, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const float *x = c->logits + i * c->V;
        float mx = -INFINITY;
        for (int64_t j = 0; j < c->V; j++) mx = x[j] > mx ? x[j] : mx;
        double sum = 0.0;
        for (int64_t j = 0; j < c->V; j++) sum += expf(x[j] - mx);
        const float l = mx + (float)log(sum);
        c->lse[i] = l;
        const int32_t t = c->targets[i];
        c->losses[i] = t >= 0 ? l - x[t] : 0.0f;
    }
}

static void ce_bwd_task(void *p, int ith, int nth) {
    const ce_ctx *c = p;
    int64_t lo, hi;
    fl_split_range(c->N, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const float *x = c->logits + i * c->V;
        float *d = c->dlogits + i * c->V;
        const int32_t t = c->targets[i];
        if (t < 0) {
            memset(d, 0, (size_t)c->V * sizeof(float));
            continue;
        }
        const float g = c->dloss[i], l = c->lse[i];
        for (int64_t j = 0; j < c->V; j++) d[j] = expf(x[j] - l) * g;
        d[t] -= g;
    }
}

void fl_train_crossentropy_forward(float *losses, float *lse, const float *logits, const int32_t *targets,
                                   int64_t N, int64_t V) {
    ce_ctx c = {.losses = losses, .lse = lse, .logits = logits, .targets = targets, .N = N, .V = V};
    fl_parallel(ce_fwd_task, &c);
}

void fl_train_crossentropy_backward(float *dlogits, const float *dloss, const float *logits, const float *lse,
                                    const int32_t *targets, int64_t N, int64_t V) {
    ce_ctx c = {.dlogits = dlogits, .dloss = dloss, .logits = logits, .lse = (float *)lse, .targets = targets,
                .N = N, .V = V};
    fl_parallel(ce_bwd_task, &c);
}

/* ---------------------------------------------------------------- precision */

void fl_train_round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = fl_bf16_to_f32(fl_f32_to_bf16(x[i]));
}

void fl_train_round_fp16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = fl_f16_to_f32(fl_f32_to_f16(x[i]));
}
