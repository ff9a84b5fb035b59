/* q8_0 / q4_0 KV rows (kv/kv_quant.c: groups of 32 values, an f16 d, then the codes; q4_0's low
 * nibbles are the group's first 16 values, the high ones the last 16) decoded 16 values at a
 * time on AVX-512: d x q for q8_0, d x (q - 8) for q4_0, one multiply per value as
 * fl_kv_dequant's scalar loops compute it, so the same bits.  Used by fl_kv_dequant and by the
 * paged attention's block loader.  Internal to the AVX-512 code: kernels/avx512 and functions
 * with an AVX-512 target attribute. */
#ifndef FL_KERNELS_AVX512_KVQ_512_H
#define FL_KERNELS_AVX512_KVQ_512_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define FL_KVQ_512_INLINE static inline __attribute__((always_inline, target("avx512f")))

/* Values [e, e + 16) of the row at `row` (e a multiple of 16). */
FL_KVQ_512_INLINE __m512 fl_kvq16_to_f32(const uint8_t *row, int64_t e, bool q8) {
    const uint8_t *g = row + (e / 32) * (q8 ? 34 : 18);
    uint16_t dh;
    memcpy(&dh, g, 2);
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)dh));
    __m512i q;
    if (q8) q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(g + 2 + e % 32)));
    else {
        const __m128i b = _mm_loadu_si128((const __m128i *)(g + 2));
        const __m128i n = _mm_and_si128(e % 32 ? _mm_srli_epi16(b, 4) : b, _mm_set1_epi8(0x0F));
        q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(n), _mm512_set1_epi32(8));
    }
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(q));
}

#endif
