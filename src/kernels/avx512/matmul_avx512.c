/* AVX-512 VNNI integer tiles (Q8_0 / Q4_0 weights x 8-bit activations) and the f32 dot.
 *
 * One zmm holds two blocks of 32 codes.  vpdpbusd multiplies unsigned by signed bytes, so the
 * weights enter as unsigned: Q4_0 nibbles as they are (0..15, true code q - 8), Q8_0 codes
 * with the sign bit flipped (w + 128).  The offsets are removed for free by starting each
 * block's accumulator at -offset * (sum of the activation codes), spread over its 8 lanes
 * (fl_act_q8.sv).  Each block's int32 sum is converted once and scaled by d_w * d_x.
 * Leftover blocks use masked loads of a single block; reference: fl_gemm_q8_ref. */
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* weight block pair b, b+1 of one row (or only b when single) as 64 unsigned bytes in x order */
INLINE __m512i load_w(int32_t wtype, const char *w, int64_t b, int single, __m512 *dw) {
    if (wtype == FL_TYPE_Q8_0) {
        const fl_block_q8_0 *p = (const fl_block_q8_0 *)w + b;
        const float d0 = _cvtsh_ss(p[0].d), d1 = single ? 0.0f : _cvtsh_ss(p[1].d);
        *dw = _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
        __m256i lo = _mm256_loadu_si256((const __m256i *)p[0].qs);
        __m256i hi = single ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)p[1].qs);
        __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    } else {
        const fl_block_q4_0 *p = (const fl_block_q4_0 *)w + b;
        const float d0 = _cvtsh_ss(p[0].d), d1 = single ? 0.0f : _cvtsh_ss(p[1].d);
        *dw = _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
        __m128i q0 = _mm_loadu_si128((const __m128i *)p[0].qs);
        __m128i q1 = single ? _mm_setzero_si128() : _mm_loadu_si128((const __m128i *)p[1].qs);
        __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); /* lo0 lo1 hi0 hi1 */
        return _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0));       /* lo0 hi0 lo1 hi1 */
    }
}

INLINE void tile(int32_t wtype, const char *w, size_t ldw, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy,
                 const int NR, const int NT) {
    __m512 acc[4][4];
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    const int64_t nb = a->nb, K = a->K;
    const int shift = wtype == FL_TYPE_Q8_0 ? 4 : 0; /* offset 128 = 16 per lane x 8 lanes; 8 = 1 x 8 */
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i xv[4], iv[4];
        __m512 dxv[4];
        for (int t = 0; t < NT; t++) {
            const int64_t mb = (m0 + t) * nb + b;
            xv[t] = _mm512_loadu_si512(a->qs + (m0 + t) * K + b * 32);
            dxv[t] = _mm512_loadu_ps(a->dv + mb * 8);
            iv[t] = _mm512_slli_epi32(_mm512_loadu_si512(a->sv + mb * 8), shift);
        }
        for (int r = 0; r < NR; r++) {
            __m512 dw;
            const __m512i wv = load_w(wtype, w + r * ldw, b, 0, &dw);
            for (int t = 0; t < NT; t++) {
                const __m512i p = _mm512_dpbusd_epi32(iv[t], wv, xv[t]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dxv[t]), acc[r][t]);
            }
        }
    }
    if (b < nb) { /* one block left */
        for (int t = 0; t < NT; t++) {
            const int64_t mb = (m0 + t) * nb + b;
            const __m512i xv = _mm512_maskz_loadu_epi8(0xFFFFFFFFull, a->qs + (m0 + t) * K + b * 32);
            const __m512 dxv = _mm512_maskz_loadu_ps(0x00FF, a->dv + mb * 8);
            const __m512i iv = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(0x00FF, a->sv + mb * 8), shift);
            for (int r = 0; r < NR; r++) {
                __m512 dw;
                const __m512i wv = load_w(wtype, w + r * ldw, b, 1, &dw);
                const __m512i p = _mm512_dpbusd_epi32(iv, wv, xv);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dxv), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

void fl_gemm_q8_avx512(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt,
                       float *y, int64_t ldy) {
    const char *wc = w;
    if (nr == 4 && nt == 4) tile(wtype, wc, ldw, a, m0, y, ldy, 4, 4);
    else if (nr == 4 && nt == 1) tile(wtype, wc, ldw, a, m0, y, ldy, 4, 1);
    else
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++) tile(wtype, wc + r * ldw, ldw, a, m0 + t, y + t * ldy + r, ldy, 1, 1);
}

float fl_dot_f32_avx512(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}
