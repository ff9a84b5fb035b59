/* Q4_0_R8 / Q8_0_R8 (groups of 8 interleaved rows, layout in kernels/matmul.h) on AVX-512 VNNI,
 * straight on the groups for every step size: one group at a time for 1-2 tokens (tile8, the
 * GEMV), 32 rows (four groups, tile32r) x up to 8 tokens per pass for more, the last 8 or 16 rows
 * of a call 16 at a time (tile16); where matmul has laid the step's activations out as 16-token
 * records (fl_act_q8_quantize_blocks_avx512 writes them; the reference layout is
 * fl_act16_pack_row's), 32 rows x 9-16 tokens (tile32), the last rows 16 at a time (tile16w).
 *
 * A group's 4-byte units of a block are [unit v][row][4 bytes], so two groups' 32-byte runs in
 * one zmm are the 16 rows x 4 codes a vpdpbusd takes against 4 broadcast activation codes: Q4_0
 * unit v holds codes 4v..4v+3 in its low nibbles and 16+4v.. in its high ones (two vectors after
 * an and / a shift, which run beside the products), Q8_0 unit v codes 4v..4v+3 with the sign bit
 * flipped (code + 128).  Each token's int32 sums start at -offset * (its activation code sum),
 * then per block one convert and one fma with d_w (16 lanes) * d_x: the arithmetic of the
 * packed panels (fl_panel_gemm_avx512, panel_tile), so the outputs are the same bits, with no
 * pack and no panel scratch.  Reference: fl_gemm_q8_ref on the R8 type. */
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/avx512/r8_pairs.h"
#include "kernels/avx512/tile16w.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define INLINE static inline __attribute__((always_inline))
/* tile32 takes the blocks in runs of this many, each run through both token passes, so the second
 * pass reads the run from L1 and a streamed decode step reads memory evenly (against one pass
 * over all the blocks per 8 tokens, 16 tokens streamed: runs of 4 1.019-1.025, 8 1.010-1.019, 16
 * 0.99) */
#define R8_QUAD_CHUNK 8
/* Q8_0 where the rows come from memory (the tile that prefetches them, pf): runs of 4, so that a
 * step's reads come evenly, not in bursts of 8 blocks (Q8_0 has twice Q4_0's bytes per product).
 * With passes of 8 tokens against runs of 8 on a Zen 5 VM, alternated call by call, median of
 * the paired speedups, 16 tokens over 24 streamed 5632 x 2048 matrices: runs of 1 1.047-1.056, 2
 * 1.039-1.065, 4 1.028; with the register passes and the prefetch spread over them (tile32), runs
 * of 4 against 2: 1.05-1.07.  Q4_0 keeps 8 (4: 0.97-1.00). */
#define R8_QUAD_CHUNK_Q8_STREAM 4

/* steps of up to this many tokens take one group (8 rows, ymm) at a time: tile8 */
#define R8_GEMV_TOKENS 2
/* 16 rows (groups ga, gb) x NT tokens; gb == ga computes rows 0..7 twice (the caller stores 8) */
INLINE void tile16(const bool q8, const char *ga, const char *gb, const fl_act_q8 *a, int64_t m0, const int NT,
                   float *y, int64_t ldy, __mmask16 rm) {
    const size_t bb = q8 ? FL_R8_Q8_0_BLOCK : FL_R8_Q4_0_BLOCK;
    const int64_t nb = a->nb, K = a->K;
    const int8_t *xq0 = a->qs + m0 * K;
    const int32_t *s0 = a->s + m0 * nb;
    const float *d0 = a->d + m0 * nb;
    const int32_t off = q8 ? 128 : 8;
    const size_t gbytes = (size_t)nb * bb; /* a group (gb = ga + gbytes, or ga) */
    const __m512i m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *pa = ga + (size_t)b * bb, *pb = gb + (size_t)b * bb;
        /* (in the first token tile the weights come from memory: 16 sequences, Q8_0, 120 -> 155
         * tok/s with the prefetch into L1 alone) */
        fl_r8_prefetch(ga, gb, b, bb, gbytes);
        __m512i wv[8];
        if (q8) {
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) {
                const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(pa + 16 + 32 * v))),
                                                     _mm256_loadu_si256((const __m256i *)(pb + 16 + 32 * v)), 1);
                wv[v] = _mm512_xor_si512(z, flip);
            }
        } else {
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(pa + 16 + 32 * v))),
                                                     _mm256_loadu_si256((const __m256i *)(pb + 16 + 32 * v)), 1);
                wv[v] = _mm512_and_si512(z, m4);
                wv[v + 4] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa)),
                                                                  _mm_loadu_si128((const __m128i *)pb), 1));
        __m512i s[8], h[8];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            s[t] = _mm512_set1_epi32(-s0[t * nb + b] * off);
            h[t] = _mm512_setzero_si512();
        }
        /* quads 0..7 (codes 4i..4i+3); below 4 tokens two chains per token (quads 0..3, 4..7),
         * added in int32 (exact), so a token's dependent vpdpbusd do not queue */
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m512i xv = _mm512_set1_epi32(((const int32_t *)(xq0 + t * K + b * 32))[i]);
                if (NT < 4 && i >= 4) h[t] = _mm512_dpbusd_epi32(h[t], wv[i], xv);
                else s[t] = _mm512_dpbusd_epi32(s[t], wv[i], xv);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const __m512i st = NT < 4 ? _mm512_add_epi32(s[t], h[t]) : s[t];
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), _mm512_mul_ps(dw, _mm512_set1_ps(d0[t * nb + b])), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, rm, acc[t]);
}

/* 16 rows (groups ga, gb) x NT tokens, 9 <= NT <= 16: each weight vector serves NT products, so
 * a pass over the weights (from memory, in a decode step) carries twice the work of tile16's 8
 * tokens.  The activations come from the records above, one sequential stream at fixed offsets
 * from one pointer (rows of codes K bytes apart took a pointer per token, more than the free
 * registers).  The int32 sums of NT tokens take NT registers, so the f32 sums live on the stack
 * (fl_acc_fma: one load and store per token and block, beside 8 vpdpbusd) and each weight vector is
 * loaded where it is used.  One core, 256 x 2048 rows in cache, 16 tokens: tile16 in two passes
 * 280-340 against 330-365 GOP/s, from memory (32000 rows) ~205 against 285 (Q8_0), 245-265 against
 * 320 (Q4_0), the same bits.  Per lane the arithmetic of tile16. */
INLINE void tile16w(const bool q8, const char *ga, const char *gb, const char *act, int64_t nb, const int NT, float *y,
                    int64_t ldy, __mmask16 rm) {
    const size_t bb = q8 ? FL_R8_Q8_0_BLOCK : FL_R8_Q4_0_BLOCK;
    const size_t gbytes = (size_t)nb * bb;
    const __m512i m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[16];
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *pa = ga + (size_t)b * bb, *pb = gb + (size_t)b * bb, *r = act + (size_t)b * FL_ACT16_REC;
        fl_r8_prefetch(ga, gb, b, bb, gbytes);
        const int32_t *o = (const int32_t *)(r + FL_ACT16_CODES) + (q8 ? FL_ACT16_TOKENS : 0);
        const float *dx = (const float *)(r + FL_ACT16_CODES) + 2 * FL_ACT16_TOKENS; /* (fl_act16 layout, kernels/matmul.h) */
        __m512i s[16];
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++) s[t] = _mm512_set1_epi32(o[t]);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const int v = q8 ? i : i & 3;
            const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(pa + 16 + 32 * v))),
                                                 _mm256_loadu_si256((const __m256i *)(pb + 16 + 32 * v)), 1);
            const __m512i wv = q8 ? _mm512_xor_si512(z, flip) : i < 4 ? _mm512_and_si512(z, m4) : _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
#pragma GCC unroll 16
            for (int t = 0; t < NT; t++) s[t] = fl_dpbusd_bcast16(s[t], wv, (const int32_t *)(r + t * 32) + i);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa)),
                                                                  _mm_loadu_si128((const __m128i *)pb), 1));
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++) fl_acc_fma(&acc[t], _mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dw, _mm512_set1_ps(dx[t])));
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, rm, acc[t]);
}

/* The activation dword at x broadcast into a register (GCC would fold a broadcast that two
 * vpdpbusd share into each as a {1to16} operand). */
INLINE __m512i bcast_reg(const int32_t *x) {
    __m512i r;
    __asm__("vpbroadcastd %1, %0" : "=v"(r) : "m"(*x));
    return r;
}

/* Block b's rows (at ob) of the four groups pfd bytes ahead into L1, past a group's end the same
 * place in the next four groups: the block's cache lines pfp, pfp + pfn, ... (a pass of pfn over
 * the run takes its share).  No prefetch into L2 (fl_r8_prefetch's second distance): 16 tokens
 * over 24 streamed 5632 x 2048 matrices, against both distances, alternated call by call, median
 * of the paired speedups: Q8_0 1.04-1.05, Q4_0 1.10 (into L2 alone 1.00; none 0.90). */
INLINE void quad_prefetch(const char *g0, const char *g1, const char *g2, const char *g3, size_t ob, size_t bb, size_t gbytes,
                          int pfp, int pfn, size_t pfd) {
    const size_t o = ob + pfd, skip = o >= gbytes ? 3 * gbytes : 0;
    for (size_t l = 64 * (size_t)pfp; l < bb; l += 64 * (size_t)pfn) {
        _mm_prefetch(g0 + o + skip + l, _MM_HINT_T0);
        _mm_prefetch(g1 + o + skip + l, _MM_HINT_T0);
        _mm_prefetch(g2 + o + skip + l, _MM_HINT_T0);
        _mm_prefetch(g3 + o + skip + l, _MM_HINT_T0);
    }
}

/* Where tile32h finds token t's activations for block b: its codes at c + t * ct + b * cb, its
 * int32 start o[t * ot + b * ob] * om and its d_x d[t * dt + b * db] (the 16-token records, or
 * fl_act_q8's rows). */
typedef struct quad_act {
    const char *c;
    const int32_t *o;
    const float *d;
    int64_t ct, cb, ot, ob, dt, db;
    int32_t om;
} quad_act;

INLINE quad_act quad_act_records(bool q8, const char *act, int t0) {
    return (quad_act){act + t0 * 32, (const int32_t *)(act + FL_ACT16_CODES) + (q8 ? FL_ACT16_TOKENS : 0) + t0,
                      (const float *)(act + FL_ACT16_CODES) + 2 * FL_ACT16_TOKENS + t0, 32, FL_ACT16_REC, 1, FL_ACT16_REC / 4,
                      1, FL_ACT16_REC / 4, 1};
}

INLINE quad_act quad_act_rows(bool q8, const fl_act_q8 *a, int64_t m0) {
    return (quad_act){(const char *)(a->qs + m0 * a->K), a->s + m0 * a->nb, a->d + m0 * a->nb, a->K, 32, a->nb, 1, a->nb, 1,
                      q8 ? -128 : -8};
}

/* Passes of up to this many tokens keep their f32 sums in registers through a run of blocks
 * (6 tokens: 12 sums, 12 int32 sums, the weights, a broadcast and the scales fill the 32 zmm);
 * longer passes keep them in memory (fl_acc_fma).  The memory sums' load and store per fma
 * cost more than the fma: one Zen 5 core, a 32-row tile in L1 (a throwaway harness, Q8_0):
 * 8 tokens with the sums in memory 70.5% of the vpdpbusd peak, 6 in registers 77%, 5 76%,
 * 4 71%; without any fold 99.6% (the fold's multiply and fma are the rest). */
#define R8_REG_TOKENS 6

/* 32 rows (groups g0, g1 in vector A, g2, g3 in B; g3 == g2 where the matrix ends at 24 rows, its
 * 8 rows computed twice) x NT <= 8 tokens of A, blocks [b0, b1) of nb, into the f32 sums acc[t]
 * (A) and acc[8 + t] (B) in memory (NT <= R8_REG_TOKENS: held in registers over the run).  Each
 * activation broadcast feeds two vpdpbusd (A and B): one broadcast per vpdpbusd held a Zen 5
 * core to 4.8-5.3 of the 6.4 G vpdpbusd/s it runs with register operands in one stretch (6.2-6.5
 * in another), two per broadcast ran at 6.3-6.6 in both (a microbenchmark, 16 chains).  Per lane
 * the arithmetic of tile16w (the same int32 sums, the same fma per block in the same order), so
 * the same bits.  pfp >= 0: each block prefetches its share of the rows pfd bytes ahead (quad_prefetch). */
INLINE void tile32h(const bool q8, const char *g0, const char *g1, const char *g2, const char *g3, const quad_act A,
                    int64_t nb, int64_t b0, int64_t b1, const int NT, int pfp, int pfn, size_t pfd, __m512 *acc) {
    const size_t bb = q8 ? FL_R8_Q8_0_BLOCK : FL_R8_Q4_0_BLOCK;
    const size_t gbytes = (size_t)nb * bb;
    const __m512i m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    const bool reg = NT <= R8_REG_TOKENS;
    __m512 ra[R8_REG_TOKENS], rb[R8_REG_TOKENS];
    if (reg) {
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) ra[t] = acc[t], rb[t] = acc[8 + t];
    }
    for (int64_t b = b0; b < b1; b++) {
        const size_t ob = (size_t)b * bb;
        const char *r = A.c + b * A.cb;
        if (pfp >= 0) quad_prefetch(g0, g1, g2, g3, ob, bb, gbytes, pfp, pfn, pfd);
        __m512i sa[8], sb[8];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) sb[t] = sa[t] = _mm512_set1_epi32(A.o[t * A.ot + b * A.ob] * A.om);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const size_t ov = ob + 16 + 32 * (size_t)(q8 ? i : i & 3);
            const __m512i za = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(g0 + ov))),
                                                  _mm256_loadu_si256((const __m256i *)(g1 + ov)), 1);
            const __m512i zb = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(g2 + ov))),
                                                  _mm256_loadu_si256((const __m256i *)(g3 + ov)), 1);
            const __m512i wa = q8 ? _mm512_xor_si512(za, flip) : i < 4 ? _mm512_and_si512(za, m4) : _mm512_and_si512(_mm512_srli_epi16(za, 4), m4);
            const __m512i wb = q8 ? _mm512_xor_si512(zb, flip) : i < 4 ? _mm512_and_si512(zb, m4) : _mm512_and_si512(_mm512_srli_epi16(zb, 4), m4);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m512i x = bcast_reg((const int32_t *)(r + t * A.ct) + i);
                sa[t] = _mm512_dpbusd_epi32(sa[t], wa, x);
                sb[t] = _mm512_dpbusd_epi32(sb[t], wb, x);
            }
        }
        const __m512 dwa = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(g0 + ob))),
                                                                   _mm_loadu_si128((const __m128i *)(g1 + ob)), 1));
        const __m512 dwb = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(g2 + ob))),
                                                                   _mm_loadu_si128((const __m128i *)(g3 + ob)), 1));
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const __m512 d = _mm512_set1_ps(A.d[t * A.dt + b * A.db]);
            if (reg) {
                ra[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sa[t]), _mm512_mul_ps(dwa, d), ra[t]);
                rb[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb[t]), _mm512_mul_ps(dwb, d), rb[t]);
            } else {
                fl_acc_fma(&acc[t], _mm512_cvtepi32_ps(sa[t]), _mm512_mul_ps(dwa, d));
                fl_acc_fma(&acc[8 + t], _mm512_cvtepi32_ps(sb[t]), _mm512_mul_ps(dwb, d));
            }
        }
    }
    if (reg) {
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[t] = ra[t], acc[8 + t] = rb[t];
    }
}

/* How far ahead a streamed tile32 prefetches its rows, in blocks: about a run (Q4_0) or a run and
 * a half (Q8_0), so the lines of the next run are on their way while every pass of this one runs.
 * 16 tokens over 24 streamed 5632 x 2048 matrices, alternated call by call: Q4_0 8 blocks
 * against 4: 1.08; 12 or 16: 0.99-1.00; Q8_0 6 blocks against 4: 1.12, 8: 1.03, 12: 0.97. */
#define R8_PF_BLOCKS_Q4 8
#define R8_PF_BLOCKS_Q8 6

/* 32 rows x NT (9..16) tokens: per run of R8_QUAD_CHUNK blocks (R8_QUAD_CHUNK_Q8_STREAM for Q8_0
 * rows from memory) the tokens in two passes (NT <= 12) or three of at most R8_REG_TOKENS, as
 * even as can be (16: 6, 5, 5), the sums in registers, the later passes reading the run from L1.
 * Where the rows come from memory (pf: a step's first 16-token tile) each pass prefetches its
 * share of the lines R8_PF_BLOCKS_* ahead (pass p the lines p, p + np, ...), so memory is read
 * through all of the passes.  Pass p's sums are acc[16 p + t] (rows 0-15) and acc[16 p + 8 + t]
 * (rows 16-31, stored under rmb).
 * `fitllm bench model -m tl-T.gguf -p 512 -n 0 -t 2 -r 2` (TinyLlama-shaped), two alternated
 * rounds against passes of 8 everywhere: pp Q4_0 455.6, 474.2 -> 472.4, 494.8 tok/s, Q8_0 445.5,
 * 470.4 -> 484.0, 487.4.  Streamed, the register passes had lost with the prefetch in the first
 * pass alone (16-sequence decode, Q4_0 453.3, 449.2 -> 429.5, 426.6 decode tok/s): memory then
 * idled through the later passes.  With the prefetch spread over the passes, against two passes
 * of 8 with the sums in memory and the prefetch in the first: 16 tokens over 24 streamed 5632 x
 * 2048 matrices, alternated call by call, Q4_0 1.10, Q8_0 1.12 (2048 x 5632: 1.06 / 1.07; 12
 * tokens 1.04 / 1.06).  Against the pairs of groups (tile16w), fl_matmul on 2 threads alternated
 * call by call (two passes of 8): 16 tokens on a 512 x 2048 matrix in cache Q8_0 1.11, Q4_0
 * 1.07, 64 tokens Q8_0 1.11. */
INLINE void tile32(const bool q8, const char *g0, const char *g1, const char *g2, const char *g3, const char *act,
                   int64_t nb, const int NT, float *y, int64_t ldy, __mmask16 rmb, bool pf) {
    const int np = NT <= 2 * R8_REG_TOKENS ? 2 : 3;
    const int n0 = NT / np + (NT % np > 0), n1 = NT / np + (NT % np > 1), n2 = NT - n0 - n1;
    __m512 acc[48];
#pragma GCC unroll 48
    for (int t = 0; t < 48; t++) acc[t] = _mm512_setzero_ps();
    const int64_t run = q8 && pf ? R8_QUAD_CHUNK_Q8_STREAM : R8_QUAD_CHUNK;
    const size_t pfd = q8 ? R8_PF_BLOCKS_Q8 * FL_R8_Q8_0_BLOCK : R8_PF_BLOCKS_Q4 * FL_R8_Q4_0_BLOCK;
    for (int64_t b0 = 0; b0 < nb; b0 += run) {
        const int64_t b1 = b0 + run < nb ? b0 + run : nb;
        tile32h(q8, g0, g1, g2, g3, quad_act_records(q8, act, 0), nb, b0, b1, n0, pf ? 0 : -1, np, pfd, acc);
        tile32h(q8, g0, g1, g2, g3, quad_act_records(q8, act, n0), nb, b0, b1, n1, pf ? 1 : -1, np, pfd, acc + 16);
        if (np == 3) tile32h(q8, g0, g1, g2, g3, quad_act_records(q8, act, n0 + n1), nb, b0, b1, n2, pf ? 2 : -1, np, pfd, acc + 32);
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++) {
        const int p = t < n0 ? 0 : t < n0 + n1 ? 1 : 2, j = t - (p == 0 ? 0 : p == 1 ? n0 : n0 + n1);
        _mm512_storeu_ps(y + t * ldy, acc[16 * p + j]);
        _mm512_mask_storeu_ps(y + t * ldy + 16, rmb, acc[16 * p + 8 + j]);
    }
}

/* tile32r's prefetch distance for Q8_0 (Q4_0: FL_R8_PF, 512 B): 8 tokens over 24 streamed 5632 x
 * 2048 matrices, alternated call by call, against 512 B: 1024 1.07-1.09 (4 tokens 1.07, 6 1.10),
 * 768 1.05, 1280 1.07, 1632 1.07 (Q4_0 at 384, 768, 1024 B: 0.99-1.01, 1536 0.95). */
#define R8_PF_ROWS_Q8 1024

/* 32 rows x NT (1..8) tokens of fl_act_q8's rows from token m0 (steps of 3-8 tokens: batched
 * decode of a few sequences); rows 16-31 stored under rmb.  Against the pairs of groups (tile16),
 * 24 streamed 5632 x 2048 matrices, alternated call by call, median of the paired speedups: 4
 * tokens Q8_0 1.07, Q4_0 1.11; 8 tokens Q8_0 1.04, Q4_0 1.33 (in cache Q8_0 1.18 / 1.10).
 * `fitllm bench serve -n 8 --max-seqs 8 --prompt-len 16 --gen-len 48`, three alternated pairs:
 * Q4_0 247-257 -> 323-349 decode tok/s, Q8_0 199-209 -> 208-234. */
INLINE void tile32r(const bool q8, const char *g0, const char *g1, const char *g2, const char *g3, const fl_act_q8 *a,
                    int64_t m0, const int NT, float *y, int64_t ldy, __mmask16 rmb, bool pf) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
    tile32h(q8, g0, g1, g2, g3, quad_act_rows(q8, a, m0), a->nb, 0, a->nb, NT, pf ? 0 : -1, 1, q8 ? R8_PF_ROWS_Q8 : FL_R8_PF, acc);
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        _mm512_storeu_ps(y + t * ldy, acc[t]);
        _mm512_mask_storeu_ps(y + t * ldy + 16, rmb, acc[8 + t]);
    }
}

/* The 32-row tiles as functions of n tokens: NAME##q4_##n and NAME##q8_##n call KERNEL(q8, g0..g3,
 * act, k, n, ...), act and k the records and nb (tile32) or fl_act_q8's rows and m0 (tile32r). */
#define DEFINE_QUAD(name, kernel, atype, n)                                                                           \
    static void name##q4_##n(const char *g0, const char *g1, const char *g2, const char *g3, atype act, int64_t k,    \
                             float *y, int64_t ldy, __mmask16 rmb, bool pf) {                                         \
        kernel(false, g0, g1, g2, g3, act, k, n, y, ldy, rmb, pf);                                                    \
    }                                                                                                                 \
    static void name##q8_##n(const char *g0, const char *g1, const char *g2, const char *g3, atype act, int64_t k,    \
                             float *y, int64_t ldy, __mmask16 rmb, bool pf) {                                         \
        kernel(true, g0, g1, g2, g3, act, k, n, y, ldy, rmb, pf);                                                     \
    }
DEFINE_QUAD(quadr_, tile32r, const fl_act_q8 *, 1)
DEFINE_QUAD(quadr_, tile32r, const fl_act_q8 *, 2)
DEFINE_QUAD(quadr_, tile32r, const fl_act_q8 *, 3)
DEFINE_QUAD(quadr_, tile32r, const fl_act_q8 *, 4)
DEFINE_QUAD(quadr_, tile32r, const fl_act_q8 *, 5)
DEFINE_QUAD(quadr_, tile32r, const fl_act_q8 *, 6)
DEFINE_QUAD(quadr_, tile32r, const fl_act_q8 *, 7)
DEFINE_QUAD(quadr_, tile32r, const fl_act_q8 *, 8)
DEFINE_QUAD(quad_, tile32, const char *, 9)
DEFINE_QUAD(quad_, tile32, const char *, 10)
DEFINE_QUAD(quad_, tile32, const char *, 11)
DEFINE_QUAD(quad_, tile32, const char *, 12)
DEFINE_QUAD(quad_, tile32, const char *, 13)
DEFINE_QUAD(quad_, tile32, const char *, 14)
DEFINE_QUAD(quad_, tile32, const char *, 15)
DEFINE_QUAD(quad_, tile32, const char *, 16)
#undef DEFINE_QUAD

/* acc + w (unsigned bytes) . the 4 signed bytes at x broadcast to every lane, the broadcast
 * folded into the instruction (GCC keeps a separate vpbroadcastd for _mm256_set1_epi32) */
INLINE __m256i dpbusd_bcast(__m256i acc, __m256i w, const int32_t *x) {
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
    return acc;
}

/* One group (8 rows, ymm) x NT tokens, for steps of 1-2 tokens, where the weights stream from
 * memory: one sequential stream per call (two groups per call, two streams, read 10-25% slower
 * in `fitllm bench matmul -p 16 --stream-mib 256`).  Per lane the arithmetic of tile16, so the
 * same bits.  ymm vpdpbusd runs at twice the zmm rate (Zen 4), so the products cost the same.
 * The one stream is left to the hardware prefetchers: with tile16's prefetch 1.5 KiB ahead, a
 * microbenchmark (2 x 256 MiB of groups, one token, 1 and 2 threads) read 5-15% slower than with
 * none, and `fitllm bench model -p 0 -n 64 -t 2` Q8_0 decode, six alternated rounds, 20.9-24.8
 * against 24.8-29.7 tok/s (Q4_0 41.4-46.9 against 41.1-51.0); a prefetch into L2 4 KiB ahead
 * was slower again for one token (a 1-token forward of TinyLlama-shaped Q8_0, the two alternated
 * in one process: 0.84x).  Two tokens take that one (the same forward at 2 tokens: 1.16x Q8_0,
 * 1.31x Q4_0). */
INLINE void tile8(const bool q8, const char *g, const fl_act_q8 *a, int64_t m0, const int NT, float *y, int64_t ldy) {
    const size_t bb = q8 ? FL_R8_Q8_0_BLOCK : FL_R8_Q4_0_BLOCK;
    const int64_t nb = a->nb, K = a->K;
    const int8_t *xq0 = a->qs + m0 * K;
    const int32_t *s0 = a->s + m0 * nb;
    const float *d0 = a->d + m0 * nb;
    const int32_t off = q8 ? 128 : 8;
    const __m256i m4 = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8((char)0x80);
    __m256 acc[2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    /* one token where the GEMVs prefetch into L2 as well (Intel, fl_gemv_pf_far): their two
     * distances, as gemv_prefetch (see the comment above for Zen 4) */
    const size_t pf_near = (size_t)fl_gemv_pf_near, pf_far = (size_t)fl_gemv_pf_far;
    #pragma GCC unroll 2
    for (int64_t b = 0; b < nb; b++) {
        const char *p = g + (size_t)b * bb;
        if (NT == 2) /* (see the comment above) */
            for (size_t l = 0; l < bb; l += 64) _mm_prefetch(p + FL_R8_PF_L2 + l, _MM_HINT_T1);
        else if (pf_far)
            for (size_t l = 0; l < bb; l += 64) {
                _mm_prefetch(p + pf_near + l, _MM_HINT_T0);
                _mm_prefetch(p + pf_far + l, _MM_HINT_T1);
            }
        __m256i wv[8];
        if (q8) {
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) wv[v] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 16 + 32 * v)), flip);
        } else {
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                __m256i z = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * v));
                __asm__("" : "+v"(z)); /* one load for both nibbles (GCC folds it into each, and loads bind here) */
                wv[v] = _mm256_and_si256(z, m4);
                wv[v + 4] = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        /* per token two chains (quads 0..3, 4..7) added in int32 (exact); the activation codes
         * enter as broadcast memory operands (dpbusd_bcast), which the loop's width needs: with a
         * broadcast instruction each it ran ~17 cycles per block, issue-bound */
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const int32_t *xb = (const int32_t *)(xq0 + t * K + b * 32);
            const __m256i z = _mm256_setzero_si256();
            __m256i c0 = dpbusd_bcast(_mm256_set1_epi32(-s0[t * nb + b] * off), wv[0], xb), c1 = dpbusd_bcast(z, wv[2], xb + 2);
            __m256i c2 = dpbusd_bcast(z, wv[4], xb + 4), c3 = dpbusd_bcast(z, wv[6], xb + 6);
            c0 = dpbusd_bcast(c0, wv[1], xb + 1);
            c1 = dpbusd_bcast(c1, wv[3], xb + 3);
            c2 = dpbusd_bcast(c2, wv[5], xb + 5);
            c3 = dpbusd_bcast(c3, wv[7], xb + 7);
            __m256i st = _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(st), _mm256_mul_ps(dw, _mm256_set1_ps(d0[t * nb + b])), acc[t]);
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);
}

static void tile8_q4_1(const char *g, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy) { tile8(false, g, a, m0, 1, y, ldy); }
static void tile8_q4_2(const char *g, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy) { tile8(false, g, a, m0, 2, y, ldy); }
static void tile8_q8_1(const char *g, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy) { tile8(true, g, a, m0, 1, y, ldy); }
static void tile8_q8_2(const char *g, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy) { tile8(true, g, a, m0, 2, y, ldy); }

#define DEFINE_R8_TILES(n)                                                                                          \
    static void tile_q4_##n(const char *ga, const char *gb, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy, \
                            __mmask16 rm) {                                                                         \
        tile16(false, ga, gb, a, m0, n, y, ldy, rm);                                                                \
    }                                                                                                               \
    static void tile_q8_##n(const char *ga, const char *gb, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy, \
                            __mmask16 rm) {                                                                         \
        tile16(true, ga, gb, a, m0, n, y, ldy, rm);                                                                 \
    }
DEFINE_R8_TILES(1)
DEFINE_R8_TILES(2)
DEFINE_R8_TILES(3)
DEFINE_R8_TILES(4)
DEFINE_R8_TILES(5)
DEFINE_R8_TILES(6)
DEFINE_R8_TILES(7)
DEFINE_R8_TILES(8)

FL_R8_PAIR_FNS(wide_q4_, tile16w, false)
FL_R8_PAIR_FNS(wide_q8_, tile16w, true)

void fl_r8_gemm_avx512(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                       int64_t ldy) {
    typedef void (*fn)(const char *, const char *, const fl_act_q8 *, int64_t, float *, int64_t, __mmask16);
#define ROW(q) {NULL, tile_##q##_1, tile_##q##_2, tile_##q##_3, tile_##q##_4, tile_##q##_5, tile_##q##_6, tile_##q##_7, tile_##q##_8}
    static const fn tiles[2][9] = {ROW(q4), ROW(q8)};
#undef ROW
    const bool q8 = wtype == FL_TYPE_Q8_0_R8;
    const fn *tq = tiles[q8];
    const size_t gs = (size_t)FL_R8_ROWS * ldw;
    if (nt <= R8_GEMV_TOKENS) { /* one group at a time */
        for (int r = 0; r < nr; r += FL_R8_ROWS) {
            const char *g = (const char *)w + (size_t)(r / FL_R8_ROWS) * gs;
            if (nt == 1) (q8 ? tile8_q8_1 : tile8_q4_1)(g, a, m0, y + r, ldy);
            else (q8 ? tile8_q8_2 : tile8_q4_2)(g, a, m0, y + r, ldy);
        }
        return;
    }
    typedef void (*quad_fn)(const char *, const char *, const char *, const char *, const fl_act_q8 *, int64_t, float *, int64_t,
                            __mmask16, bool);
#define ROW(q) {NULL, quadr_##q##_1, quadr_##q##_2, quadr_##q##_3, quadr_##q##_4, quadr_##q##_5, quadr_##q##_6, quadr_##q##_7, quadr_##q##_8}
    static const quad_fn quads[2][9] = {ROW(q4), ROW(q8)};
#undef ROW
    int r0 = 0;
    for (; nr - r0 > 16; r0 += 32) { /* four groups (the fourth the third again at 24 rows) */
        const char *g0 = (const char *)w + (size_t)(r0 / FL_R8_ROWS) * gs;
        const bool four = nr - r0 >= 32;
        for (int t = 0; t < nt; t += 8)
            quads[q8][nt - t < 8 ? nt - t : 8](g0, g0 + gs, g0 + 2 * gs, four ? g0 + 3 * gs : g0 + 2 * gs, a, m0 + t, y + t * ldy + r0,
                                               ldy, four ? (__mmask16)0xFFFF : (__mmask16)0x00FF, t == 0);
    }
    for (int r = r0; r < nr; r += 16) { /* pairs of groups; a last lone group computed twice, 8 rows stored */
        const char *ga = (const char *)w + (size_t)(r / FL_R8_ROWS) * gs;
        const bool two = nr - r >= 16;
        for (int t = 0; t < nt; t += 8) {
            const int n = nt - t < 8 ? nt - t : 8;
            tq[n](ga, two ? ga + gs : ga, a, m0 + t, y + t * ldy + r, ldy, two ? (__mmask16)0xFFFF : (__mmask16)0x00FF);
        }
    }
}

void fl_r8_gemm16_avx512(int32_t wtype, const void *w, size_t ldw, int nr, const void *act, int64_t nb, int nt, float *y, int64_t ldy,
                         bool pf) {
    static const fl_r8_pair_fn tiles[2][8] = {FL_R8_PAIR_ROW(wide_q4_), FL_R8_PAIR_ROW(wide_q8_)};
    typedef void (*quad_fn)(const char *, const char *, const char *, const char *, const char *, int64_t, float *, int64_t, __mmask16, bool);
#define ROW(q) {quad_##q##_9, quad_##q##_10, quad_##q##_11, quad_##q##_12, quad_##q##_13, quad_##q##_14, quad_##q##_15, quad_##q##_16}
    static const quad_fn quads[2][8] = {ROW(q4), ROW(q8)};
#undef ROW
    const bool q8 = wtype == FL_TYPE_Q8_0_R8;
    const size_t gs = (size_t)FL_R8_ROWS * ldw;
    int r = 0;
    for (; nr - r > 16; r += 32) { /* four groups (the fourth the third again at 24 rows) */
        const char *g0 = (const char *)w + (size_t)(r / FL_R8_ROWS) * gs;
        const bool four = nr - r >= 32;
        quads[q8][nt - 9](g0, g0 + gs, g0 + 2 * gs, four ? g0 + 3 * gs : g0 + 2 * gs, (const char *)act, nb, y + r, ldy,
                          four ? (__mmask16)0xFFFF : (__mmask16)0x00FF, pf);
    }
    if (r < nr) /* 8 or 16 rows left: a pair */
        fl_r8_pairs(tiles[q8][nt - 9], (const char *)w + (size_t)(r / FL_R8_ROWS) * gs, ldw, nr - r, act, nb, y + r, ldy);
}
