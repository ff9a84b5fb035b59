/* fp8 (e4m3, e5m2) to and from f32, 16 lanes at a time, on AVX-512.  Decode: 16 fp8 codes as
 * f32, lane for lane fl_fp8_e4m3_to_f32 / fl_fp8_e5m2_to_f32 (core/dtype.h): exact values, NaN
 * codes as +-NAN (0x7FC00000 with the code's sign), e5m2's infinities as infinities.  Each code is widened to the f16 with the same
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

/* 16 floats as fp8 codes (e4m3 or e5m2), lane for lane fl_f32_to_fp8_e4m3 / _e5m2: round to
 * nearest even on the format's grid; e4m3 saturates to its largest finite (infinities too),
 * e5m2 saturates finite values and keeps infinities; NaN is sign | 0x7F.  Normal results round
 * the float's mantissa by an integer add (ties to even) and rebias the exponent; those below the
 * format's smallest normal are a conversion of |v| x 2^(bias - 1 + mantissa bits) to the nearest
 * integer, which is the subnormal code (or the smallest normal's, where it rounds up). */
FL_FP8_512_INLINE __m128i fl_f32x16_to_fp8(__m512 v, bool e5m2) {
    const int mb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, sh = 23 - mb, max_code = e5m2 ? 0x7B : 0x7E;
    const __m512i bits = _mm512_castps_si512(v), abits = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
    const __m512i half = _mm512_add_epi32(_mm512_set1_epi32((1 << (sh - 1)) - 1), _mm512_and_si512(_mm512_srli_epi32(abits, sh), _mm512_set1_epi32(1)));
    const __m512i normal = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(abits, half), sh), _mm512_set1_epi32((127 - bias) << mb));
    const __m512 a = _mm512_castsi512_ps(abits);
    const __m512i sub = _mm512_cvt_roundps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(e5m2 ? 65536.0f : 512.0f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 is_sub = _mm512_cmp_ps_mask(a, _mm512_set1_ps(e5m2 ? 0x1p-14f : 0x1p-6f), _CMP_LT_OQ);
    __m512i code = _mm512_min_epu32(_mm512_mask_mov_epi32(normal, is_sub, sub), _mm512_set1_epi32(max_code));
    if (e5m2) code = _mm512_mask_mov_epi32(code, _mm512_cmpeq_epi32_mask(abits, _mm512_set1_epi32(0x7F800000)), _mm512_set1_epi32(0x7C));
    code = _mm512_mask_mov_epi32(code, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7F));
    return _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign));
}

#endif
