/* AMX-INT8 on the R8 groups (Q4_0_R8 / Q8_0_R8, layout in kernels/matmul.h) for passes of 11-16
 * tokens, the activations in their 16-token records (fl_act16): the batched decode of 11-16
 * sequences, and prefill where AMX-BF16 is off.  Per block of 32 codes and pair of groups (16 rows):
 *  - tile A: the 16 tokens' 32 codes, straight from the record (16 rows x 32 bytes);
 *  - tile B: the two groups' codes as 8 rows of [group a's unit v | group b's unit v] (16 weight
 *    rows x 4 codes each: the VNNI layout the groups already have, per group), as signed codes
 *    (Q4_0 nibble - 8, Q8_0 as stored), written into an L1 buffer one block ahead (a tile load
 *    does not read the store buffer);
 *  - TDPBSSD into a zeroed C, stored one block later and folded two blocks later as the VNNI tile
 *    folds its sums: acc_t += float(C_t) * (d_w * d_x,t).
 * C_t is the VNNI tile's int32 sum (there: -off * (code sum) + the unsigned codes' products; here
 * the signed codes' products; both exact), so the outputs are the bits of fl_r8_gemm16_avx512 and
 * of the 1-8 token tiles, which test_matmul checks.  The tile always multiplies 16 tokens; what it
 * saves is the 128 vpdpbusd per block that the VNNI tile spends beside the same fold. */
#include "kernels/amx/amx.h"
#include "kernels/avx512/r8_pairs.h"
#include "kernels/matmul.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define INLINE static inline __attribute__((always_inline))

/* Tiles: A = 0 (16 tokens x 32 codes), B = 1, 2 (8 x 64 bytes, double-buffered), C = 3, 4
 * (16 tokens x 16 rows of int32).  A static object: GCC 12 drops stores to a local config before
 * _tile_loadconfig. */
static const tile_config g_cfg_r8 __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {32, 64, 64, 64, 64},
    .rows = {16, 8, 8, 16, 16},
};

void fl_amx_r8_begin(void) { _tile_loadconfig(&g_cfg_r8); }

/* Block b of the pair (pa, pb: its blocks in groups a and b) into the B layout at dst (8 rows of
 * 64 bytes): row v = [a's unit v | b's unit v]; Q4_0 rows 0-3 the low nibbles of units 0-3 and
 * rows 4-7 their high nibbles, each - 8. */
INLINE void b_tile(const bool q8, const char *pa, const char *pb, int8_t *dst) {
    if (q8) {
#pragma GCC unroll 4
        for (int v = 0; v < 8; v += 2) {
            const __m512i za = _mm512_loadu_si512((const void *)(pa + 16 + 32 * v));
            const __m512i zb = _mm512_loadu_si512((const void *)(pb + 16 + 32 * v));
            _mm512_store_si512((void *)(dst + 64 * v), _mm512_shuffle_i64x2(za, zb, 0x44));
            _mm512_store_si512((void *)(dst + 64 * (v + 1)), _mm512_shuffle_i64x2(za, zb, 0xEE));
        }
    } else {
        /* nibble - 8 by a 64-entry byte permute: index bits 0-3 the nibble, bits 4-5 whatever
         * the neighbouring nibble or byte put there (the table repeats every 16) */
        const __m512i tab = _mm512_set_epi8(7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4,
                                            -5, -6, -7, -8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8, 7, 6, 5, 4, 3, 2, 1, 0,
                                            -1, -2, -3, -4, -5, -6, -7, -8);
#pragma GCC unroll 2
        for (int v = 0; v < 4; v += 2) {
            const __m512i za = _mm512_loadu_si512((const void *)(pa + 16 + 32 * v));
            const __m512i zb = _mm512_loadu_si512((const void *)(pb + 16 + 32 * v));
            const __m512i r0 = _mm512_shuffle_i64x2(za, zb, 0x44), r1 = _mm512_shuffle_i64x2(za, zb, 0xEE);
            _mm512_store_si512((void *)(dst + 64 * v), _mm512_permutexvar_epi8(r0, tab));
            _mm512_store_si512((void *)(dst + 64 * (v + 1)), _mm512_permutexvar_epi8(r1, tab));
            _mm512_store_si512((void *)(dst + 64 * (v + 4)), _mm512_permutexvar_epi8(_mm512_srli_epi16(r0, 4), tab));
            _mm512_store_si512((void *)(dst + 64 * (v + 5)), _mm512_permutexvar_epi8(_mm512_srli_epi16(r1, 4), tab));
        }
    }
}

/* acc_t += float(c_t) * (d_w * d_x,t) for the NT tokens of block (pa, pb), record r */
INLINE void fold(__m512 acc[16], const int32_t *c, const char *pa, const char *pb, const char *r, const int NT) {
    const float *dx = (const float *)(r + FL_ACT16_CODES) + 2 * FL_ACT16_TOKENS;
    const __m512 dw = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa)),
                                                              _mm_loadu_si128((const __m128i *)pb), 1));
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++) {
        const __m512i ct = _mm512_load_si512((const void *)(c + 16 * t));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ct), _mm512_mul_ps(dw, _mm512_set1_ps(dx[t])), acc[t]);
    }
}

/* 16 rows (groups ga, gb; gb == ga computes rows 0-7 twice, the caller stores 8) x NT tokens.
 * Step b: the product of block b (B prepared at step b - 1), B of block b + 1, the store of
 * block b - 1's C, the fold of block b - 2. */
INLINE void pair(const bool q8, const char *ga, const char *gb, const char *act, int64_t nb, const int NT, float *y,
                 int64_t ldy, __mmask16 rm) {
    const size_t bb = q8 ? FL_R8_Q8_0_BLOCK : FL_R8_Q4_0_BLOCK;
    const size_t gbytes = (size_t)nb * bb;
    int8_t bbuf[2][512] __attribute__((aligned(64)));
    int32_t cbuf[2][256] __attribute__((aligned(64)));
    __m512 acc[16];
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    b_tile(q8, ga, gb, bbuf[0]);
#define PROD(b, TB, TC)                                                                                          \
    do {                                                                                                         \
        if ((b) < nb) {                                                                                          \
            fl_r8_prefetch(ga, gb, (b), bb, gbytes);                                                                 \
            _tile_loadd(0, act + (size_t)(b) * FL_ACT16_REC, 32);                                                \
            _tile_loadd(TB, bbuf[(b) & 1], 64);                                                                  \
            _tile_zero(TC);                                                                                      \
            _tile_dpbssd(TC, 0, TB);                                                                             \
            if ((b) + 1 < nb) b_tile(q8, ga + (size_t)((b) + 1) * bb, gb + (size_t)((b) + 1) * bb, bbuf[((b) + 1) & 1]); \
        }                                                                                                        \
    } while (0)
#define STORE(b, TCP) do { if ((b) >= 1 && (b) - 1 < nb) _tile_stored(TCP, cbuf[((b) - 1) & 1], 64); } while (0)
#define FOLD(b)                                                                                                  \
    do {                                                                                                         \
        if ((b) >= 2) {                                                                                          \
            const int64_t f_ = (b) - 2;                                                                          \
            fold(acc, cbuf[f_ & 1], ga + (size_t)f_ * bb, gb + (size_t)f_ * bb, act + (size_t)f_ * FL_ACT16_REC, NT);     \
        }                                                                                                        \
    } while (0)
#define STEP(b, TB, TC, TCP)                                                                                     \
    do {                                                                                                         \
        PROD(b, TB, TC);                                                                                         \
        STORE(b, TCP);                                                                                           \
        FOLD(b);                                                                                                 \
    } while (0)
    for (int64_t b = 0; b <= nb + 1; b += 2) {
        STEP(b, 1, 3, 4);
        if (b + 1 <= nb + 1) STEP(b + 1, 2, 4, 3);
    }
#undef STEP
#undef FOLD
#undef STORE
#undef PROD
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, rm, acc[t]);
}

FL_R8_PAIR_FNS(pair_q4_, pair, false)
FL_R8_PAIR_FNS(pair_q8_, pair, true)

void fl_amx_r8_gemm16(int32_t wtype, const void *w, size_t ldw, int nr, const void *act, int64_t nb, int nt, float *y,
                      int64_t ldy) {
    static const fl_r8_pair_fn pairs[2][8] = {FL_R8_PAIR_ROW(pair_q4_), FL_R8_PAIR_ROW(pair_q8_)};
    fl_r8_pairs(pairs[wtype == FL_TYPE_Q8_0_R8][nt - 9], w, ldw, nr, act, nb, y, ldy);
}
