/* AVX2 row panels (the GEMM path for M > 1 on CPUs without AVX-512; Q4_0, Q8_0, Q4_K, Q5_K, Q6_K): the panel layout of
 * matmul.h (fl_panel_pack_ref: per block of 32, 16 f32 scales then the codes ordered
 * [k / 4][row][k % 4]), packed here without gathers, and a kernel whose 8 int32 lanes are 8
 * weight rows, so no horizontal sum is ever needed and one scale multiply serves 8 rows.
 *
 * Per block, for each of the 8 groups of 4 codes: one 32-byte load holds 8 rows x 4 codes and
 * one broadcast holds a token's 4 activation codes.
 * - Q4_0 / Q4_K (unsigned codes 0..15): vpmaddubsw, and the 8 groups' int16 pair sums are added
 *   in int16.  Q4_K: |pair| <= 2 * 15 * 127 = 3810, so 8 of them stay within 30480 < 32767 and
 *   the sums are exact; one vpmaddwd per block and token widens them and the mins term is added
 *   in f32 (fl_act_q8.ms).  Q4_0: each int16 lane starts at -8 x the sum of its 16 activation
 *   codes (fl_act_q8.o4), so after g groups it holds sum (w - 8) x over the codes done plus
 *   -8 x over the rest: 16 terms of at most 8 * 127, |.| <= 16256, and it ends at the offset sum
 *   with no per-block offset step.
 * - Q5_K (codes 0..31): as Q4_0 with the lanes starting at -16 x the sums (2 x fl_act_q8.o4),
 *   so they end at sum (q - 16) x (16 terms of at most 16 * 127 = 32512), and the panel's mins
 *   words dmin m_j - 16 d sc_j give the 16 back with the mins term.
 * - Q6_K (codes 0..63, a scale per 16 codes): per half block the int16 lanes start at -32 x
 *   their codes' sums (fl_act_q8.o6) and take 4 groups, ending at sum (q - 32) x (8 terms of at
 *   most 32 * 127, |.| <= 32512); one vpmaddwd by the words (sc, sc) then gives sc x sum in int32, and
 *   the fold multiplies by d.
 * - Q8_0 (panel codes + 128): the weight vector is flipped back to signed once per group and
 *   multiplied as |w| x sign(x, w) (pairs up to 2 * 127 * 127 = 32258, no saturation), each group
 *   widened by vpmaddwd and added in int32.
 * Then one convert and one fma with d_w (8 lanes) * d_x per block and token.  A Q8_0 tile is 8
 * rows (half a panel) x up to 4 tokens, the 4 tokens sharing each weight load; a Q4_0 / Q5_K
 * tile is the whole panel (both halves) x up to 4 tokens, the other K-quants' x up to 2, each
 * token's broadcast activation group serving 16 rows.  On this kind of core
 * (two vector integer multipliers) the Q4_0 tile needs one multiply per 32 products where the
 * int8 calibration loop needs two, so it can pass that loop's rate.
 * Reference: fl_panel_gemm_ref (the same integer sums; only the f32 order of the folds differs). */
#include "core/status.h"
#include "kernels/avx2/f16x8_avx2.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define PANEL_BLOCK (FL_PANEL_ROWS * 4 + FL_PANEL_ROWS * 32)

/* ---- packing ---- */

/* 4 x 4 dword transposes in both 128-bit lanes: in r[i] = [row i | row i + 4] (4 dwords each),
 * out o[g] = [rows 0..3 dword g | rows 4..7 dword g]. */
INLINE void transpose4(const __m256i r[4], __m256i o[4]) {
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpacklo_epi32(r[2], r[3]);
    const __m256i t2 = _mm256_unpackhi_epi32(r[0], r[1]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    o[0] = _mm256_unpacklo_epi64(t0, t1);
    o[1] = _mm256_unpackhi_epi64(t0, t1);
    o[2] = _mm256_unpacklo_epi64(t2, t3);
    o[3] = _mm256_unpackhi_epi64(t2, t3);
}

/* 8 rows of one Q4_0 block (row i's block at r8[i] + off, its codes 2 bytes on) into half h of the panel
 * block pb.  The packers are inlined and unrolled: as calls, their arrays went through the stack
 * and a panel's pack took ~30% as long as passing 16 tokens through it. */
INLINE void pack_half_q4_0(const char *const r8[8], size_t off, int h, char *pb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i r[4], o[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        r[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(r8[i] + off + 2))),
                                       _mm_loadu_si128((const __m128i *)(r8[i + 4] + off + 2)), 1);
    transpose4(r, o);
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) { /* codes 4g..4g+3 are the low nibbles of qs[4g..], 16 + 4g.. the high */
        _mm256_storeu_si256((__m256i *)(pb + 64 + 64 * g + 32 * h), _mm256_and_si256(o[g], m4));
        _mm256_storeu_si256((__m256i *)(pb + 64 + 64 * (g + 4) + 32 * h), _mm256_and_si256(_mm256_srli_epi16(o[g], 4), m4));
    }
}

/* 8 rows x 32 code bytes (row i's at r8[i] + off) into half h of the panel block pb: Q8_0's codes
 * sign-flipped (mode 0), or the low (1) or high (2) nibbles of a Q4_K sub-block pair. */
INLINE void pack_half_bytes(const char *const r8[8], size_t off, int h, char *pb, const int mode) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), m4 = _mm256_set1_epi8(0x0F);
    __m256i r[4], o[4];
#pragma GCC unroll 2
    for (int part = 0; part < 2; part++) { /* codes 0..15, then 16..31 */
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            r[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(r8[i] + off + 16 * part))),
                                           _mm_loadu_si128((const __m128i *)(r8[i + 4] + off + 16 * part)), 1);
        transpose4(r, o);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i v = mode == 0 ? _mm256_xor_si256(o[g], flip)
                              : mode == 1 ? _mm256_and_si256(o[g], m4)
                                          : _mm256_and_si256(_mm256_srli_epi16(o[g], 4), m4);
            _mm256_storeu_si256((__m256i *)(pb + 64 + 64 * (4 * part + g) + 32 * h), v);
        }
    }
}

/* 8 rows x 32 bytes (row i's at r8[i] + off) transposed to the panel's code order: o[g] holds
 * bytes 4g..4g+3 of the 8 rows (rows 0..3 in the low lane, 4..7 in the high one). */
INLINE void transpose_half(const char *const r8[8], size_t off, __m256i o[8]) {
    __m256i r[4];
#pragma GCC unroll 2
    for (int part = 0; part < 2; part++) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            r[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(r8[i] + off + 16 * part))),
                                           _mm_loadu_si128((const __m128i *)(r8[i + 4] + off + 16 * part)), 1);
        transpose4(r, o + 4 * part);
    }
}

/* Shift every byte of v left by n (n < 0: right), then keep the bits of mask. */
INLINE __m256i shift_mask(__m256i v, const int n, const __m256i mask) {
    return _mm256_and_si256(n > 0 ? _mm256_slli_epi16(v, n) : n < 0 ? _mm256_srli_epi16(v, -n) : v, mask);
}

/* Q5_K / Q6_K (full panels): 8 rows x one 32-code block into half h of the panel block pb from
 * transposed low bits lo (the nibbles at shift ls: 0 or 4) and high bits hi (Q5_K: bit j of qh
 * to bit 4; Q6_K: bits 2qq, 2qq + 1 of qh to bits 4, 5). */
INLINE void combine_half_m(const __m256i lo[8], const __m256i hi[8], const int ls, const __m256i lmask, const int hs,
                           const __m256i hmask, int h, char *pb) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++)
        _mm256_storeu_si256((__m256i *)(pb + 64 + 64 * g + 32 * h),
                            _mm256_or_si256(shift_mask(lo[g], -ls, lmask), shift_mask(hi[g], hs, hmask)));
}
INLINE void combine_half(const __m256i lo[8], const __m256i hi[8], const int ls, const int hs, const __m256i hmask, int h,
                         char *pb) {
    combine_half_m(lo, hi, ls, _mm256_set1_epi8(0x0F), hs, hmask, h, pb);
}

/* The fifth bits of codes 4g + i (hi: 16 + 4g + i), i < 4, of 8 rows as 0x10 or 0 in panel order,
 * from qh = the rows' 32-bit qh words as dwords [rows 0..3 | rows 4..7]. */
INLINE __m256i fifth_bits(__m256i qh, const int g, const int hi) {
    const int byte = 2 * hi + g / 2, bit = 4 * (g % 2);
    const __m256i sel = _mm256_shuffle_epi8(qh, _mm256_setr_epi8(byte, byte, byte, byte, 4 + byte, 4 + byte, 4 + byte, 4 + byte, 8 + byte, 8 + byte,
                                                                 8 + byte, 8 + byte, 12 + byte, 12 + byte, 12 + byte, 12 + byte, byte, byte, byte, byte,
                                                                 4 + byte, 4 + byte, 4 + byte, 4 + byte, 8 + byte, 8 + byte, 8 + byte, 8 + byte,
                                                                 12 + byte, 12 + byte, 12 + byte, 12 + byte));
    const __m256i m = _mm256_set1_epi32((int)(0x08040201u << bit));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(sel, m), m), _mm256_set1_epi8(0x10));
}

/* 8 rows of one Q4_1 / Q5_0 / Q5_1 / IQ4_NL block (row i's at r8[i] + off; its codes qs bytes
 * on, the fifth bits qh bytes on) into half h of the panel block pb. */
INLINE void pack_half_b32(const char *const r8[8], size_t off, const int qs, const int qh, const bool iq4, int h, char *pb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i tab = _mm256_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153, (char)166, (char)181, (char)197,
                                         (char)217, (char)241, 1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153,
                                         (char)166, (char)181, (char)197, (char)217, (char)241); /* fl_iq4nl_values + 128 */
    __m256i r[4], o[4], hv = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        r[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(r8[i] + off + qs))),
                                       _mm_loadu_si128((const __m128i *)(r8[i + 4] + off + qs)), 1);
    transpose4(r, o);
    if (qh) {
        int32_t q[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) memcpy(&q[i], r8[i] + off + qh, 4);
        hv = _mm256_setr_epi32(q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        __m256i lo = _mm256_and_si256(o[g], m4), hi = _mm256_and_si256(_mm256_srli_epi16(o[g], 4), m4);
        if (iq4) lo = _mm256_shuffle_epi8(tab, lo), hi = _mm256_shuffle_epi8(tab, hi);
        if (qh) lo = _mm256_or_si256(lo, fifth_bits(hv, g, 0)), hi = _mm256_or_si256(hi, fifth_bits(hv, g, 1));
        _mm256_storeu_si256((__m256i *)(pb + 64 + 64 * g + 32 * h), lo);
        _mm256_storeu_si256((__m256i *)(pb + 64 + 64 * (g + 4) + 32 * h), hi);
    }
}

/* Q4_1, Q5_0, Q5_1, IQ4_NL: one half of a full panel, block after block, with the scales d and the
 * mins words (fl_panel_pack_ref's bytes). */
INLINE void pack_half_rows_b32(const char *w, size_t ldw, int64_t nb, int h, char *panel, const int32_t wtype) {
    const size_t bsz = wtype == FL_TYPE_Q4_1 ? sizeof(fl_block_q4_1)
                       : wtype == FL_TYPE_Q5_0 ? sizeof(fl_block_q5_0)
                       : wtype == FL_TYPE_Q5_1 ? sizeof(fl_block_q5_1)
                                               : sizeof(fl_block_iq4_nl);
    const int qs = wtype == FL_TYPE_Q4_1 ? 4 : wtype == FL_TYPE_Q5_0 ? 6 : wtype == FL_TYPE_Q5_1 ? 8 : 2;
    const int qh = wtype == FL_TYPE_Q5_0 ? 2 : wtype == FL_TYPE_Q5_1 ? 4 : 0;
    float *mins = (float *)(panel + nb * PANEL_BLOCK);
    const char *r8[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) r8[i] = w + (size_t)(8 * h + i) * ldw;
    for (int64_t b = 0; b < nb; b++) {
        char *pb = panel + b * PANEL_BLOCK;
        const size_t off = (size_t)b * bsz;
        const __m256 d = fl_f16x8_ptrs_avx2(r8, off);
        _mm256_storeu_ps((float *)pb + 8 * h, d);
        const __m256 neg = _mm256_set1_ps(-0.0f); /* negation flips the sign bit, as C's unary minus */
        if (wtype == FL_TYPE_Q4_1) /* -m */
            _mm256_storeu_ps(mins + b * FL_PANEL_ROWS + 8 * h, _mm256_xor_ps(neg, fl_f16x8_ptrs_avx2(r8, off + 2)));
        else if (wtype == FL_TYPE_Q5_0)
            _mm256_storeu_ps(mins + b * FL_PANEL_ROWS + 8 * h, _mm256_setzero_ps());
        else if (wtype == FL_TYPE_Q5_1) /* -(16 d + m) */
            _mm256_storeu_ps(mins + b * FL_PANEL_ROWS + 8 * h,
                             _mm256_xor_ps(neg, _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(16), d), fl_f16x8_ptrs_avx2(r8, off + 2))));
        pack_half_b32(r8, off, qs, qh, wtype == FL_TYPE_IQ4_NL, h, pb);
    }
}

/* One half (rows 8h..8h+7) of a full Q4_0 / Q8_0 panel, block after block: the 8 row pointers
 * stay in registers and the block offset is one index (blocks inner, with 16 row pointers
 * live, GCC kept them on the stack and the pack took ~50 cycles per block). */
INLINE void pack_half_rows(const char *w, size_t ldw, int64_t nb, int h, char *panel, const bool q8) {
    const size_t bsz = q8 ? sizeof(fl_block_q8_0) : sizeof(fl_block_q4_0);
    const char *r8[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) r8[i] = w + (size_t)(8 * h + i) * ldw;
    for (int64_t b = 0; b < nb; b++) {
        char *pb = panel + b * PANEL_BLOCK;
        const size_t off = (size_t)b * bsz;
        _mm256_storeu_ps((float *)pb + 8 * h, fl_f16x8_ptrs_avx2(r8, off));
        if (q8) pack_half_bytes(r8, off + 2, h, pb, 0);
        else pack_half_q4_0(r8, off, h, pb);
    }
}

/* Q4_K: panel block b is sub-block j = b % 8 of super-block b / 8; scales d sc_j, then the
 * mins dmin m_j after the blocks (fl_panel_pack_ref's bytes). */
static void pack_q4_K(const char *w, size_t ldw, int64_t K, char *panel) {
    const int64_t nb = K / 32;
    float *mins = (float *)(panel + nb * PANEL_BLOCK);
    const char *rows[FL_PANEL_ROWS];
    for (int r = 0; r < FL_PANEL_ROWS; r++) rows[r] = w + (size_t)r * ldw;
    for (int64_t b = 0; b < nb; b++) {
        const int j = (int)(b % 8);
        char *pb = panel + b * PANEL_BLOCK;
        for (int r = 0; r < FL_PANEL_ROWS; r++) {
            const fl_block_q4_K *blk = (const fl_block_q4_K *)rows[r] + b / 8;
            uint8_t sc, mn;
            fl_q4_K_scale_min(j, blk->scales, &sc, &mn);
            ((float *)pb)[r] = _cvtsh_ss(blk->d) * (float)sc;
            mins[b * FL_PANEL_ROWS + r] = _cvtsh_ss(blk->dmin) * (float)mn;
        }
        const size_t off = (size_t)(b / 8) * sizeof(fl_block_q4_K) + offsetof(fl_block_q4_K, qs) + (size_t)(j / 2) * 32;
        for (int h = 0; h < 2; h++) {
            if (j % 2) pack_half_bytes(rows + 8 * h, off, h, pb, 2);
            else pack_half_bytes(rows + 8 * h, off, h, pb, 1);
        }
    }
}

/* Q5_K: as Q4_K with bit j of qh[l] adding 16 to code l of sub-block j; its mins words are
 * dmin m_j - 16 d sc_j (the tile sums (q - 16) x, fl_panel_pack_ref). */
static void pack_q5_K(const char *w, size_t ldw, int64_t K, char *panel) {
    const int64_t nb = K / 32;
    float *mins = (float *)(panel + nb * PANEL_BLOCK);
    const char *rows[FL_PANEL_ROWS];
    for (int r = 0; r < FL_PANEL_ROWS; r++) rows[r] = w + (size_t)r * ldw;
    for (int64_t i = 0; i < nb / 8; i++) {
        for (int r = 0; r < FL_PANEL_ROWS; r++) {
            const fl_block_q5_K *blk = (const fl_block_q5_K *)rows[r] + i;
            const float d = _cvtsh_ss(blk->d), dmin = _cvtsh_ss(blk->dmin);
            for (int j = 0; j < 8; j++) {
                uint8_t sc, mn;
                fl_q4_K_scale_min(j, blk->scales, &sc, &mn);
                const float dw = d * (float)sc;
                ((float *)(panel + (i * 8 + j) * PANEL_BLOCK))[r] = dw;
                mins[(i * 8 + j) * FL_PANEL_ROWS + r] = dmin * (float)mn - 16 * dw;
            }
        }
        const size_t base = (size_t)i * sizeof(fl_block_q5_K);
        for (int h = 0; h < 2; h++) {
            __m256i qh[8], qs[8];
            transpose_half(rows + 8 * h, base + offsetof(fl_block_q5_K, qh), qh);
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) { /* sub-blocks 2p (low nibbles) and 2p + 1 (high) */
                transpose_half(rows + 8 * h, base + offsetof(fl_block_q5_K, qs) + 32 * (size_t)p, qs);
                const __m256i b4 = _mm256_set1_epi8(0x10);
                combine_half(qs, qh, 0, 4 - 2 * p, b4, h, panel + (i * 8 + 2 * p) * PANEL_BLOCK);
                combine_half(qs, qh, 4, 3 - 2 * p, b4, h, panel + (i * 8 + 2 * p + 1) * PANEL_BLOCK);
            }
        }
    }
}

/* The 16 rows' scales d[r] in the 8 panel blocks of super-block i, and their 16 int8 scales
 * sc[r][k] (one per 16 codes) as the words (sc, sc) after the blocks: Q6_K, Q3_K.  All rows at
 * once: each d slot two stores, and the words through a 16 x 16 byte transpose (four unpack
 * stages), each scale's 16 rows two stores; per row, 24 strided scalar stores per super-block had
 * been over half of a 16-token Q6_K pack's samples (a 16-token TinyLlama-shaped Q6_K forward,
 * alternated in one process: 1.17-1.22x on AVX-512, 1.20x with FL_KERNELS=avx2 there). */
static void pack_scales16_x16(char *panel, int64_t nb, int64_t i, const float d[16], const int8_t sc[16][16]) {
    uint32_t *words = (uint32_t *)(panel + nb * PANEL_BLOCK);
    const __m256 d0 = _mm256_loadu_ps(d), d1 = _mm256_loadu_ps(d + 8);
    for (int j = 0; j < 8; j++) {
        float *f = (float *)(panel + (i * 8 + j) * PANEL_BLOCK);
        _mm256_storeu_ps(f, d0);
        _mm256_storeu_ps(f + 8, d1);
    }
    __m128i l1[8], h1[8], c2[4][4], c3[2][4][2];
    for (int p = 0; p < 8; p++) { /* 16-bit elements: rows 2p, 2p + 1 of a column */
        const __m128i a = _mm_loadu_si128((const __m128i *)sc[2 * p]), b = _mm_loadu_si128((const __m128i *)sc[2 * p + 1]);
        l1[p] = _mm_unpacklo_epi8(a, b); /* columns 0..7 */
        h1[p] = _mm_unpackhi_epi8(a, b); /* 8..15 */
    }
    for (int q = 0; q < 4; q++) { /* 32-bit: rows 4q .. 4q + 3; c2[q][g] columns 4g .. 4g + 3 */
        c2[q][0] = _mm_unpacklo_epi16(l1[2 * q], l1[2 * q + 1]);
        c2[q][1] = _mm_unpackhi_epi16(l1[2 * q], l1[2 * q + 1]);
        c2[q][2] = _mm_unpacklo_epi16(h1[2 * q], h1[2 * q + 1]);
        c2[q][3] = _mm_unpackhi_epi16(h1[2 * q], h1[2 * q + 1]);
    }
    for (int t = 0; t < 2; t++) /* 64-bit: rows 8t .. 8t + 7; c3[t][g][h] columns 4g + 2h, 4g + 2h + 1 */
        for (int g = 0; g < 4; g++) {
            c3[t][g][0] = _mm_unpacklo_epi32(c2[2 * t][g], c2[2 * t + 1][g]);
            c3[t][g][1] = _mm_unpackhi_epi32(c2[2 * t][g], c2[2 * t + 1][g]);
        }
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    for (int g = 0; g < 4; g++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++) { /* column k: its 16 rows' scales */
                const int k = 4 * g + 2 * h + e;
                const __m128i col = e ? _mm_unpackhi_epi64(c3[0][g][h], c3[1][g][h]) : _mm_unpacklo_epi64(c3[0][g][h], c3[1][g][h]);
                const __m256i x0 = _mm256_cvtepi8_epi32(col), x1 = _mm256_cvtepi8_epi32(_mm_srli_si128(col, 8));
                uint32_t *o = words + (i * 16 + k) * FL_PANEL_ROWS;
                _mm256_storeu_si256((__m256i *)o, _mm256_or_si256(_mm256_and_si256(x0, lo16), _mm256_slli_epi32(x0, 16)));
                _mm256_storeu_si256((__m256i *)(o + 8), _mm256_or_si256(_mm256_and_si256(x1, lo16), _mm256_slli_epi32(x1, 16)));
            }
}

/* Q6_K: panel block b is quarter qq = b % 4 of half n = (b % 8) / 4 of super-block b / 8; its
 * scale d, codes 0..63, and after the blocks the words (sc, sc) of its two 16-code halves. */
static void pack_q6_K(const char *w, size_t ldw, int64_t K, char *panel) {
    const int64_t nb = K / 32;
    const char *rows[FL_PANEL_ROWS];
    for (int r = 0; r < FL_PANEL_ROWS; r++) rows[r] = w + (size_t)r * ldw;
    for (int64_t i = 0; i < nb / 8; i++) {
        float d[FL_PANEL_ROWS];
        int8_t sc[FL_PANEL_ROWS][16];
        for (int r = 0; r < FL_PANEL_ROWS; r++) {
            const fl_block_q6_K *blk = (const fl_block_q6_K *)rows[r] + i;
            d[r] = _cvtsh_ss(blk->d);
            memcpy(sc[r], blk->scales, 16);
        }
        pack_scales16_x16(panel, nb, i, d, sc);
        const size_t base = (size_t)i * sizeof(fl_block_q6_K);
        for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
            for (int n = 0; n < 2; n++) {
                __m256i qh[8], ql[8];
                transpose_half(rows + 8 * h, base + offsetof(fl_block_q6_K, qh) + 32 * (size_t)n, qh);
                const __m256i b45 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
                for (int c = 0; c < 2; c++) { /* ql[64n + 32c ..]: quarters c (low nibbles) and c + 2 (high) */
                    transpose_half(rows + 8 * h, base + offsetof(fl_block_q6_K, ql) + 64 * (size_t)n + 32 * (size_t)c, ql);
                    combine_half(ql, qh, 0, 4 - 2 * c, b45, h, panel + (i * 8 + 4 * n + c) * PANEL_BLOCK);
                    combine_half(ql, qh, 4, -2 * c, b45, h, panel + (i * 8 + 4 * n + c + 2) * PANEL_BLOCK);
                }
            }
    }
}

/* Q3_K: panel block b takes bits 2 (b % 4), 2 (b % 4) + 1 of qs[32 n ..] (n = (b % 8) / 4) and bit
 * b % 8 of hmask as bit 2: codes 0..7 (value + 4); its scale d and the words (sc, sc) as Q6_K. */
static void pack_q3_K(const char *w, size_t ldw, int64_t K, char *panel) {
    const int64_t nb = K / 32;
    const char *rows[FL_PANEL_ROWS];
    for (int r = 0; r < FL_PANEL_ROWS; r++) rows[r] = w + (size_t)r * ldw;
    for (int64_t i = 0; i < nb / 8; i++) {
        float d[FL_PANEL_ROWS];
        int8_t sc[FL_PANEL_ROWS][16];
        for (int r = 0; r < FL_PANEL_ROWS; r++) {
            const fl_block_q3_K *blk = (const fl_block_q3_K *)rows[r] + i;
            fl_q3_K_scales(blk->scales, sc[r]);
            d[r] = _cvtsh_ss(blk->d);
        }
        pack_scales16_x16(panel, nb, i, d, sc);
        const size_t base = (size_t)i * sizeof(fl_block_q3_K);
        const __m256i m2 = _mm256_set1_epi8(0x03), b2 = _mm256_set1_epi8(0x04);
        for (int h = 0; h < 2; h++) {
            __m256i hm[8], qs[8];
            transpose_half(rows + 8 * h, base + offsetof(fl_block_q3_K, hmask), hm);
#pragma GCC unroll 2
            for (int n = 0; n < 2; n++) {
                transpose_half(rows + 8 * h, base + offsetof(fl_block_q3_K, qs) + 32 * (size_t)n, qs);
                char *pb = panel + (i * 8 + 4 * n) * PANEL_BLOCK;
                combine_half_m(qs, hm, 0, m2, 2 - 4 * n, b2, h, pb);
                combine_half_m(qs, hm, 2, m2, 1 - 4 * n, b2, h, pb + PANEL_BLOCK);
                combine_half_m(qs, hm, 4, m2, 0 - 4 * n, b2, h, pb + 2 * PANEL_BLOCK);
                combine_half_m(qs, hm, 6, m2, -1 - 4 * n, b2, h, pb + 3 * PANEL_BLOCK);
            }
        }
    }
}

/* Q2_K: panel block b takes bits 2 (b % 4), 2 (b % 4) + 1 of qs[32 n ..] (n = (b % 8) / 4): codes
 * 0..3; its scale d, the words (sc, sc) and (m, m) of its halves and dmin (fl_panel_pack_ref). */
static void pack_q2_K(const char *w, size_t ldw, int64_t K, char *panel) {
    const int64_t nb = K / 32;
    uint32_t *words = (uint32_t *)(panel + nb * PANEL_BLOCK);
    float *dmin = (float *)words + nb * 4 * FL_PANEL_ROWS;
    const char *rows[FL_PANEL_ROWS];
    for (int r = 0; r < FL_PANEL_ROWS; r++) rows[r] = w + (size_t)r * ldw;
    for (int64_t i = 0; i < nb / 8; i++) {
        for (int r = 0; r < FL_PANEL_ROWS; r++) {
            const fl_block_q2_K *blk = (const fl_block_q2_K *)rows[r] + i;
            const float d = _cvtsh_ss(blk->d), dm = _cvtsh_ss(blk->dmin);
            for (int j = 0; j < 8; j++) {
                ((float *)(panel + (i * 8 + j) * PANEL_BLOCK))[r] = d;
                dmin[(i * 8 + j) * FL_PANEL_ROWS + r] = dm;
                for (int h = 0; h < 2; h++) {
                    const uint32_t v = blk->scales[2 * j + h];
                    words[((i * 8 + j) * 4 + h) * FL_PANEL_ROWS + r] = (v & 0xF) * 0x10001u;
                    words[((i * 8 + j) * 4 + 2 + h) * FL_PANEL_ROWS + r] = (v >> 4) * 0x10001u;
                }
            }
        }
        const size_t base = (size_t)i * sizeof(fl_block_q2_K) + offsetof(fl_block_q2_K, qs);
        const __m256i m2 = _mm256_set1_epi8(0x03), zero = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
            for (int n = 0; n < 2; n++) {
                __m256i qs[8];
                transpose_half(rows + 8 * h, base + 32 * (size_t)n, qs);
                char *pb = panel + (i * 8 + 4 * n) * PANEL_BLOCK;
                const __m256i z[8] = {zero, zero, zero, zero, zero, zero, zero, zero}; /* no high bits */
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) combine_half_m(qs, z, 2 * c, m2, 0, zero, h, pb + c * PANEL_BLOCK);
            }
    }
}

/* Q4_0_R8 / Q8_0_R8 (kernels/matmul.h) into a Q4_0 / Q8_0 panel: group h of the panel's rows is
 * half h, and its vectors per block are already 8 rows x 4 code bytes, so the pack is a mask and
 * a shift per vector (Q4_0: low nibbles group q, high group q + 4) or a sign flip (Q8_0's codes
 * + 128), and one convert of the 8 scales; a panel of 8 rows has its second half zero. */
static void pack_r8(const char *w, size_t ldw, int nr, int64_t K, char *panel, const bool q8) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8((char)0x80);
    const int64_t nb = K / 32;
    for (int h = 0; h < 2; h++) {
        const char *g = w + (size_t)h * FL_R8_ROWS * ldw;
        for (int64_t b = 0; b < nb; b++) {
            char *pb = panel + b * PANEL_BLOCK;
            if (8 * h >= nr) {
                _mm256_storeu_ps((float *)pb + 8 * h, _mm256_setzero_ps());
                for (int q = 0; q < 8; q++) _mm256_storeu_si256((__m256i *)(pb + 64 + 64 * q + 32 * h), _mm256_setzero_si256());
                continue;
            }
            const char *gb = g + (size_t)b * (q8 ? FL_R8_Q8_0_BLOCK : FL_R8_Q4_0_BLOCK);
            _mm256_storeu_ps((float *)pb + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)gb)));
            if (q8) { /* Q8_0: the panel's codes + 128 */
#pragma GCC unroll 8
                for (int q = 0; q < 8; q++)
                    _mm256_storeu_si256((__m256i *)(pb + 64 + 64 * q + 32 * h),
                                        _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(gb + 16 + 32 * q)), flip));
                continue;
            }
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(gb + 16 + 32 * q));
                _mm256_storeu_si256((__m256i *)(pb + 64 + 64 * q + 32 * h), _mm256_and_si256(v, m4));
                _mm256_storeu_si256((__m256i *)(pb + 64 + 64 * (q + 4) + 32 * h), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
        }
    }
}

void fl_panel_pack_avx2(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, void *panel) {
    if (fl_k16_type(wtype)) { /* Q6_K_R16, Q5_K_R16, Q3_K_R16, Q2_K_R16 (AVX-512 only: their groups are packed there) */
        FL_ASSERT(nr == FL_PANEL_ROWS);
        fl_k16_panel_pack_avx512(wtype, w, K, panel);
        return;
    }
    if (wtype == FL_TYPE_Q4_0_R8 || wtype == FL_TYPE_Q8_0_R8) { /* nr 8 or 16 (whole groups) */
        if (wtype == FL_TYPE_Q8_0_R8) pack_r8(w, ldw, nr, K, panel, true);
        else pack_r8(w, ldw, nr, K, panel, false);
        return;
    }
    const bool b32 = wtype == FL_TYPE_Q4_1 || wtype == FL_TYPE_Q5_0 || wtype == FL_TYPE_Q5_1 || wtype == FL_TYPE_IQ4_NL;
    if (nr < FL_PANEL_ROWS || (wtype != FL_TYPE_Q4_0 && wtype != FL_TYPE_Q8_0 && wtype != FL_TYPE_Q4_K &&
                               wtype != FL_TYPE_Q5_K && wtype != FL_TYPE_Q6_K && wtype != FL_TYPE_Q3_K && wtype != FL_TYPE_Q2_K &&
                               !b32)) { /* a partial panel */
        fl_panel_pack_ref(wtype, w, ldw, nr, K, panel);
        return;
    }
    if (b32) {
        for (int h = 0; h < 2; h++) switch (wtype) {
            case FL_TYPE_Q4_1: pack_half_rows_b32(w, ldw, K / 32, h, panel, FL_TYPE_Q4_1); break;
            case FL_TYPE_Q5_0: pack_half_rows_b32(w, ldw, K / 32, h, panel, FL_TYPE_Q5_0); break;
            case FL_TYPE_Q5_1: pack_half_rows_b32(w, ldw, K / 32, h, panel, FL_TYPE_Q5_1); break;
            default: pack_half_rows_b32(w, ldw, K / 32, h, panel, FL_TYPE_IQ4_NL); break;
            }
        return;
    }
    if (wtype == FL_TYPE_Q4_K || wtype == FL_TYPE_Q5_K || wtype == FL_TYPE_Q6_K || wtype == FL_TYPE_Q3_K || wtype == FL_TYPE_Q2_K) {
        (wtype == FL_TYPE_Q4_K   ? pack_q4_K
         : wtype == FL_TYPE_Q5_K ? pack_q5_K
         : wtype == FL_TYPE_Q6_K ? pack_q6_K
         : wtype == FL_TYPE_Q3_K ? pack_q3_K
                                 : pack_q2_K)(w, ldw, K, panel);
        return;
    }
    const int64_t nb = K / 32;
    for (int h = 0; h < 2; h++) {
        if (wtype == FL_TYPE_Q8_0) pack_half_rows(w, ldw, nb, h, panel, true);
        else pack_half_rows(w, ldw, nb, h, panel, false);
    }
}

/* ---- the tiles ---- */

#define TILE_ACC 8 /* the most accumulators of a tile (16 rows x 4 tokens) */
enum { P_Q8 = 0, P_Q4 = 1, P_Q4K = 2, P_Q5K = 3, P_Q6K = 4, P_Q3K = 5, P_Q2K = 6, P_Q8R = 7, P_Q4R = 8 };
/* P_Q8R: the Q8_0 tile straight on a Q8_0_R8 group (pan: the group of rows 8h..8h+7, h passed as
 * 0): its vectors are already 8 rows x 4 signed codes (no pack, no flip), the scales the
 * block's 8 f16 (one convert).  P_Q4R: the Q4_0 tile straight on Q4_0_R8 groups (pan: the first,
 * the second gs bytes on, h passed as 0): group g < 4 of a block is the low nibbles of its
 * vector g, group g + 4 the high ones (a mask, or a shift and a mask, per use). */

/* Rows 8h..8h+8HH-1 of the panel (HH halves: 1, or 2 with h = 0) x tokens m0..m0+NT-1
 * (HH x NT <= 8 accumulators; past 4 only Q4_0 / Q5_K, whose f32 sums then live in memory),
 * y[t * ldy + r] for r < nr (rows present from 8h). */
INLINE void tile(const char *pan, size_t gs, const fl_act_q8 *a, int64_t m0, const int NT, const int HH, const int kind, int h,
                 float *y, int64_t ldy, int nr, const char *pf, const char *pf_end, int pf_per_block) {
    const int64_t nb = a->nb, K = a->K;
    const int8_t *xq0 = a->qs + m0 * K;
    const int32_t *o40 = a->o4 + m0 * nb, *o60 = a->o6 + m0 * nb * 2;
    const float *d0 = a->d + m0 * nb, *ms0 = a->ms + m0 * nb;
    const bool has_mins = kind == P_Q4K || kind == P_Q5K;
    const float *mins = has_mins ? (const float *)(pan + nb * PANEL_BLOCK) + 8 * h : NULL;
    const bool halves = kind == P_Q6K || kind == P_Q3K || kind == P_Q2K; /* a scale per 16 codes */
    const int nw = kind == P_Q2K ? 4 : 2; /* words per block: (sc, sc) of each half, Q2_K's (m, m) */
    const __m256i *words = halves ? (const __m256i *)(pan + nb * PANEL_BLOCK) : NULL; /* [b][nw][16 rows] */
    const float *dmin = kind == P_Q2K ? (const float *)(pan + nb * PANEL_BLOCK) + nb * 4 * FL_PANEL_ROWS + 8 * h : NULL;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80), m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[TILE_ACC];
#pragma GCC unroll 8
    for (int u = 0; u < HH * NT; u++) acc[u] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *pb = pan + b * (kind == P_Q8R ? FL_R8_Q8_0_BLOCK : kind == P_Q4R ? FL_R8_Q4_0_BLOCK : PANEL_BLOCK);
        for (int i = 0; i < pf_per_block && pf < pf_end; i++, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
        __m256i s[TILE_ACC];
#pragma GCC unroll 8
        for (int u = 0; u < TILE_ACC; u++) s[u] = _mm256_setzero_si256();
        if (kind == P_Q4 || kind == P_Q4R || kind == P_Q5K) /* the int16 lanes start at -8 x (their codes' sums): fl_act_q8.o4; Q5_K -16 x */
#pragma GCC unroll 8
            for (int u = 0; u < HH * NT; u++) {
                s[u] = _mm256_set1_epi32(o40[(u % NT) * nb + b]);
                if (kind == P_Q5K) s[u] = _mm256_add_epi16(s[u], s[u]);
            }
        if (halves) {
            /* per 16-code half (one scale): int16 lanes from -32 x their codes' sums (fl_act_q8.o6)
             * through 4 groups to sum (q - 32) x (|.| <= 8 x 32 x 127), then x (sc, sc) into int32 */
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) {
                __m256i s16[4] = {s[0], s[1], s[2], s[3]}; /* (all four through the barrier below) */
#pragma GCC unroll 4
                for (int u = 0; u < HH * NT; u++) { /* Q3_K: -4 x (o6 / 8, exact) */
                    s16[u] = kind == P_Q2K ? _mm256_setzero_si256() : _mm256_set1_epi32(o60[((u % NT) * nb + b) * 2 + half]);
                    if (kind == P_Q3K) s16[u] = _mm256_srai_epi16(s16[u], 3);
                }
#pragma GCC unroll 4
                for (int g = 4 * half; g < 4 * half + 4; g++) {
                    __m256i wv[2];
#pragma GCC unroll 2
                    for (int hh = 0; hh < HH; hh++) wv[hh] = _mm256_loadu_si256((const __m256i *)(pb + 64 + 64 * g + 32 * (h + hh)));
#pragma GCC unroll 4
                    for (int t = 0; t < NT; t++) {
                        const __m256i xv = _mm256_set1_epi32(((const int32_t *)(xq0 + t * K + b * 32))[g]);
#pragma GCC unroll 2
                        for (int hh = 0; hh < HH; hh++) s16[hh * NT + t] = _mm256_add_epi16(s16[hh * NT + t], _mm256_maddubs_epi16(wv[hh], xv));
                    }
                    __asm__("" : "+x"(s16[0]), "+x"(s16[1]), "+x"(s16[2]), "+x"(s16[3]));
                }
#pragma GCC unroll 2
                for (int hh = 0; hh < HH; hh++) {
                    const __m256i sc = _mm256_loadu_si256(words + (b * nw + half) * 2 + h + hh);
#pragma GCC unroll 4
                    for (int t = 0; t < NT; t++) {
                        const __m256i p = _mm256_madd_epi16(s16[hh * NT + t], sc);
                        s[hh * NT + t] = half ? _mm256_add_epi32(s[hh * NT + t], p) : p;
                    }
                }
            }
        }
#pragma GCC unroll 8
        for (int g = 0; g < 8 && !halves; g++) {
            __m256i wv[2], ws[2], wa[2];
#pragma GCC unroll 2
            for (int hh = 0; hh < HH; hh++) {
                if (kind == P_Q8R) ws[hh] = _mm256_loadu_si256((const __m256i *)(pb + 16 + 32 * g)), wa[hh] = _mm256_sign_epi8(ws[hh], ws[hh]);
                else if (kind == P_Q4R) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(pb + hh * gs + 16 + 32 * (g % 4)));
                    wv[hh] = _mm256_and_si256(g < 4 ? v : _mm256_srli_epi16(v, 4), m4);
                } else wv[hh] = _mm256_loadu_si256((const __m256i *)(pb + 64 + 64 * g + 32 * (h + hh)));
                if (kind == P_Q8) ws[hh] = _mm256_xor_si256(wv[hh], flip), wa[hh] = _mm256_sign_epi8(ws[hh], ws[hh]);
            }
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const __m256i xv = _mm256_set1_epi32(((const int32_t *)(xq0 + t * K + b * 32))[g]);
#pragma GCC unroll 2
                for (int hh = 0; hh < HH; hh++) {
                    const int u = hh * NT + t;
                    if (kind == P_Q8 || kind == P_Q8R)
                        s[u] = _mm256_add_epi32(s[u], _mm256_madd_epi16(_mm256_maddubs_epi16(wa[hh], _mm256_sign_epi8(xv, ws[hh])), ones));
                    else s[u] = _mm256_add_epi16(s[u], _mm256_maddubs_epi16(wv[hh], xv));
                }
            }
            /* one group at a time: without this GCC reassociated the adds of all 8 groups,
             * computed every product first and spilled them (in-cache Q4_0 tile
             * 1.2x slower, Q8_0 1.05x) */
            if (HH * NT > 4) __asm__("" : "+x"(s[0]), "+x"(s[1]), "+x"(s[2]), "+x"(s[3]), "+x"(s[4]), "+x"(s[5]), "+x"(s[6]), "+x"(s[7]));
            else __asm__("" : "+x"(s[0]), "+x"(s[1]), "+x"(s[2]), "+x"(s[3]));
        }
#pragma GCC unroll 2
        for (int hh = 0; hh < HH; hh++) {
            const __m256 dw = kind == P_Q8R || kind == P_Q4R ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + hh * gs)))
                                                             : _mm256_loadu_ps((const float *)pb + 8 * (h + hh));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const int u = hh * NT + t;
                __m256i is = s[u];
                if (kind != P_Q8 && kind != P_Q8R && !halves) is = _mm256_madd_epi16(is, ones);
                acc[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, _mm256_set1_ps(d0[t * nb + b])), acc[u]);
            }
            if (kind == P_Q2K) { /* less dmin x (m, m) . (the halves' sums, -32 x in o6: so d_x / 32) */
                const __m256 dm = _mm256_loadu_ps(dmin + b * FL_PANEL_ROWS + 8 * hh);
                const __m256i mw0 = _mm256_loadu_si256(words + (b * 4 + 2) * 2 + h + hh), mw1 = _mm256_loadu_si256(words + (b * 4 + 3) * 2 + h + hh);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    const int32_t *o6 = o60 + (t * nb + b) * 2;
                    const __m256i im = _mm256_add_epi32(_mm256_madd_epi16(_mm256_set1_epi32(o6[0]), mw0), _mm256_madd_epi16(_mm256_set1_epi32(o6[1]), mw1));
                    acc[hh * NT + t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(dm, _mm256_set1_ps(d0[t * nb + b] * (1.0f / 32))), acc[hh * NT + t]);
                }
            }
            if (has_mins) {
                const __m256 mv = _mm256_loadu_ps(mins + b * FL_PANEL_ROWS + 8 * hh);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) acc[hh * NT + t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(ms0[t * nb + b]), acc[hh * NT + t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int hh = 0; hh < HH; hh++) {
        const int nr8 = nr - 8 * hh;
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            float *yt = y + t * ldy + 8 * hh;
            if (nr8 >= 8) _mm256_storeu_ps(yt, acc[hh * NT + t]);
            else if (nr8 > 0) {
                float tmp[8];
                _mm256_storeu_ps(tmp, acc[hh * NT + t]);
                memcpy(yt, tmp, (size_t)nr8 * sizeof(float));
            }
        }
    }
}

typedef void (*tile_fn)(const char *, size_t, const fl_act_q8 *, int64_t, int, float *, int64_t, int, const char *,
                        const char *, int);
#define DEFINE_TILE(hh, n, k)                                                                                          \
    static void tile_##hh##_##n##_##k(const char *pan, size_t gs, const fl_act_q8 *a, int64_t m0, int h, float *y,     \
                                      int64_t ldy, int nr, const char *pf, const char *pf_end, int pf_per_block) {    \
        tile(pan, gs, a, m0, n, hh, k, h, y, ldy, nr, pf, pf_end, pf_per_block);                                       \
    }
#define DEFINE_TILES(k) \
    DEFINE_TILE(1, 1, k) DEFINE_TILE(1, 2, k) DEFINE_TILE(1, 3, k) DEFINE_TILE(1, 4, k) DEFINE_TILE(2, 1, k) DEFINE_TILE(2, 2, k)
#define DEFINE_TILES16(k) DEFINE_TILE(2, 1, k) DEFINE_TILE(2, 2, k)
DEFINE_TILES(P_Q8)
DEFINE_TILE(1, 1, P_Q8R) DEFINE_TILE(1, 2, P_Q8R) DEFINE_TILE(1, 3, P_Q8R) DEFINE_TILE(1, 4, P_Q8R)
DEFINE_TILE(2, 1, P_Q4R) DEFINE_TILE(2, 2, P_Q4R) DEFINE_TILE(2, 3, P_Q4R) DEFINE_TILE(2, 4, P_Q4R)
DEFINE_TILES(P_Q4) DEFINE_TILE(2, 3, P_Q4) DEFINE_TILE(2, 4, P_Q4)
DEFINE_TILES(P_Q4K)
/* the other kinds take the 16-row tiles for a partial panel of <= 8 rows too (its zero rows
 * past nr cost one half's work; 18 fewer instances keep the file's compile time down: the
 * sanitized fuzz build of tests/cli_fuzz.sh compiles it) */
DEFINE_TILES16(P_Q5K) DEFINE_TILE(2, 3, P_Q5K) DEFINE_TILE(2, 4, P_Q5K)
DEFINE_TILES16(P_Q6K)
DEFINE_TILES16(P_Q3K)
DEFINE_TILES16(P_Q2K)

void fl_panel_gemm_avx2_pf(int32_t wtype, const void *panel, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                           int64_t ldy, const void *pf, size_t pf_bytes) {
#define ROW(k) {{NULL, tile_1_1_##k, tile_1_2_##k, tile_1_3_##k, tile_1_4_##k}, {NULL, tile_2_1_##k, tile_2_2_##k, NULL, NULL}}
#define ROW16(k) {{NULL, NULL, NULL, NULL, NULL}, {NULL, tile_2_1_##k, tile_2_2_##k, NULL, NULL}}
#define ROW16W(k) {{NULL, NULL, NULL, NULL, NULL}, {NULL, tile_2_1_##k, tile_2_2_##k, tile_2_3_##k, tile_2_4_##k}}
    static const tile_fn tiles[7][2][5] = {ROW(P_Q8),
                                           {{NULL, tile_1_1_P_Q4, tile_1_2_P_Q4, tile_1_3_P_Q4, tile_1_4_P_Q4},
                                            {NULL, tile_2_1_P_Q4, tile_2_2_P_Q4, tile_2_3_P_Q4, tile_2_4_P_Q4}},
                                           ROW(P_Q4K), ROW16W(P_Q5K), ROW16(P_Q6K), ROW16(P_Q3K), ROW16(P_Q2K)};
#undef ROW
#undef ROW16
#undef ROW16W
    /* Q4_1 has Q4_K's sums (codes 0..15 and mins words), Q5_0 / Q5_1 Q5_K's, IQ4_NL Q8_0's */
    const int k = wtype == FL_TYPE_Q8_0 || wtype == FL_TYPE_IQ4_NL || wtype == FL_TYPE_Q8_0_R8  ? P_Q8
                  : wtype == FL_TYPE_Q4_K || wtype == FL_TYPE_Q4_1                               ? P_Q4K
                  : wtype == FL_TYPE_Q5_K || wtype == FL_TYPE_Q5_0 || wtype == FL_TYPE_Q5_1      ? P_Q5K
                  : wtype == FL_TYPE_Q6_K                                                        ? P_Q6K
                  : wtype == FL_TYPE_Q3_K                                                        ? P_Q3K
                  : wtype == FL_TYPE_Q2_K                                                        ? P_Q2K
                                                                                                 : P_Q4; /* Q4_0, Q4_0_R8 */
    /* All but Q8_0 run both halves per call, so each broadcast activation group serves 16 rows
     * (against 8 rows x 2 tokens, best of 5, one core, in-cache 16 x 2048 panel: Q4_0 186 -> 206
     * GOP/s at 16 tokens, 179 -> 198 at 512; `bench matmul -p 64 --types Q4_K --stream-mib 1`
     * 251 -> 269).  Q4_0 and Q5_K (Q5_0, Q5_1) take 4 tokens per call: 8 int16 accumulators in
     * registers, the f32 sums on the stack (touched once per block), each panel load serving 4
     * tokens (against 2, one core, in-cache 16 x 2048 panel, alternated in one process, the
     * same bits: Q4_0 at 16 tokens 199 -> 232 GOP/s, at 512 150 -> 178; Q5_K 124 -> 146, 99 ->
     * 139; Q5_0 122 -> 145).  Q4_K / Q4_1 lost half their speed that way (their mins term), so
     * they keep 2; 6 tokens spilled the int16 sums.  Q8_0 keeps 8 rows x 4 tokens: with its
     * signed copies of both halves live it lost (x 2 tokens 120 -> 116, x 4 a quarter). */
    const bool both = (nr > 8 && k != P_Q8) || k >= P_Q5K, wide = both && (k == P_Q4 || k == P_Q5K);
    const int halves = nr > 8 && !both ? 2 : 1, step = wide ? 4 : both ? 2 : 4;
    const int64_t calls = (int64_t)((nt + step - 1) / step) * halves, nb = a->nb;
    /* the prefetch spread over every block step of every call: each call its share, a few lines
     * per block */
    const size_t lines = (pf_bytes + 63) / 64, share = pf ? (lines + (size_t)calls - 1) / (size_t)calls : 0;
    const int per_block = (int)((share + (size_t)nb - 1) / (size_t)nb);
    const char *p = pf, *end = pf ? (const char *)pf + pf_bytes : NULL;
    for (int t = 0; t < nt; t += step) {
        const int n = nt - t < step ? nt - t : step;
        for (int h = 0; h < halves; h++) {
            const char *e = p && p + share * 64 < end ? p + share * 64 : end;
            tiles[k][both][n]((const char *)panel, 0, a, m0 + t, h, y + t * ldy + 8 * h, ldy, nr - 8 * h, p, e, per_block);
            p = e;
        }
    }
}

void fl_r8_gemm_avx2_pf(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                        int64_t ldy, const void *pf, size_t pf_bytes) {
    static const tile_fn q8[5] = {NULL, tile_1_1_P_Q8R, tile_1_2_P_Q8R, tile_1_3_P_Q8R, tile_1_4_P_Q8R};
    static const tile_fn q4[5] = {NULL, tile_2_1_P_Q4R, tile_2_2_P_Q4R, tile_2_3_P_Q4R, tile_2_4_P_Q4R};
    const size_t gs = (size_t)FL_R8_ROWS * ldw;
    /* Q8_0: one group x 4 tokens per call; Q4_0: both groups of 16 rows (nr 16) x 4 */
    const bool q4_0 = wtype == FL_TYPE_Q4_0_R8;
    const int groups = q4_0 ? 1 : (nr + FL_R8_ROWS - 1) / FL_R8_ROWS;
    const int64_t calls = (int64_t)((nt + 3) / 4) * groups, nb = a->nb;
    const size_t lines = (pf_bytes + 63) / 64, share = pf ? (lines + (size_t)calls - 1) / (size_t)calls : 0;
    const int per_block = (int)((share + (size_t)nb - 1) / (size_t)nb);
    const char *p = pf, *end = pf ? (const char *)pf + pf_bytes : NULL;
    for (int t = 0; t < nt; t += 4) {
        const int n = nt - t < 4 ? nt - t : 4;
        for (int h = 0; h < groups; h++) {
            const char *e = p && p + share * 64 < end ? p + share * 64 : end;
            (q4_0 ? q4 : q8)[n]((const char *)w + (size_t)h * gs, gs, a, m0 + t, 0, y + t * ldy + 8 * h, ldy, nr - 8 * h, p, e, per_block);
            p = e;
        }
    }
}

void fl_panel_gemm_avx2(int32_t wtype, const void *panel, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                        int64_t ldy) {
    fl_panel_gemm_avx2_pf(wtype, panel, nr, a, m0, nt, y, ldy, NULL, 0);
}
