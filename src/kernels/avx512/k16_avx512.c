/* Q4_K_R16 / Q5_K_R16 / Q6_K_R16 / Q3_K_R16 / Q2_K_R16 (those types in groups of 16 interleaved rows, layouts
 * in kernels/matmul.h) on AVX-512 VNNI, straight on the groups for steps of up to 32 tokens
 * (past that: the base type's panels, packed from the groups here); Q4_1_R16 / Q5_0_R16 /
 * Q5_1_R16 / IQ4_NL_R16 (blocks of 32, at the end) for steps of any size.  A lane is a row: one
 * 64-byte load of a group's codes is 16 rows x 4 code bytes, which go to a vpdpbusd against 4
 * broadcast activation codes.  Codes are unsigned (Q4_K 0..15: low nibbles sub-block 2c, high
 * 2c + 1; Q5_K the same with the fifth bits of its qh vectors or'd in; Q6_K 0..63 made of a
 * nibble and two qh bits, each token's int32 sums started at -32 x its half-block's activation
 * code sum, fl_act_q8.o6; Q3_K 0..7, two qs bits and an hmask bit, started at -4 x that sum;
 * Q2_K 0..3).  Per super-block the 16 rows' scales come from loads of their planes
 * (a row per byte lane), and per sub-block each token folds its sums as
 *     acc += f32(sum) * ((d * sc_j) * d_x)  (Q4_K / Q5_K then  acc += (dmin * m_j) * (-s d_x), fl_act_q8.ms;
 *                                           Q2_K per 16-code half block, its own -s d_x)
 * so a token's result has the same bits in any step, one token or many; the integer sums are
 * exact, so splitting them over more chains changes nothing.
 * Against the file's rows (the GEMVs of matmul_avx512.c: horizontal sums and per-row scale
 * unpacking per super-block; the panels: a pack per call into 8-bit codes and f32 scales) this
 * reads each weight byte once, as the file has it.  Reference: fl_gemm_q8_ref on the type. */
#include "core/status.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
/* tokens per pass: 8 f32 sums and 8 int32 sums stay in registers */
#define K16_TOKENS 8

/* The 16 rows' scales (d sc_j) and mins (dmin m_j) of sub-blocks 2c and 2c + 1 of super-block b. */
typedef struct {
    __m512 sc[2], mn[2];
} k16_scales;

/* A super-block's 16 rows: d and dmin as f32, the 8 scales and 8 mins as bytes (128-bit lane
 * j % 4 of sc03 / sc47 holds sub-block j's, a row per byte). */
typedef struct {
    __m512 d, dm;
    __m512i sc03, mn03, sc47, mn47;
} k16_sb;

INLINE void k16_sb_scales(const unsigned char *b, __m512i *sc03, __m512i *mn03, __m512i *sc47, __m512i *mn47) {
    const __m512i m6 = _mm512_set1_epi8(0x3F), m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i p0 = _mm512_loadu_si512(b + FL_K16_SCALES), p1 = _mm512_loadu_si512(b + FL_K16_SCALES + 64);
    const __m512i p2 = _mm512_loadu_si512(b + FL_K16_SCALES + 128);
    /* fl_k4_scale_min_bytes per byte lane: sc 0..3 = s[0..3] & 63, m 0..3 = s[4..7] & 63,
     * sc 4..7 = (s[8..11] & 15) | (s[0..3] >> 6) << 4, m 4..7 = (s[8..11] >> 4) | (s[4..7] >> 6) << 4 */
    *sc03 = _mm512_and_si512(p0, m6);
    *mn03 = _mm512_and_si512(p1, m6);
    *sc47 = _mm512_or_si512(_mm512_and_si512(p2, m4), _mm512_and_si512(_mm512_srli_epi16(p0, 2), m30));
    *mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(p2, 4), m4), _mm512_and_si512(_mm512_srli_epi16(p1, 2), m30));
}

/* 128-bit lane q (0..3, a literal) of v as 16 floats, a byte each */
#define k16_lane_f32(v, q) _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32((v), (q))))

INLINE k16_sb k16_sb_load(const unsigned char *b) {
    k16_sb sb;
    sb.d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b));
    sb.dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 32)));
    k16_sb_scales(b, &sb.sc03, &sb.mn03, &sb.sc47, &sb.mn47);
    return sb;
}

INLINE k16_scales k16_pair(const k16_sb *sb, const int c) {
    k16_scales s;
    const __m512i sc = c < 2 ? sb->sc03 : sb->sc47, mn = c < 2 ? sb->mn03 : sb->mn47;
    const __m512 d = sb->d, dm = sb->dm;
    if ((2 * c) % 4 == 0) { /* sub-blocks 0, 1 or 4, 5 */
        s.sc[0] = _mm512_mul_ps(d, k16_lane_f32(sc, 0)), s.sc[1] = _mm512_mul_ps(d, k16_lane_f32(sc, 1));
        s.mn[0] = _mm512_mul_ps(dm, k16_lane_f32(mn, 0)), s.mn[1] = _mm512_mul_ps(dm, k16_lane_f32(mn, 1));
    } else {
        s.sc[0] = _mm512_mul_ps(d, k16_lane_f32(sc, 2)), s.sc[1] = _mm512_mul_ps(d, k16_lane_f32(sc, 3));
        s.mn[0] = _mm512_mul_ps(dm, k16_lane_f32(mn, 2)), s.mn[1] = _mm512_mul_ps(dm, k16_lane_f32(mn, 3));
    }
    return s;
}

INLINE __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* The kernels prefetch two super-blocks ahead into L1 (Q4_K / Q5_K: 2 x the block's bytes,
 * written out where used, its 36 / 44 lines spread over the four sub-block pairs; Q6_K below):
 * the rows stream from memory in a decode step.  `fitllm bench matmul --types
 * Q4_K_R16 -t 2` on a Zen 5 VM, all shapes streamed: one token 33-42 GB/s without, 51-52 with
 * 1, 2 or 4 super-blocks ahead (Q4_0_R8 42-45 in the same runs); 16 tokens 474 GOP/s without, 568
 * one half ahead, and alternated three times 1 / 2 / 4 ahead 625, 574, 572 / 648, 595, 587 /
 * 598, 572, 576. */
#define K16_PF_Q6_AHEAD (2 * FL_K16_Q6_BLOCK) /* (52.5 lines a super-block: 26 per half, the rest with the next) */
/* Q5_K_R16: the fifth bits (bit j of each byte of qh vector v) as 16, to or into the codes of
 * sub-block j */
INLINE __m512i q5_bits(const unsigned char *b, int v, int j) {
    const __m512i qh = _mm512_loadu_si512(b + FL_K16_Q5_QH + 64 * v);
    return _mm512_and_si512(_mm512_slli_epi16(_mm512_srl_epi16(qh, _mm_cvtsi32_si128(j)), 4), _mm512_set1_epi8(0x10));
}

/* 16 rows (one group at g) x NT tokens (1..K16_TOKENS) from token m0; pf: prefetch (the rows
 * come from memory: the first pass over them); Q5: Q5_K_R16. */

INLINE void k16_tile(const unsigned char *g, const fl_act_q8 *a, int64_t m0, const int NT, float *y, int64_t ldy, const bool pf,
                     const bool Q5) {
    const int64_t K = a->K, nb = a->nb, nsb = K / 256;
    const size_t bsz = Q5 ? FL_K16_Q5_BLOCK : FL_K16_BLOCK, qs = Q5 ? FL_K16_Q5_QS : FL_K16_QS;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[K16_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const unsigned char *b = g + (size_t)i * bsz;
        const k16_sb sb = k16_sb_load(b);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            if (pf)
                for (int l = 0; l < (Q5 ? 11 : 9); l++) _mm_prefetch((const char *)b + 2 * bsz + ((Q5 ? 11 : 9) * c + l) * 64, _MM_HINT_T0);
            const k16_scales s = k16_pair(&sb, c);
            const unsigned char *q = b + qs + (size_t)512 * c;
            const int64_t j = i * 8 + 2 * c; /* the 32-block of sub-block 2c */
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) { /* low nibbles: sub-block 2c, high: 2c + 1 */
                __m512i is[K16_TOKENS];
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) is[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int v = 0; v < 8; v++) {
                    const __m512i raw = _mm512_loadu_si512(q + 64 * v);
                    __m512i w = h ? _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4) : _mm512_and_si512(raw, m4);
                    if (Q5) w = _mm512_or_si512(w, q5_bits(b, v, 2 * c + h));
#pragma GCC unroll 8
                    for (int t = 0; t < NT; t++)
                        is[t] = _mm512_dpbusd_epi32(is[t], w, bcast4(a->qs + (m0 + t) * K + (j + h) * 32 + 4 * v));
                }
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) {
                    const int64_t jt = (m0 + t) * nb + j + h;
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), _mm512_mul_ps(s.sc[h], _mm512_set1_ps(a->d[jt])), acc[t]);
                    acc[t] = _mm512_fmadd_ps(s.mn[h], _mm512_set1_ps(a->ms[jt]), acc[t]);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

/* One token (the GEMV): the tile's arithmetic, its 8-product chains split in two per nibble
 * half so that four run at once (exact integer sums: the same bits). */
INLINE void k16_gemv(const unsigned char *g, const fl_act_q8 *a, int64_t m, float *y, const bool Q5) {
    const int64_t K = a->K, nb = a->nb, nsb = K / 256;
    const size_t bsz = Q5 ? FL_K16_Q5_BLOCK : FL_K16_BLOCK, qs = Q5 ? FL_K16_Q5_QS : FL_K16_QS;
    const int8_t *x = a->qs + m * K;
    const float *dx = a->d + m * nb, *ms = a->ms + m * nb;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const unsigned char *b = g + (size_t)i * bsz;
        const k16_sb sb = k16_sb_load(b);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const k16_scales s = k16_pair(&sb, c);
            const unsigned char *q = b + qs + (size_t)512 * c;
            for (int l = 0; l < (Q5 ? 11 : 9); l++) _mm_prefetch((const char *)b + 2 * bsz + ((Q5 ? 11 : 9) * c + l) * 64, _MM_HINT_T0);
            const int64_t j = i * 8 + 2 * c;
            const int8_t *xl = x + j * 32, *xh = xl + 32;
            __m512i l0 = _mm512_setzero_si512(), l1 = l0, h0 = l0, h1 = l0;
#pragma GCC unroll 4
            for (int v = 0; v < 8; v += 2) {
                const __m512i r0 = _mm512_loadu_si512(q + 64 * v), r1 = _mm512_loadu_si512(q + 64 * v + 64);
                __m512i wl0 = _mm512_and_si512(r0, m4), wl1 = _mm512_and_si512(r1, m4);
                __m512i wh0 = _mm512_and_si512(_mm512_srli_epi16(r0, 4), m4), wh1 = _mm512_and_si512(_mm512_srli_epi16(r1, 4), m4);
                if (Q5) {
                    wl0 = _mm512_or_si512(wl0, q5_bits(b, v, 2 * c)), wl1 = _mm512_or_si512(wl1, q5_bits(b, v + 1, 2 * c));
                    wh0 = _mm512_or_si512(wh0, q5_bits(b, v, 2 * c + 1)), wh1 = _mm512_or_si512(wh1, q5_bits(b, v + 1, 2 * c + 1));
                }
                l0 = _mm512_dpbusd_epi32(l0, wl0, bcast4(xl + 4 * v));
                l1 = _mm512_dpbusd_epi32(l1, wl1, bcast4(xl + 4 * v + 4));
                h0 = _mm512_dpbusd_epi32(h0, wh0, bcast4(xh + 4 * v));
                h1 = _mm512_dpbusd_epi32(h1, wh1, bcast4(xh + 4 * v + 4));
            }
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(l0, l1)), _mm512_mul_ps(s.sc[0], _mm512_set1_ps(dx[j])), acc);
            acc = _mm512_fmadd_ps(s.mn[0], _mm512_set1_ps(ms[j]), acc);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(h0, h1)), _mm512_mul_ps(s.sc[1], _mm512_set1_ps(dx[j + 1])), acc);
            acc = _mm512_fmadd_ps(s.mn[1], _mm512_set1_ps(ms[j + 1]), acc);
        }
    }
    _mm512_storeu_ps(y, acc);
}

/* ---- Q6_K_R16 ---- */

/* The 16 rows' 6-bit codes (0..63) of 32-block kb (0..7) of a super-block at l = 4v..4v + 3:
 * Q6_K's q1..q4 (k = kb % 4) of its half n = kb / 4, from ql vector 16n + 8 (k & 1) + v (low
 * nibbles for k < 2, high for k >= 2) and bits 2k, 2k + 1 of qh vector 8n + v (a word shift
 * right by 2k, then left by 4: each byte's bits from its own byte, masked to bits 4, 5).
 * lsh: the ql shift (0 or 4), hsh: 2k, as shift counts. */
INLINE __m512i q6_codes(const unsigned char *b, int kb, int v, __m128i lsh, __m128i hsh) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const int n = kb / 4, k = kb % 4;
    const __m512i ql = _mm512_loadu_si512(b + FL_K16_Q6_QL + 64 * (16 * n + 8 * (k & 1) + v));
    const __m512i qh = _mm512_loadu_si512(b + FL_K16_Q6_QH + 64 * (8 * n + v));
    const __m512i lo = _mm512_and_si512(_mm512_srl_epi16(ql, lsh), m4);
    const __m512i hi = _mm512_and_si512(_mm512_slli_epi16(_mm512_srl_epi16(qh, hsh), 4), m30);
    return _mm512_or_si512(lo, hi);
}

/* -32 x the activation code sum of each of the 16 half blocks of super-block i (j = 2 kb + h),
 * token m: o6's two int16 per half, added */
INLINE __m512i k16_half_sums(const fl_act_q8 *a, int64_t m, int64_t i) {
    const __m512i o = _mm512_loadu_si512(a->o6 + (m * a->nb + i * 8) * 2);
    return _mm512_add_epi32(_mm512_srai_epi32(_mm512_slli_epi32(o, 16), 16), _mm512_srai_epi32(o, 16));
}

/* The blocks run as a loop (not unrolled: with all of it unrolled GCC kept the token sums on the
 * stack), the tokens and the 4 code vectors of a half unrolled; each token's 16 offsets made
 * once per super-block (a per-half scalar load and add per token had been 128 a super-block). */
INLINE void k16_q6_tile(const unsigned char *g, const fl_act_q8 *a, int64_t m0, const int NT, float *y, int64_t ldy, const bool pf) {
    const int64_t K = a->K, nb = a->nb, nsb = K / 256;
    __m512 acc[K16_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const unsigned char *b = g + (size_t)i * FL_K16_Q6_BLOCK;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b));
        _Alignas(64) int32_t off[K16_TOKENS][16]; /* each token's 16 half-block starts */
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) _mm512_storeu_si512(off[t], k16_half_sums(a, m0 + t, i));
#pragma GCC unroll 1
        for (int kb = 0; kb < 8; kb++) {
            const int64_t jb = i * 8 + kb; /* the 32-block */
            const __m128i lsh = _mm_cvtsi32_si128(kb % 4 >= 2 ? 4 : 0), hsh = _mm_cvtsi32_si128(2 * (kb % 4));
            if (pf && kb % 2 == 0)
#pragma GCC unroll 13
                for (int l = 0; l < 13; l++) _mm_prefetch((const char *)b + K16_PF_Q6_AHEAD + (13 * (kb / 2) + l) * 64, _MM_HINT_T0);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) { /* its 16-code halves: scale 8 (kb / 4) + 2 (kb % 4) + h */
                const int j = 8 * (kb / 4) + 2 * (kb % 4) + h;
                const __m512 sc = _mm512_mul_ps(
                    d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + FL_K16_Q6_SCALES + 16 * j)))));
                __m512i is[K16_TOKENS];
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) is[t] = _mm512_set1_epi32(off[t][2 * kb + h]);
#pragma GCC unroll 4
                for (int v = 4 * h; v < 4 * h + 4; v++) {
                    const __m512i w = q6_codes(b, kb, v, lsh, hsh);
#pragma GCC unroll 8
                    for (int t = 0; t < NT; t++) is[t] = _mm512_dpbusd_epi32(is[t], w, bcast4(a->qs + (m0 + t) * K + jb * 32 + 4 * v));
                }
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++)
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), _mm512_mul_ps(sc, _mm512_set1_ps(a->d[(m0 + t) * nb + jb])), acc[t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

/* One token (the GEMV): the tile's arithmetic in the same order, every loop unrolled (the 16
 * half-block sums of a super-block are independent chains of 4). */
INLINE void k16_q6_gemv(const unsigned char *g, const fl_act_q8 *a, int64_t m, float *y) {
    const int64_t K = a->K, nb = a->nb, nsb = K / 256;
    const int8_t *x = a->qs + m * K;
    const float *dx = a->d + m * nb;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const unsigned char *b = g + (size_t)i * FL_K16_Q6_BLOCK;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b));
        _Alignas(64) int32_t off[16];
        _mm512_storeu_si512(off, k16_half_sums(a, m, i));
#pragma GCC unroll 8
        for (int kb = 0; kb < 8; kb++) {
            const int64_t jb = i * 8 + kb;
            const __m128i lsh = _mm_cvtsi32_si128(kb % 4 >= 2 ? 4 : 0), hsh = _mm_cvtsi32_si128(2 * (kb % 4));
            if (kb % 2 == 0)
#pragma GCC unroll 13
                for (int l = 0; l < 13; l++) _mm_prefetch((const char *)b + K16_PF_Q6_AHEAD + (13 * (kb / 2) + l) * 64, _MM_HINT_T0);
            __m512i is[2];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                is[h] = _mm512_set1_epi32(off[2 * kb + h]);
#pragma GCC unroll 4
                for (int v = 4 * h; v < 4 * h + 4; v++) is[h] = _mm512_dpbusd_epi32(is[h], q6_codes(b, kb, v, lsh, hsh), bcast4(x + jb * 32 + 4 * v));
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const int j = 8 * (kb / 4) + 2 * (kb % 4) + h;
                const __m512 sc = _mm512_mul_ps(
                    d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + FL_K16_Q6_SCALES + 16 * j)))));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[h]), _mm512_mul_ps(sc, _mm512_set1_ps(dx[jb])), acc);
            }
        }
    }
    _mm512_storeu_ps(y, acc);
}

/* ---- Q3_K_R16 and Q2_K_R16 ----
 * Per 32-block kb a token's two half-block sums (int32, |.| < 2^13) are packed as the int16
 * pair (lower half, upper half) of each row's lane, and one vpmaddwd against the rows' pair of
 * scales (sc_2kb, sc_2kb+1) gives the block's scaled integer sum I; Q2_K's mins likewise give
 * M = m_2kb (-s_2kb) + m_2kb+1 (-s_2kb+1) from the token's half-block code sums s (from o6).
 * Then per token and block
 *     u = f32(I) * (d * d_x)   (Q2_K: u += f32(M) * (dmin * d_x)),   acc += u
 * the same in every step, so a token's result has the same bits in any of them: 3 (Q2_K 6)
 * FMA-pipe operations per block beside the vpmaddwd, where a fold per half block took 6 (8),
 * and the GEMV's one chain through acc is 8 adds per super-block. */

/* Token m's word pairs for super-block i: per 32-block kb (an int32 each) the int16 pair
 * (-s_2kb, -s_2kb+1), s the code sums of its halves (o6's two int16 per half are -32 x parts of
 * s); Q3_K instead the int32 start of each half's sums, -4 s (its codes are value + 4). */
INLINE void k23_act(const fl_act_q8 *a, int64_t m, int64_t i, int32_t *act, const bool Q3) {
    const __m512i s32 = k16_half_sums(a, m, i); /* -32 s */
    if (Q3) _mm512_storeu_si512(act, _mm512_srai_epi32(s32, 3));
    else _mm256_storeu_si256((__m256i *)act, _mm512_cvtepi32_epi16(_mm512_srai_epi32(s32, 5)));
}

/* The rows' scale pairs of 32-block kb as int16 words (a row per 32-bit lane: sc_2kb low,
 * sc_2kb+1 high) from the scale bytes' pairs (the layout keeps a row's bytes 2p, 2p + 1 side by
 * side): Q3_K's 6-bit scales - 32 (fl_q3_K_scales: low 4 bits from byte j or the high nibble of
 * byte j - 8, the top 2 from byte 8 + j % 4 at bit 2 (j / 4); for a pair j = 2kb, 2kb + 1 that is
 * pair kb % 4 (kb >= 4: high nibbles) and pair 4 + kb % 2 at bit 2 (kb / 2)); Q2_K's low nibbles,
 * its mins words (the high nibbles) in *mn. */
INLINE __m512i k23_pair_words(const unsigned char *b, int kb, __m512i *mn, const bool Q3) {
    const __m512i m4 = _mm512_set1_epi16(0x0F);
    if (!Q3) {
        const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + FL_K16_Q2_SCALES + 32 * kb)));
        *mn = _mm512_srli_epi16(w, 4);
        return _mm512_and_si512(w, m4);
    }
    const __m512i lw = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + FL_K16_Q3_SCALES + 32 * (kb % 4))));
    const __m512i hw = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + FL_K16_Q3_SCALES + 32 * (4 + kb % 2))));
    const __m512i lo = _mm512_and_si512(_mm512_srl_epi16(lw, _mm_cvtsi32_si128(kb >= 4 ? 4 : 0)), m4);
    const __m512i hi = _mm512_and_si512(_mm512_srl_epi16(hw, _mm_cvtsi32_si128(2 * (kb / 2))), _mm512_set1_epi16(3));
    return _mm512_sub_epi16(_mm512_or_si512(lo, _mm512_slli_epi16(hi, 4)), _mm512_set1_epi16(32));
}

/* The codes of 32-block kb at 4v..4v+3 of 16 rows: the two bits at 2 (kb % 4) of qs vector
 * 8 (kb / 4) + v (sh: that shift), Q3_K plus 4 where bit kb of hmask vector v is set (hb: that bit) */
INLINE __m512i k23_codes(const unsigned char *b, int kb, int v, __m128i sh, __m512i hb, const bool Q3) {
    const __m512i q = _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512(b + (Q3 ? FL_K16_Q3_QS : FL_K16_Q2_QS) + 64 * (8 * (kb / 4) + v)), sh),
                                       _mm512_set1_epi8(3));
    if (!Q3) return q;
    const __mmask64 hi = _mm512_test_epi8_mask(_mm512_loadu_si512(b + FL_K16_Q3_HM + 64 * v), hb);
    return _mm512_mask_add_epi8(q, hi, q, _mm512_set1_epi8(4));
}

/* u of one token and 32-block: i0, i1 its half sums; sw / mw the rows' scale / mins pairs; d, dm
 * the rows' d, dmin; dx the token's block scale; sp its (-s, -s) pair (Q2_K) */
INLINE __m512 k23_fold(__m512i i0, __m512i i1, __m512i sw, __m512i mw, __m512 d, __m512 dm, float dx, int32_t sp, const bool Q3) {
    const __m512i p = _mm512_mask_blend_epi16(0xAAAAAAAAu, i0, _mm512_slli_epi32(i1, 16));
    const __m512 x = _mm512_set1_ps(dx);
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(p, sw)), _mm512_mul_ps(d, x));
    if (Q3) return u;
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(mw, _mm512_set1_epi32(sp))), _mm512_mul_ps(dm, x), u);
}

/* Lines of the super-block two ahead prefetched per 32-block: Q3_K_R16 27.5 lines a super-block, Q2_K_R16 21 */
#define K23_PF_LINES(Q3) ((Q3) ? 4 : 3)

/* 16 rows (one group at g) x NT tokens (1..K16_TOKENS) from token m0. */
INLINE void k23_tile(const unsigned char *g, const fl_act_q8 *a, int64_t m0, const int NT, float *y, int64_t ldy, const bool pf, const bool Q3) {
    const int64_t K = a->K, nb = a->nb, nsb = K / 256;
    const size_t bsz = Q3 ? FL_K16_Q3_BLOCK : FL_K16_Q2_BLOCK;
    __m512 acc[K16_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const unsigned char *b = g + (size_t)i * bsz;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b));
        const __m512 dm = Q3 ? d : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 32)));
        _Alignas(64) int32_t act[K16_TOKENS][16];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) k23_act(a, m0 + t, i, act[t], Q3);
#pragma GCC unroll 1
        for (int kb = 0; kb < 8; kb++) {
            const int64_t jb = i * 8 + kb; /* the 32-block */
            const __m128i sh = _mm_cvtsi32_si128(2 * (kb % 4));
            const __m512i hb = _mm512_set1_epi8((char)(1 << kb));
            if (pf)
                for (int l = 0; l < K23_PF_LINES(Q3); l++) _mm_prefetch((const char *)b + 2 * bsz + (K23_PF_LINES(Q3) * kb + l) * 64, _MM_HINT_T0);
            __m512i is[2][K16_TOKENS];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) is[h][t] = Q3 ? _mm512_set1_epi32(act[t][2 * kb + h]) : _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int v = 4 * h; v < 4 * h + 4; v++) {
                    const __m512i w = k23_codes(b, kb, v, sh, hb, Q3);
#pragma GCC unroll 8
                    for (int t = 0; t < NT; t++) is[h][t] = _mm512_dpbusd_epi32(is[h][t], w, bcast4(a->qs + (m0 + t) * K + jb * 32 + 4 * v));
                }
            }
            __m512i mw = _mm512_setzero_si512();
            const __m512i sw = k23_pair_words(b, kb, &mw, Q3);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                acc[t] = _mm512_add_ps(acc[t], k23_fold(is[0][t], is[1][t], sw, mw, d, dm, a->d[(m0 + t) * nb + jb], Q3 ? 0 : act[t][kb], Q3));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

/* One token (the GEMV): the tile's arithmetic in the same order; each qs vector loaded once for
 * its four 32-blocks, each hmask vector once for its eight, into 16 chains (one per half block). */
INLINE void k23_gemv(const unsigned char *g, const fl_act_q8 *a, int64_t m, float *y, const bool Q3) {
    const int64_t K = a->K, nb = a->nb, nsb = K / 256;
    const size_t bsz = Q3 ? FL_K16_Q3_BLOCK : FL_K16_Q2_BLOCK, qs = Q3 ? FL_K16_Q3_QS : FL_K16_Q2_QS;
    const int8_t *x = a->qs + m * K;
    const float *dx = a->d + m * nb;
    const __m512i m3 = _mm512_set1_epi8(3);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const unsigned char *b = g + (size_t)i * bsz;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b));
        const __m512 dm = Q3 ? d : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 32)));
        _Alignas(64) int32_t act[16];
        k23_act(a, m, i, act, Q3);
        const int8_t *xb = x + i * 256;
        /* the codes at bits 2s, 2s + 1 of a byte are taken in place (an and, no shift), so the
         * chains sum 4^s x theirs, exactly (|.| < 2^20), and are shifted back once each; Q3_K's
         * third bit then adds 4 << 2s, so its s = 3 codes (4 << 6 is past a byte) are shifted */
#define K23_SCALED(s) (!Q3 || (s) < 3)
        __m512i is[16]; /* [2 kb + h] */
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) is[j] = Q3 ? _mm512_set1_epi32(act[j] * (1 << (K23_SCALED(j / 2 % 4) ? 2 * (j / 2 % 4) : 0))) : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            for (int l = 0; l < K23_PF_LINES(Q3); l++) _mm_prefetch((const char *)b + 2 * bsz + (K23_PF_LINES(Q3) * v + l) * 64, _MM_HINT_T0);
            const __m512i hm = Q3 ? _mm512_loadu_si512(b + FL_K16_Q3_HM + 64 * v) : m3;
#pragma GCC unroll 2
            for (int n = 0; n < 2; n++) {
                const __m512i q = _mm512_loadu_si512(b + qs + 64 * (8 * n + v));
#pragma GCC unroll 4
                for (int s = 0; s < 4; s++) {
                    const int kb = 4 * n + s, sc = K23_SCALED(s) ? 2 * s : 0;
                    __m512i w = K23_SCALED(s) ? _mm512_and_si512(q, _mm512_set1_epi8((char)(3 << sc))) : _mm512_and_si512(_mm512_srli_epi16(q, 2 * s), m3);
                    if (Q3) w = _mm512_mask_add_epi8(w, _mm512_test_epi8_mask(hm, _mm512_set1_epi8((char)(1 << kb))), w, _mm512_set1_epi8((char)(4 << sc)));
                    is[2 * kb + v / 4] = _mm512_dpbusd_epi32(is[2 * kb + v / 4], w, bcast4(xb + kb * 32 + 4 * v));
                }
            }
        }
#pragma GCC unroll 8
        for (int kb = 0; kb < 8; kb++) {
            const int sc = K23_SCALED(kb % 4) ? 2 * (kb % 4) : 0;
            __m512i mw = _mm512_setzero_si512();
            const __m512i sw = k23_pair_words(b, kb, &mw, Q3);
            acc = _mm512_add_ps(acc, k23_fold(_mm512_srai_epi32(is[2 * kb], sc), _mm512_srai_epi32(is[2 * kb + 1], sc), sw, mw, d, dm, dx[i * 8 + kb],
                                              Q3 ? 0 : act[kb], Q3));
        }
#undef K23_SCALED
    }
    _mm512_storeu_ps(y, acc);
}

/* ---- Q4_1_R16 / Q5_0_R16 / Q5_1_R16 / IQ4_NL_R16 (blocks of 32) ----
 * Per block of 32 and 16 rows: the 16 d (one convert), Q4_1 / Q5_1 the 16 m, and 8 code vectors
 * of 16 rows x 4 codes (the 4 qs vectors' low and high nibbles; Q5_x's fifth bits one shift and
 * one ternary-logic op away, fl_b16_qh_word; IQ4_NL's table values + 128 by a byte shuffle).
 * Each token's int32 sums start at -offset x its activation code sum (Q5_0 16, IQ4_NL 128), then
 *     acc += f32(sum) * (d * d_x)   (Q4_1 / Q5_1 then  acc -= m * (-s d_x), fl_act_q8.ms)
 * per block, so a token has the same bits in any step. */
enum { B16_Q4_1, B16_Q5_0, B16_Q5_1, B16_IQ4_NL };
#define B16_Q5(k) ((k) == B16_Q5_0 || (k) == B16_Q5_1)
#define B16_MINS(k) ((k) == B16_Q4_1 || (k) == B16_Q5_1)
INLINE int32_t b16_type(const int kind) {
    return kind == B16_Q4_1 ? FL_TYPE_Q4_1_R16 : kind == B16_Q5_0 ? FL_TYPE_Q5_0_R16 : kind == B16_Q5_1 ? FL_TYPE_Q5_1_R16 : FL_TYPE_IQ4_NL_R16;
}
INLINE size_t b16_bytes(const int kind) {
    return (size_t)FL_K16_ROWS * (kind == B16_Q4_1 ? 20 : kind == B16_Q5_0 ? 22 : kind == B16_Q5_1 ? 24 : 18);
}
/* prefetch distance into L1 (the rows stream from memory in a decode step): 16-20 blocks.
 * TinyLlama-shaped Q5_0, `fitllm bench model -p 0 -n 64 -t 2`, three alternated rounds, paired %
 * of the bandwidth: 1536 B 78.5, 75.1, 78.8; 3072 76.6, 85.5, 75.8; 6144 83.6, 84.3, 77.4 (within
 * this VM's noise) */
#define B16_PF 6144

INLINE __m512i b16_table(const int kind) {
    if (kind != B16_IQ4_NL) return _mm512_setzero_si512();
    return _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)fl_iq4nl_values)), _mm512_set1_epi8((char)0x80));
}

/* Block b's 8 code vectors: w[v] the codes 4v.. of the 16 rows (activations 4v..4v+3), w[4 + v]
 * the codes 16 + 4v.. */
INLINE void b16_codes(const unsigned char *b, const int kind, __m512i tab, __m512i *w) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    const size_t qs = fl_b16_qs(b16_type(kind));
    const __m512i h = B16_Q5(kind) ? _mm512_loadu_si512(b + fl_b16_qh(b16_type(kind))) : _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m512i z = _mm512_loadu_si512(b + qs + 64 * v);
        __m512i lo = _mm512_and_si512(z, m4), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
        if (B16_Q5(kind)) { /* lo | (bit v of h, moved to bit 4), hi | (bit 4 + v): no bit of the next byte lands on bit 4 */
            lo = _mm512_ternarylogic_epi32(lo, _mm512_slli_epi16(h, 4 - v), b4, 0xF8);
            hi = _mm512_ternarylogic_epi32(hi, v ? _mm512_srli_epi16(h, v) : h, b4, 0xF8);
        }
        if (kind == B16_IQ4_NL) lo = _mm512_shuffle_epi8(tab, lo), hi = _mm512_shuffle_epi8(tab, hi);
        w[v] = lo, w[4 + v] = hi;
    }
}

/* token t's fold of block j (the same in the tile and the GEMV) */
INLINE __m512 b16_fold(__m512 acc, __m512i is, __m512 dw, __m512 mw, const fl_act_q8 *a, int64_t jt, const int kind) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(a->d[jt])), acc);
    if (B16_MINS(kind)) acc = _mm512_fnmadd_ps(mw, _mm512_set1_ps(a->ms[jt]), acc);
    return acc;
}

INLINE int32_t b16_off(const int kind) { return kind == B16_Q5_0 ? 16 : kind == B16_IQ4_NL ? 128 : 0; }

/* 16 rows (one group at g) x NT tokens (1..K16_TOKENS) from token m0; pf: prefetch */
INLINE void b16_tile(const unsigned char *g, const fl_act_q8 *a, int64_t m0, const int NT, float *y, int64_t ldy, const bool pf,
                     const int kind) {
    const int64_t K = a->K, nb = a->nb;
    const size_t bsz = b16_bytes(kind);
    const __m512i tab = b16_table(kind);
    __m512 acc[K16_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nb; j++) {
        const unsigned char *b = g + (size_t)j * bsz;
        if (pf)
            for (size_t l = 0; l < bsz; l += 64) _mm_prefetch((const char *)b + B16_PF + l, _MM_HINT_T0);
        __m512i w[8], is[K16_TOKENS];
        b16_codes(b, kind, tab, w);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b));
        const __m512 mw = B16_MINS(kind) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 32))) : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) is[t] = _mm512_set1_epi32(-b16_off(kind) * a->s[(m0 + t) * nb + j]);
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++)
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                is[t] = _mm512_dpbusd_epi32(is[t], w[v], bcast4(a->qs + (m0 + t) * K + j * 32 + (v < 4 ? 4 * v : 16 + 4 * (v - 4))));
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[t] = b16_fold(acc[t], is[t], dw, mw, a, (m0 + t) * nb + j, kind);
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

/* One token (the GEMV): the tile's arithmetic, the 8 products of a block in four chains (exact
 * integer sums: the same bits). */
INLINE void b16_gemv(const unsigned char *g, const fl_act_q8 *a, int64_t m, float *y, const int kind) {
    const int64_t K = a->K, nb = a->nb;
    const size_t bsz = b16_bytes(kind);
    const __m512i tab = b16_table(kind);
    const int8_t *x = a->qs + m * K;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < nb; j++) {
        const unsigned char *b = g + (size_t)j * bsz;
        for (size_t l = 0; l < bsz; l += 64) _mm_prefetch((const char *)b + B16_PF + l, _MM_HINT_T0);
        __m512i w[8];
        b16_codes(b, kind, tab, w);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b));
        const __m512 mw = B16_MINS(kind) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 32))) : _mm512_setzero_ps();
        const int8_t *xb = x + j * 32;
        const __m512i z = _mm512_setzero_si512();
        __m512i c0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-b16_off(kind) * a->s[m * nb + j]), w[0], bcast4(xb));
        __m512i c1 = _mm512_dpbusd_epi32(z, w[1], bcast4(xb + 4)), c2 = _mm512_dpbusd_epi32(z, w[4], bcast4(xb + 16));
        __m512i c3 = _mm512_dpbusd_epi32(z, w[5], bcast4(xb + 20));
        c0 = _mm512_dpbusd_epi32(c0, w[2], bcast4(xb + 8));
        c1 = _mm512_dpbusd_epi32(c1, w[3], bcast4(xb + 12));
        c2 = _mm512_dpbusd_epi32(c2, w[6], bcast4(xb + 24));
        c3 = _mm512_dpbusd_epi32(c3, w[7], bcast4(xb + 28));
        acc = b16_fold(acc, _mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)), dw, mw, a, m * nb + j, kind);
    }
    _mm512_storeu_ps(y, acc);
}

#define B16_TILE_CASE(kind, n)                                                                                                 \
    case n: b16_tile(g, a, m, n, yt, ldy, pf, kind); break;
#define B16_GEMM(name, kind)                                                                                                   \
    static void name(const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y, int64_t ldy) {      \
        for (int r = 0; r < nr; r += FL_K16_ROWS) {                                                                            \
            const unsigned char *g = (const unsigned char *)w + (size_t)r * ldw;                                               \
            if (nt == 1) {                                                                                                     \
                b16_gemv(g, a, m0, y + r, kind);                                                                               \
                continue;                                                                                                      \
            }                                                                                                                  \
            for (int t0 = 0; t0 < nt; t0 += K16_TOKENS) {                                                                      \
                const int n = nt - t0 < K16_TOKENS ? nt - t0 : K16_TOKENS;                                                     \
                const int64_t m = m0 + t0;                                                                                     \
                float *yt = y + t0 * ldy + r;                                                                                  \
                const bool pf = t0 == 0;                                                                                       \
                switch (n) {                                                                                                   \
                    B16_TILE_CASE(kind, 1)                                                                                     \
                    B16_TILE_CASE(kind, 2)                                                                                     \
                    B16_TILE_CASE(kind, 3)                                                                                     \
                    B16_TILE_CASE(kind, 4)                                                                                     \
                    B16_TILE_CASE(kind, 5)                                                                                     \
                    B16_TILE_CASE(kind, 6)                                                                                     \
                    B16_TILE_CASE(kind, 7)                                                                                     \
                default: b16_tile(g, a, m, 8, yt, ldy, pf, kind);                                                              \
                }                                                                                                              \
            }                                                                                                                  \
        }                                                                                                                      \
    }
B16_GEMM(b16_gemm_q4_1, B16_Q4_1)
B16_GEMM(b16_gemm_q5_0, B16_Q5_0)
B16_GEMM(b16_gemm_q5_1, B16_Q5_1)
B16_GEMM(b16_gemm_iq4_nl, B16_IQ4_NL)

#define K16_TILE_CASE(n)                                                                                   \
    case n:                                                                                                \
        (q6   ? k16_q6_tile(g, a, m, n, yt, ldy, pf)                                                       \
         : q5 ? k16_tile(g, a, m, n, yt, ldy, pf, true)                                                    \
         : q3 ? k23_tile(g, a, m, n, yt, ldy, pf, true)                                                    \
         : q2 ? k23_tile(g, a, m, n, yt, ldy, pf, false)                                                   \
              : k16_tile(g, a, m, n, yt, ldy, pf, false));                                                 \
        break;

void fl_k16_gemm_avx512(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y, int64_t ldy) {
    FL_ASSERT(nr % FL_K16_ROWS == 0 && fl_k16_type(wtype));
    if (fl_b16_type(wtype)) {
        (wtype == FL_TYPE_Q4_1_R16   ? b16_gemm_q4_1
         : wtype == FL_TYPE_Q5_0_R16 ? b16_gemm_q5_0
         : wtype == FL_TYPE_Q5_1_R16 ? b16_gemm_q5_1
                                     : b16_gemm_iq4_nl)(w, ldw, nr, a, m0, nt, y, ldy);
        return;
    }
    const bool q6 = wtype == FL_TYPE_Q6_K_R16, q5 = wtype == FL_TYPE_Q5_K_R16, q3 = wtype == FL_TYPE_Q3_K_R16, q2 = wtype == FL_TYPE_Q2_K_R16;
    for (int r = 0; r < nr; r += FL_K16_ROWS) {
        const unsigned char *g = (const unsigned char *)w + (size_t)r * ldw;
        if (nt == 1) {
            if (q6) k16_q6_gemv(g, a, m0, y + r);
            else if (q5) k16_gemv(g, a, m0, y + r, true);
            else if (q3) k23_gemv(g, a, m0, y + r, true);
            else if (q2) k23_gemv(g, a, m0, y + r, false);
            else k16_gemv(g, a, m0, y + r, false);
            continue;
        }
        for (int t0 = 0; t0 < nt; t0 += K16_TOKENS) {
            const int n = nt - t0 < K16_TOKENS ? nt - t0 : K16_TOKENS;
            const int64_t m = m0 + t0;
            float *yt = y + t0 * ldy + r;
            const bool pf = t0 == 0; /* (later passes find the group in L1 / L2) */
            switch (n) {
                K16_TILE_CASE(1)
                K16_TILE_CASE(2)
                K16_TILE_CASE(3)
                K16_TILE_CASE(4)
                K16_TILE_CASE(5)
                K16_TILE_CASE(6)
                K16_TILE_CASE(7)
                default: K16_TILE_CASE(8)
            }
        }
    }
}

/* The Q4_K panel of one group (fl_panel_pack_avx512's layout: per 32-block the 16 rows' f32
 * d sc_j, then the codes [k / 4][row][k % 4] as bytes; the mins dmin m_j after the blocks): a
 * group's 64-byte vectors are that order already, so a sub-block's codes are 8 ands (or shifts
 * and ands) and stores. */
static void k16_q6_panel_pack(const void *w, int64_t K, void *panel);
static void k23_panel_pack(const void *w, int64_t K, void *panel, bool q3);

void fl_k16_panel_pack_avx512(int32_t wtype, const void *w, int64_t K, void *panel) {
    FL_ASSERT(!fl_b16_type(wtype)); /* (their tiles take every step: matmul.c, panel_direct) */
    if (wtype == FL_TYPE_Q6_K_R16) {
        k16_q6_panel_pack(w, K, panel);
        return;
    }
    if (wtype == FL_TYPE_Q3_K_R16 || wtype == FL_TYPE_Q2_K_R16) {
        k23_panel_pack(w, K, panel, wtype == FL_TYPE_Q3_K_R16);
        return;
    }
    /* Q5_K's AVX2 panel (pack_q5_K): the same with codes 0..31 and the mins words dmin m_j - 16 d sc_j */
    const bool q5 = wtype == FL_TYPE_Q5_K_R16;
    FL_ASSERT(wtype == FL_TYPE_Q4_K_R16 || q5);
    const int64_t nsb = K / 256, nb = K / 32;
    const size_t pblock = FL_PANEL_ROWS * 4 + FL_PANEL_ROWS * 32, bsz = q5 ? FL_K16_Q5_BLOCK : FL_K16_BLOCK, qs = q5 ? FL_K16_Q5_QS : FL_K16_QS;
    float *mins = (float *)((char *)panel + nb * pblock);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512 c16 = _mm512_set1_ps(16.0f);
    for (int64_t i = 0; i < nsb; i++) {
        const unsigned char *b = (const unsigned char *)w + (size_t)i * bsz;
        const k16_sb sb = k16_sb_load(b);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const k16_scales s = k16_pair(&sb, c);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                char *o = (char *)panel + (size_t)(i * 8 + 2 * c + h) * pblock;
                _mm512_storeu_ps(o, s.sc[h]);
                _mm512_storeu_ps(mins + (i * 8 + 2 * c + h) * FL_PANEL_ROWS, q5 ? _mm512_sub_ps(s.mn[h], _mm512_mul_ps(c16, s.sc[h])) : s.mn[h]);
#pragma GCC unroll 8
                for (int v = 0; v < 8; v++) {
                    const __m512i raw = _mm512_loadu_si512(b + qs + 512 * c + 64 * v);
                    __m512i code = h ? _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4) : _mm512_and_si512(raw, m4);
                    if (q5) code = _mm512_or_si512(code, q5_bits(b, v, 2 * c + h));
                    _mm512_storeu_si512(o + 64 + 64 * v, code);
                }
            }
        }
    }
}

/* Q6_K's AVX2 panel (kernels/avx2/panel_avx2.c, pack_q6_K): per 32-block its 16 rows' d as f32
 * and its codes 0..63 [k / 4][row][k % 4], then after the blocks each 16-code half's scale as
 * the int16 words (sc, sc), [super-block][half][row]; a group's planes are those rows already. */
static void k16_q6_panel_pack(const void *w, int64_t K, void *panel) {
    const int64_t nsb = K / 256, nb = K / 32;
    const size_t pblock = FL_PANEL_ROWS * 4 + FL_PANEL_ROWS * 32;
    uint32_t *words = (uint32_t *)((char *)panel + nb * pblock);
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    for (int64_t i = 0; i < nsb; i++) {
        const unsigned char *b = (const unsigned char *)w + (size_t)i * FL_K16_Q6_BLOCK;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b));
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + FL_K16_Q6_SCALES + 16 * j)));
            _mm512_storeu_si512(words + (i * 16 + j) * FL_PANEL_ROWS, _mm512_or_si512(_mm512_and_si512(sc, lo16), _mm512_slli_epi32(sc, 16)));
        }
#pragma GCC unroll 8
        for (int kb = 0; kb < 8; kb++) {
            char *o = (char *)panel + (size_t)(i * 8 + kb) * pblock;
            const __m128i lsh = _mm_cvtsi32_si128(kb % 4 >= 2 ? 4 : 0), hsh = _mm_cvtsi32_si128(2 * (kb % 4));
            _mm512_storeu_ps(o, d);
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) _mm512_storeu_si512(o + 64 + 64 * v, q6_codes(b, kb, v, lsh, hsh));
        }
    }
}

/* Q3_K's / Q2_K's AVX2 panel (fl_panel_pack_ref): per 32-block its 16 rows' d as f32 and its codes
 * (Q3_K 0..7 = value + 4, Q2_K 0..3) [k / 4][row][k % 4], the group's code vectors; after the
 * blocks Q3_K each half's scale as the int16 words (sc, sc) [block][half][row], Q2_K per block
 * the words (sc, sc) of its two halves, then (m, m), [block][4][row], then dmin as f32 [block][row]. */
static void k23_panel_pack(const void *w, int64_t K, void *panel, bool q3) {
    const int64_t nsb = K / 256, nb = K / 32;
    const size_t pblock = FL_PANEL_ROWS * 4 + FL_PANEL_ROWS * 32, bsz = q3 ? FL_K16_Q3_BLOCK : FL_K16_Q2_BLOCK;
    uint32_t *words = (uint32_t *)((char *)panel + nb * pblock);
    float *dmin = (float *)words + nb * 4 * FL_PANEL_ROWS;
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    for (int64_t i = 0; i < nsb; i++) {
        const unsigned char *b = (const unsigned char *)w + (size_t)i * bsz;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b));
        for (int kb = 0; kb < 8; kb++) {
            const int64_t jb = i * 8 + kb;
            char *o = (char *)panel + (size_t)jb * pblock;
            const __m128i sh = _mm_cvtsi32_si128(2 * (kb % 4));
            const __m512i hb = _mm512_set1_epi8((char)(1 << kb));
            _mm512_storeu_ps(o, d);
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++)
                _mm512_storeu_si512(o + 64 + 64 * v, q3 ? k23_codes(b, kb, v, sh, hb, true) : k23_codes(b, kb, v, sh, hb, false));
            __m512i mw = _mm512_setzero_si512();
            const __m512i sw = q3 ? k23_pair_words(b, kb, &mw, true) : k23_pair_words(b, kb, &mw, false);
            for (int h = 0; h < 2; h++) { /* half h's word of each lane, sign-extended, as (x, x) */
                const __m512i sc = h ? _mm512_srai_epi32(sw, 16) : _mm512_srai_epi32(_mm512_slli_epi32(sw, 16), 16);
                const __m512i mn = h ? _mm512_srai_epi32(mw, 16) : _mm512_srai_epi32(_mm512_slli_epi32(mw, 16), 16);
                const __m512i sc2 = _mm512_or_si512(_mm512_and_si512(sc, lo16), _mm512_slli_epi32(sc, 16));
                if (q3) {
                    _mm512_storeu_si512(words + (jb * 2 + h) * FL_PANEL_ROWS, sc2);
                    continue;
                }
                _mm512_storeu_si512(words + (jb * 4 + h) * FL_PANEL_ROWS, sc2);
                _mm512_storeu_si512(words + (jb * 4 + 2 + h) * FL_PANEL_ROWS, _mm512_or_si512(_mm512_and_si512(mn, lo16), _mm512_slli_epi32(mn, 16)));
            }
            if (!q3) _mm512_storeu_ps(dmin + jb * FL_PANEL_ROWS, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 32))));
        }
    }
}
