/* exp(x) on 16 lanes with the arithmetic of fl_expf_poly (kernels/ops.h), lane for lane: what
 * fl_expf_poly_row_avx512 computes per element, inlined where a row of 16 is all there is (the
 * paged attention's block update).  Internal to the AVX-512 code: kernels/avx512 and functions
 * with an AVX-512 target attribute. */
#ifndef FL_KERNELS_AVX512_EXP512_H
#define FL_KERNELS_AVX512_EXP512_H

#include <immintrin.h>
#include <math.h>

#define FL_EXP512_INLINE static inline __attribute__((always_inline, target("avx512f")))

FL_EXP512_INLINE __m512 fl_exp512(__m512 x) {
    const __m512 shift = _mm512_set1_ps(0x1.8p23f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift), shift);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 hi = _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f));
    const __m512 mid = _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f));
    const __m512 lo = _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f));
    const __m512 r = _mm512_scalef_ps(_mm512_fmadd_ps(_mm512_fmadd_ps(hi, u, mid), u, lo), n);
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    if (!big) return r;
    const __m512 sat = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                            _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(big, r, sat);
}

#endif
