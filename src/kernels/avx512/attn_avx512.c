/*
 * attn_avx512.c - AVX-512 flash-attention micro-kernels (contract in kernels/attn.h).
 * Each zmm holds 16 query lanes of the tile; K/V elements are broadcast from memory.
 *   qk: 8 keys x 32 lanes of scores in 16 accumulators, one FMA per (key, lane vector, d)
 *   pv: 8 output dims x 32 lanes in 16 accumulators, one FMA per (dim, lane vector, key)
 */
#include "kernels/attn.h"

#include <immintrin.h>
#include <math.h>

#define FL_INLINE static inline __attribute__((always_inline))

/* 2^x per lane; exactly 0 for x < -126 (and -inf), x clamped at 128.  Degree-6 Taylor
 * polynomial of 2^f on |f| <= 0.5 (relative error ~1.2e-7), exponent applied with scalef. */
FL_INLINE __m512 exp2_ps(__m512 x) {
    const __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-126.0f)), _mm512_set1_ps(128.0f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5403530393381608e-4f); /* ln2^6 / 6! */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f)); /* ln2^5 / 5! */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f)); /* ln2^4 / 4! */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f)); /* ln2^3 / 3! */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f)); /* ln2^2 / 2! */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f)); /* ln2 */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps((__mmask16)~zero, _mm512_scalef_ps(p, n));
}

/* s[j][lanes] for NJ keys x NV lane vectors. */
FL_INLINE void qk_block(const float *qt, const float *k, int64_t ks, int32_t hd, float *s, const int NV, const int NJ) {
    __m512 acc[8][2];
    for (int j = 0; j < NJ; j++)
        for (int v = 0; v < NV; v++) acc[j][v] = _mm512_setzero_ps();
    for (int32_t d = 0; d < hd; d++) {
        __m512 q[2];
        for (int v = 0; v < NV; v++) q[v] = _mm512_load_ps(qt + (int64_t)d * FL_ATTN_TQ + 16 * v);
        for (int j = 0; j < NJ; j++) {
            const __m512 kb = _mm512_set1_ps(k[j * ks + d]);
            for (int v = 0; v < NV; v++) acc[j][v] = _mm512_fmadd_ps(kb, q[v], acc[j][v]);
        }
    }
    for (int j = 0; j < NJ; j++)
        for (int v = 0; v < NV; v++) _mm512_store_ps(s + (int64_t)j * FL_ATTN_TQ + 16 * v, acc[j][v]);
}

FL_INLINE void qk_lanes(const float *qt, const float *k, int64_t ks, int32_t nk, int32_t hd, float *s, const int NV) {
    int32_t j = 0;
    for (; j + 8 <= nk; j += 8) qk_block(qt, k + j * ks, ks, hd, s + (int64_t)j * FL_ATTN_TQ, NV, 8);
    const float *kj = k + j * ks;
    float *sj = s + (int64_t)j * FL_ATTN_TQ;
    switch (nk - j) {
    case 7: qk_block(qt, kj, ks, hd, sj, NV, 7); break;
    case 6: qk_block(qt, kj, ks, hd, sj, NV, 6); break;
    case 5: qk_block(qt, kj, ks, hd, sj, NV, 5); break;
    case 4: qk_block(qt, kj, ks, hd, sj, NV, 4); break;
    case 3: qk_block(qt, kj, ks, hd, sj, NV, 3); break;
    case 2: qk_block(qt, kj, ks, hd, sj, NV, 2); break;
    case 1: qk_block(qt, kj, ks, hd, sj, NV, 1); break;
    default: break;
    }
}

void fl_attn_qk_avx512(const float *qt, int32_t nq, const float *k, int64_t k_stride, int32_t nk, int32_t hd, float *s) {
    int32_t i = 0;
    for (; i + 32 <= nq; i += 32) qk_lanes(qt + i, k, k_stride, nk, hd, s + i, 2);
    if (i < nq) qk_lanes(qt + i, k, k_stride, nk, hd, s + i, 1);
}

void fl_attn_softmax_avx512(float *s, int32_t nk, int32_t nq, float *m, float *l, float *alpha) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int32_t i = 0; i < nq; i += 16) {
        __m512 mt = ninf;
        for (int32_t j = 0; j < nk; j++) mt = _mm512_max_ps(mt, _mm512_load_ps(s + (int64_t)j * FL_ATTN_TQ + i));
        const __m512 mo = _mm512_load_ps(m + i);
        const __m512 mn = _mm512_max_ps(mo, mt);
        /* lanes that have seen nothing yet subtract 0 instead of -inf (exp2(-inf) = 0, no NaN) */
        const __m512 mu = _mm512_mask_mov_ps(mn, _mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), _mm512_setzero_ps());
        const __m512 a = exp2_ps(_mm512_sub_ps(mo, mu));
        __m512 sum = _mm512_setzero_ps();
        for (int32_t j = 0; j < nk; j++) {
            float *sj = s + (int64_t)j * FL_ATTN_TQ + i;
            const __m512 p = exp2_ps(_mm512_sub_ps(_mm512_load_ps(sj), mu));
            _mm512_store_ps(sj, p);
            sum = _mm512_add_ps(sum, p);
        }
        _mm512_store_ps(alpha + i, a);
        _mm512_store_ps(l + i, _mm512_fmadd_ps(_mm512_load_ps(l + i), a, sum));
        _mm512_store_ps(m + i, mn);
    }
}

/* ot[d0..d0+8)[lanes] = alpha * ot + sum_j v[j][d] s[j][lanes], NV lane vectors. */
FL_INLINE void pv_block(const float *s, int32_t nk, const float *v, int64_t vs, float *ot, const float *alpha, const int NV) {
    __m512 acc[8][2], al[2];
    for (int w = 0; w < NV; w++) al[w] = _mm512_load_ps(alpha + 16 * w);
    for (int d = 0; d < 8; d++)
        for (int w = 0; w < NV; w++) acc[d][w] = _mm512_mul_ps(al[w], _mm512_load_ps(ot + d * FL_ATTN_TQ + 16 * w));
    for (int32_t j = 0; j < nk; j++) {
        __m512 p[2];
        for (int w = 0; w < NV; w++) p[w] = _mm512_load_ps(s + (int64_t)j * FL_ATTN_TQ + 16 * w);
        const float *vj = v + j * vs;
        for (int d = 0; d < 8; d++) {
            const __m512 vb = _mm512_set1_ps(vj[d]);
            for (int w = 0; w < NV; w++) acc[d][w] = _mm512_fmadd_ps(vb, p[w], acc[d][w]);
        }
    }
    for (int d = 0; d < 8; d++)
        for (int w = 0; w < NV; w++) _mm512_store_ps(ot + d * FL_ATTN_TQ + 16 * w, acc[d][w]);
}

void fl_attn_pv_avx512(const float *s, int32_t nk, const float *v, int64_t v_stride, int32_t hd, float *ot,
                       int32_t nq, const float *alpha) {
    for (int32_t d = 0; d < hd; d += 8) { /* head_dim is a multiple of 8 */
        int32_t i = 0;
        for (; i + 32 <= nq; i += 32) pv_block(s + i, nk, v + d, v_stride, ot + (int64_t)d * FL_ATTN_TQ + i, alpha + i, 2);
        if (i < nq) pv_block(s + i, nk, v + d, v_stride, ot + (int64_t)d * FL_ATTN_TQ + i, alpha + i, 1);
    }
}
