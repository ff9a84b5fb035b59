/*
 * attn_bwd.c - attention backward.
 *
 * With s_ij = scale q_i.k_j, p_ij = exp(s_ij - lse_i), D_i = dO_i . O_i:
 *     dV_j = sum_i p_ij dO_i
 *     dp_ij = dO_i . v_j,   ds_ij = p_ij (dp_ij - D_i)
 *     dQ_i = scale sum_j ds_ij k_j,   dK_j = scale sum_i ds_ij q_i
 * fl_attn_backward (FlashAttention-2): P is recomputed tile by tile from the saved lse, in two
 * race-free passes built on the forward's qk/pv micro-kernels (so they run at SIMD speed):
 * (1) per (sequence, kv head, tile of 64 keys as lanes) accumulate dK, dV of those keys over
 * every query row of the group that sees them; (2) per (sequence, kv head, 64 (token, head)
 * rows as lanes) accumulate dQ.  Memory: D (n_q x n_head floats) + per-thread tiles of
 * O(64 x head_dim), never n x n.
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


typedef struct bwd_ctx {
    const fl_attn_args *a;
    const fl_attn_res *r;
    const float *dout;
    int64_t ds; /* dout token stride */
    const float *D; /* [n_q][n_head] */
    float *dq, *dk, *dv;
    int64_t *off1, *off2; /* [n_seq + 1] first item of each sequence in pass 1 / pass 2 */
    const fl_attn_kernels *kk;
    char *scratch;        /* [nth][tile_bytes] */
    size_t tile_bytes;
    atomic_long next1, next2;
} bwd_ctx;

/* The fixed inner length 8 lets the compiler vectorize; any n. */
static float dotf(const float *x, const float *y, int32_t n) {
    float acc[8] = {0};
    int32_t d = 0;
    for (; d + 8 <= n; d += 8)
        for (int e = 0; e < 8; e++) acc[e] += x[d + e] * y[d + e];
    for (; d < n; d++) acc[0] += x[d] * y[d];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
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

/* Per-thread buffers, all [.][FL_ATTN_TQ] lanes-minor like the forward tile (64-aligned). */
typedef struct bwd_tile {
    float *xt, *yt;     /* [hd][TQ] lanes: pass 1 Kt, Vt; pass 2 Qt (scaled), dOt */
    float *at, *bt;     /* [hd][TQ] accumulators: pass 1 dKt, dVt; pass 2 dQt */
    float *s, *dp;      /* [TK][TQ] scores -> P, dP -> dS */
    float *ones;        /* [TQ] 1.0 (alpha for pv) */
    float *lse, *dd;    /* [TQ] pass 2: per-lane lse and D */
    int64_t *lo, *hi;   /* [TQ] pass 2: per-lane visible keys */
} bwd_tile;

static size_t bwd_up64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t bwd_tile_bytes(int32_t hd) {
    return 4 * bwd_up64(sizeof(float) * (size_t)hd * FL_ATTN_TQ) + 2 * bwd_up64(sizeof(float) * FL_ATTN_TK * FL_ATTN_TQ) +
           3 * bwd_up64(sizeof(float) * FL_ATTN_TQ) + 2 * bwd_up64(sizeof(int64_t) * FL_ATTN_TQ);
}

static void bwd_tile_bind(bwd_tile *t, char *p, int32_t hd) {
#define BCARVE(field, type, n) (t->field = (type *)(void *)p, p += bwd_up64((n) * sizeof(type)))
    BCARVE(xt, float, (size_t)hd * FL_ATTN_TQ);
    BCARVE(yt, float, (size_t)hd * FL_ATTN_TQ);
    BCARVE(at, float, (size_t)hd * FL_ATTN_TQ);
    BCARVE(bt, float, (size_t)hd * FL_ATTN_TQ);
    BCARVE(s, float, (size_t)FL_ATTN_TK * FL_ATTN_TQ);
    BCARVE(dp, float, (size_t)FL_ATTN_TK * FL_ATTN_TQ);
    BCARVE(ones, float, FL_ATTN_TQ);
    BCARVE(lse, float, FL_ATTN_TQ);
    BCARVE(dd, float, FL_ATTN_TQ);
    BCARVE(lo, int64_t, FL_ATTN_TQ);
    BCARVE(hi, int64_t, FL_ATTN_TQ);
#undef BCARVE
    for (int i = 0; i < FL_ATTN_TQ; i++) t->ones[i] = 1.0f;
}

/* Pass 1 item: keys [jb, je) of sequence s, kv head hk, as the lanes of the tile.  For every
 * query row i (each head of the group) that sees one of them:
 *   S[i][j] = q_i.k_j, dP[i][j] = dO_i.v_j          (qk kernel, rows = queries)
 *   P = exp(scale S - lse_i) (0 where masked), dS = P (dP - D_i)
 *   dVt[d][j] += sum_i dO_i[d] P[i][j], dKt[d][j] += sum_i q_i[d] dS[i][j]   (pv kernel) */
static void bwd_dkdv(const bwd_ctx *c, bwd_tile *t, int32_t s, int64_t it) {
    const fl_attn_args *a = c->a;
    const fl_attn_res *r = c->r;
    const fl_attn_kernels *kk = c->kk;
    int64_t q0, lq, k0, lk;
    fl_attn_seq(a, s, &q0, &lq, &k0, &lk);
    const int64_t tiles = (lk + FL_ATTN_TQ - 1) / FL_ATTN_TQ;
    const int32_t hk = (int32_t)(it / tiles), hd = a->head_dim, nh = a->n_head;
    const int64_t jb = (it % tiles) * FL_ATTN_TQ, je = jb + FL_ATTN_TQ < lk ? jb + FL_ATTN_TQ : lk;
    const int32_t nj = (int32_t)(je - jb), nq = (nj + 15) & ~15;
    const int64_t krow = (int64_t)a->n_head_kv * hd;
    const float *K = (const float *)a->k, *V = (const float *)a->v;
    memset(t->xt, 0, sizeof(float) * (size_t)hd * FL_ATTN_TQ);
    memset(t->yt, 0, sizeof(float) * (size_t)hd * FL_ATTN_TQ);
    memset(t->at, 0, sizeof(float) * (size_t)hd * FL_ATTN_TQ);
    memset(t->bt, 0, sizeof(float) * (size_t)hd * FL_ATTN_TQ);
    for (int32_t j = 0; j < nj; j++) {
        const float *kj = K + (k0 + jb + j) * r->ks + (int64_t)hk * hd, *vj = V + (k0 + jb + j) * r->vs + (int64_t)hk * hd;
        for (int32_t d = 0; d < hd; d++) {
            t->xt[(int64_t)d * FL_ATTN_TQ + j] = kj[d];
            t->yt[(int64_t)d * FL_ATTN_TQ + j] = vj[d];
        }
    }
    for (int32_t g = 0; g < r->group; g++) {
        const int32_t h = hk * r->group + g;
        for (int64_t i0 = 0; i0 < lq; i0 += FL_ATTN_TK) {
            const int32_t ni = (int32_t)(lq - i0 < FL_ATTN_TK ? lq - i0 : FL_ATTN_TK);
            int64_t lo0, hi0, lo1, hi1; /* lo and hi never decrease with i */
            fl_attn_row_range(i0, lq, lk, a->causal, a->window, &lo0, &hi0);
            fl_attn_row_range(i0 + ni - 1, lq, lk, a->causal, a->window, &lo1, &hi1);
            if (hi1 < jb || lo0 > je - 1) continue;
            const float *qrows = a->q + (q0 + i0) * r->qs + (int64_t)h * hd;
            const float *drows = c->dout + (q0 + i0) * c->ds + (int64_t)h * hd;
            kk->qk(t->xt, nq, qrows, r->qs, ni, hd, t->s);
            kk->qk(t->yt, nq, drows, c->ds, ni, hd, t->dp);
            for (int32_t i = 0; i < ni; i++) {
                int64_t lo, hi;
                fl_attn_row_range(i0 + i, lq, lk, a->causal, a->window, &lo, &hi);
                const float lse = a->lse[(q0 + i0 + i) * nh + h], Di = c->D[(q0 + i0 + i) * nh + h];
                float *si = t->s + (int64_t)i * FL_ATTN_TQ, *dpi = t->dp + (int64_t)i * FL_ATTN_TQ;
                for (int32_t j = 0; j < nq; j++) {
                    const bool vis = j < nj && jb + j >= lo && jb + j <= hi;
                    const float p = vis ? expf(r->scale * si[j] - lse) : 0.0f;
                    si[j] = p;
                    dpi[j] = p * (dpi[j] - Di);
                }
            }
            kk->pv(t->s, ni, drows, c->ds, hd, t->bt, nq, t->ones);
            kk->pv(t->dp, ni, qrows, r->qs, hd, t->at, nq, t->ones);
        }
    }
    for (int32_t j = 0; j < nj; j++) {
        float *dkj = c->dk + (k0 + jb + j) * krow + (int64_t)hk * hd, *dvj = c->dv + (k0 + jb + j) * krow + (int64_t)hk * hd;
        for (int32_t d = 0; d < hd; d++) {
            dkj[d] = r->scale * t->at[(int64_t)d * FL_ATTN_TQ + j];
            dvj[d] = t->bt[(int64_t)d * FL_ATTN_TQ + j];
        }
    }
}

/* Pass 2 item: FL_ATTN_TQ (token, head-in-group) rows of sequence s, kv head hk, as lanes:
 *   S^T[j][i] = k_j.(scale q_i), dP^T[j][i] = v_j.dO_i        (qk kernel, rows = keys)
 *   dS = P (dP - D_i),  dQt[d][i] += sum_j k_j[d] dS[j][i]     (pv kernel) */
static void bwd_dq(const bwd_ctx *c, bwd_tile *t, int32_t s, int64_t it) {
    const fl_attn_args *a = c->a;
    const fl_attn_res *r = c->r;
    const fl_attn_kernels *kk = c->kk;
    int64_t q0, lq, k0, lk;
    fl_attn_seq(a, s, &q0, &lq, &k0, &lk);
    const int64_t rows = lq * r->group, tiles = (rows + FL_ATTN_TQ - 1) / FL_ATTN_TQ;
    const int32_t hk = (int32_t)(it / tiles), hd = a->head_dim, nh = a->n_head;
    const int64_t r0 = (it % tiles) * FL_ATTN_TQ;
    const int32_t n = (int32_t)(rows - r0 < FL_ATTN_TQ ? rows - r0 : FL_ATTN_TQ), nq = (n + 15) & ~15;
    const float *K = (const float *)a->k, *V = (const float *)a->v;
    memset(t->xt, 0, sizeof(float) * (size_t)hd * FL_ATTN_TQ);
    memset(t->yt, 0, sizeof(float) * (size_t)hd * FL_ATTN_TQ);
    memset(t->at, 0, sizeof(float) * (size_t)hd * FL_ATTN_TQ);
    int64_t lo_min = INT64_MAX, hi_max = INT64_MIN;
    for (int32_t lane = 0; lane < FL_ATTN_TQ; lane++) {
        t->lo[lane] = 1, t->hi[lane] = 0, t->lse[lane] = 0.0f, t->dd[lane] = 0.0f; /* padding: sees nothing */
        if (lane >= n) continue;
        const int64_t i = (r0 + lane) / r->group, h = (int64_t)hk * r->group + (r0 + lane) % r->group;
        fl_attn_row_range(i, lq, lk, a->causal, a->window, &t->lo[lane], &t->hi[lane]);
        if (t->lo[lane] <= t->hi[lane]) {
            if (t->lo[lane] < lo_min) lo_min = t->lo[lane];
            if (t->hi[lane] > hi_max) hi_max = t->hi[lane];
        }
        t->lse[lane] = a->lse[(q0 + i) * nh + h];
        t->dd[lane] = c->D[(q0 + i) * nh + h];
        const float *qi = a->q + (q0 + i) * r->qs + h * hd, *doi = c->dout + (q0 + i) * c->ds + h * hd;
        for (int32_t d = 0; d < hd; d++) {
            t->xt[(int64_t)d * FL_ATTN_TQ + lane] = r->scale * qi[d];
            t->yt[(int64_t)d * FL_ATTN_TQ + lane] = doi[d];
        }
    }
    for (int64_t j0 = lo_min; j0 <= hi_max; j0 += FL_ATTN_TK) {
        const int32_t nk = (int32_t)(hi_max + 1 - j0 < FL_ATTN_TK ? hi_max + 1 - j0 : FL_ATTN_TK);
        const float *krows = K + (k0 + j0) * r->ks + (int64_t)hk * hd, *vrows = V + (k0 + j0) * r->vs + (int64_t)hk * hd;
        kk->qk(t->xt, nq, krows, r->ks, nk, hd, t->s);
        kk->qk(t->yt, nq, vrows, r->vs, nk, hd, t->dp);
        for (int32_t j = 0; j < nk; j++) {
            float *sj = t->s + (int64_t)j * FL_ATTN_TQ, *dpj = t->dp + (int64_t)j * FL_ATTN_TQ;
            for (int32_t i = 0; i < nq; i++) {
                const bool vis = j0 + j >= t->lo[i] && j0 + j <= t->hi[i];
                const float p = vis ? expf(sj[i] - t->lse[i]) : 0.0f;
                sj[i] = p * (dpj[i] - t->dd[i]);
            }
        }
        kk->pv(t->s, nk, krows, r->ks, hd, t->at, nq, t->ones);
    }
    for (int32_t lane = 0; lane < n; lane++) {
        const int64_t i = (r0 + lane) / r->group, h = (int64_t)hk * r->group + (r0 + lane) % r->group;
        float *dqi = c->dq + (q0 + i) * (int64_t)nh * hd + h * hd;
        for (int32_t d = 0; d < hd; d++) dqi[d] = r->scale * t->at[(int64_t)d * FL_ATTN_TQ + lane];
    }
}

static void bwd_task(void *p, int ith, int nth) {
    bwd_ctx *c = p;
    (void)nth;
    bwd_tile t;
    bwd_tile_bind(&t, c->scratch + (size_t)ith * c->tile_bytes, c->a->head_dim);
    const int32_t n_seq = c->a->n_seq;
    int32_t s = 0;
    for (long it; (it = atomic_fetch_add(&c->next1, 1)) < c->off1[n_seq];) {
        while (c->off1[s + 1] <= it) s++;
        bwd_dkdv(c, &t, s, it - c->off1[s]);
    }
}

static void bwd_task2(void *p, int ith, int nth) {
    bwd_ctx *c = p;
    (void)nth;
    bwd_tile t;
    bwd_tile_bind(&t, c->scratch + (size_t)ith * c->tile_bytes, c->a->head_dim);
    const int32_t n_seq = c->a->n_seq;
    int32_t s = 0;
    for (long it; (it = atomic_fetch_add(&c->next2, 1)) < c->off2[n_seq];) {
        while (c->off2[s + 1] <= it) s++;
        bwd_dq(c, &t, s, it - c->off2[s]);
    }
}

size_t fl_attn_backward_scratch_bytes(int64_t n_q, int32_t n_seq, int32_t n_head, int32_t head_dim, int nth) {
    if (n_q < 0 || n_seq < 1 || n_head < 1 || head_dim < 1 || nth < 1) return 0;
    const size_t d_bytes = sizeof(float) * (size_t)n_q * (size_t)n_head;
    return (d_bytes ? d_bytes : 1) + 2 * sizeof(int64_t) * (size_t)(n_seq + 1) + bwd_tile_bytes(head_dim) * (size_t)nth;
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
    const int nth = fl_threads_get();
    /* the SIMD micro-kernels need head_dim % 8 == 0; the scalar ones take any */
    c.kk = hd % 8 ? fl_attn_kernels_for(FL_ISA_REF) : fl_attn_kernels_get();
    c.tile_bytes = bwd_tile_bytes(hd);
    const size_t d_bytes = sizeof(float) * (size_t)(fa->n_q * nh);
    const size_t off_bytes = sizeof(int64_t) * (size_t)(fa->n_seq + 1), sc_bytes = c.tile_bytes * (size_t)nth;
    float *D = fl_alloc(FL_MEM_SCRATCH, d_bytes ? d_bytes : 1, 64);
    c.off1 = D ? fl_alloc(FL_MEM_SCRATCH, off_bytes, 64) : NULL;
    c.off2 = c.off1 ? fl_alloc(FL_MEM_SCRATCH, off_bytes, 64) : NULL;
    c.scratch = c.off2 ? fl_alloc(FL_MEM_SCRATCH, sc_bytes, 64) : NULL;
    if (!c.scratch) {
        fl_free(FL_MEM_SCRATCH, c.off2, off_bytes);
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
        c.off1[s + 1] = c.off1[s] + (lk + FL_ATTN_TQ - 1) / FL_ATTN_TQ * fa->n_head_kv;
        c.off2[s + 1] = c.off2[s] + (lq * r.group + FL_ATTN_TQ - 1) / FL_ATTN_TQ * fa->n_head_kv;
    }
    fl_parallel_n(bwd_task, &c, nth);
    fl_parallel_n(bwd_task2, &c, nth);
    fl_free(FL_MEM_SCRATCH, c.scratch, sc_bytes);
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
