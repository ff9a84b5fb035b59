/* 8 f16 values at p, p + stride, ..., p + 7 stride (or at p[0] + off, ..., p[7] + off) as 8
 * f32: one word insert each and one convert (the block scales of 8 blocks of a row for the GEMV,
 * of 8 rows for the panel packer).
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

#endif
