/* AVX2 row dots of Q4_1, Q5_0, Q5_1, IQ4_NL (blocks of 32) and Q3_K, Q2_K (super-blocks of 256)
 * against 8-bit activations: the decode GEMV of these types (their one-token steps had gone
 * through the 16-row panels, whose pack per 16 rows is paid for one token) and, for Q3_K / Q2_K,
 * steps of up to 4 tokens (fl_matmul_gemv_max_tokens): each row is read from memory once and from
 * L1 for every further token, and a token gets the same bits at any such step size.  Reference:
 * fl_gemm_q8_ref (ref/matmul.c), which these match to f32 rounding (the integer sums are exact;
 * the f32 sums go in another order).
 *
 * Blocks of 32: the 32 codes of a block go into one ymm as unsigned bytes (Q4_1 / Q5_x: the
 * nibbles split by a 128-bit broadcast and one variable shift; Q5_x's fifth bits from qh by a
 * byte shuffle and a compare), one maddubs + madd gives 8 int32 lanes of sum(u x), converted and
 * fma'd with d_w d_x (made for 8 blocks at once).  The affine part (Q4_1 / Q5_1 m_w, Q5_0's
 * -16 d_w) times d_x s_x is one 8-lane fma per 8 blocks.  IQ4_NL looks its codes up in the table
 * with a byte shuffle and multiplies |v| by sign(x, v) (|pair| <= 2 x 127 x 127, no saturation).
 *
 * Super-blocks: per group of 32 codes (one activation block), maddubs(u, x) gives int16 pairs and
 * one madd with the two 16-code sub-blocks' scale words (low / high 128-bit lane, one byte shuffle
 * of the 16 scale bytes) takes them into int32, converted and fma'd with d d_x.  The constant
 * parts (Q3_K's -4 offset, Q2_K's dmin x mins) need the 16-code half sums of x: they come from
 * fl_act_q8.o6 (-32 x the half sums by lane parity), one madd against the scale or min words
 * for 8 groups at once. */
#include "kernels/avx2/f16x8_avx2.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* Rows stream from memory once: each dot prefetches its row PF_AHEAD bytes ahead of its loads
 * (into the next rows, which follow in memory), as the Q4_0 / Q8_0 GEMV does; the hardware
 * prefetchers alone leave the loads waiting. */
#define PF_AHEAD 4096
INLINE void prefetch_span(const char *p, size_t n) {
    for (size_t l = 0; l < n; l += 64) _mm_prefetch(p + PF_AHEAD + l, _MM_HINT_T0);
}

/* ---- blocks of 32 ---- */

INLINE size_t b32_size(const int32_t t) {
    return t == FL_TYPE_Q4_1 ? sizeof(fl_block_q4_1) : t == FL_TYPE_Q5_0 ? sizeof(fl_block_q5_0)
         : t == FL_TYPE_Q5_1 ? sizeof(fl_block_q5_1) : sizeof(fl_block_iq4_nl);
}
INLINE size_t b32_qs(const int32_t t) {
    return t == FL_TYPE_Q4_1 ? offsetof(fl_block_q4_1, qs) : t == FL_TYPE_Q5_0 ? offsetof(fl_block_q5_0, qs)
         : t == FL_TYPE_Q5_1 ? offsetof(fl_block_q5_1, qs) : offsetof(fl_block_iq4_nl, qs);
}

/* The 32 codes of the block at p: unsigned 0..15 / 0..31, IQ4_NL's signed table values. */
INLINE __m256i b32_codes(const int32_t t, const char *p) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), split = _mm256_setr_epi64x(0, 0, 4, 4);
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + b32_qs(t))));
    __m256i u = _mm256_and_si256(_mm256_srlv_epi64(q, split), m4); /* lane 0: low nibbles = codes 0..15 */
    if (t == FL_TYPE_Q5_0 || t == FL_TYPE_Q5_1) { /* bit j of qh: the fifth bit of code j */
        int32_t qh;
        memcpy(&qh, p + (t == FL_TYPE_Q5_0 ? offsetof(fl_block_q5_0, qh) : offsetof(fl_block_q5_1, qh)), 4);
        const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
        const __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread);
        u = _mm256_or_si256(u, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), _mm256_set1_epi8(16)));
    }
    if (t == FL_TYPE_IQ4_NL)
        u = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)fl_iq4nl_values)), u);
    return u;
}

/* One row of type t (blocks of 32) x token m. */
INLINE float dot_b32(const int32_t t, const char *w, const fl_act_q8 *a, int64_t m) {
    const size_t bsz = b32_size(t);
    const bool affine = t == FL_TYPE_Q4_1 || t == FL_TYPE_Q5_1; /* m_w after d */
    const int64_t nb = a->nb;
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * nb;
    const int32_t *sx = a->s + m * nb;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    _Alignas(32) float sc[8];
    for (int64_t b = 0; b < nb; b += 8) {
        const int n = nb - b < 8 ? (int)(nb - b) : 8;
        prefetch_span(w + (size_t)b * bsz, (size_t)n * bsz);
        __m256 d8, m8 = _mm256_setzero_ps(), dx8, s8;
        if (n == 8) {
            d8 = fl_f16x8_avx2(w + (size_t)b * bsz, bsz);
            if (affine) m8 = fl_f16x8_avx2(w + (size_t)b * bsz + 2, bsz);
            dx8 = _mm256_loadu_ps(dx + b);
            s8 = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(sx + b)));
        } else { /* the tail: the missing blocks count 0 */
            _Alignas(32) float dt[8] = {0}, mt[8] = {0}, xt[8] = {0}, st[8] = {0};
            for (int j = 0; j < n; j++) {
                uint16_t h;
                memcpy(&h, w + (size_t)(b + j) * bsz, 2);
                dt[j] = _cvtsh_ss(h);
                if (affine) {
                    memcpy(&h, w + (size_t)(b + j) * bsz + 2, 2);
                    mt[j] = _cvtsh_ss(h);
                }
                xt[j] = dx[b + j];
                st[j] = (float)sx[b + j];
            }
            d8 = _mm256_load_ps(dt), m8 = _mm256_load_ps(mt), dx8 = _mm256_load_ps(xt), s8 = _mm256_load_ps(st);
        }
        const __m256 sd = _mm256_mul_ps(d8, dx8);
        _mm256_store_ps(sc, sd);
        if (affine) accm = _mm256_fmadd_ps(_mm256_mul_ps(m8, dx8), s8, accm);
        if (t == FL_TYPE_Q5_0) accm = _mm256_fmadd_ps(_mm256_mul_ps(sd, _mm256_set1_ps(-16.0f)), s8, accm); /* codes - 16 */
#define B32_BLOCK(j)                                                                                                       \
    do {                                                                                                                   \
        const __m256i u = b32_codes(t, w + (size_t)(b + (j)) * bsz), xv = _mm256_loadu_si256((const __m256i *)(x + (b + (j)) * 32)); \
        const __m256i is = t == FL_TYPE_IQ4_NL                                                                             \
                               ? _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(xv, u)), ones) \
                               : _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), ones);                                     \
        if ((j) & 1) acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_broadcast_ss(sc + (j)), acc1);                 \
        else acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_broadcast_ss(sc + (j)), acc0);                         \
    } while (0)
        if (n == 8) {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) B32_BLOCK(j);
        } else {
#pragma GCC unroll 1
            for (int j = 0; j < n; j++) B32_BLOCK(j);
        }
#undef B32_BLOCK
    }
    return fl_hsum8_avx2(_mm256_add_ps(acc0, acc1)) + fl_hsum8_avx2(accm);
}

/* ---- super-blocks (Q3_K, Q2_K) ---- */

/* The scale words of group g (codes 32 g .. 32 g + 31) from the 16 scale bytes in both 128-bit
 * lanes (sb): sub-block 2 g in the low lane, 2 g + 1 in the high one, one byte shuffle.  Unsigned
 * (Q2_K): the byte zero-extended; signed (Q3_K): the byte as the high half of its word, 256 x sc. */
INLINE __m256i group_words(__m256i sb, const int g, const bool sgn) {
    const char l = (char)(2 * g), h = (char)(2 * g + 1), z = (char)0x80;
    const __m256i pick = sgn ? _mm256_setr_epi8(z, l, z, l, z, l, z, l, z, l, z, l, z, l, z, l, z, h, z, h, z, h, z, h, z, h, z, h, z, h, z, h)
                             : _mm256_setr_epi8(l, z, l, z, l, z, l, z, l, z, l, z, l, z, l, z, h, z, h, z, h, z, h, z, h, z, h, z, h, z, h, z);
    return _mm256_shuffle_epi8(sb, pick);
}

/* fl_q3_K_scales in one xmm: byte j = (low 4 bits | 2 high bits << 4) - 32, the low bits from
 * the nibbles of bytes 0..7 (j < 8: low, else high), the high ones bits 2 (j / 4) of byte 8 + j % 4. */
INLINE __m128i q3_K_scales(const uint8_t *s) {
    int64_t l8;
    int32_t h4;
    memcpy(&l8, s, 8);
    memcpy(&h4, s + 8, 4);
    const __m128i m4 = _mm_set1_epi8(0x0F), l = _mm_cvtsi64_si128(l8);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(l, m4), _mm_and_si128(_mm_srli_epi16(l, 4), m4));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(h4), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

/* For the 8 activation blocks of one super-block: lane g = -32 (w_{2g} H_{g,0} + w_{2g+1} H_{g,1})
 * as f32, H the 16-code half sums of block g (from o6, 2 int32 per block) and w16 the 16
 * sub-block words. */
INLINE __m256 half_sums_times(const int32_t *o6, __m256i w16) {
    const __m256i s = _mm256_permute4x64_epi64(w16, 0xD8); /* words 0-3, 8-11 | 4-7, 12-15 */
    const __m256i lo = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)o6), _mm256_unpacklo_epi16(s, s));
    const __m256i hi = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(o6 + 8)), _mm256_unpackhi_epi16(s, s));
    /* hadd: groups 0 1 4 5 | 2 3 6 7 */
    return _mm256_cvtepi32_ps(_mm256_permute4x64_epi64(_mm256_hadd_epi32(lo, hi), 0xD8));
}

/* One Q3_K / Q2_K row x token m.  Q3_K: code = two bits + 4 x (hmask bit) - 4, so sum(code x) =
 * sum(u x) - 4 H per 16-code half (u = 0..7); Q2_K: d sc q - dmin m per half. */
INLINE float dot_k2(const bool q3, const char *w, const fl_act_q8 *a, int64_t m) {
    const int64_t nsb = a->K / FL_QK_K, nb = a->nb;
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * nb;
    const int32_t *o6 = a->o6 + m * nb * 2;
    const __m256i m3 = _mm256_set1_epi8(3), four8 = _mm256_set1_epi8(4);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acck = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *qs, *hm = NULL;
        __m256i sw, sb; /* the 16 scale words; the 16 scale bytes in both lanes */
        __m256 sd; /* d d_x of the 8 groups (Q3_K: / 256, for its words' 256 x sc) */
        const __m256 dx8 = _mm256_loadu_ps(dx + i * 8);
        prefetch_span(w + (size_t)i * (q3 ? sizeof(fl_block_q3_K) : sizeof(fl_block_q2_K)), q3 ? sizeof(fl_block_q3_K) : sizeof(fl_block_q2_K));
        if (q3) {
            const fl_block_q3_K *b = (const fl_block_q3_K *)w + i;
            const __m128i s = q3_K_scales(b->scales);
            sw = _mm256_cvtepi8_epi16(s);
            sb = _mm256_broadcastsi128_si256(s);
            sd = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), dx8);
            qs = b->qs, hm = b->hmask;
            /* -4 sum_h sc H = (1/8) (-32 sum_h sc H) */
            acck = _mm256_fmadd_ps(half_sums_times(o6 + i * 16, sw), _mm256_mul_ps(sd, _mm256_set1_ps(0.125f)), acck);
            sd = _mm256_mul_ps(sd, _mm256_set1_ps(1.0f / 256));
        } else {
            const fl_block_q2_K *b = (const fl_block_q2_K *)w + i;
            const __m128i s = _mm_loadu_si128((const __m128i *)b->scales), m4 = _mm_set1_epi8(0x0F);
            sw = _mm256_cvtepu8_epi16(_mm_and_si128(s, m4));
            sb = _mm256_broadcastsi128_si256(_mm_and_si128(s, m4));
            sd = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), dx8);
            qs = b->qs;
            /* - dmin sum_h m H d_x = (dmin d_x / 32) (-32 sum_h m H) */
            const __m256 md = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->dmin) * (1.0f / 32)), dx8);
            acck = _mm256_fmadd_ps(half_sums_times(o6 + i * 16, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4))), md, acck);
        }
        const __m256i q0 = _mm256_loadu_si256((const __m256i *)qs), q1 = _mm256_loadu_si256((const __m256i *)(qs + 32));
        const __m256i h = q3 ? _mm256_loadu_si256((const __m256i *)hm) : _mm256_setzero_si256();
        const int8_t *xb = x + i * FL_QK_K;
        _Alignas(32) float sdv[8];
        _mm256_store_ps(sdv, sd);
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            __m256i u = _mm256_and_si256(_mm256_srli_epi16(g < 4 ? q0 : q1, 2 * (g % 4)), m3);
            if (q3) /* hmask bit g of each byte to bit 2 */
                u = _mm256_or_si256(u, _mm256_and_si256(g < 2 ? _mm256_slli_epi16(h, 2 - g) : _mm256_srli_epi16(h, g - 2), four8));
            const __m256i p16 = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(xb + 32 * g)));
            const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, group_words(sb, g, q3)));
            const __m256 s = _mm256_broadcast_ss(sdv + g);
            if (g & 1) acc1 = _mm256_fmadd_ps(p, s, acc1);
            else acc0 = _mm256_fmadd_ps(p, s, acc0);
        }
    }
    return fl_hsum8_avx2(_mm256_add_ps(acc0, acc1)) + fl_hsum8_avx2(acck);
}

static float dot_q4_1(const char *w, const fl_act_q8 *a, int64_t m) { return dot_b32(FL_TYPE_Q4_1, w, a, m); }
static float dot_q5_0(const char *w, const fl_act_q8 *a, int64_t m) { return dot_b32(FL_TYPE_Q5_0, w, a, m); }
static float dot_q5_1(const char *w, const fl_act_q8 *a, int64_t m) { return dot_b32(FL_TYPE_Q5_1, w, a, m); }
static float dot_iq4_nl(const char *w, const fl_act_q8 *a, int64_t m) { return dot_b32(FL_TYPE_IQ4_NL, w, a, m); }
static float dot_q3_K(const char *w, const fl_act_q8 *a, int64_t m) { return dot_k2(true, w, a, m); }
static float dot_q2_K(const char *w, const fl_act_q8 *a, int64_t m) { return dot_k2(false, w, a, m); }

bool fl_gemm_rows_avx2(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt,
                       float *y, int64_t ldy) {
    float (*row)(const char *, const fl_act_q8 *, int64_t);
    switch (wtype) {
    case FL_TYPE_Q4_1: row = dot_q4_1; break;
    case FL_TYPE_Q5_0: row = dot_q5_0; break;
    case FL_TYPE_Q5_1: row = dot_q5_1; break;
    case FL_TYPE_IQ4_NL: row = dot_iq4_nl; break;
    case FL_TYPE_Q3_K: row = dot_q3_K; break;
    case FL_TYPE_Q2_K: row = dot_q2_K; break;
    default: return false;
    }
    const char *wc = w;
    for (int r = 0; r < nr; r++) /* each row from L1 for every token */
        for (int t = 0; t < nt; t++) y[t * ldy + r] = row(wc + (size_t)r * ldw, a, m0 + t);
    return true;
}
