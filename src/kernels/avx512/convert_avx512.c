/* f16/bf16 <-> f32 rows with AVX-512 (16 lanes).  bf16 encode uses the AVX512-BF16
 * instruction only when present, else integer rounding (same RNE result); tails are masked (f32 -> bf16: ref). */
#include "kernels/convert.h"

#include <immintrin.h>

void fl_f16_to_f32_row_avx512(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    if (i < n) { /* masked tail: short rows (a head of 8 dims) stay vectorised */
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)));
    }
}

void fl_f32_to_f16_row_avx512(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT));
    }
}

void fl_bf16_to_f32_row_avx512(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
        _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + i));
        _mm512_mask_storeu_ps(y + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
}

/* Integer RNE: u + 0x7FFF + ((u >> 16) & 1), NaN lanes -> (u >> 16) | 0x40. */
void fl_f32_to_bf16_row_avx512(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512((const void *)(x + i));
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absmask), inf);
        r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000)); /* quiet bit, no rounding */
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    fl_f32_to_bf16_row_ref(x + i, y + i, n - i);
}
