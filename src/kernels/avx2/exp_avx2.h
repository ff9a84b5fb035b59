/* exp(x) in 8 lanes with the arithmetic of fl_expf_poly (kernels/ops.h), lane for lane: the
 * AVX2 softmax exponent (fl_expf_poly_row_avx2, SwiGLU, the paged-attention block update).
 * For the AVX2 + FMA translation units of src/kernels/avx2/ only. */
#ifndef FL_KERNELS_AVX2_EXP_AVX2_H
#define FL_KERNELS_AVX2_EXP_AVX2_H

#include <immintrin.h>
#include <math.h>

/* 2^k for integer k in [-126, 127], as float bits */
static inline __attribute__((always_inline)) __m256 fl_pow2i_avx2(__m256i k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

static inline __attribute__((always_inline)) __m256 fl_exp_avx2(__m256 x) {
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift), shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 hi = _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f));
    const __m256 mid = _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f));
    const __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f));
    const __m256 p = _mm256_fmadd_ps(_mm256_fmadd_ps(hi, u, mid), u, lo);
    const __m256 an = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(an, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 nc = _mm256_blendv_ps(n, _mm256_setzero_ps(), big); /* keep the shifts in range */
    /* ldexpf(p, n): p 2^(n - n / 2) is exact (|n - n / 2| <= 96, p near 1), times 2^(n / 2)
     * rounds once, as ldexpf does */
    const __m256i k = _mm256_cvtps_epi32(nc), k1 = _mm256_srai_epi32(k, 1), k2 = _mm256_sub_epi32(k, k1);
    const __m256 r = _mm256_mul_ps(_mm256_mul_ps(p, fl_pow2i_avx2(k2)), fl_pow2i_avx2(k1));
    if (_mm256_testz_ps(big, big)) return r;
    const __m256 sat = _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(), _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
    return _mm256_blendv_ps(r, sat, big);
}

#endif
