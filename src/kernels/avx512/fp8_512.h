/* 16 fp8 codes (e4m3 or e5m2) as f32 on AVX-512, lane for lane fl_fp8_e4m3_to_f32 /
 * fl_fp8_e5m2_to_f32 (core/dtype.h): exact values, NaN codes as +-NAN (0x7FC00000 with the
 * code's sign), e5m2's infinities as infinities.  Each code is widened to the f16 with the same
 * value (e5m2 is f16's top byte; e4m3's exponent and mantissa shifted into f16's, which then
 * reads 2^-8 of it, subnormals included) and converted by vcvtph2ps; e4m3 is then scaled by 256,
 * exactly.  Internal to the AVX-512 code: kernels/avx512 and functions with an AVX-512 target
 * attribute (avx512f, avx512bw, avx512vl). */
#ifndef FL_KERNELS_AVX512_FP8_512_H
#define FL_KERNELS_AVX512_FP8_512_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#define FL_FP8_512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl")))

/* the codes at p in lanes m (the others 0, and not read) */
FL_FP8_512_INLINE __m512 fl_fp8x16_to_f32(const uint8_t *p, bool e5m2, __mmask16 m) {
    const __m256i h = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p));
    const __m256i em = _mm256_and_si256(h, _mm256_set1_epi16(0x7F));
    __m256i f16;
    __mmask16 nan;
    if (e5m2) {
        f16 = _mm256_slli_epi16(h, 8);
        nan = _mm256_cmpgt_epi16_mask(em, _mm256_set1_epi16(0x7C));
    } else {
        f16 = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8), _mm256_slli_epi16(em, 7));
        nan = _mm256_cmpeq_epi16_mask(em, _mm256_set1_epi16(0x7F));
    }
    __m512 f = _mm512_cvtph_ps(f16);
    if (!e5m2) f = _mm512_mul_ps(f, _mm512_set1_ps(256.0f));
    if (nan) {
        const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(_mm512_cvtepu16_epi32(h), _mm512_set1_epi32(0x80)), 24);
        f = _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x7FC00000))));
    }
    return f;
}

#endif
