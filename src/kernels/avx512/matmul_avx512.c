/* AVX-512 VNNI integer tiles (Q8_0 / Q4_0 weights x 8-bit activations) and the f32 dot.
 *
 * One zmm holds two blocks of 32 codes.  vpdpbusd multiplies unsigned by signed bytes, so the
 * weights enter as unsigned: Q4_0 nibbles as they are (0..15, true code q - 8), Q8_0 codes
 * with the sign bit flipped (w + 128).  The offsets are removed for free by starting each
 * block's accumulator at -offset * (sum of the activation codes), spread over its 8 lanes
 * (fl_act_q8.sv).  Each block's int32 sum is converted once and scaled by d_w * d_x.
 * Leftover blocks use masked loads of a single block; reference: fl_gemm_q8_ref. */
#include "core/cpu.h"
#include "core/status.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/avx512/tile16w.h"
#include "kernels/avx512/fp8_512.h"

#include <immintrin.h>
#include <stddef.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

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

/* f32 dot for matmul's f32 path, in llama.cpp's (ggml's) summation order so that models
 * computed in f32 give its logits bit for bit more often (the f16 roundings of its attention
 * amplify one-ulp differences):
 *   n % 16 == 0: one 16-lane accumulator over k, then _mm512_reduce_add_ps (its tinyBLAS GEMM);
 *   otherwise: four accumulators over 64-element steps, added 0+2, 1+3, then together, reduced,
 *   then the last n % 64 products added one at a time: to an f32 sum for f32 rows
 *   (ggml_vec_dot_f32), to a double sum for rows of f16 values (ggml_vec_dot_f16, f16_rows). */
static inline float dot_ggml(const float *a, const float *b, int64_t n, bool f16_rows) {
    if (n % 16 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
        return _mm512_reduce_add_ps(acc);
    }
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    const int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    return fl_dot_tail_ggml(a, b, np, n, _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3))), f16_rows);
}

float fl_mm_dot_f32_avx512(const float *a, const float *b, int64_t n) { return dot_ggml(a, b, n, false); }
float fl_mm_dot_f16vals_avx512(const float *a, const float *b, int64_t n) { return dot_ggml(a, b, n, true); }

/* Four rows against one activation row: out[r] = dot_ggml(w[r], x, n) exactly (the same order
 * per row), with x loaded once per step for the four rows (n % 16 == 0). */
static void dot4_f32(const float *const *w, const float *x, int64_t n, float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 xv = _mm512_loadu_ps(x + i);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w[0] + i), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w[1] + i), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w[2] + i), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w[3] + i), xv, a3);
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
}

void fl_mm_rows_f32_avx512(const float *const *w, int nr, const float *x, int64_t M, int64_t K, float *y, int64_t ldy,
                           bool f16_rows) {
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * K;
        float *ym = y + m * ldy;
        int r = 0;
        if (K % 16 == 0)
            for (; r + 4 <= nr; r += 4) dot4_f32(w + r, xm, K, ym + r);
        for (; r < nr; r++) ym[r] = dot_ggml(w[r], xm, K, f16_rows);
    }
}

/* ---- F32 / F16 / BF16 / NF4 / FP8 weights read as they are (K % 16 == 0) ---- */

/* 16 weights of a row from k on (k % 16 == 0), as f32: F16, BF16 and F32 exactly; NF4 and FP8
 * as fl_dequant_row's scalar code computes them (quant.h's layouts: NF4 x = (gscale * sc) *
 * NF4[q], FP8 x = scale * e4m3(q), the same products in the same order). */
INLINE __m512 wrow_load(const int32_t wt, const char *row, int64_t k) {
    if (wt == FL_TYPE_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * k)));
    if (wt == FL_TYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * k))), 16));
    if (wt == FL_TYPE_FP8_E4M3) {
        float s;
        memcpy(&s, row, 4);
        return _mm512_mul_ps(_mm512_set1_ps(s), fl_fp8x16_to_f32((const uint8_t *)row + 4 + k, false, 0xFFFF));
    }
    if (wt == FL_TYPE_NF4) {
        const int64_t part = (k >> 4) & 3;
        float amax;
        const uint8_t *qs = fl_nf4_block(row, k >> 6, &amax);
        const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + (part & 1) * 16)));
        const __m512i q = part < 2 ? _mm512_and_si512(c, _mm512_set1_epi32(0xF)) : _mm512_srli_epi32(c, 4);
        return _mm512_mul_ps(_mm512_set1_ps(amax), _mm512_permutexvar_ps(q, _mm512_loadu_ps(fl_nf4_values)));
    }
    return _mm512_loadu_ps((const float *)row + k);
}

/* NR rows (row r at w + r ldw) x NT tokens over all of K, y[t ldy + r ys]: one 16-lane
 * accumulator per output over k, then _mm512_reduce_add_ps, dot4_f32's order (so the bits of the
 * converted rows' dots), each weight vector serving NT tokens and each activation vector NR rows. */
INLINE void wtile(const int32_t wt, const char *w, size_t ldw, const float *x, int64_t K, float *y, int64_t ldy, int64_t ys,
                  const int NR, const int NT) {
    __m512 acc[4][6];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    if (wt == FL_TYPE_NF4 && NT == 1) { /* (one token: a block's scale and codes once per row, its 4 vectors in k order) */
        const __m512 tab = _mm512_loadu_ps(fl_nf4_values);
        for (int64_t b = 0; b < K / 64; b++) {
            __m512 wv[4][4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                float a;
                const uint8_t *qs = fl_nf4_block(w + (size_t)r * ldw, b, &a);
                const __m512 amax = _mm512_set1_ps(a);
                const __m512i c0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
                const __m512i c1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16)));
                const __m512i m = _mm512_set1_epi32(0xF);
                wv[r][0] = _mm512_mul_ps(amax, _mm512_permutexvar_ps(_mm512_and_si512(c0, m), tab));
                wv[r][1] = _mm512_mul_ps(amax, _mm512_permutexvar_ps(_mm512_and_si512(c1, m), tab));
                wv[r][2] = _mm512_mul_ps(amax, _mm512_permutexvar_ps(_mm512_srli_epi32(c0, 4), tab));
                wv[r][3] = _mm512_mul_ps(amax, _mm512_permutexvar_ps(_mm512_srli_epi32(c1, 4), tab));
            }
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m512 xv = _mm512_loadu_ps(x + b * 64 + j * 16);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) acc[r][0] = _mm512_fmadd_ps(wv[r][j], xv, acc[r][0]);
            }
        }
    } else {
        for (int64_t k = 0; k < K; k += 16) {
            __m512 wv[4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) wv[r] = wrow_load(wt, w + (size_t)r * ldw, k);
#pragma GCC unroll 6
            for (int t = 0; t < NT; t++) {
                const __m512 xv = _mm512_loadu_ps(x + t * K + k);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) y[t * ldy + r * ys] = _mm512_reduce_add_ps(acc[r][t]);
}

typedef void (*wtile_fn)(const char *, size_t, const float *, int64_t, float *, int64_t, int64_t);
#define WT_ROW(T, nr) wt_##T##_##nr##_1, wt_##T##_##nr##_2, wt_##T##_##nr##_3, wt_##T##_##nr##_4, wt_##T##_##nr##_5, wt_##T##_##nr##_6
#define WT_DEF(T, type, nr, nt)                                                                                    \
    static void wt_##T##_##nr##_##nt(const char *w, size_t ldw, const float *x, int64_t K, float *y, int64_t ldy, int64_t ys) { \
        wtile(type, w, ldw, x, K, y, ldy, ys, nr, nt);                                                                        \
    }
#define WT_DEFS_NR(T, type, nr) \
    WT_DEF(T, type, nr, 1) WT_DEF(T, type, nr, 2) WT_DEF(T, type, nr, 3) WT_DEF(T, type, nr, 4) WT_DEF(T, type, nr, 5) WT_DEF(T, type, nr, 6)
#define WT_DEFS(T, type) WT_DEFS_NR(T, type, 1) WT_DEFS_NR(T, type, 2) WT_DEFS_NR(T, type, 3) WT_DEFS_NR(T, type, 4)
WT_DEFS(f32, FL_TYPE_F32)
WT_DEFS(f16, FL_TYPE_F16)
WT_DEFS(bf16, FL_TYPE_BF16)
WT_DEFS(nf4, FL_TYPE_NF4)
WT_DEFS(fp8, FL_TYPE_FP8_E4M3)
#define WT_TAB(T) {{WT_ROW(T, 1)}, {WT_ROW(T, 2)}, {WT_ROW(T, 3)}, {WT_ROW(T, 4)}}
static const wtile_fn wtiles[5][4][6] = {WT_TAB(f32), WT_TAB(f16), WT_TAB(bf16), WT_TAB(nf4), WT_TAB(fp8)};
#undef WT_TAB
#undef WT_ROW
#undef WT_DEF
#undef WT_DEFS_NR
#undef WT_DEFS

void fl_mm_wrows_avx512(int32_t wtype, const void *w, size_t ldw, int64_t nr, const float *x, int64_t M, int64_t K, float *y,
                        int64_t ldy) {
    const int ti = wtype == FL_TYPE_F32 ? 0 : wtype == FL_TYPE_F16 ? 1 : wtype == FL_TYPE_BF16 ? 2 : wtype == FL_TYPE_NF4 ? 3 : 4;
    FL_ASSERT(K % 16 == 0 && (ti < 4 || wtype == FL_TYPE_FP8_E4M3));
    const wtile_fn(*tab)[6] = wtiles[ti];
    if (M == 1) {
        /* Two rows at a time, one from each half of the range: two sequential streams far apart.
         * 8, 4 or 2 neighbouring rows (streams ldw apart) read memory slower, and one row at a
         * time (one stream, one fma chain) slower too: TinyLlama-shaped F16 decode, 2 Zen 4
         * threads, five alternated rounds, median GB/s: 8 rows 24.6, 1 row 25.2, two halves
         * 26.9; 1 row 25.8 against two halves 28.7 and four quarters 27.6.
         * Where x outgrows its share of L1 (FL_WROWS_X_L1), four rows at a time, one from each
         * quarter: x, reloaded from L2 once per row pair, cost the streams more than the four
         * streams cost.  2 Zen 4 threads, 24 streamed matrices alternated call by call (a
         * throwaway harness), GB/s halves / quarters: F16 2048 x 5632 25.9 / 28.6, 28.6 / 31.1,
         * BF16 24.9 / 27.2; F16 4096 x 4096 24.3 / 26.3; K 2048 even (docs/QUANT.md). */
        if (K * (int64_t)sizeof(float) > FL_WROWS_X_L1 && nr >= 4) {
            const int64_t q = nr / 4;
            for (int64_t r = 0; r < q; r++) tab[3][0]((const char *)w + (size_t)r * ldw, (size_t)q * ldw, x, K, y + r, 1, q);
            for (int64_t r = 4 * q; r < nr; r++) tab[0][0]((const char *)w + (size_t)r * ldw, ldw, x, K, y + r, 1, 1);
            return;
        }
        const int64_t h = nr / 2;
        for (int64_t r = 0; r < h; r++) tab[1][0]((const char *)w + (size_t)r * ldw, (size_t)h * ldw, x, K, y + r, 1, h);
        if (nr % 2) tab[0][0]((const char *)w + (size_t)(nr - 1) * ldw, ldw, x, K, y + nr - 1, 1, 1);
        return;
    }
    int64_t mc = FL_WROWS_CHUNK_BYTES / (K * (int64_t)sizeof(float)) / 6 * 6;
    if (mc < 6) mc = 6;
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        const int64_t mn = M - m0 < mc ? M - m0 : mc;
        for (int64_t r0 = 0; r0 < nr; r0 += 4) {
            const int nrr = nr - r0 < 4 ? (int)(nr - r0) : 4;
            const char *wr = (const char *)w + (size_t)r0 * ldw;
            for (int64_t t0 = 0; t0 < mn; t0 += 6) {
                const int nt = mn - t0 < 6 ? (int)(mn - t0) : 6;
                tab[nrr - 1][nt - 1](wr, ldw, x + (m0 + t0) * K, K, y + (m0 + t0) * ldy + r0, ldy, 1);
            }
        }
    }
}

INLINE void tile(const int32_t wtype, const char *w, size_t ldw, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy,
                 const int NR, const int NT) {
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    const int64_t nb = a->nb, K = a->K;
    const int shift = wtype == FL_TYPE_Q8_0 ? 4 : 0; /* offset 128 = 16 per lane x 8 lanes; 8 = 1 x 8 */
    int64_t b = 0;
    /* groups of 16 blocks: scales gathered once per row / loaded once per token; every
     * block's int32 sum starts at -offset * (activation code sum), so it is exact */
    const int bsz = wtype == FL_TYPE_Q8_0 ? 34 : 18;
    const __m512i vidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(bsz));
    for (; b + 16 <= nb; b += 16) {
        __m512 dw16[4], dx16[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            dw16[r] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(vidx, (const void *)(w + r * ldw + b * bsz), 1)));
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) dx16[t] = _mm512_loadu_ps(a->d + (m0 + t) * nb + b);
        for (int j = 0; j < 8; j++) {
            const __m512i pidx = _mm512_set_epi32(2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1,
                                                  2 * j + 1, 2 * j + 1, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j);
            __m512i xv[4], iv[4];
            __m512 dxp[4];
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                xv[t] = _mm512_loadu_si512(a->qs + (m0 + t) * K + (b + 2 * j) * 32);
                iv[t] = _mm512_slli_epi32(_mm512_loadu_si512(a->sv + ((m0 + t) * nb + b + 2 * j) * 8), shift);
                dxp[t] = _mm512_permutexvar_ps(pidx, dx16[t]);
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m512 unused;
                const __m512i wv = load_w(wtype, w + r * ldw, b + 2 * j, 0, &unused);
                const __m512 dwp = _mm512_permutexvar_ps(pidx, dw16[r]);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    const __m512i p = _mm512_dpbusd_epi32(iv[t], wv, xv[t]);
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dwp, dxp[t]), acc[r][t]);
                }
            }
        }
    }
    for (; b + 2 <= nb; b += 2) {
        __m512i xv[4], iv[4];
        __m512 dxv[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const int64_t mb = (m0 + t) * nb + b;
            xv[t] = _mm512_loadu_si512(a->qs + (m0 + t) * K + b * 32);
            dxv[t] = _mm512_loadu_ps(a->dv + mb * 8);
            iv[t] = _mm512_slli_epi32(_mm512_loadu_si512(a->sv + mb * 8), shift);
        }
        #pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m512 dw;
            const __m512i wv = load_w(wtype, w + r * ldw, b, 0, &dw);
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const __m512i p = _mm512_dpbusd_epi32(iv[t], wv, xv[t]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dxv[t]), acc[r][t]);
            }
        }
    }
    if (b < nb) { /* one block left */
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const int64_t mb = (m0 + t) * nb + b;
            const __m512i xv = _mm512_maskz_loadu_epi8(0xFFFFFFFFull, a->qs + (m0 + t) * K + b * 32);
            const __m512 dxv = _mm512_maskz_loadu_ps(0x00FF, a->dv + mb * 8);
            const __m512i iv = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(0x00FF, a->sv + mb * 8), shift);
            #pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m512 dw;
                const __m512i wv = load_w(wtype, w + r * ldw, b, 1, &dw);
                const __m512i p = _mm512_dpbusd_epi32(iv, wv, xv);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dxv), acc[r][t]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

/* One row (GEMV): groups of 16 blocks take their 16 f16 scales with one gather, so the
 * per-pair work is load/expand, vpdpbusd, convert, and one fma with the pair's scales picked
 * by a permute.  Each block's int32 sum starts at -offset * (activation code sum) (8 or 128;
 * fl_act_q8.sv shifted), so it is exact: removing the offset afterwards in f32 would cancel
 * 128-times-larger terms and lose digits (Q8_0). */
/* The GEMVs' software prefetch of `bytes` weight bytes at p: fl_gemv_pf_near bytes ahead into L1
 * and, where set, fl_gemv_pf_far ahead into L2 (kernels/matmul.h; rows are contiguous, so past
 * the row end this reads the next row; a prefetch never faults). */
INLINE void gemv_prefetch(const char *p, int bytes, int near) {
#ifndef FL_GEMV_NO_PREFETCH
    for (int l = 0; l < bytes; l += 64) _mm_prefetch(p + near + l, _MM_HINT_T0);
    const int far = fl_gemv_pf_far;
    if (far)
        for (int l = 0; l < bytes; l += 64) _mm_prefetch(p + far + l, _MM_HINT_T1);
#else
    (void)p, (void)bytes, (void)near;
#endif
}

/* The K-quant GEMVs prefetch each super-block at most 2048 bytes ahead into L1. */
#define KQ_PF_NEAR (fl_gemv_pf_near < 2048 ? fl_gemv_pf_near : 2048)

/* A GEMV's group of 16 blocks at wb (bsz bytes each, f16 scale first): its prefetch, then the 16
 * weight scales (one gather) times the activation scales. */
INLINE __m512 group_scales(const char *wb, int bsz, __m512i vidx, const float *dxb) {
    gemv_prefetch(wb, 16 * bsz, fl_gemv_pf_near);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(vidx, (const void *)wb, 1)));
    return _mm512_mul_ps(dw, _mm512_loadu_ps(dxb));
}

/* Blocks [b, nb) of one row (the part a GEMV's 16-block groups leave): pairs of blocks in one
 * zmm (exact int32 sums as below), then a last single block in scalar code. */
INLINE float gemv_tail(const int32_t wtype, const char *w, const fl_act_q8 *a, int64_t m, int64_t b) {
    const bool q8 = wtype == FL_TYPE_Q8_0;
    const int bsz = q8 ? 34 : 18, shift = q8 ? 4 : 0;
    const int64_t nb = a->nb;
    const float *dx = a->d + m * nb;
    __m512 acc = _mm512_setzero_ps();
    for (; b + 2 <= nb; b += 2) {
        __m512 dw;
        const __m512i wv = load_w(wtype, w, b, 0, &dw);
        const __m512i xv = _mm512_loadu_si512(a->qs + m * a->K + b * 32);
        const __m512i p = _mm512_dpbusd_epi32(_mm512_slli_epi32(_mm512_loadu_si512(a->sv + (m * nb + b) * 8), shift), wv, xv);
        const __m512 dxv = _mm512_insertf32x8(_mm512_set1_ps(dx[b]), _mm256_set1_ps(dx[b + 1]), 1);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dxv), acc);
    }
    float r = _mm512_reduce_add_ps(acc);
    if (b < nb) {
        const char *blk = w + b * bsz;
        uint16_t h;
        __builtin_memcpy(&h, blk, 2);
        const int8_t *x = a->qs + m * a->K + b * 32;
        int32_t is = 0;
        if (q8)
            for (int j = 0; j < 32; j++) is += ((const int8_t *)blk + 2)[j] * x[j];
        else
            for (int j = 0; j < 16; j++) {
                const uint8_t v = ((const uint8_t *)blk + 2)[j];
                is += ((v & 0xF) - 8) * x[j] + ((v >> 4) - 8) * x[j + 16];
            }
        r += _cvtsh_ss(h) * dx[b] * (float)is;
    }
    return r;
}

INLINE float gemv_row(const int32_t wtype, const char *w, const fl_act_q8 *a, int64_t m) {
    const bool q8 = wtype == FL_TYPE_Q8_0;
    const int bsz = q8 ? 34 : 18;
    const int64_t nb = a->nb;
    const int8_t *xq = a->qs + m * a->K;
    const float *dx = a->d + m * nb;
    const __m512i vidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(bsz));
    const __m512i m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    const int shift = q8 ? 4 : 0; /* 8 lanes x 16 = 128, 8 lanes x 1 = 8 */
    const int32_t *sv = a->sv + m * nb * 8;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        const char *wb = w + b * bsz;
        const __m512 sc = group_scales(wb, bsz, vidx, dx + b);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const char *p0 = wb + (2 * j) * bsz + 2, *p1 = p0 + bsz;
            __m512i wv;
            if (q8) {
                wv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                                        _mm256_loadu_si256((const __m256i *)p1), 1);
                wv = _mm512_xor_si512(wv, flip);
            } else {
                const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                                          _mm_loadu_si128((const __m128i *)p1), 1);
                const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
                wv = _mm512_and_si512(qq, m4);                          /* lo0 lo1 hi0 hi1 */
                wv = _mm512_shuffle_i64x2(wv, wv, _MM_SHUFFLE(3, 1, 2, 0)); /* lo0 hi0 lo1 hi1 */
            }
            const __m512i xv = _mm512_loadu_si512(xq + (b + 2 * j) * 32);
            const __m512i p = _mm512_dpbusd_epi32(_mm512_slli_epi32(_mm512_loadu_si512(sv + (b + 2 * j) * 8), shift), wv, xv);
            const __m512 s2 = _mm512_permutexvar_ps(_mm512_set_epi32(2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1,
                                                                     2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1,
                                                                     2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j), sc);
            if (j & 1) acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s2, acc1);
            else acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s2, acc0);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + (b < nb ? gemv_tail(wtype, w, a, m, b) : 0.0f);
}

static void gemv_q8(const char *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m, float *y) {
    for (int r = 0; r < nr; r++) y[r] = gemv_row(FL_TYPE_Q8_0, w + r * ldw, a, m);
}

/* Q4_0 GEMV with AVX-512 VBMI, on the activations in Q4_0 order (fl_act_q8.qs4): 4 blocks
 * (72 bytes) at a time, one two-source byte permute pulls their 64 code bytes out of the 18-byte
 * blocks; the low and high nibbles then meet the 4 first and the 4 second activation halves, two
 * vpdpbusd into one int32 sum whose lanes 4k..4k+3 belong to block k, one convert, and one fma
 * with the blocks' scales spread over 4 lanes each.  Per 4 blocks that is 2 shuffles and 7 other
 * vector operations, against 18 for the pairwise unpack above: Q4_0 decode stops being
 * compute-bound.  Each block's 4 lanes start at -2 * (its activation code sum) (fl_act_q8.sv4),
 * so the nibble offset 8 is removed exactly in int32. */
__attribute__((target("avx512vbmi"))) static float gemv_row_q4_vbmi(const char *w, const fl_act_q8 *a, int64_t m) {
    const int bsz = 18;
    const int64_t nb = a->nb;
    const int8_t *x4 = a->qs4 + m * a->K;
    const float *dx = a->d + m * nb;
    const int32_t *sv4 = a->sv4 + m * nb * 4;
    /* byte i of the group's codes: block i / 16, code byte i % 16, at 18 (i / 16) + 2 + i % 16;
     * blocks 0-2 come from the 64 bytes at the group start, block 3 from the 16 bytes at 56 */
    static const uint8_t ix[64] = {
        2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 20, 21, 22, 23, 24, 25,
        26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49,
        50, 51, 52, 53, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79};
    /* the 4 blocks' f16 scales (bytes 0-1, 18-19, 36-37, 54-55 of the same 64 bytes), as words
     * 4j .. 4j + 3 of the 16 blocks' scales: one merge-masked byte permute per 4 blocks instead
     * of a gather per 16 (the gather had cost about a fifth of the kernel with the weights in
     * L2) */
    static const uint8_t sx[64] = {0, 1, 18, 19, 36, 37, 54, 55, 0, 1, 18, 19, 36, 37, 54, 55,
                                   0, 1, 18, 19, 36, 37, 54, 55, 0, 1, 18, 19, 36, 37, 54, 55};
    const __m512i pidx = _mm512_loadu_si512(ix), sidx = _mm512_loadu_si512(sx);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        const char *wb = w + b * bsz;
        gemv_prefetch(wb, 16 * bsz, fl_gemv_pf_near);
        __m512i sw = _mm512_setzero_si512(), s[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const char *p = wb + j * 4 * bsz;
            const __m512i v0 = _mm512_loadu_si512(p);
            const __m512i v1 = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 56)));
            sw = _mm512_mask_permutexvar_epi8(sw, (__mmask64)0xFFull << (8 * j), sidx, v0);
            const __m512i q = _mm512_permutex2var_epi8(v0, pidx, v1);
            const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            const int8_t *xg = x4 + (b + 4 * j) * 32;
            s[j] = _mm512_dpbusd_epi32(_mm512_loadu_si512(sv4 + (b + 4 * j) * 4), lo, _mm512_loadu_si512(xg));
            s[j] = _mm512_dpbusd_epi32(s[j], hi, _mm512_loadu_si512(xg + 64));
        }
        const __m512 sc = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(sw)), _mm512_loadu_ps(dx + b));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m512 s4 = _mm512_permutexvar_ps(
                _mm512_set_epi32(4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 2,
                                 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j, 4 * j, 4 * j, 4 * j), sc);
            if (j & 1) acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[j]), s4, acc1);
            else acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[j]), s4, acc0);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + (b < nb ? gemv_tail(FL_TYPE_Q4_0, w, a, m, b) : 0.0f);
}

static void gemv_q4(const char *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m, float *y) {
    if (fl_cpu()->avx512vbmi && a->qs4)
        for (int r = 0; r < nr; r++) y[r] = gemv_row_q4_vbmi(w + r * ldw, a, m);
    else
        for (int r = 0; r < nr; r++) y[r] = gemv_row(FL_TYPE_Q4_0, w + r * ldw, a, m);
}

/* Q4_K / Q5_K row (GEMV) with the 8-bit activations in blocks of 32, one per sub-block (Q5_K:
 * the fifth bits from qh[l], bit j for sub-block j, shifted per 256-bit half and or'd in as 16).  Per
 * super-block: the 6-bit scales and mins unpacked with 32-bit masks (sub-blocks 0-3 in the low
 * 6 bits of bytes 0-7, 4-7 split over bytes 8-11 and the top bits of 0-7), 8 scales
 * (d sc_j) d_x in one vector; the 128 code bytes as two zmm, whose low nibbles hold sub-blocks
 * 0 and 2 (then 4 and 6) and high nibbles 1 and 3 (5 and 7), so each vpdpbusd takes the
 * activation halves of two sub-blocks; the mins term dmin m_j d_x s_j is one 8-lane fma per
 * super-block.  Codes are unsigned 0..15, so no offset. */
INLINE float gemv_row_k4(const char *w, const fl_act_q8 *a, int64_t m, const bool Q5) {
    /* Q4_K and Q5_K share d, dmin and scales at the start; Q5_K's qh[32] comes before its qs */
    const size_t bsz = Q5 ? sizeof(fl_block_q5_K) : sizeof(fl_block_q4_K);
    const size_t qs_off = Q5 ? offsetof(fl_block_q5_K, qs) : offsetof(fl_block_q4_K, qs);
    const __m512i one = _mm512_set1_epi8(1);
    /* per 256-bit half, the qh bit of each nibble vector: low / high nibbles of qs[0..63] hold
     * sub-blocks 0, 2 / 1, 3, of qs[64..127] 4, 6 / 5, 7 */
    const __m512i sh02 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    const __m512i sh13 = _mm512_inserti64x4(_mm512_set1_epi16(1), _mm256_set1_epi16(3), 1);
    const __m512i sh46 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    const __m512i sh57 = _mm512_inserti64x4(_mm512_set1_epi16(5), _mm256_set1_epi16(7), 1);
    const int64_t nsb = a->K / FL_QK_K;
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    const int32_t *sx = a->s + m * a->nb;
    const __m512i m4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
    const __m512i i02 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    const __m512i i13 = _mm512_add_epi32(i02, _mm512_set1_epi32(1)), i46 = _mm512_add_epi32(i02, _mm512_set1_epi32(4));
    const __m512i i57 = _mm512_add_epi32(i02, _mm512_set1_epi32(5));
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m256 mins = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const fl_block_q4_K *b = (const fl_block_q4_K *)(w + (size_t)i * bsz); /* d, dmin, scales */
        gemv_prefetch((const char *)b, 192, KQ_PF_NEAR);
        uint8_t sc[8], mn[8];
        fl_k4_scale_min_bytes(b->scales, sc, mn);
        const __m128i scv = _mm_loadl_epi64((const __m128i *)sc), mnv = _mm_loadl_epi64((const __m128i *)mn);
        const __m256 dx8 = _mm256_loadu_ps(dx + i * 8);
        const __m256 scf = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(scv))), dx8);
        const __m256 mnf = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->dmin)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mnv)));
        mins = _mm256_fmadd_ps(mnf, _mm256_mul_ps(dx8, _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(sx + i * 8)))), mins);
        const __m512 s512 = _mm512_castps256_ps512(scf);
        const uint8_t *qs = (const uint8_t *)b + qs_off;
        const __m512i v0 = _mm512_loadu_si512(qs), v1 = _mm512_loadu_si512(qs + 64);
        __m512i h02 = zero, h13 = zero, h46 = zero, h57 = zero; /* the fifth bits (Q5_K), as 16 */
        if (Q5) {
            const __m512i hz = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)((const fl_block_q5_K *)b)->qh));
            h02 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hz, sh02), one), 4);
            h13 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hz, sh13), one), 4);
            h46 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hz, sh46), one), 4);
            h57 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hz, sh57), one), 4);
        }
        const int8_t *xb = x + i * FL_QK_K;
#define XPAIR(o1, o2) _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(xb + (o1)))), \
                                         _mm256_loadu_si256((const __m256i *)(xb + (o2))), 1)
        const __m512i p02 = _mm512_dpbusd_epi32(zero, _mm512_or_si512(_mm512_and_si512(v0, m4), h02), XPAIR(0, 64));
        const __m512i p13 = _mm512_dpbusd_epi32(zero, _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), m4), h13), XPAIR(32, 96));
        const __m512i p46 = _mm512_dpbusd_epi32(zero, _mm512_or_si512(_mm512_and_si512(v1, m4), h46), XPAIR(128, 192));
        const __m512i p57 = _mm512_dpbusd_epi32(zero, _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), m4), h57), XPAIR(160, 224));
#undef XPAIR
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p02), _mm512_permutexvar_ps(i02, s512), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p13), _mm512_permutexvar_ps(i13, s512), acc1);
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p46), _mm512_permutexvar_ps(i46, s512), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p57), _mm512_permutexvar_ps(i57, s512), acc1);
    }
    const __m128 mh = _mm_add_ps(_mm256_castps256_ps128(mins), _mm256_extractf128_ps(mins, 1));
    const float msum = _mm_cvtss_f32(_mm_add_ss(_mm_add_ps(mh, _mm_movehl_ps(mh, mh)), _mm_movehdup_ps(_mm_add_ps(mh, _mm_movehl_ps(mh, mh)))));
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) - msum;
}

static float gemv_row_q4_K(const char *w, const fl_act_q8 *a, int64_t m) { return gemv_row_k4(w, a, m, false); }
static float gemv_row_q5_K(const char *w, const fl_act_q8 *a, int64_t m) { return gemv_row_k4(w, a, m, true); }

/* What the Q2_K / Q3_K GEMVs need of one token per super-block, computed once per call instead
 * of once per row: ext[i][j] = d_x of 16-code sub-block j (its block of 32's scale) and
 * ext[i][16 + j] = d_x * (the sum of its 16 codes), for super-blocks i0 .. i1 - 1. */
#define KQ_EXT_SB 64 /* super-blocks per pass: 8 KiB of ext on the stack */
static void kq_ext(const fl_act_q8 *a, int64_t m, int64_t i0, int64_t i1, float *ext) {
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    const __m512i idx2 = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int64_t i = i0; i < i1; i++) {
        float *e = ext + (i - i0) * 32;
        const __m512 d16 = _mm512_permutexvar_ps(idx2, _mm512_castps256_ps512(_mm256_loadu_ps(dx + i * 8)));
        int32_t s16[16];
        for (int j = 0; j < 16; j++)
            s16[j] = _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(x + i * FL_QK_K + 16 * j))));
        _mm512_storeu_ps(e, d16);
        _mm512_storeu_ps(e + 16, _mm512_mul_ps(d16, _mm512_cvtepi32_ps(_mm512_loadu_si512(s16))));
    }
}

/* The per-s activation pair of a super-block: groups s (codes 32s .. 32s + 31) and 4 + s. */
INLINE __m512i kq_xpair(const int8_t *xb, int s) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(xb + 32 * s))),
                              _mm256_loadu_si256((const __m256i *)(xb + 128 + 32 * s)), 1);
}

/* vpdpbusd lanes 4k .. 4k + 3 of group pair s: sub-blocks 2s, 2s + 1, 8 + 2s, 9 + 2s. */
INLINE __m512i kq_sidx(int s) {
    return _mm512_setr_epi32(2 * s, 2 * s, 2 * s, 2 * s, 2 * s + 1, 2 * s + 1, 2 * s + 1, 2 * s + 1, 8 + 2 * s, 8 + 2 * s,
                             8 + 2 * s, 8 + 2 * s, 9 + 2 * s, 9 + 2 * s, 9 + 2 * s, 9 + 2 * s);
}

/* Q3_K row (GEMV), 8-bit activations in blocks of 32, super-blocks i0 .. i1 - 1 (ext from
 * kq_ext).  Per super-block the 16 6-bit signed scales are unpacked with 64-bit masks and
 * converted once (times d, times each sub-block's d_x from ext); per s = 0..3 one zmm of qs
 * holds groups s (bytes 0..31) and 4 + s (32..63): bits 2s are their two low code bits, and
 * hmask (both halves) shifted by s / 4 + s gives the third, so codes are 0..7 unsigned.  The
 * -4 is applied once per super-block: -4 * sum_j d sc_j (d_x sum_j x). */
INLINE float gemv_row_q3_K(const char *w, const fl_act_q8 *a, int64_t m, const float *ext, int64_t i0, int64_t i1) {
    const fl_block_q3_K *blk = (const fl_block_q3_K *)w;
    const int8_t *x = a->qs + m * a->K;
    const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), off = _mm512_setzero_ps();
    for (int64_t i = i0; i < i1; i++) {
        const fl_block_q3_K *b = blk + i;
        const float *e = ext + (i - i0) * 32;
        gemv_prefetch((const char *)b, 128, KQ_PF_NEAR);
        uint64_t lo8;
        uint32_t h4;
        memcpy(&lo8, b->scales, 8);
        memcpy(&h4, b->scales + 8, 4);
        /* scale j: low 4 bits from byte j (j < 8) or the high nibble of byte j - 8; high 2 bits
         * from byte 8 + (j & 3) at bit 2 (j >> 2) */
        const uint64_t hi0 = (uint64_t)(h4 & 0x03030303u) | ((uint64_t)((h4 >> 2) & 0x03030303u) << 32);
        const uint64_t hi1 = (uint64_t)((h4 >> 4) & 0x03030303u) | ((uint64_t)((h4 >> 6) & 0x03030303u) << 32);
        const uint64_t s0 = (lo8 & 0x0F0F0F0F0F0F0F0Full) | (hi0 << 4), s1 = ((lo8 >> 4) & 0x0F0F0F0F0F0F0F0Full) | (hi1 << 4);
        const __m128i scb = _mm_sub_epi8(_mm_set_epi64x((long long)s1, (long long)s0), _mm_set1_epi8(32));
        const __m512 sc16 = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b->d)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scb)));
        const __m512 scx = _mm512_mul_ps(sc16, _mm512_loadu_ps(e));
        off = _mm512_fmadd_ps(sc16, _mm512_loadu_ps(e + 16), off);
        const __m512i q = _mm512_loadu_si512(b->qs);
        const __m512i hz = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->hmask));
        const int8_t *xb = x + i * FL_QK_K;
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
            const __m512i hsh = _mm512_inserti64x4(_mm512_set1_epi16((short)s), _mm256_set1_epi16((short)(4 + s)), 1);
            const __m512i u = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 2 * s), m3),
                                              _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hz, hsh), one), 2));
            const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, u, kq_xpair(xb, s)));
            if (s & 1) acc1 = _mm512_fmadd_ps(p, _mm512_permutexvar_ps(kq_sidx(s), scx), acc1);
            else acc0 = _mm512_fmadd_ps(p, _mm512_permutexvar_ps(kq_sidx(s), scx), acc0);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) - 4.0f * _mm512_reduce_add_ps(off);
}

/* Q2_K row (GEMV), super-blocks i0 .. i1 - 1: as the Q3_K kernel without the third bit (codes
 * 0..3, no offset); the mins once per super-block: sum_j dmin m_j (d_x sum_j x), subtracted. */
INLINE float gemv_row_q2_K(const char *w, const fl_act_q8 *a, int64_t m, const float *ext, int64_t i0, int64_t i1) {
    const fl_block_q2_K *blk = (const fl_block_q2_K *)w;
    const int8_t *x = a->qs + m * a->K;
    const __m512i m3 = _mm512_set1_epi8(3), zero = _mm512_setzero_si512();
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), mins = _mm512_setzero_ps();
    for (int64_t i = i0; i < i1; i++) {
        const fl_block_q2_K *b = blk + i;
        const float *e = ext + (i - i0) * 32;
        gemv_prefetch((const char *)b, 128, KQ_PF_NEAR);
        const __m128i sb = _mm_loadu_si128((const __m128i *)b->scales);
        const __m512 sc16 = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b->d)), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(sb, m4))));
        const __m512 mn16 = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b->dmin)),
                                          _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(sb, 4), m4))));
        const __m512 scx = _mm512_mul_ps(sc16, _mm512_loadu_ps(e));
        mins = _mm512_fmadd_ps(mn16, _mm512_loadu_ps(e + 16), mins);
        const __m512i q = _mm512_loadu_si512(b->qs);
        const int8_t *xb = x + i * FL_QK_K;
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) { /* groups s (bytes 0..31 of qs) and 4 + s (32..63) */
            const __m512i u = _mm512_and_si512(_mm512_srli_epi16(q, 2 * s), m3);
            const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, u, kq_xpair(xb, s)));
            if (s & 1) acc1 = _mm512_fmadd_ps(p, _mm512_permutexvar_ps(kq_sidx(s), scx), acc1);
            else acc0 = _mm512_fmadd_ps(p, _mm512_permutexvar_ps(kq_sidx(s), scx), acc0);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) - _mm512_reduce_add_ps(mins);
}

/* Rows of Q2_K / Q3_K for token m: KQ_EXT_SB super-blocks at a time (one pass for K <= 16384),
 * each pass's partial dot added to y. */
static void gemv_kq23(const int32_t wtype, const char *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m, float *y) {
    float ext[KQ_EXT_SB * 32];
    const int64_t nsb = a->K / FL_QK_K;
    for (int64_t i0 = 0; i0 < nsb; i0 += KQ_EXT_SB) {
        const int64_t i1 = nsb - i0 < KQ_EXT_SB ? nsb : i0 + KQ_EXT_SB;
        kq_ext(a, m, i0, i1, ext);
        for (int r = 0; r < nr; r++) {
            const float v = wtype == FL_TYPE_Q3_K ? gemv_row_q3_K(w + r * ldw, a, m, ext, i0, i1)
                                                  : gemv_row_q2_K(w + r * ldw, a, m, ext, i0, i1);
            y[r] = i0 ? y[r] + v : v;
        }
    }
}

/* Q4_1 / Q5_0 / Q5_1 / IQ4_NL row (GEMV), two blocks per zmm: the codes as 64 unsigned bytes
 * (nibbles; Q5_x's fifth bits from the two 32-bit qh words as a 64-bit byte mask; IQ4_NL's table
 * values by a byte shuffle, + 128), one vpdpbusd from -offset * (activation code sum) (Q5_0 16,
 * IQ4_NL 128), one fma with the blocks' d_w d_x; Q4_1 / Q5_1 add m d_x s per block. */
INLINE float gemv_row_b32(const int32_t wtype, const char *w, const fl_act_q8 *a, int64_t m) {
    const int bsz = wtype == FL_TYPE_Q4_1 ? 20 : wtype == FL_TYPE_Q5_0 ? 22 : wtype == FL_TYPE_Q5_1 ? 24 : 18;
    const int qs_off = wtype == FL_TYPE_Q4_1 ? 4 : wtype == FL_TYPE_Q5_0 ? 6 : wtype == FL_TYPE_Q5_1 ? 8 : 2;
    const int qh_off = wtype == FL_TYPE_Q5_0 ? 2 : 4;
    const bool q5 = wtype == FL_TYPE_Q5_0 || wtype == FL_TYPE_Q5_1, mins = wtype == FL_TYPE_Q4_1 || wtype == FL_TYPE_Q5_1;
    const int shift = wtype == FL_TYPE_Q5_0 ? 1 : wtype == FL_TYPE_IQ4_NL ? 4 : -1; /* 8 lanes x 2^shift = 16 / 128 */
    const int64_t nb = a->nb;
    const int8_t *xq = a->qs + m * a->K;
    const float *dx = a->d + m * nb;
    const int32_t *sv = a->sv + m * nb * 8, *sx = a->s + m * nb;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)fl_iq4nl_values));
    const __m512i flip = _mm512_set1_epi8((char)0x80), k16 = _mm512_set1_epi8(16);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    float msum = 0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const char *p0 = w + b * bsz, *p1 = p0 + bsz;
        gemv_prefetch(p0, 64, fl_gemv_pf_near);
        const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + qs_off))),
                                                  _mm_loadu_si128((const __m128i *)(p1 + qs_off)), 1);
        __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(q, m4)), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4), 1);
        v = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0)); /* lo0 hi0 lo1 hi1: x order */
        if (q5) {
            uint32_t h0, h1;
            memcpy(&h0, p0 + qh_off, 4);
            memcpy(&h1, p1 + qh_off, 4);
            v = _mm512_mask_add_epi8(v, (__mmask64)h0 | ((__mmask64)h1 << 32), v, k16);
        } else if (wtype == FL_TYPE_IQ4_NL)
            v = _mm512_xor_si512(_mm512_shuffle_epi8(tab, v), flip);
        const __m512i init = shift >= 0 ? _mm512_slli_epi32(_mm512_loadu_si512(sv + b * 8), shift) : _mm512_setzero_si512();
        const __m512i p = _mm512_dpbusd_epi32(init, v, _mm512_loadu_si512(xq + b * 32));
        uint16_t d0, d1;
        memcpy(&d0, p0, 2);
        memcpy(&d1, p1, 2);
        const __m512 s = _mm512_insertf32x8(_mm512_set1_ps(_cvtsh_ss(d0) * dx[b]), _mm256_set1_ps(_cvtsh_ss(d1) * dx[b + 1]), 1);
        if (b & 2) acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc1);
        else acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc0);
        if (mins) {
            uint16_t m0, m1;
            memcpy(&m0, p0 + 2, 2);
            memcpy(&m1, p1 + 2, 2);
            msum += _cvtsh_ss(m0) * dx[b] * (float)sx[b] + _cvtsh_ss(m1) * dx[b + 1] * (float)sx[b + 1];
        }
    }
    float r = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + msum;
    if (b < nb) { /* a last single block */
        int c[32];
        float d0, m0;
        fl_b32_block_codes(wtype, w + b * bsz, c, &d0, &m0);
        int32_t is = 0;
        for (int j = 0; j < 32; j++) is += c[j] * xq[b * 32 + j];
        r += d0 * dx[b] * (float)is + m0 * dx[b] * (float)sx[b];
    }
    return r;
}

/* Q6_K row (GEMV), 8-bit activations in blocks of 32.  Per 128 codes (64 ql + 32 qh bytes):
 * the low nibbles of ql[0..63] are codes 0..63 in order and the high nibbles codes 64..127;
 * their two high bits come from qh shifted per 256-bit half (a variable word shift); codes are
 * then 0..63 unsigned, and the -32 offset is a second vpdpbusd of the constant 32 against the
 * same activations.  vpdpbusd lanes 4k..4k+3 are one 16-code sub-block, so the scale vector is
 * d sc_j spread over 4 lanes times the activation scale of its 32-block. */
INLINE float gemv_row_q6_K(const char *w, const fl_act_q8 *a, int64_t m) {
    const fl_block_q6_K *blk = (const fl_block_q6_K *)w;
    const int64_t nsb = a->K / FL_QK_K;
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), c32 = _mm512_set1_epi8(32), zero = _mm512_setzero_si512();
    /* per 16-bit word: low half shifted by 4 / high half by 2 (left), or 0 / 2 (right) */
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i sidx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i didx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const fl_block_q6_K *b = blk + i;
        gemv_prefetch((const char *)b, 256, KQ_PF_NEAR);
        const __m512 sc16 = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b->d)),
                                          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->scales))));
        const __m512 dx8 = _mm512_castps256_ps512(_mm256_loadu_ps(dx + i * 8));
        const int8_t *xb = x + i * FL_QK_K;
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) {
            const __m512i ql = _mm512_loadu_si512(b->ql + 64 * c);
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * c)));
            const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
            const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i xv = _mm512_loadu_si512(xb + 128 * c + 64 * h);
                const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, h ? q23 : q01, xv), _mm512_dpbusd_epi32(zero, c32, xv));
                const int j0 = 8 * c + 4 * h, b0 = 4 * c + 2 * h; /* first scale, first 32-block */
                const __m512 scale = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_add_epi32(sidx, _mm512_set1_epi32(j0)), sc16),
                                                   _mm512_permutexvar_ps(_mm512_add_epi32(didx, _mm512_set1_epi32(b0)), dx8));
                if (h) acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc1);
                else acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc0);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

#define DEFINE_TILES(WT, sfx)                                                                              \
    static void tile4x4_##sfx(const char *w, size_t ldw, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy) { \
        tile(WT, w, ldw, a, m0, y, ldy, 4, 4);                                                              \
    }                                                                                                       \
    static void tile1x1_##sfx(const char *w, size_t ldw, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy) { \
        tile(WT, w, ldw, a, m0, y, ldy, 1, 1);                                                              \
    }
DEFINE_TILES(FL_TYPE_Q8_0, q8)
DEFINE_TILES(FL_TYPE_Q4_0, q4)

void fl_gemm_q8_avx512(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt,
                       float *y, int64_t ldy) {
    const char *wc = w;
    const bool q8 = wtype == FL_TYPE_Q8_0;
    if (fl_k16_type(wtype)) { /* (kernels/avx512/k16_avx512.c) */
        fl_k16_gemm_avx512(wtype, w, ldw, nr, a, m0, nt, y, ldy);
        return;
    }
    if (fl_r8_base(wtype) >= 0) { /* (kernels/avx512/r8_avx512.c) */
        fl_r8_gemm_avx512(wtype, w, ldw, nr, a, m0, nt, y, ldy);
        return;
    }
    if (wtype == FL_TYPE_Q4_1 || wtype == FL_TYPE_Q5_0 || wtype == FL_TYPE_Q5_1 || wtype == FL_TYPE_IQ4_NL) {
        for (int t = 0; t < nt; t++) /* one-token steps (fl_matmul) */
            for (int r = 0; r < nr; r++) y[t * ldy + r] = gemv_row_b32(wtype, wc + r * ldw, a, m0 + t);
        return;
    }
    if (wtype == FL_TYPE_Q3_K || wtype == FL_TYPE_Q2_K) { /* one-token steps */
        for (int t = 0; t < nt; t++) gemv_kq23(wtype, wc, ldw, nr, a, m0 + t, y + t * ldy);
        return;
    }
    if (wtype == FL_TYPE_Q4_K || wtype == FL_TYPE_Q5_K || wtype == FL_TYPE_Q6_K) {
        float (*row)(const char *, const fl_act_q8 *, int64_t) = /* one-token steps */
            wtype == FL_TYPE_Q4_K ? gemv_row_q4_K : wtype == FL_TYPE_Q5_K ? gemv_row_q5_K : gemv_row_q6_K;
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < nr; r++) y[t * ldy + r] = row(wc + r * ldw, a, m0 + t);
        return;
    }
    if (nr == 4 && nt == 4) (q8 ? tile4x4_q8 : tile4x4_q4)(wc, ldw, a, m0, y, ldy);
    else if (nt == 1) (q8 ? gemv_q8 : gemv_q4)(wc, ldw, nr, a, m0, y);
    else
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++) (q8 ? tile1x1_q8 : tile1x1_q4)(wc + r * ldw, ldw, a, m0 + t, y + t * ldy + r, ldy);
}

/* ---- 8-bit activations (reference: fl_act_q8_quantize_row) ---- */

/* Sixteen vectors reduced to one, lane i holding v[i]'s reduction (max or add: the order of the
 * terms differs from a lane-by-lane tree, so only for exact operations).  Four levels, each
 * pairing halves of two vectors: 256-bit halves, 128-bit quarters, then pairs and single lanes
 * within each quarter; lane 4L + e ends with v[4e + L], which one permute puts in order. */
#define R16_LEVELS(OP)                                                                                                     \
    for (int i = 0; i < 8; i++)                                                                                            \
        v[i] = OP(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE)); \
    for (int i = 0; i < 4; i++)                                                                                            \
        v[i] = OP(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD)); \
    for (int i = 0; i < 2; i++)                                                                                            \
        v[i] = OP(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0xEE));       \
    v[0] = OP(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
static inline __m512i r16_order(void) { return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15); }
static inline __m512 r16_max_ps(__m512 *v) {
    R16_LEVELS(_mm512_max_ps)
    return _mm512_permutexvar_ps(r16_order(), v[0]);
}
#define ADD_AS_PS(a, b) _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)))
static inline __m512i r16_add_epi32(__m512 *v) {
    R16_LEVELS(ADD_AS_PS)
    return _mm512_permutexvar_epi32(r16_order(), _mm512_castps_si512(v[0]));
}
#undef ADD_AS_PS
#undef R16_LEVELS

/* Blocks [b, b + 16) of a row (the lean fields: all false): the sixteen scales and code sums as
 * vectors.  The same bits as one block at a time (below): the max and the integer sums are
 * exact in any order, and d, 127 / amax and the codes are the same per-lane operations.  One
 * block at a time had each block's max, two scalar divisions and its sum in one dependency
 * chain.  A throwaway microbenchmark (one thread, in cache, the previous build alternated):
 * one token's rows 9.2-9.5 -> 4.1-4.9 ns a block, 16 tokens into the records 9.4-9.8 -> 5.5-5.6.
 * Inside fl_matmul (16 and 512 tokens) the quantization waits on x coming from L2 / L3, and
 * the whole call measured the same within the noise. */
static void quant16_blocks(fl_act_q8 *a, int64_t m, const float *x, int64_t b, bool rows, char *g, int64_t t) {
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    __m512 v[16];
    for (int i = 0; i < 16; i++)
        v[i] = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(x + (b + i) * 32), absmask), _mm512_and_ps(_mm512_loadu_ps(x + (b + i) * 32 + 16), absmask));
    const __m512 amax = r16_max_ps(v);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_div_ps(amax, _mm512_set1_ps(127.0f)), _MM_FROUND_TO_NEAREST_INT));
    const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(127.0f), amax);
    float idv[16] __attribute__((aligned(64)));
    _mm512_store_ps(idv, id);
    int8_t *q = a->qs + m * a->K + b * 32;
    for (int i = 0; i < 16; i++) {
        const __m512 vid = _mm512_set1_ps(idv[i]);
        __m512i c0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + (b + i) * 32), vid));
        __m512i c1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + (b + i) * 32 + 16), vid));
        c0 = _mm512_min_epi32(_mm512_max_epi32(c0, lo), hi);
        c1 = _mm512_min_epi32(_mm512_max_epi32(c1, lo), hi);
        const __m256i codes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(c0)), _mm512_cvtepi32_epi8(c1), 1);
        if (rows) _mm256_storeu_si256((__m256i *)(q + i * 32), codes);
        if (g) _mm256_storeu_si256((__m256i *)(g + (size_t)(b + i) * FL_ACT16_REC + t * 32), codes);
        v[i] = _mm512_castsi512_ps(_mm512_add_epi32(c0, c1));
    }
    const __m512i sum = r16_add_epi32(v);
    const __m512 ms = _mm512_mul_ps(_mm512_xor_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(-0.0f)), d); /* -(float)s x d (-0 for s 0) */
    if (rows) {
        const int64_t i0 = m * a->nb + b;
        _mm512_storeu_ps(a->d + i0, d);
        _mm512_storeu_si512(a->s + i0, sum);
        _mm512_storeu_ps(a->ms + i0, ms);
    }
    if (g) { /* each block's record: -8 s, -128 s, d, ms at token t */
        int32_t f8[16] __attribute__((aligned(64))), f128[16] __attribute__((aligned(64)));
        float fd[16] __attribute__((aligned(64))), fms[16] __attribute__((aligned(64)));
        const __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(), sum);
        _mm512_store_si512(f8, _mm512_slli_epi32(neg, 3));
        _mm512_store_si512(f128, _mm512_slli_epi32(neg, 7));
        _mm512_store_ps(fd, d);
        _mm512_store_ps(fms, ms);
        for (int i = 0; i < 16; i++) {
            int32_t *f = (int32_t *)(g + (size_t)(b + i) * FL_ACT16_REC + FL_ACT16_CODES);
            f[t] = f8[i];
            f[FL_ACT16_TOKENS + t] = f128[i];
            memcpy(&f[2 * FL_ACT16_TOKENS + t], &fd[i], 4);
            memcpy(&f[3 * FL_ACT16_TOKENS + t], &fms[i], 4);
        }
    }
}

void fl_act_q8_quantize_blocks_avx512(fl_act_q8 *a, int64_t m, const float *x, int64_t b0, int64_t b1, bool all, bool rows,
                                      void *act16) {
    int8_t *q = a->qs + m * a->K;
    const int64_t nb = a->nb, t = m % FL_ACT16_TOKENS;
    char *g = act16 ? (char *)act16 + (size_t)(m / FL_ACT16_TOKENS) * (size_t)nb * FL_ACT16_REC : NULL;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    FL_ASSERT(rows || g);
    if (!all)
        for (; b0 + 16 <= b1; b0 += 16) quant16_blocks(a, m, x, b0, rows, g, t);
    for (int64_t b = b0; b < b1; b++) {
        const __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(x0, absmask), _mm512_and_ps(x1, absmask)));
        const float d = _cvtsh_ss(_cvtss_sh(amax / 127, _MM_FROUND_TO_NEAREST_INT)), id = amax > 0 ? 127.0f / amax : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        __m512i c0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), c1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
        c0 = _mm512_min_epi32(_mm512_max_epi32(c0, lo), hi);
        c1 = _mm512_min_epi32(_mm512_max_epi32(c1, lo), hi);
        const __m256i codes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(c0)), _mm512_cvtepi32_epi8(c1), 1);
        if (rows) _mm256_storeu_si256((__m256i *)(q + b * 32), codes);
        /* per half of the block, the code sums at k % 4 < 2 and >= 2 (o4 / o6, the AVX2 tiles'
         * int16 starts; the reference's loop over them cost 5% of a 512-token prefill) */
        const __m256i h0 = _mm256_add_epi32(_mm512_castsi512_si256(c0), _mm512_extracti64x4_epi64(c0, 1));
        const __m256i h1 = _mm256_add_epi32(_mm512_castsi512_si256(c1), _mm512_extracti64x4_epi64(c1, 1));
        const __m128i q0 = _mm_add_epi32(_mm256_castsi256_si128(h0), _mm256_extracti128_si256(h0, 1));
        const __m128i q1 = _mm_add_epi32(_mm256_castsi256_si128(h1), _mm256_extracti128_si256(h1, 1));
        int32_t hs[4]; /* first half k % 4 < 2, >= 2, second half the same */
        _mm_storeu_si128((__m128i *)hs, _mm_hadd_epi32(q0, q1));
        const int64_t i = m * nb + b;
        const int32_t sum = hs[0] + hs[1] + hs[2] + hs[3];
        if (rows && all) {
            fl_act_q8_set_block(a, i, d, sum);
            a->o4[i] = (int32_t)(((uint32_t)(uint16_t)(int16_t)(-8 * (hs[1] + hs[3])) << 16) | (uint16_t)(int16_t)(-8 * (hs[0] + hs[2])));
            for (int h = 0; h < 2; h++)
                a->o6[i * 2 + h] = (int32_t)(((uint32_t)(uint16_t)(int16_t)(-32 * hs[2 * h + 1]) << 16) | (uint16_t)(int16_t)(-32 * hs[2 * h]));
        } else if (rows) { /* (fl_act_q8_set_block's d, s, ms only) */
            a->d[i] = d;
            a->s[i] = sum;
            a->ms[i] = -(float)sum * d;
        }
        if (g) { /* the record's fields, as fl_act16_pack_blocks lays them out */
            char *r = g + (size_t)b * FL_ACT16_REC;
            int32_t *f = (int32_t *)(r + FL_ACT16_CODES);
            const float ms = -(float)sum * d;
            _mm256_storeu_si256((__m256i *)(r + t * 32), codes);
            f[t] = -8 * sum;
            f[FL_ACT16_TOKENS + t] = -128 * sum;
            memcpy(&f[2 * FL_ACT16_TOKENS + t], &d, 4);
            memcpy(&f[3 * FL_ACT16_TOKENS + t], &ms, 4);
        }
    }
}

void fl_act_q8_quantize_row_avx512(fl_act_q8 *a, int64_t m, const float *x) {
    fl_act_q8_quantize_blocks_avx512(a, m, x, 0, a->nb, true, true, NULL);
    if (a->qs4) fl_act_q8_order_q4(a, m); /* (one token: the Q4_0 order for the VBMI GEMV) */
}

/* ---- row panels (layout in matmul.h; reference fl_panel_pack_ref / fl_panel_gemm_ref) ---- */

#define PANEL_BLOCK (FL_PANEL_ROWS * 4 + FL_PANEL_ROWS * 32)

/* 16 rows x 32 Q8_0 codes (row r at p + r * ldw) -> 8 vectors [quad c][row][4], sign-flipped:
 * rows j and j + 8 share a zmm, an 8 x 8 dword transpose runs in both halves, and a two-source
 * qword permute puts the halves in row order. */
INLINE void pack_q8_full(const char *p, size_t ldw, __m512i *out, __m512i flip) {
    __m512i z[8], t[8], u[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + j * ldw))),
                                  _mm256_loadu_si256((const __m256i *)(p + (j + 8) * ldw)), 1);
#pragma GCC unroll 4
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm512_unpacklo_epi32(z[j], z[j + 1]);     /* per 128 lane: c0 r_j, c0 r_j+1, c1 r_j, c1 r_j+1 */
        t[j + 1] = _mm512_unpackhi_epi32(z[j], z[j + 1]); /* c2, c3 */
    }
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += 4) {
        u[h + 0] = _mm512_unpacklo_epi64(t[h + 0], t[h + 2]); /* col 0 (lane 0) / col 4 (lane 1), 4 rows */
        u[h + 1] = _mm512_unpackhi_epi64(t[h + 0], t[h + 2]); /* col 1 / 5 */
        u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]); /* col 2 / 6 */
        u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]); /* col 3 / 7 */
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        _mm512_storeu_si512(out + c, _mm512_xor_si512(_mm512_permutex2var_epi64(u[c], lo, u[c + 4]), flip));
        _mm512_storeu_si512(out + c + 4, _mm512_xor_si512(_mm512_permutex2var_epi64(u[c], hi, u[c + 4]), flip));
    }
}

/* 16 rows x 16 Q4_0 bytes: 128-bit lane k of z[j] holds row j + 4k, a 4 x 4 dword transpose per
 * lane gives [quad c][row], then the nibbles split into quads c (low) and c + 4 (high). */
INLINE void pack_q4_full(const char *p, size_t ldw, __m512i *out, __m512i m4) {
    __m512i z[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + j * ldw)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (j + 4) * ldw)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (j + 8) * ldw)), 2);
        z[j] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (j + 12) * ldw)), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    const __m512i v[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                          _mm512_unpackhi_epi64(t1, t3)};
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        _mm512_storeu_si512(out + c, _mm512_and_si512(v[c], m4));
        _mm512_storeu_si512(out + c + 4, _mm512_and_si512(_mm512_srli_epi16(v[c], 4), m4));
    }
}

/* Repack up to 16 rows with gathers: lane r of each gather reads row r (masked past nr). */
/* Q4_K: per super-block and row the 8 scales / mins as floats, per 32-code sub-block the 16
 * rows' nibbles unpacked to a 16 x 32 byte tile, then transposed like Q8_0 codes (no flip). */
static void pack_q4_K(const char *w, size_t ldw, int nr, int64_t K, char *panel) {
    const int64_t nb = K / 32;
    float *mins = (float *)(panel + nb * PANEL_BLOCK);
    uint8_t tile[2][FL_PANEL_ROWS * 32] __attribute__((aligned(64)));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const int64_t nsb = K / FL_QK_K;
    const size_t span = (size_t)FL_PANEL_ROWS * ldw, step = (span / (size_t)nsb + 63) & ~(size_t)63;
    const bool gather = (uint64_t)ldw * FL_PANEL_ROWS < (1ull << 31); /* (int32 gather offsets) */
    const __m512i vrow = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32((int)ldw));
    const __mmask16 rm = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1);
    for (int64_t i = 0; i < K / FL_QK_K; i++) {
        /* the next panel's rows (the 16 after these, contiguous) into L2, a slice per super-block:
         * the rows' own prefetch below starts two super-blocks in, so a panel's first ones came
         * from memory while the pack waited (K = 2048: 8 super-blocks a row).  A 16-token forward
         * of TinyLlama-shaped Q4_K, the two alternated in one process: 1.17-1.20x; two panels
         * ahead 1.12x, three 1.06x. */
        if (nr == FL_PANEL_ROWS)
            for (size_t l = 0; l < step; l += 64) _mm_prefetch(w + span + (size_t)i * step + l, _MM_HINT_T1);
        if (i + 2 < K / FL_QK_K) /* 16 row streams: each row's super-block after next */
            for (int r = 0; r < nr; r++) {
                const char *nx = (const char *)((const fl_block_q4_K *)(w + r * ldw) + i + 2);
                _mm_prefetch(nx, _MM_HINT_T0);
                _mm_prefetch(nx + 64, _MM_HINT_T0);
                _mm_prefetch(nx + 143, _MM_HINT_T0);
            }
        if (gather) { /* the 16 rows' scales and mins a lane each: fl_k4_scale_min_bytes' bit
                       * operations on gathered dwords, each sub-block's 16 values one store (per
                       * row, the 16 scalar stores per super-block were a quarter of the pack's
                       * samples; a 16-token TinyLlama-shaped Q4_K forward, alternated in one
                       * process, 1.10-1.11x) */
            const char *sb = w + (size_t)i * sizeof(fl_block_q4_K);
            const __m512i z = _mm512_setzero_si512();
            const __m512i dd = _mm512_mask_i32gather_epi32(z, rm, vrow, sb, 1);
            const __m512i w0 = _mm512_mask_i32gather_epi32(z, rm, vrow, sb + 4, 1), w1 = _mm512_mask_i32gather_epi32(z, rm, vrow, sb + 8, 1);
            const __m512i w2 = _mm512_mask_i32gather_epi32(z, rm, vrow, sb + 12, 1);
            const __m512 dv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)), mv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
            const __m512i c3f = _mm512_set1_epi32(0x3F3F3F3F), c0f = _mm512_set1_epi32(0x0F0F0F0F), c03 = _mm512_set1_epi32(0x03030303);
            const __m512i sq[2] = {_mm512_and_si512(w0, c3f),
                                   _mm512_or_si512(_mm512_and_si512(w2, c0f), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), c03), 4))};
            const __m512i mq[2] = {_mm512_and_si512(w1, c3f),
                                   _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), c0f), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), c03), 4))};
            const __m512i ff = _mm512_set1_epi32(0xFF);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m512i sj = _mm512_and_si512(_mm512_srli_epi32(sq[j / 4], 8 * (j % 4)), ff);
                const __m512i mj = _mm512_and_si512(_mm512_srli_epi32(mq[j / 4], 8 * (j % 4)), ff);
                _mm512_storeu_ps(panel + (i * 8 + j) * PANEL_BLOCK, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(sj)));
                _mm512_storeu_ps(mins + (i * 8 + j) * FL_PANEL_ROWS, _mm512_mul_ps(mv, _mm512_cvtepi32_ps(mj)));
            }
        } else
        for (int r = 0; r < FL_PANEL_ROWS; r++) { /* a row's 8 scales and mins at once, inline (one call
                                                    * per scale had been ~60% of the pack's samples at 16
                                                    * tokens) */
            float ds[8] __attribute__((aligned(32))), dm[8] __attribute__((aligned(32)));
            if (r < nr) {
                const fl_block_q4_K *blk = (const fl_block_q4_K *)(w + r * ldw) + i;
                uint8_t sc[8], mn[8];
                fl_k4_scale_min_bytes(blk->scales, sc, mn);
                const __m128i vs = _mm_loadl_epi64((const __m128i *)sc), vm = _mm_loadl_epi64((const __m128i *)mn);
                _mm256_store_ps(ds, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(blk->d)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(vs))));
                _mm256_store_ps(dm, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(blk->dmin)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(vm))));
            } else {
                _mm256_store_ps(ds, _mm256_setzero_ps());
                _mm256_store_ps(dm, _mm256_setzero_ps());
            }
            for (int j = 0; j < 8; j++) {
                ((float *)(panel + (i * 8 + j) * PANEL_BLOCK))[r] = ds[j];
                mins[(i * 8 + j) * FL_PANEL_ROWS + r] = dm[j];
            }
        }
        for (int g = 0; g < 4; g++) {
            for (int r = 0; r < FL_PANEL_ROWS; r++) {
                __m256i v = _mm256_setzero_si256();
                if (r < nr) v = _mm256_loadu_si256((const __m256i *)(((const fl_block_q4_K *)(w + r * ldw) + i)->qs + 32 * g));
                _mm256_store_si256((__m256i *)(tile[0] + 32 * r), _mm256_and_si256(v, m4));
                _mm256_store_si256((__m256i *)(tile[1] + 32 * r), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
            pack_q8_full((const char *)tile[0], 32, (__m512i *)(panel + (i * 8 + 2 * g) * PANEL_BLOCK + 64), _mm512_setzero_si512());
            pack_q8_full((const char *)tile[1], 32, (__m512i *)(panel + (i * 8 + 2 * g + 1) * PANEL_BLOCK + 64), _mm512_setzero_si512());
        }
    }
}

void fl_panel_pack_avx512(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, void *panel) {
    if (wtype == FL_TYPE_Q4_K_R16) { /* (a whole group: the type's matrices have N % 16 == 0) */
        FL_ASSERT(nr == FL_PANEL_ROWS);
        fl_k16_panel_pack_avx512(wtype, w, K, panel);
        return;
    }
    if (wtype == FL_TYPE_Q4_K) {
        pack_q4_K(w, ldw, nr, K, panel);
        return;
    }
    const bool q8 = wtype == FL_TYPE_Q8_0;
    const int bsz = q8 ? 34 : 18;
    const int64_t nb = K / 32;
    const __mmask16 rm = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1);
    if ((uint64_t)ldw * FL_PANEL_ROWS >= (1ull << 31)) { /* gather offsets are int32 */
        fl_panel_pack_ref(wtype, w, ldw, nr, K, panel);
        return;
    }
    const __m512i vrow = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)ldw));
    const __m512i zero = _mm512_setzero_si512(), m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++) {
        const char *base = (const char *)w + b * bsz;
        char *pb = (char *)panel + b * PANEL_BLOCK;
        const __m512i g = _mm512_mask_i32gather_epi32(zero, rm, vrow, (const void *)base, 1);
        if (nr == FL_PANEL_ROWS) { /* full panel: codes by in-register transposes */
            _mm512_storeu_ps(pb, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
            if (q8) pack_q8_full(base + 2, ldw, (__m512i *)(pb + 64), flip);
            else pack_q4_full(base + 2, ldw, (__m512i *)(pb + 64), m4);
            continue;
        }
        _mm512_storeu_ps(pb, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
        __m512i *q = (__m512i *)(pb + 64);
        if (q8) {
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                _mm512_storeu_si512(q + i, _mm512_maskz_xor_epi32(rm, _mm512_mask_i32gather_epi32(zero, rm, vrow, (const void *)(base + 2 + 4 * i), 1), flip));
        } else {
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const __m512i v = _mm512_mask_i32gather_epi32(zero, rm, vrow, (const void *)(base + 2 + 4 * i), 1);
                _mm512_storeu_si512(q + i, _mm512_and_si512(v, m4));
                _mm512_storeu_si512(q + i + 4, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
            }
        }
    }
}

/* 16 rows x NT tokens: per block, 8 weight vectors loaded once; per token an int32 sum started
 * at -offset * (code sum) takes 8 vpdpbusd with 4 broadcast activation codes each, then one
 * convert and one fma with d_w (16 lanes) * d_x. */
INLINE void panel_tile(const char *pan, const fl_act_q8 *a, int64_t m0, const int NT, const int32_t off, float *y,
                       int64_t ldy, int nr) {
    /* off 0: a Q4_K panel (unsigned codes, no offset; mins after the blocks) */
    const float *mins = off == 0 ? (const float *)(pan + a->nb * PANEL_BLOCK) : NULL;
    const float *ms0 = a->ms + m0 * a->nb;
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    const int64_t nb = a->nb, K = a->K;
    const int8_t *xq0 = a->qs + m0 * K;
    const int32_t *sv0 = a->sv + m0 * nb * 8;
    const float *d0 = a->d + m0 * nb;
    const int shift = off == 128 ? 7 : 3;
    for (int64_t b = 0; b < nb; b++) {
        const char *pb = pan + b * PANEL_BLOCK;
        /* each token's int32 sums start at -offset * (its code sum): a broadcast load of -s
         * (fl_act_q8.sv) and a shift */
        __m512i s[8];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            s[t] = off ? _mm512_slli_epi32(_mm512_set1_epi32(sv0[(t * nb + b) * 8]), shift) : _mm512_setzero_si512();
        /* one weight vector at a time, the tokens' dependent vpdpbusd NT instructions apart */
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const __m512i wv = _mm512_loadu_si512(pb + 64 + 64 * i);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                s[t] = _mm512_dpbusd_epi32(s[t], wv, _mm512_set1_epi32(((const int32_t *)(xq0 + t * K + b * 32))[i]));
        }
        const __m512 dw = _mm512_loadu_ps(pb);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dw, _mm512_set1_ps(d0[t * nb + b])), acc[t]);
        if (mins) {
            const __m512 mv = _mm512_loadu_ps(mins + b * FL_PANEL_ROWS);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) acc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(ms0[t * nb + b]), acc[t]);
        }
    }
    const __mmask16 rm = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1);
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, rm, acc[t]);
}

/* one function per tile width and offset (128: Q8_0, 8: Q4_0, 0: Q4_K with mins), so the
 * offset and the mins branch are compile-time constants inside the loop */
#define DEFINE_PANEL(n)                                                                                     \
    static void panel_tile##n##_128(const char *pan, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy, int nr) { \
        panel_tile(pan, a, m0, n, 128, y, ldy, nr);                                                        \
    }                                                                                                       \
    static void panel_tile##n##_8(const char *pan, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy, int nr) { \
        panel_tile(pan, a, m0, n, 8, y, ldy, nr);                                                          \
    }                                                                                                       \
    static void panel_tile##n##_0(const char *pan, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy, int nr) { \
        panel_tile(pan, a, m0, n, 0, y, ldy, nr);                                                          \
    }
DEFINE_PANEL(1)
DEFINE_PANEL(2)
DEFINE_PANEL(3)
DEFINE_PANEL(4)
DEFINE_PANEL(5)
DEFINE_PANEL(6)
DEFINE_PANEL(7)
DEFINE_PANEL(8)

void fl_panel_gemm_avx512(int32_t wtype, const void *panel, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                          int64_t ldy) {
    typedef void (*fn)(const char *, const fl_act_q8 *, int64_t, float *, int64_t, int);
#define ROW(o) {NULL, panel_tile1_##o, panel_tile2_##o, panel_tile3_##o, panel_tile4_##o, \
                panel_tile5_##o, panel_tile6_##o, panel_tile7_##o, panel_tile8_##o}
    static const fn tiles[3][9] = {ROW(128), ROW(8), ROW(0)};
#undef ROW
    const int o = wtype == FL_TYPE_Q8_0 ? 0 : wtype == FL_TYPE_Q4_K ? 2 : 1;
    for (int t = 0; t < nt; t += 8) {
        const int n = nt - t < 8 ? nt - t : 8;
        tiles[o][n]((const char *)panel, a, m0 + t, y + t * ldy, ldy, nr);
    }
}

/* A panel (16 rows) x NT tokens, 9 <= NT <= 16, the activations in fl_act16 records: panel_tile's
 * arithmetic in the same order (so the same bits) with 16 tokens per pass over the panel, as
 * tile16w does on the R8 groups (the int32 sums in 16 registers, the f32 sums in memory: see
 * kernels/avx512/tile16w.h).  off as panel_tile's (0: Q4_K, with the mins term). */
INLINE void panel_tile16w(const char *pan, const char *act, int64_t nb, const int NT, const int32_t off, float *y, int64_t ldy,
                          int nr) {
    const float *mins = off == 0 ? (const float *)(pan + nb * PANEL_BLOCK) : NULL;
    __m512 acc[16];
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *pb = pan + b * PANEL_BLOCK, *r = act + (size_t)b * FL_ACT16_REC;
        const int32_t *o = (const int32_t *)(r + FL_ACT16_CODES) + (off == 128 ? FL_ACT16_TOKENS : 0);
        const float *dx = (const float *)(r + FL_ACT16_CODES) + 2 * FL_ACT16_TOKENS, *ms = dx + FL_ACT16_TOKENS;
        __m512i s[16];
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++) s[t] = off ? _mm512_set1_epi32(o[t]) : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const __m512i wv = _mm512_loadu_si512(pb + 64 + 64 * i);
#pragma GCC unroll 16
            for (int t = 0; t < NT; t++) s[t] = fl_dpbusd_bcast16(s[t], wv, (const int32_t *)(r + t * 32) + i);
        }
        const __m512 dw = _mm512_loadu_ps(pb);
        if (mins) {
            const __m512 mv = _mm512_loadu_ps(mins + b * FL_PANEL_ROWS);
#pragma GCC unroll 16
            for (int t = 0; t < NT; t++) fl_acc_fma2(&acc[t], _mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dw, _mm512_set1_ps(dx[t])), mv, ms + t);
        } else {
#pragma GCC unroll 16
            for (int t = 0; t < NT; t++) fl_acc_fma(&acc[t], _mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dw, _mm512_set1_ps(dx[t])));
        }
    }
    const __mmask16 rm = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1);
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, rm, acc[t]);
}

#define DEFINE_PANEL_WIDE(n)                                                                                     \
    static void panel_wide##n##_128(const char *p, const char *a, int64_t nb, float *y, int64_t ldy, int nr) { \
        panel_tile16w(p, a, nb, n, 128, y, ldy, nr);                                                           \
    }                                                                                                          \
    static void panel_wide##n##_8(const char *p, const char *a, int64_t nb, float *y, int64_t ldy, int nr) {   \
        panel_tile16w(p, a, nb, n, 8, y, ldy, nr);                                                             \
    }                                                                                                          \
    static void panel_wide##n##_0(const char *p, const char *a, int64_t nb, float *y, int64_t ldy, int nr) {   \
        panel_tile16w(p, a, nb, n, 0, y, ldy, nr);                                                             \
    }
DEFINE_PANEL_WIDE(9)
DEFINE_PANEL_WIDE(10)
DEFINE_PANEL_WIDE(11)
DEFINE_PANEL_WIDE(12)
DEFINE_PANEL_WIDE(13)
DEFINE_PANEL_WIDE(14)
DEFINE_PANEL_WIDE(15)
DEFINE_PANEL_WIDE(16)

void fl_panel_gemm16_avx512(int32_t wtype, const void *panel, int nr, const void *act, int64_t nb, int nt, float *y, int64_t ldy) {
    typedef void (*fn)(const char *, const char *, int64_t, float *, int64_t, int);
#define ROW(o) {panel_wide9_##o, panel_wide10_##o, panel_wide11_##o, panel_wide12_##o, \
                panel_wide13_##o, panel_wide14_##o, panel_wide15_##o, panel_wide16_##o}
    static const fn tiles[3][8] = {ROW(128), ROW(8), ROW(0)};
#undef ROW
    const int o = wtype == FL_TYPE_Q8_0 ? 0 : wtype == FL_TYPE_Q4_K ? 2 : 1;
    tiles[o][nt - 9]((const char *)panel, (const char *)act, nb, y, ldy, nr);
}

/* fl_dot_f32_avx512 lives in avx512/ops_avx512.c. */

/* ---- the AVX2 panels of Q6_K, Q3_K, Q2_K (a scale per 16 codes) and of Q5_K, Q5_0, Q5_1, Q4_1
 * (a min per block), 16 rows per zmm ----
 * The layout of fl_panel_pack_avx2 (kernels/avx2/panel_avx2.c): per block the 16 rows' f32
 * scales, then per group g the 16 rows' 4 codes (rows 0-7, then 8-15: one zmm), and after the
 * blocks the words (sc, sc) of each 16-code half, [b][nw][16 rows] (Q2_K also (m, m) and its
 * dmin), or the f32 mins [b][16 rows] (Q5_x: sums of (q - 16) x from -16 x the codes' sums, o4;
 * Q4_1: of q x).  The arithmetic of the AVX2 tile lane for lane (int16 sums from fl_act_q8.o6 through
 * maddubs, x (sc, sc) into int32, one convert and fma per block), so the same bits, with both
 * 8-row halves in one register and up to 4 tokens per pass (the AVX2 tile takes 2).  A 16-token
 * TinyLlama-shaped Q6_K forward against the AVX2 tile, alternated in one process: 1.35x (8
 * tokens per pass 1.30x, 6 1.31x: their per-token address registers spill).  The mins kinds'
 * AVX2 tile already took 4 tokens with both halves: here the two halves are one register. */
enum { H_Q6K, H_Q3K, H_Q2K, H_Q5K, H_Q4K };
#define HALVES_TOKENS 4

INLINE void halves_tile(const char *pan, const fl_act_q8 *a, int64_t m0, const int NT, const int kind, float *y, int64_t ldy,
                        __mmask16 rm, const char *pf, const char *pf_end, int pf_per_block) {
    const int64_t nb = a->nb, K = a->K;
    const int8_t *xq0 = a->qs + m0 * K;
    const int32_t *o60 = a->o6 + m0 * nb * 2, *o40 = a->o4 + m0 * nb;
    const float *d0 = a->d + m0 * nb, *ms0 = a->ms + m0 * nb;
    const bool mins_kind = kind == H_Q5K || kind == H_Q4K; /* one int16 sum per block, then the mins */
    const int nw = kind == H_Q2K ? 4 : 2;
    const char *words = pan + nb * PANEL_BLOCK; /* [b][nw][16] u32; the mins kinds: [b][16] f32 mins */
    const float *dmin = kind == H_Q2K ? (const float *)words + nb * 4 * FL_PANEL_ROWS : NULL;
    const __m512i ones = _mm512_set1_epi16(1);
    __m512 acc[HALVES_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *pb = pan + b * PANEL_BLOCK;
        for (int i = 0; i < pf_per_block && pf < pf_end; i++, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
        __m512i s[HALVES_TOKENS];
        if (mins_kind) { /* int16 lanes from 0 (Q4_1: codes 0..15) or -16 x their codes' sums (2 x o4: Q5_x, sum (q - 16) x) */
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                s[t] = kind == H_Q5K ? _mm512_set1_epi32(o40[t * nb + b]) : _mm512_setzero_si512();
                if (kind == H_Q5K) s[t] = _mm512_add_epi16(s[t], s[t]);
            }
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m512i wv = _mm512_loadu_si512((const void *)(pb + 64 + 64 * g));
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    s[t] = _mm512_add_epi16(s[t], _mm512_maddubs_epi16(wv, _mm512_set1_epi32(((const int32_t *)(xq0 + t * K + b * 32))[g])));
                    __asm__("" : "+v"(s[t])); /* one group at a time */
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) s[t] = _mm512_madd_epi16(s[t], ones);
        } else
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            __m512i s16[HALVES_TOKENS];
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                s16[t] = kind == H_Q2K ? _mm512_setzero_si512() : _mm512_set1_epi32(o60[(t * nb + b) * 2 + half]);
                if (kind == H_Q3K) s16[t] = _mm512_srai_epi16(s16[t], 3); /* -4 x (o6 / 8, exact) */
            }
#pragma GCC unroll 4
            for (int g = 4 * half; g < 4 * half + 4; g++) {
                const __m512i wv = _mm512_loadu_si512((const void *)(pb + 64 + 64 * g));
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    s16[t] = _mm512_add_epi16(s16[t], _mm512_maddubs_epi16(wv, _mm512_set1_epi32(((const int32_t *)(xq0 + t * K + b * 32))[g])));
                    __asm__("" : "+v"(s16[t])); /* one group at a time (GCC otherwise reassociates the adds and spills) */
                }
            }
            const __m512i sc = _mm512_loadu_si512((const void *)(words + ((size_t)b * nw + half) * 64));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const __m512i p = _mm512_madd_epi16(s16[t], sc);
                s[t] = half ? _mm512_add_epi32(s[t], p) : p;
            }
        }
        const __m512 dw = _mm512_loadu_ps((const float *)pb);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dw, _mm512_set1_ps(d0[t * nb + b])), acc[t]);
        if (kind == H_Q2K) { /* less dmin x (m, m) . (the halves' sums, -32 x in o6: so d_x / 32) */
            const __m512 dm = _mm512_loadu_ps(dmin + b * FL_PANEL_ROWS);
            const __m512i mw0 = _mm512_loadu_si512((const void *)(words + ((size_t)b * 4 + 2) * 64));
            const __m512i mw1 = _mm512_loadu_si512((const void *)(words + ((size_t)b * 4 + 3) * 64));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const int32_t *o6 = o60 + (t * nb + b) * 2;
                const __m512i im = _mm512_add_epi32(_mm512_madd_epi16(_mm512_set1_epi32(o6[0]), mw0), _mm512_madd_epi16(_mm512_set1_epi32(o6[1]), mw1));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dm, _mm512_set1_ps(d0[t * nb + b] * (1.0f / 32))), acc[t]);
            }
        }
        if (mins_kind) {
            const __m512 mv = _mm512_loadu_ps((const float *)words + b * FL_PANEL_ROWS);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) acc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(ms0[t * nb + b]), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, rm, acc[t]);
}

typedef void (*halves_fn)(const char *, const fl_act_q8 *, int64_t, float *, int64_t, __mmask16, const char *, const char *, int);
#define DEFINE_HALVES(kind, n)                                                                                     \
    static void halves_##kind##_##n(const char *pan, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy, __mmask16 rm, \
                                     const char *pf, const char *pf_end, int ppb) {                               \
        halves_tile(pan, a, m0, n, kind, y, ldy, rm, pf, pf_end, ppb);                                             \
    }
#define DEFINE_HALVES_ALL(kind) DEFINE_HALVES(kind, 1) DEFINE_HALVES(kind, 2) DEFINE_HALVES(kind, 3) DEFINE_HALVES(kind, 4)
DEFINE_HALVES_ALL(H_Q6K)
DEFINE_HALVES_ALL(H_Q3K)
DEFINE_HALVES_ALL(H_Q2K)
DEFINE_HALVES_ALL(H_Q5K)
DEFINE_HALVES_ALL(H_Q4K)

bool fl_panel_halves_avx512(int32_t wtype) {
    return wtype == FL_TYPE_Q6_K || wtype == FL_TYPE_Q3_K || wtype == FL_TYPE_Q2_K || wtype == FL_TYPE_Q5_K || wtype == FL_TYPE_Q5_0 ||
           wtype == FL_TYPE_Q5_1 || wtype == FL_TYPE_Q4_1;
}

void fl_panel_gemm_halves_avx512(int32_t wtype, const void *panel, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                                 int64_t ldy, const void *pf, size_t pf_bytes) {
#define ROW(k) {NULL, halves_##k##_1, halves_##k##_2, halves_##k##_3, halves_##k##_4}
    static const halves_fn tiles[5][HALVES_TOKENS + 1] = {ROW(H_Q6K), ROW(H_Q3K), ROW(H_Q2K), ROW(H_Q5K), ROW(H_Q4K)};
#undef ROW
    /* (the AVX2 tile kinds: Q5_0 / Q5_1 have Q5_K's sums, Q4_1 Q4_K's) */
    const int k = wtype == FL_TYPE_Q6_K   ? H_Q6K
                  : wtype == FL_TYPE_Q3_K ? H_Q3K
                  : wtype == FL_TYPE_Q2_K ? H_Q2K
                  : wtype == FL_TYPE_Q4_1 ? H_Q4K
                                          : H_Q5K;
    const __mmask16 rm = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1);
    const int64_t calls = (nt + HALVES_TOKENS - 1) / HALVES_TOKENS, nb = a->nb;
    /* the next panel's prefetch spread over every block of every call, as the AVX2 tiles do */
    const size_t lines = (pf_bytes + 63) / 64, share = pf ? (lines + (size_t)calls - 1) / (size_t)calls : 0;
    const int per_block = (int)((share + (size_t)nb - 1) / (size_t)nb);
    const char *p = pf, *end = pf ? (const char *)pf + pf_bytes : NULL;
    for (int t = 0; t < nt; t += HALVES_TOKENS) {
        const int n = nt - t < HALVES_TOKENS ? nt - t : HALVES_TOKENS;
        const char *e = p && p + share * 64 < end ? p + share * 64 : end;
        tiles[k][n]((const char *)panel, a, m0 + t, y + t * ldy, ldy, rm, p, e, per_block);
        p = e;
    }
}
