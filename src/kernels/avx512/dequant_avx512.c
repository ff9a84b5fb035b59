/* AVX-512 dequantizers, 16 codes at a time, bit-identical to the scalar specification in
 * ref/quant.c (the same f32 operations in the same order: scale products first, then times the
 * code, then the min; no fused multiply-add).  Used by matmul's f32 path, where every row of a
 * type without an integer kernel is expanded once per call.  Types not handled here (NF4, FP8,
 * ...) go to the scalar code. */
#include "kernels/matmul.h"
#include "kernels/avx512/dequant_block.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

static float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* 16 bytes -> 16 int32 lanes */
INLINE __m512i u8x16(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }

static const __m512i *lane_index(void) {
    static const int32_t idx[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    return (const __m512i *)idx;
}

static void q4_0(const fl_block_q4_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        __m512 lo, hi;
        fl_q4_0_block_ps(&b[i], &lo, &hi);
        _mm512_storeu_ps(y, lo);
        _mm512_storeu_ps(y + 16, hi);
    }
}

static void q8_0(const fl_block_q8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        __m512 lo, hi;
        fl_q8_0_block_ps(&b[i], &lo, &hi);
        _mm512_storeu_ps(y, lo);
        _mm512_storeu_ps(y + 16, hi);
    }
}

static void q4_1(const fl_block_q4_1 *b, float *y, int64_t nb) {
    const __m512i m4 = _mm512_set1_epi32(0xF);
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m512 d = _mm512_set1_ps(h2f(b[i].d)), m = _mm512_set1_ps(h2f(b[i].m));
        const __m512i q = u8x16(b[i].qs);
        _mm512_storeu_ps(y, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, m4)), d), m));
        _mm512_storeu_ps(y + 16, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d), m));
    }
}

/* the fifth bits of a Q5 block as 16 + 16 lanes of 0 or 16 */
INLINE void q5_high(const uint8_t *qh4, __m512i *h0, __m512i *h1) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    const __m512i v = _mm512_set1_epi32((int)qh), j = _mm512_loadu_si512(lane_index()), one = _mm512_set1_epi32(1);
    *h0 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(v, j), one), 4);
    *h1 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(v, _mm512_add_epi32(j, _mm512_set1_epi32(16))), one), 4);
}

static void q5_0(const fl_block_q5_0 *b, float *y, int64_t nb) {
    const __m512i m4 = _mm512_set1_epi32(0xF), sixteen = _mm512_set1_epi32(16);
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m512 d = _mm512_set1_ps(h2f(b[i].d));
        __m512i h0, h1;
        q5_high(b[i].qh, &h0, &h1);
        const __m512i q = u8x16(b[i].qs);
        const __m512i lo = _mm512_sub_epi32(_mm512_or_si512(_mm512_and_si512(q, m4), h0), sixteen);
        const __m512i hi = _mm512_sub_epi32(_mm512_or_si512(_mm512_srli_epi32(q, 4), h1), sixteen);
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
    }
}

static void q5_1(const fl_block_q5_1 *b, float *y, int64_t nb) {
    const __m512i m4 = _mm512_set1_epi32(0xF);
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m512 d = _mm512_set1_ps(h2f(b[i].d)), m = _mm512_set1_ps(h2f(b[i].m));
        __m512i h0, h1;
        q5_high(b[i].qh, &h0, &h1);
        const __m512i q = u8x16(b[i].qs);
        const __m512i lo = _mm512_or_si512(_mm512_and_si512(q, m4), h0), hi = _mm512_or_si512(_mm512_srli_epi32(q, 4), h1);
        _mm512_storeu_ps(y, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(lo), d), m));
        _mm512_storeu_ps(y + 16, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(hi), d), m));
    }
}

static void iq4_nl(const fl_block_iq4_nl *b, float *y, int64_t nb) {
    int32_t t[16];
    for (int j = 0; j < 16; j++) t[j] = fl_iq4nl_values[j];
    const __m512i tab = _mm512_loadu_si512(t), m4 = _mm512_set1_epi32(0xF);
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m512 d = _mm512_set1_ps(h2f(b[i].d));
        const __m512i q = u8x16(b[i].qs);
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(_mm512_and_si512(q, m4), tab));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(_mm512_srli_epi32(q, 4), tab));
        _mm512_storeu_ps(y, _mm512_mul_ps(d, lo));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(d, hi));
    }
}

/* 32 codes (two 16-lane halves) times d1 minus m1 */
INLINE void k_store(float *y, __m512i c0, __m512i c1, float d1, float m1) {
    const __m512 d = _mm512_set1_ps(d1), m = _mm512_set1_ps(m1);
    _mm512_storeu_ps(y, _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(c0)), m));
    _mm512_storeu_ps(y + 16, _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(c1)), m));
}

static void q4_K(const fl_block_q4_K *b, float *y, int64_t nb) {
    const __m512i m4 = _mm512_set1_epi32(0xF);
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            uint8_t sc, m;
            fl_q4_K_scale_min(j, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            fl_q4_K_scale_min(j + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const __m512i a = u8x16(q), c = u8x16(q + 16);
            k_store(y, _mm512_and_si512(a, m4), _mm512_and_si512(c, m4), d1, m1);
            k_store(y + 32, _mm512_srli_epi32(a, 4), _mm512_srli_epi32(c, 4), d2, m2);
        }
    }
}

static void q5_K(const fl_block_q5_K *b, float *y, int64_t nb) {
    const __m512i m4 = _mm512_set1_epi32(0xF);
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t *ql = b[i].qs;
        const __m512i h0 = u8x16(b[i].qh), h1 = u8x16(b[i].qh + 16);
        for (int j = 0; j < 8; j += 2, ql += 32, y += 64) {
            uint8_t sc, m;
            fl_q4_K_scale_min(j, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            fl_q4_K_scale_min(j + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const __m512i a = u8x16(ql), c = u8x16(ql + 16);
            /* bit j of qh[l] is the fifth bit of code l of sub-block j: 16 when set */
            const __m512i b0 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h0, j), _mm512_set1_epi32(1)), 4);
            const __m512i b1 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h1, j), _mm512_set1_epi32(1)), 4);
            const __m512i b2 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h0, j + 1), _mm512_set1_epi32(1)), 4);
            const __m512i b3 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h1, j + 1), _mm512_set1_epi32(1)), 4);
            k_store(y, _mm512_add_epi32(_mm512_and_si512(a, m4), b0), _mm512_add_epi32(_mm512_and_si512(c, m4), b1), d1, m1);
            k_store(y + 32, _mm512_add_epi32(_mm512_srli_epi32(a, 4), b2), _mm512_add_epi32(_mm512_srli_epi32(c, 4), b3), d2, m2);
        }
    }
}

static void q6_K(const fl_block_q6_K *b, float *y, int64_t nb) {
    const __m512i m4 = _mm512_set1_epi32(0xF), m2 = _mm512_set1_epi32(3), k32 = _mm512_set1_epi32(32);
    for (int64_t i = 0; i < nb; i++) {
        const __m512 d = _mm512_set1_ps(h2f(b[i].d));
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int n = 0; n < FL_QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l += 16) {
                const int is = l / 16;
                const __m512i a = u8x16(ql + l), c = u8x16(ql + l + 32), h = u8x16(qh + l);
                const __m512i q1 = _mm512_sub_epi32(_mm512_or_si512(_mm512_and_si512(a, m4), _mm512_slli_epi32(_mm512_and_si512(h, m2), 4)), k32);
                const __m512i q2 = _mm512_sub_epi32(_mm512_or_si512(_mm512_and_si512(c, m4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 2), m2), 4)), k32);
                const __m512i q3 = _mm512_sub_epi32(_mm512_or_si512(_mm512_srli_epi32(a, 4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 4), m2), 4)), k32);
                const __m512i q4 = _mm512_sub_epi32(_mm512_or_si512(_mm512_srli_epi32(c, 4), _mm512_slli_epi32(_mm512_srli_epi32(h, 6), 4)), k32);
                /* d * (float)sc * (float)q, left to right */
                _mm512_storeu_ps(y + l, _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps((float)sc[is])), _mm512_cvtepi32_ps(q1)));
                _mm512_storeu_ps(y + l + 32, _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps((float)sc[is + 2])), _mm512_cvtepi32_ps(q2)));
                _mm512_storeu_ps(y + l + 64, _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps((float)sc[is + 4])), _mm512_cvtepi32_ps(q3)));
                _mm512_storeu_ps(y + l + 96, _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps((float)sc[is + 6])), _mm512_cvtepi32_ps(q4)));
            }
    }
}

/* Q2_K: per 16 codes (two bits at `shift` of 16 bytes) dl * code - ml, dl = d (sc & 15),
 * ml = dmin (sc >> 4), as the scalar code. */
static void q2_K(const fl_block_q2_K *b, float *y, int64_t nb) {
    const __m512i m3 = _mm512_set1_epi32(3);
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t *q = b[i].qs;
        int is = 0;
        for (int n = 0; n < FL_QK_K; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int half = 0; half < 2; half++, y += 16) {
                    const uint8_t sc = b[i].scales[is++];
                    const __m512 dl = _mm512_set1_ps(d * (float)(sc & 0xF)), ml = _mm512_set1_ps(dmin * (float)(sc >> 4));
                    const __m512i c = _mm512_and_si512(_mm512_srli_epi32(u8x16(q + 16 * half), (unsigned)shift), m3);
                    _mm512_storeu_ps(y, _mm512_sub_ps(_mm512_mul_ps(dl, _mm512_cvtepi32_ps(c)), ml));
                }
    }
}

/* Q3_K: per 16 codes dl * (two bits - (hmask bit clear ? 4 : 0)), dl = d sc_j (6-bit signed). */
static void q3_K(const fl_block_q3_K *b, float *y, int64_t nb) {
    const __m512i m3 = _mm512_set1_epi32(3), four = _mm512_set1_epi32(4);
    for (int64_t i = 0; i < nb; i++) {
        const float d_all = h2f(b[i].d);
        int8_t sc[16];
        fl_q3_K_scales(b[i].scales, sc);
        const uint8_t *q = b[i].qs;
        uint8_t m = 1;
        int is = 0;
        for (int n = 0; n < FL_QK_K; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int half = 0; half < 2; half++, y += 16) {
                    const __m512 dl = _mm512_set1_ps(d_all * (float)sc[is++]);
                    __m512i c = _mm512_and_si512(_mm512_srli_epi32(u8x16(q + 16 * half), (unsigned)shift), m3);
                    const __mmask16 clear = _mm512_testn_epi32_mask(u8x16(b[i].hmask + 16 * half), _mm512_set1_epi32(m));
                    c = _mm512_mask_sub_epi32(c, clear, c, four);
                    _mm512_storeu_ps(y, _mm512_mul_ps(dl, _mm512_cvtepi32_ps(c)));
                }
    }
}

void fl_dequant_row_avx512(int32_t type, const void *src, float *dst, int64_t K) {
    switch (type) {
    case FL_TYPE_Q8_0: q8_0(src, dst, K / FL_QK); break;
    case FL_TYPE_Q4_0: q4_0(src, dst, K / FL_QK); break;
    case FL_TYPE_Q4_1: q4_1(src, dst, K / FL_QK); break;
    case FL_TYPE_Q5_0: q5_0(src, dst, K / FL_QK); break;
    case FL_TYPE_Q5_1: q5_1(src, dst, K / FL_QK); break;
    case FL_TYPE_IQ4_NL: iq4_nl(src, dst, K / FL_QK); break;
    case FL_TYPE_Q4_K: q4_K(src, dst, K / FL_QK_K); break;
    case FL_TYPE_Q5_K: q5_K(src, dst, K / FL_QK_K); break;
    case FL_TYPE_Q6_K: q6_K(src, dst, K / FL_QK_K); break;
    case FL_TYPE_Q2_K: q2_K(src, dst, K / FL_QK_K); break;
    case FL_TYPE_Q3_K: q3_K(src, dst, K / FL_QK_K); break;
    default: fl_dequant_row(type, src, dst, K);
    }
}
