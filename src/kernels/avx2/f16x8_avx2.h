/* Small AVX2 helpers of the kernels: 8 f16 values at p, p + stride, ..., p + 7 stride (or at
 * p[0] + off, ..., p[7] + off) as 8 f32, one word insert each and one convert (the block scales
 * of 8 blocks of a row for the GEMV and the row dots, of 8 rows for the panel packer); the
 * horizontal sum of 8 floats.
 * For the AVX2 + F16C translation units of src/kernels/avx2/ only. */
#ifndef FL_KERNELS_AVX2_F16X8_H
#define FL_KERNELS_AVX2_F16X8_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline __attribute__((always_inline)) __m256 fl_f16x8_avx2(const char *p, const size_t stride) {
    uint16_t d;
    __m128i v = _mm_setzero_si128();
#define FL_F16X8_LANE(i) memcpy(&d, p + (i) * stride, 2), v = _mm_insert_epi16(v, d, i)
    FL_F16X8_LANE(0); FL_F16X8_LANE(1); FL_F16X8_LANE(2); FL_F16X8_LANE(3);
    FL_F16X8_LANE(4); FL_F16X8_LANE(5); FL_F16X8_LANE(6); FL_F16X8_LANE(7);
#undef FL_F16X8_LANE
    return _mm256_cvtph_ps(v);
}

static inline __attribute__((always_inline)) __m256 fl_f16x8_ptrs_avx2(const char *const p[8], const size_t off) {
    uint16_t d;
    __m128i v = _mm_setzero_si128();
#define FL_F16X8_LANE(i) memcpy(&d, p[i] + off, 2), v = _mm_insert_epi16(v, d, i)
    FL_F16X8_LANE(0); FL_F16X8_LANE(1); FL_F16X8_LANE(2); FL_F16X8_LANE(3);
    FL_F16X8_LANE(4); FL_F16X8_LANE(5); FL_F16X8_LANE(6); FL_F16X8_LANE(7);
#undef FL_F16X8_LANE
    return _mm256_cvtph_ps(v);
}

/* The sum of the 8 lanes: (l + l+4), then (0 + 2) + (1 + 3) (the GEMV's and the row dots' order). */
static inline __attribute__((always_inline)) float fl_hsum8_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
