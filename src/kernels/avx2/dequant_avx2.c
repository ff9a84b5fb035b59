/* AVX2 dequantizers, 8 codes at a time, bit-identical to the scalar specification in
 * ref/quant.c (the same f32 operations in the same order as the AVX-512 ones in
 * avx512/dequant_avx512.c: scale products first, then times the code, then the min; no fused
 * multiply-add).  Used by matmul's f32 path on AVX2 machines.  Types not handled here (NF4, FP8,
 * ...) go to the scalar code. */
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

static float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* 8 bytes -> 8 int32 lanes */
INLINE __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* y[0..8) = float(c) * d (+ m if add, - m if sub); the order of the scalar code */
INLINE void st_mul(float *y, __m256i c, __m256 d) { _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(c), d)); }
INLINE void st_mul_add(float *y, __m256i c, __m256 d, __m256 m) {
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c), d), m));
}
INLINE void st_dmul_sub(float *y, __m256i c, __m256 d, __m256 m) { /* d * c - m */
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(c)), m));
}

static void q4_0(const fl_block_q4_0 *b, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi32(0xF), eight = _mm256_set1_epi32(8);
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m256 d = _mm256_set1_ps(h2f(b[i].d));
        for (int h = 0; h < 16; h += 8) {
            const __m256i q = u8x8(b[i].qs + h);
            st_mul(y + h, _mm256_sub_epi32(_mm256_and_si256(q, m4), eight), d);
            st_mul(y + 16 + h, _mm256_sub_epi32(_mm256_srli_epi32(q, 4), eight), d);
        }
    }
}

static void q4_1(const fl_block_q4_1 *b, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi32(0xF);
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m256 d = _mm256_set1_ps(h2f(b[i].d)), m = _mm256_set1_ps(h2f(b[i].m));
        for (int h = 0; h < 16; h += 8) {
            const __m256i q = u8x8(b[i].qs + h);
            st_mul_add(y + h, _mm256_and_si256(q, m4), d, m);
            st_mul_add(y + 16 + h, _mm256_srli_epi32(q, 4), d, m);
        }
    }
}

/* the fifth bits of codes l0 .. l0 + 7 of a Q5 block as lanes of 0 or 16 */
INLINE __m256i q5_high(uint32_t qh, int l0) {
    const __m256i j = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(l0));
    return _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)qh), j), _mm256_set1_epi32(1)), 4);
}

static void q5_0(const fl_block_q5_0 *b, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi32(0xF), sixteen = _mm256_set1_epi32(16);
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m256 d = _mm256_set1_ps(h2f(b[i].d));
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        for (int h = 0; h < 16; h += 8) {
            const __m256i q = u8x8(b[i].qs + h);
            st_mul(y + h, _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(q, m4), q5_high(qh, h)), sixteen), d);
            st_mul(y + 16 + h, _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(q, 4), q5_high(qh, 16 + h)), sixteen), d);
        }
    }
}

static void q5_1(const fl_block_q5_1 *b, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi32(0xF);
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m256 d = _mm256_set1_ps(h2f(b[i].d)), m = _mm256_set1_ps(h2f(b[i].m));
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        for (int h = 0; h < 16; h += 8) {
            const __m256i q = u8x8(b[i].qs + h);
            st_mul_add(y + h, _mm256_or_si256(_mm256_and_si256(q, m4), q5_high(qh, h)), d, m);
            st_mul_add(y + 16 + h, _mm256_or_si256(_mm256_srli_epi32(q, 4), q5_high(qh, 16 + h)), d, m);
        }
    }
}

static void iq4_nl(const fl_block_iq4_nl *b, float *y, int64_t nb) {
    int32_t t[16];
    for (int j = 0; j < 16; j++) t[j] = fl_iq4nl_values[j];
    const __m256i m4 = _mm256_set1_epi32(0xF);
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m256 d = _mm256_set1_ps(h2f(b[i].d));
        for (int h = 0; h < 16; h += 8) {
            const __m256i q = u8x8(b[i].qs + h);
            const __m256 lo = _mm256_cvtepi32_ps(_mm256_i32gather_epi32(t, _mm256_and_si256(q, m4), 4));
            const __m256 hi = _mm256_cvtepi32_ps(_mm256_i32gather_epi32(t, _mm256_srli_epi32(q, 4), 4));
            _mm256_storeu_ps(y + h, _mm256_mul_ps(d, lo));
            _mm256_storeu_ps(y + 16 + h, _mm256_mul_ps(d, hi));
        }
    }
}

static void q4_K(const fl_block_q4_K *b, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi32(0xF);
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            uint8_t sc, m;
            fl_q4_K_scale_min(j, b[i].scales, &sc, &m);
            const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(dmin * m);
            fl_q4_K_scale_min(j + 1, b[i].scales, &sc, &m);
            const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(dmin * m);
            for (int l = 0; l < 32; l += 8) {
                const __m256i a = u8x8(q + l);
                st_dmul_sub(y + l, _mm256_and_si256(a, m4), d1, m1);
                st_dmul_sub(y + 32 + l, _mm256_srli_epi32(a, 4), d2, m2);
            }
        }
    }
}

static void q5_K(const fl_block_q5_K *b, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi32(0xF), one = _mm256_set1_epi32(1);
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t *ql = b[i].qs;
        for (int j = 0; j < 8; j += 2, ql += 32, y += 64) {
            uint8_t sc, m;
            fl_q4_K_scale_min(j, b[i].scales, &sc, &m);
            const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(dmin * m);
            fl_q4_K_scale_min(j + 1, b[i].scales, &sc, &m);
            const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(dmin * m);
            for (int l = 0; l < 32; l += 8) {
                const __m256i a = u8x8(ql + l), h = u8x8(b[i].qh + l);
                /* bit j of qh[l] is the fifth bit of code l of sub-block j: 16 when set */
                const __m256i b0 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, j), one), 4);
                const __m256i b1 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, j + 1), one), 4);
                st_dmul_sub(y + l, _mm256_add_epi32(_mm256_and_si256(a, m4), b0), d1, m1);
                st_dmul_sub(y + 32 + l, _mm256_add_epi32(_mm256_srli_epi32(a, 4), b1), d2, m2);
            }
        }
    }
}

static void q6_K(const fl_block_q6_K *b, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi32(0xF), m2 = _mm256_set1_epi32(3), k32 = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < nb; i++) {
        const __m256 d = _mm256_set1_ps(h2f(b[i].d));
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int n = 0; n < FL_QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l += 8) {
                const int is = l / 16;
                const __m256i a = u8x8(ql + l), c = u8x8(ql + l + 32), h = u8x8(qh + l);
                const __m256i q1 = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi32(_mm256_and_si256(h, m2), 4)), k32);
                const __m256i q2 = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(c, m4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2), m2), 4)), k32);
                const __m256i q3 = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 4), m2), 4)), k32);
                const __m256i q4 = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_slli_epi32(_mm256_srli_epi32(h, 6), 4)), k32);
                /* d * (float)sc * (float)q, left to right */
                _mm256_storeu_ps(y + l, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps((float)sc[is])), _mm256_cvtepi32_ps(q1)));
                _mm256_storeu_ps(y + l + 32, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps((float)sc[is + 2])), _mm256_cvtepi32_ps(q2)));
                _mm256_storeu_ps(y + l + 64, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps((float)sc[is + 4])), _mm256_cvtepi32_ps(q3)));
                _mm256_storeu_ps(y + l + 96, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps((float)sc[is + 6])), _mm256_cvtepi32_ps(q4)));
            }
    }
}

static void q2_K(const fl_block_q2_K *b, float *y, int64_t nb) {
    const __m256i m3 = _mm256_set1_epi32(3);
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t *q = b[i].qs;
        int is = 0;
        for (int n = 0; n < FL_QK_K; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int half = 0; half < 2; half++, y += 16) {
                    const uint8_t sc = b[i].scales[is++];
                    const __m256 dl = _mm256_set1_ps(d * (float)(sc & 0xF)), ml = _mm256_set1_ps(dmin * (float)(sc >> 4));
                    for (int h = 0; h < 16; h += 8) {
                        const __m256i c = _mm256_and_si256(_mm256_srli_epi32(u8x8(q + 16 * half + h), shift), m3);
                        st_dmul_sub(y + h, c, dl, ml);
                    }
                }
    }
}

static void q3_K(const fl_block_q3_K *b, float *y, int64_t nb) {
    const __m256i m3 = _mm256_set1_epi32(3), four = _mm256_set1_epi32(4), zero = _mm256_setzero_si256();
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
                    const __m256 dl = _mm256_set1_ps(d_all * (float)sc[is++]);
                    for (int h = 0; h < 16; h += 8) {
                        const __m256i c = _mm256_and_si256(_mm256_srli_epi32(u8x8(q + 16 * half + h), shift), m3);
                        const __m256i clear = _mm256_cmpeq_epi32(_mm256_and_si256(u8x8(b[i].hmask + 16 * half + h), _mm256_set1_epi32(m)), zero);
                        st_mul(y + h, _mm256_sub_epi32(c, _mm256_and_si256(clear, four)), dl);
                    }
                }
    }
}

void fl_dequant_row_avx2(int32_t type, const void *src, float *dst, int64_t K) {
    switch (type) {
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
