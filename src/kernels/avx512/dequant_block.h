/*
 * dequant_block.h - one Q4_0 / Q8_0 block of 32 as two vectors of f32 (values 0-15, 16-31): the
 * products of the scalar dequantizers (kernels/ref/quant.c), bit for bit.  Shared by the
 * AVX-512 dequantizer and the AMX-BF16 panel packer; include only from files built with
 * AVX-512 (kernels/avx512, kernels/amx).
 */
#ifndef FL_DEQUANT_BLOCK_H
#define FL_DEQUANT_BLOCK_H

#include "kernels/quant.h"

#include <immintrin.h>

/* (nibble - 8) x d, the low nibbles first */
static inline void fl_q4_0_block_ps(const fl_block_q4_0 *b, __m512 *lo, __m512 *hi) {
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->qs));
    const __m512i m4 = _mm512_set1_epi32(0xF), eight = _mm512_set1_epi32(8);
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(q, m4), eight)), d);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight)), d);
}

/* code x d */
static inline void fl_q8_0_block_ps(const fl_block_q8_0 *b, __m512 *lo, __m512 *hi) {
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->qs))), d);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16)))), d);
}

#endif
