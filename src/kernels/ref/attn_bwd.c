/*
 * attn_bwd.c - attention backward.
 *
 * With s_ij = scale q_i.k_j, p_ij = exp(s_ij - lse_i), D_i = dO_i . O_i:
 *     dV_j = sum_i p_ij dO_i
 *     dp_ij = dO_i . v_j,   ds_ij = p_ij (dp_ij - D_i)
 *     dQ_i = scale sum_j ds_ij k_j,   dK_j = scale sum_i ds_ij q_i
 * fl_attn_backward (FlashAttention-2): p is recomputed from the saved lse, one key at a time,
 * in two race-free passes: (1) per (sequence, kv head, key tile) accumulate dK, dV of those
 * keys over every query row of the group that sees them; (2) per (sequence, head, query tile)
 * accumulate dQ.  Memory: D (n_q x n_head floats), never n x n.
 * fl_attn_backward_naive materializes P and dP per (sequence, head) - the reference.
 */
#include "kernels/ref/attn_internal.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define BWD_TILE 64

typedef struct bwd_ctx {
    const fl_attn_args *a;
    const fl_attn_res *r;
    const float *dout;
    int64_t ds; /* dout token stride */
    const float *D; /* [n_q][n_head] */
    float *dq, *dk, *dv;
    int64_t *off1, *off2; /* [n_seq + 1] first item of each sequence in pass 1 / pass 2 */
    atomic_long next1, next2;
} bwd_ctx;

static float dotf(const float *x, const float *y, int32_t n) {
    float s = 0.0f;
    for (int32_t d = 0; d < n; d++) s += x[d] * y[d];
    return s;
}

static fl_status bwd_check(const fl_attn_args *fa, const float *dout, float *dq, float *dk, float *dv, fl_attn_res *r) {
    fl_status st = fl_attn_resolve(fa, r);
    if (st != FL_OK) return st;
    if (fa->kv_type != FL_TYPE_F32)
        return fl_set_error(FL_ERR_UNSUPPORTED, "fl_attn_backward: K/V must be f32 (got %s)", fl_type_name(fa->kv_type));
    if (!fa->lse) return fl_set_error(FL_ERR_INVALID, "fl_attn_backward: the forward's lse is required");
    if (fa->n_q > 0 && (!dout || !dq)) return fl_set_error(FL_ERR_INVALID, "fl_attn_backward: NULL dout or dq");
    if (fa->n_kv > 0 && (!dk || !dv)) return fl_set_error(FL_ERR_INVALID, "fl_attn_backward: NULL dk or dv");
    return FL_OK;
}

/* Pass 1 item: keys [jb, je) of sequence s, kv head hk. */
static void bwd_dkdv(const bwd_ctx *c, int32_t s, int64_t it) {
    const fl_attn_args *a = c->a;
    const fl_attn_res *r = c->r;
    int64_t q0, lq, k0, lk;
    fl_attn_seq(a, s, &q0, &lq, &k0, &lk);
    const int64_t tiles = (lk + BWD_TILE - 1) / BWD_TILE;
    const int32_t hk = (int32_t)(it / tiles), hd = a->head_dim, nh = a->n_head;
    const int64_t jb = (it % tiles) * BWD_TILE, je = jb + BWD_TILE < lk ? jb + BWD_TILE : lk;
    const int64_t krow = (int64_t)a->n_head_kv * hd;
    const float *K = (const float *)a->k, *V = (const float *)a->v;
    for (int64_t j = jb; j < je; j++) {
        memset(c->dk + (k0 + j) * krow + (int64_t)hk * hd, 0, sizeof(float) * (size_t)hd);
        memset(c->dv + (k0 + j) * krow + (int64_t)hk * hd, 0, sizeof(float) * (size_t)hd);
    }
    for (int32_t g = 0; g < r->group; g++) {
        const int32_t h = hk * r->group + g;
        for (int64_t i = 0; i < lq; i++) {
            int64_t lo, hi;
            fl_attn_row_range(i, lq, lk, a->causal, a->window, &lo, &hi);
            if (lo < jb) lo = jb;
            if (hi > je - 1) hi = je - 1;
            if (lo > hi) continue;
            const float *qi = a->q + (q0 + i) * r->qs + (int64_t)h * hd;
            const float *doi = c->dout + (q0 + i) * c->ds + (int64_t)h * hd;
            const float lse = a->lse[(q0 + i) * nh + h], Di = c->D[(q0 + i) * nh + h];
            for (int64_t j = lo; j <= hi; j++) {
                const float *kj = K + (k0 + j) * r->ks + (int64_t)hk * hd, *vj = V + (k0 + j) * r->vs + (int64_t)hk * hd;
                float *dkj = c->dk + (k0 + j) * krow + (int64_t)hk * hd, *dvj = c->dv + (k0 + j) * krow + (int64_t)hk * hd;
                const float p = expf(r->scale * dotf(qi, kj, hd) - lse);
                const float dsc = r->scale * p * (dotf(doi, vj, hd) - Di);
                for (int32_t d = 0; d < hd; d++) {
                    dvj[d] += p * doi[d];
                    dkj[d] += dsc * qi[d];
                }
            }
        }
    }
}

/* Pass 2 item: query rows [ib, ie) of sequence s, head h. */
static void bwd_dq(const bwd_ctx *c, int32_t s, int64_t it) {
    const fl_attn_args *a = c->a;
    const fl_attn_res *r = c->r;
    int64_t q0, lq, k0, lk;
    fl_attn_seq(a, s, &q0, &lq, &k0, &lk);
    const int64_t tiles = (lq + BWD_TILE - 1) / BWD_TILE;
    const int32_t h = (int32_t)(it / tiles), hd = a->head_dim, nh = a->n_head, hk = h / r->group;
    const int64_t ib = (it % tiles) * BWD_TILE, ie = ib + BWD_TILE < lq ? ib + BWD_TILE : lq;
    const float *K = (const float *)a->k, *V = (const float *)a->v;
    for (int64_t i = ib; i < ie; i++) {
        float *dqi = c->dq + (q0 + i) * (int64_t)nh * hd + (int64_t)h * hd;
        memset(dqi, 0, sizeof(float) * (size_t)hd);
        int64_t lo, hi;
        fl_attn_row_range(i, lq, lk, a->causal, a->window, &lo, &hi);
        const float *qi = a->q + (q0 + i) * r->qs + (int64_t)h * hd;
        const float *doi = c->dout + (q0 + i) * c->ds + (int64_t)h * hd;
        const float lse = a->lse[(q0 + i) * nh + h], Di = c->D[(q0 + i) * nh + h];
        for (int64_t j = lo; j <= hi; j++) {
            const float *kj = K + (k0 + j) * r->ks + (int64_t)hk * hd, *vj = V + (k0 + j) * r->vs + (int64_t)hk * hd;
            const float p = expf(r->scale * dotf(qi, kj, hd) - lse);
            const float dsc = r->scale * p * (dotf(doi, vj, hd) - Di);
            for (int32_t d = 0; d < hd; d++) dqi[d] += dsc * kj[d];
        }
    }
}

static void bwd_task(void *p, int ith, int nth) {
    bwd_ctx *c = p;
    (void)ith, (void)nth;
    const int32_t n_seq = c->a->n_seq;
    int32_t s = 0;
    for (long it; (it = atomic_fetch_add(&c->next1, 1)) < c->off1[n_seq];) {
        while (c->off1[s + 1] <= it) s++;
        bwd_dkdv(c, s, it - c->off1[s]);
    }
}

static void bwd_task2(void *p, int ith, int nth) {
    bwd_ctx *c = p;
    (void)ith, (void)nth;
    const int32_t n_seq = c->a->n_seq;
    int32_t s = 0;
    for (long it; (it = atomic_fetch_add(&c->next2, 1)) < c->off2[n_seq];) {
        while (c->off2[s + 1] <= it) s++;
        bwd_dq(c, s, it - c->off2[s]);
    }
}

fl_status fl_attn_backward(const fl_attn_args *fa, const float *dout, int64_t dout_stride,
                           float *dq, float *dk, float *dv) {
    fl_attn_res r;
    fl_status st = bwd_check(fa, dout, dq, dk, dv, &r);
    if (st != FL_OK) return st;
    const int32_t nh = fa->n_head, hd = fa->head_dim;
    bwd_ctx c = {.a = fa, .r = &r, .dout = dout, .ds = dout_stride ? dout_stride : (int64_t)nh * hd,
                 .dq = dq, .dk = dk, .dv = dv};
    atomic_init(&c.next1, 0);
    atomic_init(&c.next2, 0);
    if (fa->n_kv > 0) memset(dk, 0, sizeof(float) * (size_t)(fa->n_kv * fa->n_head_kv * hd));
    if (fa->n_kv > 0) memset(dv, 0, sizeof(float) * (size_t)(fa->n_kv * fa->n_head_kv * hd));
    const size_t d_bytes = sizeof(float) * (size_t)(fa->n_q * nh);
    const size_t off_bytes = sizeof(int64_t) * (size_t)(fa->n_seq + 1);
    float *D = fl_alloc(FL_MEM_SCRATCH, d_bytes ? d_bytes : 1, 64);
    c.off1 = D ? fl_alloc(FL_MEM_SCRATCH, off_bytes, 64) : NULL;
    c.off2 = c.off1 ? fl_alloc(FL_MEM_SCRATCH, off_bytes, 64) : NULL;
    if (!c.off2) {
        fl_free(FL_MEM_SCRATCH, c.off1, off_bytes);
        fl_free(FL_MEM_SCRATCH, D, d_bytes ? d_bytes : 1);
        return fl_attn_alloc_failed(__func__);
    }
    for (int64_t t = 0; t < fa->n_q; t++)
        for (int32_t h = 0; h < nh; h++)
            D[t * nh + h] = dotf(dout + t * c.ds + (int64_t)h * hd, fa->out + t * r.os + (int64_t)h * hd, hd);
    c.D = D;
    c.off1[0] = c.off2[0] = 0;
    for (int32_t s = 0; s < fa->n_seq; s++) {
        int64_t q0, lq, k0, lk;
        fl_attn_seq(fa, s, &q0, &lq, &k0, &lk);
        c.off1[s + 1] = c.off1[s] + (lk + BWD_TILE - 1) / BWD_TILE * fa->n_head_kv;
        c.off2[s + 1] = c.off2[s] + (lq + BWD_TILE - 1) / BWD_TILE * nh;
    }
    fl_parallel(bwd_task, &c);
    fl_parallel(bwd_task2, &c);
    fl_free(FL_MEM_SCRATCH, c.off2, off_bytes);
    fl_free(FL_MEM_SCRATCH, c.off1, off_bytes);
    fl_free(FL_MEM_SCRATCH, D, d_bytes ? d_bytes : 1);
    return FL_OK;
}

fl_status fl_attn_backward_naive(const fl_attn_args *fa, const float *dout, int64_t dout_stride,
                                 float *dq, float *dk, float *dv) {
    fl_attn_res r;
    fl_status st = bwd_check(fa, dout, dq, dk, dv, &r);
    if (st != FL_OK) return st;
    const int32_t nh = fa->n_head, hd = fa->head_dim;
    const int64_t ds = dout_stride ? dout_stride : (int64_t)nh * hd, krow = (int64_t)fa->n_head_kv * hd;
    if (fa->n_q > 0) memset(dq, 0, sizeof(float) * (size_t)(fa->n_q * nh * hd));
    if (fa->n_kv > 0) memset(dk, 0, sizeof(float) * (size_t)(fa->n_kv * krow));
    if (fa->n_kv > 0) memset(dv, 0, sizeof(float) * (size_t)(fa->n_kv * krow));
    const size_t bytes = 2 * sizeof(float) * (size_t)(r.max_lq * r.max_lk) + 1;
    float *P = fl_alloc(FL_MEM_SCRATCH, bytes, 64);
    if (!P) return fl_attn_alloc_failed(__func__);
    const float *K = (const float *)fa->k, *V = (const float *)fa->v;
    for (int32_t s = 0; s < fa->n_seq; s++) {
        int64_t q0, lq, k0, lk;
        fl_attn_seq(fa, s, &q0, &lq, &k0, &lk);
        float *dP = P + lq * lk; /* (lq, lk) */
        for (int32_t h = 0; h < nh; h++) {
            const int32_t hk = h / r.group;
            for (int64_t i = 0; i < lq; i++) { /* P = softmax(scale Q K^T + mask), dP = dO V^T */
                const float *qi = fa->q + (q0 + i) * r.qs + (int64_t)h * hd;
                const float *doi = dout + (q0 + i) * ds + (int64_t)h * hd;
                int64_t lo, hi;
                fl_attn_row_range(i, lq, lk, fa->causal, fa->window, &lo, &hi);
                float mx = -INFINITY;
                for (int64_t j = 0; j < lk; j++) {
                    const float *kj = K + (k0 + j) * r.ks + (int64_t)hk * hd;
                    const float *vj = V + (k0 + j) * r.vs + (int64_t)hk * hd;
                    P[i * lk + j] = (j < lo || j > hi) ? -INFINITY : r.scale * dotf(qi, kj, hd);
                    dP[i * lk + j] = dotf(doi, vj, hd);
                    if (P[i * lk + j] > mx) mx = P[i * lk + j];
                }
                double sum = 0.0;
                for (int64_t j = 0; j < lk; j++) sum += (P[i * lk + j] = mx == -INFINITY ? 0.0f : expf(P[i * lk + j] - mx));
                float pdp = 0.0f;
                for (int64_t j = 0; j < lk; j++) {
                    P[i * lk + j] = sum > 0 ? (float)(P[i * lk + j] / sum) : 0.0f;
                    pdp += P[i * lk + j] * dP[i * lk + j];
                }
                float *dqi = dq + (q0 + i) * (int64_t)nh * hd + (int64_t)h * hd;
                for (int64_t j = 0; j < lk; j++) {
                    const float pij = P[i * lk + j];
                    if (pij == 0.0f) continue;
                    const float dsc = r.scale * pij * (dP[i * lk + j] - pdp);
                    const float *kj = K + (k0 + j) * r.ks + (int64_t)hk * hd;
                    float *dkj = dk + (k0 + j) * krow + (int64_t)hk * hd, *dvj = dv + (k0 + j) * krow + (int64_t)hk * hd;
                    for (int32_t d = 0; d < hd; d++) {
                        dqi[d] += dsc * kj[d];
                        dkj[d] += dsc * qi[d];
                        dvj[d] += pij * doi[d];
                    }
                }
            }
        }
    }
    fl_free(FL_MEM_SCRATCH, P, bytes);
    return FL_OK;
}
