/* f16 <-> f32 rows with F16C (8 lanes).  Leftovers: f16 -> f32 through an 8-lane buffer, f32 -> f16 scalar reference. */
#include "kernels/convert.h"

#include <immintrin.h>

void fl_f16_to_f32_row_avx2(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    if (i < n) { /* tail through an 8-lane buffer (exact, like the reference) */
        uint16_t t[8] = {0};
        float r[8];
        for (int64_t j = i; j < n; j++) t[j - i] = x[j];
        _mm256_storeu_ps(r, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t)));
        for (int64_t j = i; j < n; j++) y[j] = r[j - i];
    }
}

void fl_f32_to_f16_row_avx2(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    fl_f32_to_f16_row_ref(x + i, y + i, n - i);
}
