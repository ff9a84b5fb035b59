/* AVX2 integer GEMV (Q8_0 / Q4_0 weights x 8-bit activations, one or a few tokens), Q4_K / Q5_K / Q6_K row dots, and the
 * f32 dot.
 * One ymm holds one block of 32 codes.  maddubs multiplies unsigned by signed bytes: Q4_0
 * nibbles enter as 0..15 and the -8 offset is removed lane by lane: each int32 lane (4 codes)
 * subtracts 8 times its own 4 activation codes (one maddubs + madd per token and block, shared by
 * the pass's rows), so every lane holds sum (w - 8) x as llama.cpp's AVX2 dot does and the f32
 * sums take its rounding; Q8_0 uses |w| and sign(x, w).  Passes of 4 rows x 1-2 tokens or 2 rows
 * x 3-4 tokens keep the accumulators in registers (gemv_rows).  Reference: fl_gemm_q8_ref;
 * order: fl_dot_q8_llama. */
#include "kernels/avx2/f16x8_avx2.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* Q4_K row x token m: per super-block the 8 scales (d sc_j) d_x and mins (dmin m_j) unpacked
 * with 32-bit masks; per 32 code bytes the low nibbles are sub-block 2g and the high ones 2g + 1,
 * each one maddubs (codes 0..15 unsigned, so no offset) + madd into 8 int32 lanes, converted and
 * fma'd with its sub-block's scale; the mins term d_x s_j dmin m_j is one 8-lane fma. */
INLINE float dot_k4(const char *w, const fl_act_q8 *a, int64_t m, const bool q5) {
    /* Q4_K and Q5_K share d, dmin and scales at the start; Q5_K's qh[32] comes before its qs */
    const size_t bsz = q5 ? sizeof(fl_block_q5_K) : sizeof(fl_block_q4_K);
    const size_t qs_off = q5 ? offsetof(fl_block_q5_K, qs) : offsetof(fl_block_q4_K, qs);
    const __m256i one8 = _mm256_set1_epi8(1);
    const int64_t nsb = a->K / FL_QK_K;
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    const int32_t *sx = a->s + m * a->nb;
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const fl_block_q4_K *b = (const fl_block_q4_K *)(w + (size_t)i * bsz); /* d, dmin, scales */
        const uint8_t *qs = (const uint8_t *)b + qs_off;
        const __m256i hb = q5 ? _mm256_loadu_si256((const __m256i *)((const fl_block_q5_K *)b)->qh) : _mm256_setzero_si256();
        uint8_t sc[8], mn[8];
        fl_k4_scale_min_bytes(b->scales, sc, mn);
        const __m256 dx8 = _mm256_loadu_ps(dx + i * 8);
        const __m256 scf = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)),
                                                       _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc)))), dx8);
        const __m256 mnf = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->dmin)),
                                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn))));
        mins = _mm256_fmadd_ps(mnf, _mm256_mul_ps(dx8, _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(sx + i * 8)))), mins);
        const int8_t *xb = x + i * FL_QK_K;
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (q5) { /* bit j of qh[l]: the fifth bit of code l of sub-block j (2g, 2g + 1) */
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), one8), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g + 1), one8), 4));
            }
            const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(xb + 64 * g))), ones);
            const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xb + 64 * g + 32))), ones);
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(plo), _mm256_permutevar8x32_ps(scf, _mm256_set1_epi32(2 * g)), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(phi), _mm256_permutevar8x32_ps(scf, _mm256_set1_epi32(2 * g + 1)), acc1);
        }
    }
    return fl_hsum8_avx2(_mm256_add_ps(acc0, acc1)) - fl_hsum8_avx2(mins);
}
static float dot_q4_K(const char *w, const fl_act_q8 *a, int64_t m) { return dot_k4(w, a, m, false); }
static float dot_q5_K(const char *w, const fl_act_q8 *a, int64_t m) { return dot_k4(w, a, m, true); }

/* Q6_K row x token m: per 32 codes (two 16-code sub-blocks sharing one activation block) the
 * 6-bit codes are rebuilt from ql / qh, maddubs(q, x) - maddubs(32, x) gives the pair sums of
 * (q - 32) x in int16 (|.| <= 24130), one madd with the two sub-blocks' int8 scales sums them
 * into int32, and one fma adds them times d d_x. */
static float dot_q6_K(const char *w, const fl_act_q8 *a, int64_t m) {
    const fl_block_q6_K *blk = (const fl_block_q6_K *)w;
    const int64_t nsb = a->K / FL_QK_K;
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const fl_block_q6_K *b = blk + i;
        const float d = _cvtsh_ss(b->d);
        for (int n = 0; n < 2; n++) {
            const __m256i A = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * n));
            const __m256i C = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * n + 32));
            const __m256i H = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * n));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_slli_epi16(_mm256_and_si256(H, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(C, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(C, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), m2), 4));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const int64_t off = i * FL_QK_K + 128 * n + 32 * k; /* code index; sub-blocks off/16, off/16 + 1 */
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + off));
                const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q[k], xv), _mm256_maddubs_epi16(k32, xv));
                const int j = (int)((128 * n + 32 * k) / 16);
                const __m256i sc16 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(b->scales[j])),
                                                             _mm_set1_epi16(b->scales[j + 1]), 1);
                const __m256i p = _mm256_madd_epi16(p16, sc16);
                const __m256 s = _mm256_set1_ps(d * dx[off / 32]);
                if (k & 1) acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc1);
                else acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc0);
            }
        }
    }
    return fl_hsum8_avx2(_mm256_add_ps(acc0, acc1));
}

/* One block of NR rows x NT tokens: acc[r * NT + t] += (row r's lanes for token t) * sc[t][r]
 * (d_w d_x, broadcast from memory; token t's scales sc_tok floats on).  Each row's codes are
 * unpacked once for all the tokens; each token's lanes are those of the one-token GEMV. */
INLINE void gemv_block(int32_t wtype, const char *w, size_t ldw, int64_t b, const __m256i *xv, const __m256i *off,
                       const float *sc, size_t sc_stride, size_t sc_tok, __m256 *acc, const int NR, const int NT) {
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
    const __m256i split = _mm256_setr_epi64x(0, 0, 4, 4);
    if (wtype == FL_TYPE_Q4_0) {
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const fl_block_q4_0 *p = (const fl_block_q4_0 *)(w + (size_t)r * ldw) + b;
            const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p->qs));
            const __m256i wv = _mm256_and_si256(_mm256_srlv_epi64(q, split), m4);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const __m256i is = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv[t]), ones), off[t]);
                acc[r * NT + t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_broadcast_ss(sc + t * sc_tok + (size_t)r * sc_stride),
                                                  acc[r * NT + t]);
            }
        }
    } else {
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const fl_block_q8_0 *p = (const fl_block_q8_0 *)(w + (size_t)r * ldw) + b;
            const __m256i wv = _mm256_loadu_si256((const __m256i *)p->qs), wa = _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const __m256i is = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv[t], wv)), ones);
                acc[r * NT + t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_broadcast_ss(sc + t * sc_tok + (size_t)r * sc_stride),
                                                  acc[r * NT + t]);
            }
        }
    }
}

/* NT tokens (decode GEMV: one, or the few of a small batched step) x NR rows of Q4_0 / Q8_0: the
 * rows share each block's activation load and its Q4_0 offset lanes, the tokens each row's
 * codes, so the weights stream from memory once for all the tokens.  Q4_0 nibbles are split by
 * a 128-bit broadcast load and one variable shift (0 in the low half, 4 in the high).  The scales
 * d_w d_x of 8 blocks of a row are made at once (fl_f16x8_avx2, one multiply per token) and
 * broadcast from a small buffer, which took the per-block scalar convert, multiply and broadcast
 * off the vector unit.  Every lane holds llama.cpp's AVX2 sum, folded into f32 and summed in its
 * order (fl_dot_q8_llama) for every token, so the bits are the same as one token at a time. */
INLINE void gemv_rows(int32_t wtype, const char *w, size_t ldw, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy,
                      const int NR, const int NT) {
    const __m256i ones = _mm256_set1_epi16(1), eight = _mm256_set1_epi8(8);
    const int64_t nb = a->nb, K = a->K;
    const int8_t *xq = a->qs + m0 * K;
    const float *dx = a->d + m0 * nb;
    __m256 acc[8];
#pragma GCC unroll 8
    for (int u = 0; u < NR * NT; u++) acc[u] = _mm256_setzero_ps();
    const bool q4 = wtype == FL_TYPE_Q4_0;
    const size_t bsz = q4 ? sizeof(fl_block_q4_0) : sizeof(fl_block_q8_0);
    /* the NR rows are NR * ldw contiguous bytes: sweep the next NR rows into the cache at the
     * rate these are read (one stream ahead of the NR the loads interleave) */
    const char *pf = w + (size_t)NR * ldw;
    _Alignas(32) float sc[4][4][8]; /* [token][row][block] */
    __m256i xv[4], off[4];
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m256 d8 = fl_f16x8_avx2(w + (size_t)r * ldw + (size_t)b * bsz, bsz);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) _mm256_store_ps(sc[t][r], _mm256_mul_ps(d8, _mm256_loadu_ps(dx + t * nb + b)));
        }
#pragma GCC unroll 1 /* rolled: unrolled, GCC hoisted the 32 scale addresses and spilled them (Q8_0 in L2 31 -> 33 GB/s one core) */
        for (int j = 0; j < 8; j++) {
            for (size_t l = 0; l < (size_t)NR * bsz; l += 64) _mm_prefetch(pf + (size_t)(b + j) * NR * bsz + l, _MM_HINT_T0);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                xv[t] = _mm256_loadu_si256((const __m256i *)(xq + t * K + (b + j) * 32));
                off[t] = q4 ? _mm256_madd_epi16(_mm256_maddubs_epi16(eight, xv[t]), ones) : _mm256_setzero_si256();
            }
            gemv_block(wtype, w, ldw, b + j, xv, off, &sc[0][0][j], 8, 32, acc, NR, NT);
        }
    }
    for (; b < nb; b++) { /* the tail: one block at a time */
        for (size_t l = 0; l < (size_t)NR * bsz; l += 64) _mm_prefetch(pf + (size_t)b * NR * bsz + l, _MM_HINT_T0);
        float s1[4][4];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            xv[t] = _mm256_loadu_si256((const __m256i *)(xq + t * K + b * 32));
            off[t] = q4 ? _mm256_madd_epi16(_mm256_maddubs_epi16(eight, xv[t]), ones) : _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                uint16_t d;
                memcpy(&d, w + (size_t)r * ldw + (size_t)b * bsz, 2);
                s1[t][r] = _cvtsh_ss(d) * dx[t * nb + b];
            }
        }
        gemv_block(wtype, w, ldw, b, xv, off, &s1[0][0], 1, 4, acc, NR, NT);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) y[t * ldy + r] = fl_hsum8_avx2(acc[r * NT + t]);
}

/* Q4_0_R8 (groups of 8 interleaved rows, kernels/matmul.h): one group x NT tokens per pass.
 * The lanes are rows: per block, 4 loads of 8 rows x 4 code bytes, each split into its low
 * nibbles (codes 4q..4q+3) and high ones (16 + 4q..) and multiplied by the token's broadcast 4
 * activation codes (vpmaddubsw), the int16 pair sums added in int16 from -8 x their codes' sums
 * (fl_act_q8.o4) to sum (w - 8) x (as the panel tile); then one vpmaddwd, one convert and one fma
 * with the 8 rows' scales (one f16 convert) times d_x.  That is about half the vector work per
 * weight of gemv_rows, whose lanes are codes and which pays a convert, a scale broadcast and an
 * fma per row and block.  The groups stream in order, prefetched R8_PF bytes ahead (two groups
 * per pass, two streams, read slower from memory: 9.0-10.3 against 10.5-11.5 GB/s per process
 * with two at once, a microbenchmark). */
#define R8_PF 2048
INLINE void gemv_r8(const char *w, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy, const int NT) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int64_t nb = a->nb, K = a->K;
    const int8_t *xq = a->qs + m0 * K;
    const float *dx = a->d + m0 * nb;
    const int32_t *o4 = a->o4 + m0 * nb;
    __m256 acc[3];
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *blk = w + (size_t)b * FL_R8_Q4_0_BLOCK;
#pragma GCC unroll 3
        for (int l = 0; l < 3; l++) _mm_prefetch(blk + R8_PF + 48 * l, _MM_HINT_T0);
        __m256i s[3];
#pragma GCC unroll 3
        for (int t = 0; t < NT; t++) s[t] = _mm256_set1_epi32(o4[t * nb + b]);
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * q));
            const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
#pragma GCC unroll 3
            for (int t = 0; t < NT; t++) {
                const int32_t *xb = (const int32_t *)(xq + t * K + b * 32);
                s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xb[q])));
                s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xb[q + 4])));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
#pragma GCC unroll 3
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s[t], ones)), _mm256_mul_ps(dw, _mm256_set1_ps(dx[t * nb + b])),
                                     acc[t]);
    }
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);
}

/* Q8_0_R8: one group x NT tokens per pass; per block 8 loads of 8 rows x 4 codes, each
 * multiplied as |w| x sign(x, w) (gemv_rows' Q8_0 arithmetic) and widened into int32 lanes,
 * then one convert and one fma with the 8 rows' scales per block and token.  Against gemv_rows
 * it saves the per-row convert, scale broadcast and fma, and its weights are one stream.  Its
 * own kernel: folded into gemv_r8 behind a flag, the one-token q, k, v GEMV of `fitllm bench
 * matmul -p 4 --types Q4_0_R8,Q8_0_R8` took 155-170 us against 82-112. */
INLINE void gemv_r8_q8(const char *w, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy, const int NT) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t nb = a->nb, K = a->K;
    const int8_t *xq = a->qs + m0 * K;
    const float *dx = a->d + m0 * nb;
    __m256 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *blk = w + (size_t)b * FL_R8_Q8_0_BLOCK;
#pragma GCC unroll 5
        for (int l = 0; l < 5; l++) _mm_prefetch(blk + R8_PF + 56 * l, _MM_HINT_T0);
        __m256i s[4];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * g)), va = _mm256_sign_epi8(v, v);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const __m256i xv = _mm256_set1_epi32(((const int32_t *)(xq + t * K + b * 32))[g]);
                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(va, _mm256_sign_epi8(xv, v)), ones));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(dw, _mm256_set1_ps(dx[t * nb + b])), acc[t]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);
}

/* nr rows (a multiple of 8, w at a group's first row) x nt tokens: one group per pass, up to 3
 * Q4_0 / 4 Q8_0 tokens at a time (a single stream of weights: two groups at once read slower from
 * memory) */
static void gemm_r8(int32_t wtype, const char *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                    int64_t ldy) {
    const size_t gs = (size_t)FL_R8_ROWS * ldw;
    const bool q8 = wtype == FL_TYPE_Q8_0_R8;
    const int step = q8 ? 4 : 3;
    for (int t = 0; t < nt; t += step) {
        const int n = nt - t < step ? nt - t : step;
        for (int r = 0; r < nr; r += 8) {
            const char *g = w + (size_t)(r / 8) * gs;
            float *yr = y + t * ldy + r;
            if (q8) switch (n) {
                case 1: gemv_r8_q8(g, a, m0 + t, yr, ldy, 1); break;
                case 2: gemv_r8_q8(g, a, m0 + t, yr, ldy, 2); break;
                case 3: gemv_r8_q8(g, a, m0 + t, yr, ldy, 3); break;
                default: gemv_r8_q8(g, a, m0 + t, yr, ldy, 4); break;
                }
            else if (n == 1) gemv_r8(g, a, m0 + t, yr, ldy, 1);
            else if (n == 2) gemv_r8(g, a, m0 + t, yr, ldy, 2);
            else gemv_r8(g, a, m0 + t, yr, ldy, 3);
        }
    }
}

/* nt <= 4 tokens x nr rows: 4 rows at a time for one or two tokens, 2 for three or four (at most
 * 8 accumulators live) */
static void gemv_q8(int32_t wtype, const char *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                    int64_t ldy) {
    int r = 0;
    /* the type and the token count constants in each copy (the scale loads' offsets with them) */
#define ROWS(T, R, N)                                                                                     \
    for (; r + (R) <= nr; r += (R)) gemv_rows(T, w + (size_t)r * ldw, ldw, a, m0, y + r, ldy, (R), (N)); \
    for (; r < nr; r++) gemv_rows(T, w + (size_t)r * ldw, ldw, a, m0, y + r, ldy, 1, (N))
#define TOKENS(T)                \
    switch (nt) {                \
    case 1: ROWS(T, 4, 1); break; \
    case 2: ROWS(T, 4, 2); break; \
    case 3: ROWS(T, 2, 3); break; \
    default: ROWS(T, 2, 4); break; \
    }
    if (wtype == FL_TYPE_Q4_0) {
        TOKENS(FL_TYPE_Q4_0);
    } else {
        TOKENS(FL_TYPE_Q8_0);
    }
#undef TOKENS
#undef ROWS
}

void fl_gemm_q8_avx2(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt,
                     float *y, int64_t ldy) {
    const char *wc = w;
    if (wtype == FL_TYPE_Q4_K || wtype == FL_TYPE_Q5_K || wtype == FL_TYPE_Q6_K) {
        float (*row)(const char *, const fl_act_q8 *, int64_t) =
            wtype == FL_TYPE_Q4_K ? dot_q4_K : wtype == FL_TYPE_Q5_K ? dot_q5_K : dot_q6_K;
        for (int r = 0; r < nr; r++) /* each row from L1 for every token */
            for (int t = 0; t < nt; t++) y[t * ldy + r] = row(wc + r * ldw, a, m0 + t);
        return;
    }
    if (wtype == FL_TYPE_Q4_0_R8 || wtype == FL_TYPE_Q8_0_R8) {
        gemm_r8(wtype, wc, ldw, nr, a, m0, nt, y, ldy);
        return;
    }
    if (wtype != FL_TYPE_Q8_0 && wtype != FL_TYPE_Q4_0) { /* Q4_1, Q5_0, Q5_1, IQ4_NL, Q3_K, Q2_K: their row dots */
        if (!fl_gemm_rows_avx2(wtype, w, ldw, nr, a, m0, nt, y, ldy)) fl_gemm_q8_ref(wtype, w, ldw, nr, a, m0, nt, y, ldy);
        return;
    }
    for (int t = 0; t < nt; t += FL_GEMV_MAX_TOKENS) /* the rows again (from cache) for each group of tokens */
        gemv_q8(wtype, wc, ldw, nr, a, m0 + t, nt - t < FL_GEMV_MAX_TOKENS ? nt - t : FL_GEMV_MAX_TOKENS, y + t * ldy, ldy);
}

/* matmul's f32 dots in llama.cpp's (ggml's) order, the same bits as matmul_avx512.c's dot_ggml:
 * each 16-lane accumulator is two ymm (lanes 0-7, 8-15) with the same fmas, reduced in
 * _mm512_reduce_add_ps's order ((l + l+8), then (l + l+4), then (0 + 2) + (1 + 3)); so
 * FL_KERNELS=avx2 follows the AVX-512 build's tokens (and llama.cpp's more often) */
static inline float reduce16(__m256 lo, __m256 hi) {
    const __m256 t3 = _mm256_add_ps(hi, lo);
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

static inline float dot_ggml(const float *a, const float *b, int64_t n, bool f16_rows) {
    if (n % 16 == 0) {
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
        }
        return reduce16(lo, hi);
    }
    __m256 s[8]; /* four 16-lane accumulators: s[2k] lanes 0-7, s[2k + 1] lanes 8-15 */
    for (int k = 0; k < 8; k++) s[k] = _mm256_setzero_ps();
    const int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int k = 0; k < 8; k++) s[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), s[k]);
    const float head = reduce16(_mm256_add_ps(_mm256_add_ps(s[0], s[4]), _mm256_add_ps(s[2], s[6])),
                                _mm256_add_ps(_mm256_add_ps(s[1], s[5]), _mm256_add_ps(s[3], s[7])));
    return fl_dot_tail_ggml(a, b, np, n, head, f16_rows);
}

float fl_mm_dot_f32_avx2(const float *a, const float *b, int64_t n) { return dot_ggml(a, b, n, false); }
float fl_mm_dot_f16vals_avx2(const float *a, const float *b, int64_t n) { return dot_ggml(a, b, n, true); }

/* ---- F32 / F16 / BF16 / NF4 / FP8 weights read as they are (K % 16 == 0): fl_mm_wrows_avx512's bits ---- */

/* NF4's table values of 8 codes (0..15): two 8-entry permutes, picked by bit 3 */
INLINE __m256 nf4x8(__m256i q, __m256 t0, __m256 t1) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, q), _mm256_permutevar8x32_ps(t1, q), _mm256_castsi256_ps(_mm256_slli_epi32(q, 28)));
}

/* 8 weights of a row from k on (k % 8 == 0), as f32: F16, BF16 and F32 exactly; NF4 and FP8 as
 * fl_dequant_row's scalar code computes them (as wrow_load in matmul_avx512.c: NF4 by two 8-entry
 * permutes picked by the code's bit 3, FP8 widened to the f16 of the same value, times 256). */
INLINE __m256 wrow_load8(const int32_t wt, const char *row, int64_t k) {
    if (wt == FL_TYPE_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * k)));
    if (wt == FL_TYPE_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * k))), 16));
    if (wt == FL_TYPE_FP8_E4M3) {
        float s;
        memcpy(&s, row, 4);
        const __m128i h = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + 4 + k)));
        const __m128i em = _mm_and_si128(h, _mm_set1_epi16(0x7F)), sign = _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8);
        __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(sign, _mm_slli_epi16(em, 7))), _mm256_set1_ps(256.0f));
        const __m128i nan = _mm_cmpeq_epi16(em, _mm_set1_epi16(0x7F));
        if (_mm_movemask_epi8(nan)) {
            const __m256i qnan = _mm256_or_si256(_mm256_slli_epi32(_mm256_cvtepu16_epi32(sign), 16), _mm256_set1_epi32(0x7FC00000));
            f = _mm256_blendv_ps(f, _mm256_castsi256_ps(qnan), _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan)));
        }
        return _mm256_mul_ps(_mm256_set1_ps(s), f);
    }
    if (wt == FL_TYPE_NF4) {
        const int64_t part = (k >> 4) & 3;
        float amax;
        const uint8_t *qs = fl_nf4_block(row, k >> 6, &amax);
        const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + (part & 1) * 16 + ((k >> 3) & 1) * 8)));
        const __m256i q = part < 2 ? _mm256_and_si256(c, _mm256_set1_epi32(0xF)) : _mm256_srli_epi32(c, 4);
        return _mm256_mul_ps(_mm256_set1_ps(amax), nf4x8(q, _mm256_loadu_ps(fl_nf4_values), _mm256_loadu_ps(fl_nf4_values + 8)));
    }
    return _mm256_loadu_ps((const float *)row + k);
}

/* NR rows x NT tokens over all of K, each output's 16-lane accumulator as two ymm (dot_ggml's
 * fmas and reduce16), so the bits of the converted rows' dots. */
INLINE void wtile8(const int32_t wt, const char *w, size_t ldw, const float *x, int64_t K, float *y, int64_t ldy, int64_t ys,
                   const int NR, const int NT) {
    __m256 lo[4][3], hi[4][3];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 3
        for (int t = 0; t < NT; t++) lo[r][t] = hi[r][t] = _mm256_setzero_ps();
    if (wt == FL_TYPE_NF4 && NT == 1) { /* (one token: a block's scale once per row, its 8 vectors in k order) */
        const __m256 t0 = _mm256_loadu_ps(fl_nf4_values), t1 = _mm256_loadu_ps(fl_nf4_values + 8);
        for (int64_t b = 0; b < K / 64; b++) {
            __m256 amax[4];
            const uint8_t *qs[4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                float a;
                qs[r] = fl_nf4_block(w + (size_t)r * ldw, b, &a);
                amax[r] = _mm256_set1_ps(a);
            }
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) { /* values 8j..8j+7: bytes (j & 3) * 8.., low nibbles for j < 4 */
                const __m256 xv = _mm256_loadu_ps(x + b * 64 + j * 8);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) {
                    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs[r] + (j & 3) * 8)));
                    const __m256i q = j < 4 ? _mm256_and_si256(c, _mm256_set1_epi32(0xF)) : _mm256_srli_epi32(c, 4);
                    const __m256 v = nf4x8(q, t0, t1);
                    if (j & 1) hi[r][0] = _mm256_fmadd_ps(_mm256_mul_ps(amax[r], v), xv, hi[r][0]);
                    else lo[r][0] = _mm256_fmadd_ps(_mm256_mul_ps(amax[r], v), xv, lo[r][0]);
                }
            }
        }
    } else {
        for (int64_t k = 0; k < K; k += 16) {
            __m256 wv[4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) wv[r] = wrow_load8(wt, w + (size_t)r * ldw, k);
#pragma GCC unroll 3
            for (int t = 0; t < NT; t++) {
                const __m256 xv = _mm256_loadu_ps(x + t * K + k);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) lo[r][t] = _mm256_fmadd_ps(wv[r], xv, lo[r][t]);
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) wv[r] = wrow_load8(wt, w + (size_t)r * ldw, k + 8);
#pragma GCC unroll 3
            for (int t = 0; t < NT; t++) {
                const __m256 xv = _mm256_loadu_ps(x + t * K + k + 8);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) hi[r][t] = _mm256_fmadd_ps(wv[r], xv, hi[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 3
        for (int t = 0; t < NT; t++) y[t * ldy + r * ys] = reduce16(lo[r][t], hi[r][t]);
}

typedef void (*wtile8_fn)(const char *, size_t, const float *, int64_t, float *, int64_t, int64_t);
#define WT_DEF(T, type, nr, nt)                                                                                    \
    static void wt_##T##_##nr##_##nt(const char *w, size_t ldw, const float *x, int64_t K, float *y, int64_t ldy, int64_t ys) { \
        wtile8(type, w, ldw, x, K, y, ldy, ys, nr, nt);                                                                       \
    }
#define WT_DEFS(T, type) \
    WT_DEF(T, type, 1, 1) WT_DEF(T, type, 1, 2) WT_DEF(T, type, 1, 3) WT_DEF(T, type, 2, 1) WT_DEF(T, type, 2, 2) WT_DEF(T, type, 2, 3) \
    WT_DEF(T, type, 4, 1)
WT_DEFS(f32, FL_TYPE_F32)
WT_DEFS(f16, FL_TYPE_F16)
WT_DEFS(bf16, FL_TYPE_BF16)
WT_DEFS(nf4, FL_TYPE_NF4)
WT_DEFS(fp8, FL_TYPE_FP8_E4M3)
#define WT_TAB(T) {{wt_##T##_1_1, wt_##T##_1_2, wt_##T##_1_3}, {wt_##T##_2_1, wt_##T##_2_2, wt_##T##_2_3}}
static const wtile8_fn wtiles8[5][2][3] = {WT_TAB(f32), WT_TAB(f16), WT_TAB(bf16), WT_TAB(nf4), WT_TAB(fp8)};
/* one token, four rows (one from each quarter of a range: fl_mm_wrows_avx2) */
static const wtile8_fn wtiles8_4[5] = {wt_f32_4_1, wt_f16_4_1, wt_bf16_4_1, wt_nf4_4_1, wt_fp8_4_1};
#undef WT_TAB
#undef WT_DEFS
#undef WT_DEF

/* As the AVX-512 driver: tokens in chunks whose activations stay in L2, here 2 rows x 3 tokens a
 * tile; one token two rows at a time, one from each half of the range. */
void fl_mm_wrows_avx2(int32_t wtype, const void *w, size_t ldw, int64_t nr, const float *x, int64_t M, int64_t K, float *y,
                      int64_t ldy) {
    const int ti = wtype == FL_TYPE_F32 ? 0 : wtype == FL_TYPE_F16 ? 1 : wtype == FL_TYPE_BF16 ? 2 : wtype == FL_TYPE_NF4 ? 3 : 4;
    if (M == 1) { /* (4 neighbouring rows at a time: 21.4 against 27.5 GB/s, the AVX-512 driver's measurement) */
        if (K * (int64_t)sizeof(float) > FL_WROWS_X_L1 && nr >= 4) { /* (as the AVX-512 driver: a row from each quarter) */
            const int64_t q = nr / 4;
            for (int64_t r = 0; r < q; r++) wtiles8_4[ti]((const char *)w + (size_t)r * ldw, (size_t)q * ldw, x, K, y + r, 1, q);
            for (int64_t r = 4 * q; r < nr; r++) wtiles8[ti][0][0]((const char *)w + (size_t)r * ldw, ldw, x, K, y + r, 1, 1);
            return;
        }
        const int64_t h = nr / 2;
        for (int64_t r = 0; r < h; r++) wtiles8[ti][1][0]((const char *)w + (size_t)r * ldw, (size_t)h * ldw, x, K, y + r, 1, h);
        if (nr % 2) wtiles8[ti][0][0]((const char *)w + (size_t)(nr - 1) * ldw, ldw, x, K, y + nr - 1, 1, 1);
        return;
    }
    int64_t mc = FL_WROWS_CHUNK_BYTES / (K * (int64_t)sizeof(float)) / 3 * 3;
    if (mc < 3) mc = 3;
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        const int64_t mn = M - m0 < mc ? M - m0 : mc;
        for (int64_t r0 = 0; r0 < nr; r0 += 2) {
            const int nrr = nr - r0 < 2 ? (int)(nr - r0) : 2;
            const char *wr = (const char *)w + (size_t)r0 * ldw;
            for (int64_t t0 = 0; t0 < mn; t0 += 3) {
                const int nt = mn - t0 < 3 ? (int)(mn - t0) : 3;
                wtiles8[ti][nrr - 1][nt - 1](wr, ldw, x + (m0 + t0) * K, K, y + (m0 + t0) * ldy + r0, ldy, 1);
            }
        }
    }
}

/* The 8-bit activations of one row (fl_act_q8_quantize_row's bytes): per block the |x| maximum
 * by 8-lane maxima, the codes by one multiply and a round-to-nearest-even convert each (lrintf's
 * rounding), clamped, packed to bytes and summed. */
void fl_act_q8_quantize_row_avx2(fl_act_q8 *a, int64_t m, const float *x) {
    int8_t *q = a->qs + m * a->K;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo the packs' lane interleave */
    for (int64_t b = 0; b < a->nb; b++) {
        __m256 v[4], mx;
        /* (unrolled: as a loop GCC copied v through the stack in 16-byte halves and read it back
         * in 32-byte loads, which the store forwarding cannot serve: 3.0 -> 1.0 us per row of 2048, a microbenchmark) */
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) v[j] = _mm256_loadu_ps(x + b * 32 + 8 * j);
        mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                           _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = _cvtsh_ss(_cvtss_sh(amax / 127, _MM_FROUND_TO_NEAREST_INT)), id = amax > 0 ? 127.0f / amax : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i c[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) c[j] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[j], vid)), lo), hi);
        const __m256i p16 = _mm256_packs_epi32(c[0], c[1]), q16 = _mm256_packs_epi32(c[2], c[3]);
        const __m256i qv = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, q16), order);
        _mm256_storeu_si256((__m256i *)(q + b * 32), qv);
        { /* o4 / o6 (fl_act_q8_order_q4): pair sums, then per 128-bit half the even (k % 4 < 2) and
           * odd pairs summed into dword 0 as two int16 */
            const __m256i zero = _mm256_setzero_si256();
            const __m256i pr = _mm256_maddubs_epi16(_mm256_set1_epi8(1), qv);
            __m256i t = _mm256_add_epi16(pr, _mm256_shuffle_epi32(pr, _MM_SHUFFLE(1, 0, 3, 2)));
            t = _mm256_add_epi16(t, _mm256_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
            const __m256i o6 = _mm256_sub_epi16(zero, _mm256_slli_epi16(t, 5));
            a->o6[(m * a->nb + b) * 2] = _mm256_cvtsi256_si32(o6);
            a->o6[(m * a->nb + b) * 2 + 1] = _mm256_extract_epi32(o6, 4);
            const __m128i t4 = _mm_add_epi16(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            a->o4[m * a->nb + b] = _mm_cvtsi128_si32(_mm_sub_epi16(_mm256_castsi256_si128(zero), _mm_slli_epi16(t4, 3)));
        }
        const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
        const int s = _mm_cvtsi128_si32(s4);
        fl_act_q8_set_block(a, m * a->nb + b, d, s);
    }
    /* qs4 / sv4 are left unset: only the AVX-512 GEMV reads them (filling them took ~2 of 5.3 us
     * per row of 2048) */
}
