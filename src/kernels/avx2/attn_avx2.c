/*
 * attn_avx2.c - AVX2/FMA flash-attention micro-kernels (contract in kernels/attn.h).
 * Each ymm holds 8 query lanes of the tile; K/V elements are broadcast from memory.
 *   qk: 4 keys x 16 lanes in 8 accumulators;  pv: 4 dims x 16 lanes in 8 accumulators.
 */
#include "kernels/attn.h"

#include <immintrin.h>
#include <math.h>

#define FL_INLINE static inline __attribute__((always_inline))

/* 2^x per lane; exactly 0 for x < -126 (and -inf); same polynomial as the AVX-512 version,
 * exponent added to the bits of the result. */
FL_INLINE __m256 exp2_ps(__m256 x) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(127.0f));
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.5403530393381608e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    /* p in [0.7, 1.42]: adding n to its exponent field multiplies by 2^n (n in [-126, 127];
     * p * 2^-126 may land in the subnormal range: do it as two steps of at most 2^-63) */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i h1 = _mm256_srai_epi32(ni, 1), h2 = _mm256_sub_epi32(ni, h1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h1, _mm256_set1_epi32(127)), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h2, _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(p, s1), s2), keep);
}

FL_INLINE void qk_block(const float *qt, const float *k, int64_t ks, int32_t hd, float *s, const int NJ) {
    __m256 acc[4][2];
    for (int j = 0; j < NJ; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int32_t d = 0; d < hd; d++) {
        const __m256 q0 = _mm256_load_ps(qt + (int64_t)d * FL_ATTN_TQ);
        const __m256 q1 = _mm256_load_ps(qt + (int64_t)d * FL_ATTN_TQ + 8);
        for (int j = 0; j < NJ; j++) {
            const __m256 kb = _mm256_broadcast_ss(k + j * ks + d);
            acc[j][0] = _mm256_fmadd_ps(kb, q0, acc[j][0]);
            acc[j][1] = _mm256_fmadd_ps(kb, q1, acc[j][1]);
        }
    }
    for (int j = 0; j < NJ; j++) {
        _mm256_store_ps(s + (int64_t)j * FL_ATTN_TQ, acc[j][0]);
        _mm256_store_ps(s + (int64_t)j * FL_ATTN_TQ + 8, acc[j][1]);
    }
}

void fl_attn_qk_avx2(const float *qt, int32_t nq, const float *k, int64_t k_stride, int32_t nk, int32_t hd, float *s) {
    for (int32_t i = 0; i < nq; i += 16) { /* nq is a multiple of 16 */
        int32_t j = 0;
        for (; j + 4 <= nk; j += 4) qk_block(qt + i, k + j * k_stride, k_stride, hd, s + (int64_t)j * FL_ATTN_TQ + i, 4);
        const float *kj = k + j * k_stride;
        float *sj = s + (int64_t)j * FL_ATTN_TQ + i;
        switch (nk - j) {
        case 3: qk_block(qt + i, kj, k_stride, hd, sj, 3); break;
        case 2: qk_block(qt + i, kj, k_stride, hd, sj, 2); break;
        case 1: qk_block(qt + i, kj, k_stride, hd, sj, 1); break;
        default: break;
        }
    }
}

void fl_attn_softmax_avx2(float *s, int32_t nk, int32_t nq, float *m, float *l, float *alpha) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int32_t i = 0; i < nq; i += 8) {
        __m256 mt = ninf;
        for (int32_t j = 0; j < nk; j++) mt = _mm256_max_ps(mt, _mm256_load_ps(s + (int64_t)j * FL_ATTN_TQ + i));
        const __m256 mo = _mm256_load_ps(m + i);
        const __m256 mn = _mm256_max_ps(mo, mt);
        const __m256 mu = _mm256_blendv_ps(mn, _mm256_setzero_ps(), _mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ));
        const __m256 a = exp2_ps(_mm256_sub_ps(mo, mu));
        __m256 sum = _mm256_setzero_ps();
        for (int32_t j = 0; j < nk; j++) {
            float *sj = s + (int64_t)j * FL_ATTN_TQ + i;
            const __m256 p = exp2_ps(_mm256_sub_ps(_mm256_load_ps(sj), mu));
            _mm256_store_ps(sj, p);
            sum = _mm256_add_ps(sum, p);
        }
        _mm256_store_ps(alpha + i, a);
        _mm256_store_ps(l + i, _mm256_fmadd_ps(_mm256_load_ps(l + i), a, sum));
        _mm256_store_ps(m + i, mn);
    }
}

void fl_attn_pv_avx2(const float *s, int32_t nk, const float *v, int64_t v_stride, int32_t hd, float *ot,
                     int32_t nq, const float *alpha) {
    for (int32_t d0 = 0; d0 < hd; d0 += 4) { /* head_dim is a multiple of 8 */
        for (int32_t i = 0; i < nq; i += 16) {
            float *o = ot + (int64_t)d0 * FL_ATTN_TQ + i;
            const __m256 a0 = _mm256_load_ps(alpha + i), a1 = _mm256_load_ps(alpha + i + 8);
            __m256 acc[4][2];
            for (int d = 0; d < 4; d++) {
                acc[d][0] = _mm256_mul_ps(a0, _mm256_load_ps(o + d * FL_ATTN_TQ));
                acc[d][1] = _mm256_mul_ps(a1, _mm256_load_ps(o + d * FL_ATTN_TQ + 8));
            }
            for (int32_t j = 0; j < nk; j++) {
                const __m256 p0 = _mm256_load_ps(s + (int64_t)j * FL_ATTN_TQ + i);
                const __m256 p1 = _mm256_load_ps(s + (int64_t)j * FL_ATTN_TQ + i + 8);
                const float *vj = v + j * v_stride + d0;
                for (int d = 0; d < 4; d++) {
                    const __m256 vb = _mm256_broadcast_ss(vj + d);
                    acc[d][0] = _mm256_fmadd_ps(vb, p0, acc[d][0]);
                    acc[d][1] = _mm256_fmadd_ps(vb, p1, acc[d][1]);
                }
            }
            for (int d = 0; d < 4; d++) {
                _mm256_store_ps(o + d * FL_ATTN_TQ, acc[d][0]);
                _mm256_store_ps(o + d * FL_ATTN_TQ + 8, acc[d][1]);
            }
        }
    }
}
