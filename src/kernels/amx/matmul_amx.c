/* AMX-INT8 GEMM (see matmul.h, "AMX-INT8 GEMM"): up to 2 weight panels (16 rows each) x 2 tiles
 * of 16 tokens per call.  Per block of 32: load each panel's 16 x 32 codes (tiles A) and each
 * token tile's codes (tiles B, 8 rows of 16 tokens x 4 codes), TDPBSSD into zeroed int32 tiles C,
 * store them, and fold each into 16 f32 accumulators (row r, lane t): acc_r += float(C_r) *
 * (d_w[r] * d_x) [+ dmin m_j[r] * ms for Q4_K].
 * What it costs (one thread, weights and activations in L2, 16 x 16 x 32 products): a TDPBSSD
 * ~6 ns, a tile store about as long and not overlapped with the products; the tiles alone ~20 ns
 * per product with their loads, the fold alone ~12 ns, and the two do not overlap either (the
 * kernel runs ~28-31 ns): per block the fold's 16 x (convert, multiply, fma) is as dear as the
 * tile work.  Reordering the stores and folds, or prefetching the tiles' data into L1, measured
 * no faster.  Also the AVX-512 panel and activation-tile packers, and at the end the AMX-BF16
 * GEMM for prefill steps of 64 tokens or more (no fold: the scales are in the bf16 weights). */
#include "kernels/amx/amx.h"
#include "kernels/avx512/dequant_block.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))


/* Tiles: A0, A1 = 0, 1 (16 weight rows x one block of codes, from panels 0 and 1); B0, B1 = 2, 3
 * (8 groups of 4 codes x 16 tokens, token tiles 0 and 1); C[p][t] = 4 + 2p + t (16 rows x 16
 * tokens of int32).  Q6_K and Q3_K work in half blocks (their scales cover 16 codes): A is 16 rows x 16
 * codes, B 4 groups of 4.  Static objects: GCC 12 drops stores to a local config before
 * _tile_loadconfig. */
static const tile_config g_cfg __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {32, 32, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 8, 8, 16, 16, 16, 16},
};
static const tile_config g_cfg_half __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {16, 16, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 4, 4, 16, 16, 16, 16},
};

void fl_amx_begin(int32_t wtype) { _tile_loadconfig(fl_amx_half(wtype) ? &g_cfg_half : &g_cfg); }

void fl_amx_end(void) { _tile_release(); }

/* Byte offsets of 16 rows ldw apart, for the gathers that take one value per row (int32: the
 * callers keep 16 * ldw below 2^31). */
INLINE __m512i row_offsets(size_t ldw) {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32((int)ldw));
}

/* Work unit u: a block of 32 codes, or with HALF (Q6_K, Q3_K) half h = u % 2 of block u / 2. */
INLINE const int8_t *unit_codes(const int8_t *c, int64_t u, const bool HALF) {
    return HALF ? c + (u >> 1) * 512 + (u & 1) * 16 : c + u * 512;
}
INLINE const char *unit_act(const char *a, int64_t u, const bool HALF) {
    return HALF ? a + (u >> 1) * FL_AMX_ACT_BLOCK + (u & 1) * 256 : a + u * FL_AMX_ACT_BLOCK;
}
INLINE const char *unit_block(const char *a, int64_t u, const bool HALF) { /* its block's d_x, ms */
    return a + (HALF ? u >> 1 : u) * FL_AMX_ACT_BLOCK;
}
INLINE const float *unit_scales(const float *sc, int64_t nb, int64_t u, const bool HALF) {
    return HALF ? sc + (u & 1) * nb * 16 + (u >> 1) * 16 : sc + u * 16;
}

/* Unit u's products for NP panels x NT token tiles into the C tiles (4 + 2p + t). */
INLINE void tile_dp(const int8_t *c0, const int8_t *c1, const char *a0, const char *a1, int64_t u, const int NP,
                    const int NT, const bool HALF) {
    _tile_loadd(0, unit_codes(c0, u, HALF), 32); /* rows: a panel row's 32-code blocks */
    if (NP == 2) _tile_loadd(1, unit_codes(c1, u, HALF), 32);
    _tile_loadd(2, unit_act(a0, u, HALF), 64);
    if (NT == 2) _tile_loadd(3, unit_act(a1, u, HALF), 64);
    _tile_zero(4);
    if (NT == 2) _tile_zero(5);
    if (NP == 2) _tile_zero(6);
    if (NP == 2 && NT == 2) _tile_zero(7);
    _tile_dpbssd(4, 0, 2);
    if (NT == 2) _tile_dpbssd(5, 0, 3);
    if (NP == 2) _tile_dpbssd(6, 1, 2);
    if (NP == 2 && NT == 2) _tile_dpbssd(7, 1, 3);
}

/* The C tiles into cb[2p + t]. */
INLINE void tile_st(int32_t (*cb)[256], const int NP, const int NT) {
    _tile_stored(4, cb[0], 64);
    if (NT == 2) _tile_stored(5, cb[1], 64);
    if (NP == 2) _tile_stored(6, cb[2], 64);
    if (NP == 2 && NT == 2) _tile_stored(7, cb[3], 64);
}

/* acc[r] (lanes = tokens) += float(C_r) * (d_w[r] d_x) [+ dmin m_j[r] * ms] for unit u (C = its tile). */
INLINE void fold_regs(__m512 acc[16], const int32_t *c, const float *sc, const float *mn, int64_t nb, const char *ab,
                      int64_t u, const bool mins, const bool HALF) {
    const float *s = unit_scales(sc, nb, u, HALF);
    const char *blk = unit_block(ab, u, HALF);
    const __m512 dx = _mm512_load_ps((const float *)(blk + 512));
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++)
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * r)), _mm512_mul_ps(dx, _mm512_set1_ps(s[r])), acc[r]);
    if (mins) {
        /* whole blocks: the block's ms; half blocks (Q2_K): the half's (its 16 codes' sum) */
        const __m512 ms = _mm512_load_ps((const float *)(blk + (HALF ? 640 + (u & 1) * 64 : 576)));
        const float *m = unit_scales(mn, nb, u, HALF);
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(m[r]), ms, acc[r]);
    }
}

/* The same with the accumulators in memory (four C tiles' worth do not fit the registers). */
INLINE void fold(float *accm, const int32_t *c, const float *sc, const float *mn, int64_t nb, const char *ab, int64_t u,
                 const bool mins, const bool HALF) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[r] = _mm512_load_ps(accm + 16 * r);
    fold_regs(acc, c, sc, mn, nb, ab, u, mins, HALF);
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) _mm512_store_ps(accm + 16 * r, acc[r]);
}

/* r[i] lane j -> r[j] lane i (16 x 16 f32): unpack pairs of rows, then 4-row groups, then the
 * 128-bit lanes in two steps. */
INLINE void transpose16(__m512 r[16]) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* r[4i + j], 128-bit lane k: rows 4i .. 4i + 3 of column 4k + j */
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m512 a = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88), b = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
        const __m512 c = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88), d = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
        t[j] = _mm512_shuffle_f32x4(a, c, 0x88);      /* column j */
        t[8 + j] = _mm512_shuffle_f32x4(a, c, 0xDD);  /* column 8 + j */
        t[4 + j] = _mm512_shuffle_f32x4(b, d, 0x88);  /* column 4 + j */
        t[12 + j] = _mm512_shuffle_f32x4(b, d, 0xDD); /* column 12 + j */
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Write one C tile's f32 results: acc[r] lane t = row r, token t; rows [0, nr) of tokens
 * [0, ntok) go to y (token t at y + t ldy), added to what y holds if add. */
INLINE void store_tile(__m512 acc[16], int nr, int ntok, float *y, int64_t ldy, bool add) {
    transpose16(acc); /* acc[token] lanes = rows */
    const __mmask16 rm = (__mmask16)((1u << nr) - 1);
    for (int t = 0; t < ntok; t++)
        _mm512_mask_storeu_ps(y + t * ldy, rm, add ? _mm512_add_ps(acc[t], _mm512_maskz_loadu_ps(rm, y + t * ldy)) : acc[t]);
}

INLINE void gemm_tiles(const void *panel, size_t pstride, int64_t K, const void *act, int64_t mt, int ntok,
                       float *y, int64_t ldy, int nr, const char *pf, size_t pf_bytes, const int NP, const int NT,
                       const bool mins, const bool HALF) {
    const int64_t nb = K / 32, nu = HALF ? 2 * nb : nb;
    const size_t tile_bytes = (size_t)nb * FL_AMX_ACT_BLOCK;
    const int8_t *c0 = panel, *c1 = (const int8_t *)panel + pstride;
    const char *a0 = (const char *)act + (size_t)mt * tile_bytes, *a1 = a0 + tile_bytes;
    int32_t cb[2][4][256] __attribute__((aligned(64)));
    float accm[4][256] __attribute__((aligned(64)));
    const bool regs = NP == 1 && NT == 1; /* one C tile: its accumulators stay in registers */
    __m512 acc[16];
    if (regs) {
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    } else
        memset(accm, 0, sizeof accm);
    /* the caller's next weights, spread over the units: while the tiles run, memory fills L2 */
    const size_t pf_step = ((pf_bytes + (size_t)nu - 1) / (size_t)nu + 63) & ~(size_t)63;
    tile_dp(c0, c1, a0, a1, 0, NP, NT, HALF);
    tile_st(cb[0], NP, NT);
    for (int64_t u = 0; u < nu; u++) {
        if (pf)
            for (size_t o = (size_t)u * pf_step; o < (size_t)(u + 1) * pf_step && o < pf_bytes; o += 64)
                _mm_prefetch(pf + o, _MM_HINT_T1);
        /* unit u + 1's products are queued before unit u's fold and stored after it, so the
         * fold's loads never sit behind a store of the tile unit's that is still waiting */
        if (u + 1 < nu) tile_dp(c0, c1, a0, a1, u + 1, NP, NT, HALF);
        for (int p = 0; p < NP; p++) {
            const int8_t *cp = p ? c1 : c0;
            const float *sc = (const float *)(cp + FL_AMX_ROWS * K), *mn = sc + (HALF ? 2 : 1) * nb * FL_AMX_ROWS;
            for (int t = 0; t < NT; t++) {
                if (regs) fold_regs(acc, cb[u & 1][0], sc, mn, nb, a0, u, mins, HALF);
                else fold(accm[2 * p + t], cb[u & 1][2 * p + t], sc, mn, nb, t ? a1 : a0, u, mins, HALF);
            }
        }
        if (u + 1 < nu) tile_st(cb[(u + 1) & 1], NP, NT);
    }
    for (int p = 0; p < NP; p++)
        for (int t = 0; t < NT; t++) {
            __m512 o[16];
            if (regs) {
#pragma GCC unroll 16
                for (int r = 0; r < 16; r++) o[r] = acc[r];
            } else {
#pragma GCC unroll 16
                for (int r = 0; r < 16; r++) o[r] = _mm512_load_ps(accm[2 * p + t] + 16 * r);
            }
            store_tile(o, p == NP - 1 ? nr : FL_AMX_ROWS, ntok - 16 * t < 16 ? ntok - 16 * t : 16,
                       y + (int64_t)(16 * t) * ldy + 16 * p, ldy, false);
        }
}

#define VARIANTS(NP, NT)                                                                                            \
    if (wtype == FL_TYPE_Q2_K) gemm_tiles(panel, pstride, K, act, mt, ntok, y, ldy, nr, pf, pf_bytes, NP, NT, true, true); \
    else if (fl_amx_has_mins(wtype)) gemm_tiles(panel, pstride, K, act, mt, ntok, y, ldy, nr, pf, pf_bytes, NP, NT, true, false); \
    else if (fl_amx_half(wtype)) gemm_tiles(panel, pstride, K, act, mt, ntok, y, ldy, nr, pf, pf_bytes, NP, NT, false, true); \
    else gemm_tiles(panel, pstride, K, act, mt, ntok, y, ldy, nr, pf, pf_bytes, NP, NT, false, false);

void fl_amx_gemm(int32_t wtype, const void *panel, size_t pstride, int np, int64_t K, const void *act, int64_t mt,
                 int ntok, float *y, int64_t ldy, int nr, const void *pf, size_t pf_bytes) {
    if (np == 2 && ntok > 16) { VARIANTS(2, 2) }
    else if (np == 2) { VARIANTS(2, 1) }
    else if (ntok > 16) { VARIANTS(1, 2) }
    else { VARIANTS(1, 1) }
}

/* ---- steps of up to 16 tokens: the weight rows straight into the tiles ---- */

/* Block b of the 16 rows at w (rows >= nr zero) as a tile A, 16 x 32 signed codes (Q4_0 nibble
 * - 8, Q8_0 the code) at a, and their scales at sc: what fl_amx_pack_row puts in a panel. */
INLINE void rows_block(int32_t wtype, const char *w, size_t ldw, int nr, int64_t b, int8_t *a, float *sc) {
    const bool q8 = wtype == FL_TYPE_Q8_0;
    const int bsz = q8 ? 34 : 18;
    const __m512i vrow = row_offsets(ldw);
    const __mmask16 rm = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1);
    const char *wb = w + b * bsz;
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rm, vrow, (const void *)wb, 1);
    _mm512_store_ps(sc, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
    if (q8) {
        for (int r = 0; r < 16; r++)
            _mm256_store_si256((__m256i *)(a + 32 * r), r < nr ? _mm256_loadu_si256((const __m256i *)(wb + r * ldw + 2))
                                                              : _mm256_setzero_si256());
        return;
    }
    /* per row: its 16 bytes in both halves of a ymm, the upper half shifted down a nibble (one
     * variable shift: 256-bit ops spread over three ports, the 512-bit packing of two rows
     * needed three shuffles on one) */
    const __m256i m4 = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8), sh = _mm256_setr_epi64x(0, 0, 4, 4);
    for (int r = 0; r < 16; r++) {
        const __m256i v = r < nr ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(wb + r * ldw + 2)))
                                 : _mm256_set1_epi8((char)0x88);
        _mm256_store_si256((__m256i *)(a + 32 * r), _mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi64(v, sh), m4), eight));
    }
}

/* Block b of the 16 Q4_K (Q5: Q5_K) rows at w (rows >= nr zero): codes (the nibbles 0..15, Q5_K + 16 x its fifth bit), d sc_j into sc
 * and dmin m_j into mn.  Once per super-block (b % 8 == 0) the 16 rows' d, dmin and 12 scale
 * bytes come in by four gathers and their 8 scales and mins are unpacked with the rows in the
 * lanes, ks[j] / km[j] (the same products as fl_k4_scales_mins). */
INLINE void rows_block_k4(const char *w, size_t ldw, int nr, int64_t b, int8_t *a, float *sc, float *mn, float ks[8][16],
                          float km[8][16], const bool Q5) {
    /* Q5_K: the same d, dmin and scales first, qh[32] before qs, and the fifth bit of code l of
     * sub-block j at bit j of qh[l] (+ 16) */
    const size_t bsz = Q5 ? sizeof(fl_block_q5_K) : sizeof(fl_block_q4_K);
    const size_t qs_off = Q5 ? offsetof(fl_block_q5_K, qs) : offsetof(fl_block_q4_K, qs);
    const int64_t i = b / 8;
    const int j = (int)(b % 8);
    if (j == 0) {
        const __m512i vrow = row_offsets(ldw);
        const __mmask16 rm = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1);
        const char *base = w + i * (int64_t)bsz;
        const __m512i z = _mm512_setzero_si512();
        const __m512i dd = _mm512_mask_i32gather_epi32(z, rm, vrow, (const void *)base, 1); /* d | dmin << 16 */
        const __m512i q0 = _mm512_mask_i32gather_epi32(z, rm, vrow, (const void *)(base + 4), 1);
        const __m512i q1 = _mm512_mask_i32gather_epi32(z, rm, vrow, (const void *)(base + 8), 1);
        const __m512i q2 = _mm512_mask_i32gather_epi32(z, rm, vrow, (const void *)(base + 12), 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)), dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
        const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
        for (int k = 0; k < 4; k++) { /* j = k: the low 6 bits of bytes k, 4 + k; j = 4 + k: nibbles of byte 8 + k, top bits of k, 4 + k */
            const __m512i b0 = _mm512_srli_epi32(q0, 8 * k), b1 = _mm512_srli_epi32(q1, 8 * k), b2 = _mm512_srli_epi32(q2, 8 * k);
            _mm512_store_ps(ks[k], _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(b0, m6))));
            _mm512_store_ps(km[k], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_and_si512(b1, m6))));
            const __m512i s4 = _mm512_or_si512(_mm512_and_si512(b2, m4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b0, 6), m2), 4));
            const __m512i n4 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b2, 4), m4),
                                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b1, 6), m2), 4));
            _mm512_store_ps(ks[4 + k], _mm512_mul_ps(d, _mm512_cvtepi32_ps(s4)));
            _mm512_store_ps(km[4 + k], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(n4)));
        }
    }
    _mm512_store_ps(sc, _mm512_load_ps(ks[j]));
    _mm512_store_ps(mn, _mm512_load_ps(km[j]));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int r = 0; r < 16; r++) {
        if (r >= nr) {
            _mm256_store_si256((__m256i *)(a + 32 * r), _mm256_setzero_si256());
            continue;
        }
        const char *blk = w + r * ldw + i * (int64_t)bsz;
        const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + qs_off + 32 * (j / 2)));
        __m256i c = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(v, 4) : v, m4);
        if (Q5) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + offsetof(fl_block_q5_K, qh)));
            c = _mm256_or_si256(c, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j), _mm256_set1_epi8(1)), 4));
        }
        _mm256_store_si256((__m256i *)(a + 32 * r), c);
    }
}

/* acc[r] += float(C_r) * (s[r] d_x) (one C tile, no mins), d_x from the block's activations. */
INLINE void fold16(__m512 acc[16], const int32_t *c, const float *s, const char *blk) {
    const __m512 dx = _mm512_load_ps((const float *)(blk + 512));
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++)
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * r)), _mm512_mul_ps(dx, _mm512_set1_ps(s[r])), acc[r]);
}

/* One panel of up to 16 rows x one token tile, the accumulators in registers.  Per block: its
 * rows unpacked into an L1 buffer one step ahead (Q8_0 with 16 real rows: only their scales, the
 * codes are loaded straight from the rows), its product queued, its tile stored a step later and
 * folded two steps later.  Against ae3dd83 (`fitllm bench matmul -p 16 --stream-mib 256`, runs
 * alternated): Q4_0 593-653 against 451-554 GOP/s; Q8_0, Q4_K, Q5_K within the noise. */
INLINE void gemm_rows_t(int32_t wtype, const char *w, size_t ldw, int nr, int64_t K, const char *act, int ntok, float *y,
                        int64_t ldy, const char *pf, size_t pf_bytes, const bool direct, const bool k4, const bool q5) {
    const int64_t nb = K / 32;
    const __m512i vrow = row_offsets(ldw);
    /* block b's rows are unpacked during step b - 1, so its tile load at step b reads stores that
     * have reached L1 (a tile load does not take data from the store buffer: unpacking right
     * before the load stalled it, ~10% of the samples) */
    int8_t abuf[4][512] __attribute__((aligned(64)));
    float sbuf[4][16] __attribute__((aligned(64))), mbuf[4][16] __attribute__((aligned(64)));
    float ks[8][16] __attribute__((aligned(64))), km[8][16] __attribute__((aligned(64))); /* Q4_K: the super-block's scales / mins */
    int32_t cb[2][256] __attribute__((aligned(64)));
    __m512 acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    const size_t pf_step = ((pf_bytes + (size_t)nb - 1) / (size_t)nb + 63) & ~(size_t)63;
    /* block b's scales (and for all but direct Q8_0 its codes) into buffer i */
#define ROWS_UNPACK(b, i)                                                                                 \
    do {                                                                                                  \
        if ((b) < nb) {                                                                                   \
            if (pf)                                                                                       \
                for (size_t o = (size_t)(b) * pf_step; o < (size_t)((b) + 1) * pf_step && o < pf_bytes; o += 64) \
                    _mm_prefetch(pf + o, _MM_HINT_T1);                                                    \
            if (direct) {                                                                                 \
                const __m512i g = _mm512_i32gather_epi32(vrow, (const void *)(w + (b) * 34), 1);          \
                _mm512_store_ps(sbuf[i], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));                     \
            } else if (q5) rows_block_k4(w, ldw, nr, (b), abuf[i], sbuf[i], mbuf[i], ks, km, true);       \
            else if (k4) rows_block_k4(w, ldw, nr, (b), abuf[i], sbuf[i], mbuf[i], ks, km, false);        \
            else rows_block(wtype, w, ldw, nr, (b), abuf[i], sbuf[i]);                                    \
        }                                                                                                 \
    } while (0)
    /* step b: block b's product (tiles A0 B2 C4 for even blocks, A1 B3 C5 for odd ones; tile
     * numbers are immediates, so the loop goes two blocks per turn), block b + 1's rows, block
     * b - 1's store, block b - 2's fold.
     * Buffers: rows and scales by b % 4 (blocks b - 2 .. b + 1 live), C tiles' stores by b % 2. */
#define ROWS_STEP(b, TA, TB, TC, TP)                                                                      \
    do {                                                                                                  \
        if ((b) < nb) {                                                                                   \
            if (direct) {                                                                                 \
                ROWS_UNPACK((b), (b) & 3);                                                                \
                _tile_loadd(TA, w + (b) * 34 + 2, (long)ldw);                                             \
            } else _tile_loadd(TA, abuf[(b) & 3], 32);                                                    \
            _tile_loadd(TB, act + (b) * FL_AMX_ACT_BLOCK, 64);                                            \
            _tile_zero(TC);                                                                               \
            _tile_dpbssd(TC, TA, TB);                                                                     \
        }                                                                                                 \
        if (!direct) ROWS_UNPACK((b) + 1, ((b) + 1) & 3);                                                 \
        if ((b) >= 1 && (b) - 1 < nb) _tile_stored(TP, cb[((b) - 1) & 1], 64);                            \
        if ((b) >= 2) {                                                                                   \
            const int64_t f_ = (b) - 2;                                                                   \
            const char *blk_ = act + f_ * FL_AMX_ACT_BLOCK;                                               \
            fold16(acc, cb[f_ & 1], sbuf[f_ & 3], blk_);                                                  \
            if (k4) { /* + dmin m_j * (-s d_x) */                                                         \
                const __m512 ms = _mm512_load_ps((const float *)(blk_ + 576));                            \
                for (int r = 0; r < 16; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(mbuf[f_ & 3][r]), ms, acc[r]); \
            }                                                                                             \
        }                                                                                                 \
    } while (0)
    if (!direct) ROWS_UNPACK(0, 0);
    for (int64_t b = 0; b <= nb + 1; b += 2) {
        ROWS_STEP(b, 0, 2, 4, 5);
        if (b + 1 <= nb + 1) ROWS_STEP(b + 1, 1, 3, 5, 4);
    }
#undef ROWS_STEP
#undef ROWS_UNPACK
    store_tile(acc, nr, ntok, y, ldy, false);
}

/* gemm_rows_t compiled for each kind of row: Q8_0 loaded straight from 16 rows, Q4_K, Q5_K, and
 * the rest (Q4_0, Q8_0 with fewer rows) unpacked by rows_block */
static void gemm_rows(int32_t wtype, const char *w, size_t ldw, int nr, int64_t K, const char *act, int ntok, float *y,
                      int64_t ldy, const char *pf, size_t pf_bytes) {
    if (wtype == FL_TYPE_Q4_K) gemm_rows_t(wtype, w, ldw, nr, K, act, ntok, y, ldy, pf, pf_bytes, false, true, false);
    else if (wtype == FL_TYPE_Q5_K) gemm_rows_t(wtype, w, ldw, nr, K, act, ntok, y, ldy, pf, pf_bytes, false, true, true);
    else gemm_rows_t(wtype, w, ldw, nr, K, act, ntok, y, ldy, pf, pf_bytes, wtype == FL_TYPE_Q8_0 && nr == 16, false, false);
}

/* Q6_K rows (half-block tiles, the configuration of fl_amx_begin(Q6_K)): per block the 16 rows'
 * 32 codes (4 bits of ql | 2 of qh, - 32) unpacked into L1, once per super-block their 16 scales
 * times d by five gathers with the rows in the lanes, one block ahead; then two units (halves)
 * per block, each a product of 16 codes, stored and folded in the order of gemm_rows_t. */
static void gemm_rows_q6(const char *w, size_t ldw, int nr, int64_t K, const char *act, int ntok, float *y, int64_t ldy,
                         const char *pf, size_t pf_bytes) {
    const int64_t nb = K / 32, nu = 2 * nb;
    const __m512i vrow = row_offsets(ldw);
    const __mmask16 rm = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    int8_t abuf[4][512] __attribute__((aligned(64)));  /* by block % 4 (see gemm_rows_t) */
    float sk[16][16] __attribute__((aligned(64)));      /* the super-block's d sc_j, rows in the lanes */
    float sbuf[4][2][16] __attribute__((aligned(64))); /* [block % 4][half] */
    int32_t cb[2][256] __attribute__((aligned(64)));
    __m512 acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    const size_t pf_step = ((pf_bytes + (size_t)nb - 1) / (size_t)nb + 63) & ~(size_t)63;
    /* block b's rows into abuf[b % 4], its two halves' scales into sbuf[b % 4] */
#define Q6_UNPACK(b)                                                                                      \
    do {                                                                                                  \
        if ((b) < nb) {                                                                                   \
            const int64_t i = (b) / 8;                                                                    \
            const int jb = (int)((b) % 8), n = jb / 4, g = jb % 4;                                        \
            if (pf)                                                                                       \
                for (size_t o = (size_t)(b) * pf_step; o < (size_t)((b) + 1) * pf_step && o < pf_bytes; o += 64) \
                    _mm_prefetch(pf + o, _MM_HINT_T1);                                                    \
            if (jb == 0) {                                                                                \
                const char *base = w + i * (int64_t)sizeof(fl_block_q6_K);                                \
                const __m512i z = _mm512_setzero_si512();                                                 \
                const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(                \
                    _mm512_mask_i32gather_epi32(z, rm, vrow, (const void *)(base + 206), 1), 16)));       \
                for (int k = 0; k < 4; k++) {                                                             \
                    const __m512i sw = _mm512_mask_i32gather_epi32(z, rm, vrow, (const void *)(base + 192 + 4 * k), 1); \
                    for (int t = 0; t < 4; t++)                                                           \
                        _mm512_store_ps(sk[4 * k + t], _mm512_mul_ps(d, _mm512_cvtepi32_ps(              \
                            _mm512_srai_epi32(_mm512_slli_epi32(sw, 24 - 8 * t), 24))));                  \
                }                                                                                         \
            }                                                                                             \
            _mm512_store_ps(sbuf[(b) & 3][0], _mm512_load_ps(sk[2 * jb]));                                \
            _mm512_store_ps(sbuf[(b) & 3][1], _mm512_load_ps(sk[2 * jb + 1]));                            \
            for (int r = 0; r < 16; r++) {                                                                \
                __m256i c = _mm256_setzero_si256();                                                       \
                if (r < nr) {                                                                             \
                    const fl_block_q6_K *blk = (const fl_block_q6_K *)(w + r * ldw) + i;                   \
                    const __m256i l = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * n + 32 * (g & 1))); \
                    const __m256i h = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * n));             \
                    const __m256i lo = _mm256_and_si256(g >= 2 ? _mm256_srli_epi16(l, 4) : l, m4);        \
                    const __m256i hi = g == 0 ? _mm256_slli_epi16(h, 4) : g == 1 ? _mm256_slli_epi16(h, 2) \
                                     : g == 2 ? h : _mm256_srli_epi16(h, 2);                              \
                    c = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_and_si256(hi, m30)), k32);             \
                }                                                                                         \
                _mm256_store_si256((__m256i *)(abuf[(b) & 3] + 32 * r), c);                               \
            }                                                                                             \
        }                                                                                                 \
    } while (0)
    /* step u: unit u's product, at even u block u / 2 + 1's rows, unit u - 1's store, unit u - 2's
     * fold (the order of gemm_rows_t) */
#define Q6_STEP(u, TA, TB, TC, TP)                                                                        \
    do {                                                                                                  \
        if ((u) < nu) {                                                                                   \
            const int64_t b = (u) >> 1;                                                                   \
            _tile_loadd(TA, abuf[b & 3] + 16 * ((u) & 1), 32);                                            \
            _tile_loadd(TB, act + b * FL_AMX_ACT_BLOCK + 256 * ((u) & 1), 64);                            \
            _tile_zero(TC);                                                                               \
            _tile_dpbssd(TC, TA, TB);                                                                     \
        }                                                                                                 \
        if (((u) & 1) == 0) Q6_UNPACK(((u) >> 1) + 1);                                                    \
        if ((u) >= 1 && (u) - 1 < nu) _tile_stored(TP, cb[((u) - 1) & 1], 64);                            \
        if ((u) >= 2) {                                                                                   \
            const int64_t v = (u) - 2;                                                                    \
            fold16(acc, cb[v & 1], sbuf[(v >> 1) & 3][v & 1], act + (v >> 1) * FL_AMX_ACT_BLOCK);         \
        }                                                                                                 \
    } while (0)
    Q6_UNPACK(0);
    for (int64_t u = 0; u <= nu + 1; u += 2) {
        Q6_STEP(u, 0, 2, 4, 5);
        if (u + 1 <= nu + 1) Q6_STEP(u + 1, 1, 3, 5, 4);
    }
#undef Q6_STEP
#undef Q6_UNPACK
    store_tile(acc, nr, ntok, y, ldy, false);
}

static void gemm_rows_q6_t(int32_t wtype, const char *w, size_t ldw, int nr, int64_t K, const char *act, int ntok, float *y,
                           int64_t ldy, const char *pf, size_t pf_bytes) {
    (void)wtype;
    gemm_rows_q6(w, ldw, nr, K, act, ntok, y, ldy, pf, pf_bytes);
}

void fl_amx_gemm_rows(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, const void *act, int ntok, float *y,
                      int64_t ldy, const void *pf, size_t pf_bytes) {
    /* one panel at a time: its accumulators stay in registers (two panels' would not fit), which
     * measured faster for Q8_0 (`fitllm bench matmul -p 16`: 630-655 against 436-530 GOP/s)
     * and the same for Q4_0, whose unpacking is the cost */
    const size_t half = nr > 16 ? pf_bytes / 2 : pf_bytes;
    void (*rows)(int32_t, const char *, size_t, int, int64_t, const char *, int, float *, int64_t, const char *, size_t) = gemm_rows;
    if (wtype == FL_TYPE_Q6_K) rows = gemm_rows_q6_t;
    rows(wtype, w, ldw, nr < 16 ? nr : 16, K, act, ntok, y, ldy, pf, half);
    if (nr > 16)
        rows(wtype, (const char *)w + 16 * ldw, ldw, nr - 16, K, act, ntok, y + 16, ldy, pf ? (const char *)pf + half : NULL,
             pf_bytes - half);
}

/* ---- AVX-512 panel packer (byte-identical to fl_amx_panel_pack_ref) ---- */

/* The 16 rows' block scales (f16 at the start of each block, blocks bsz bytes apart) with one
 * gather per block: sc[b][r] (rows >= nr zero). */
static void gather_scales(const char *w, size_t ldw, int nr, int64_t nb, int bsz, float *sc) {
    const __mmask16 rm = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1);
    const __m512i vrow = row_offsets(ldw);
    for (int64_t b = 0; b < nb; b++) {
        const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rm, vrow, (const void *)(w + b * bsz), 1);
        _mm512_store_ps(sc + b * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
    }
}

void fl_amx_panel_pack_avx512(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, void *panel) {
    const int64_t nb = K / 32;
    int8_t *codes = panel;
    float *sc = (float *)(codes + FL_AMX_ROWS * K), *mins = sc + (fl_amx_half(wtype) ? 2 : 1) * nb * FL_AMX_ROWS;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m512i eight = _mm512_set1_epi8(8);
    const bool gather = (wtype == FL_TYPE_Q8_0 || wtype == FL_TYPE_Q4_0) && (uint64_t)ldw * FL_AMX_ROWS < (1ull << 31); /* int32 offsets */
    for (int r = 0; r < FL_AMX_ROWS; r++) {
        int8_t *q = codes + r * 32; /* block b of row r at q + b * 512 */
        const char *row = (const char *)w + (size_t)r * ldw;
        if (r >= nr) { /* (with gather the scales' masked gathers write the zeros again) */
            fl_amx_panel_zero_row(wtype, K, panel, r);
            continue;
        }
        if (wtype == FL_TYPE_Q8_0) {
            const fl_block_q8_0 *blk = (const fl_block_q8_0 *)row;
            for (int64_t b = 0; b < nb; b++) {
                _mm256_storeu_si256((__m256i *)(q + b * 512), _mm256_loadu_si256((const __m256i *)blk[b].qs));
                if (!gather) sc[b * FL_AMX_ROWS + r] = _cvtsh_ss(blk[b].d);
            }
        } else if (wtype == FL_TYPE_Q4_0) {
            const fl_block_q4_0 *blk = (const fl_block_q4_0 *)row;
            int64_t b = 0;
            for (; b + 1 < nb; b += 2) { /* two blocks: [lo_b hi_b lo_b+1 hi_b+1] - 8 */
                const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)blk[b].qs)),
                                                          _mm_loadu_si128((const __m128i *)blk[b + 1].qs), 1);
                const __m512i lohi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m4)),
                                                        _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), 1);
                const __m512i c = _mm512_sub_epi8(_mm512_shuffle_i64x2(lohi, lohi, 0xD8), eight); /* lanes 0 2 1 3 */
                _mm256_storeu_si256((__m256i *)(q + b * 512), _mm512_castsi512_si256(c));
                _mm256_storeu_si256((__m256i *)(q + (b + 1) * 512), _mm512_extracti64x4_epi64(c, 1));
                if (!gather) {
                    sc[b * FL_AMX_ROWS + r] = _cvtsh_ss(blk[b].d);
                    sc[(b + 1) * FL_AMX_ROWS + r] = _cvtsh_ss(blk[b + 1].d);
                }
            }
            for (; b < nb; b++) {
                const __m128i v = _mm_loadu_si128((const __m128i *)blk[b].qs);
                const __m256i c = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), m4);
                _mm256_storeu_si256((__m256i *)(q + b * 512), _mm256_sub_epi8(c, _mm512_castsi512_si256(eight)));
                if (!gather) sc[b * FL_AMX_ROWS + r] = _cvtsh_ss(blk[b].d);
            }
        } else if (wtype == FL_TYPE_Q5_K) {
            const fl_block_q5_K *blk = (const fl_block_q5_K *)row;
            const __m256i one = _mm256_set1_epi8(1);
            for (int64_t i = 0; i < K / FL_QK_K; i++) {
                float s8[8], m8[8];
                fl_k4_scales_mins(blk[i].d, blk[i].dmin, blk[i].scales, s8, m8);
                for (int j = 0; j < 8; j++) {
                    sc[(i * 8 + j) * FL_AMX_ROWS + r] = s8[j];
                    mins[(i * 8 + j) * FL_AMX_ROWS + r] = m8[j];
                }
                const __m256i h = _mm256_loadu_si256((const __m256i *)blk[i].qh);
                for (int g = 0; g < 4; g++) { /* bit j of qh[l]: the fifth bit of code l of sub-block j */
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(blk[i].qs + 32 * g));
                    const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * g), one), 4);
                    const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * g + 1), one), 4);
                    _mm256_storeu_si256((__m256i *)(q + (i * 8 + 2 * g) * 512), _mm256_or_si256(_mm256_and_si256(v, m4), h0));
                    _mm256_storeu_si256((__m256i *)(q + (i * 8 + 2 * g + 1) * 512),
                                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), h1));
                }
            }
        } else if (wtype == FL_TYPE_Q6_K) { /* 32 codes per step: 4 bits of ql | 2 bits of qh << 4, - 32 */
            const fl_block_q6_K *blk = (const fl_block_q6_K *)row;
            const __m256i m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
            for (int64_t i = 0; i < K / FL_QK_K; i++) {
                const float d = _cvtsh_ss(blk[i].d);
                for (int j = 0; j < 16; j++) sc[(j % 2) * nb * FL_AMX_ROWS + (i * 8 + j / 2) * FL_AMX_ROWS + r] = d * (float)blk[i].scales[j];
                for (int n = 0; n < 2; n++) {
                    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk[i].ql + 64 * n));
                    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk[i].ql + 64 * n + 32));
                    const __m256i h = _mm256_loadu_si256((const __m256i *)(blk[i].qh + 32 * n));
                    const __m256i c[4] = {
                        _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30)),
                        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m30))};
                    for (int g = 0; g < 4; g++)
                        _mm256_storeu_si256((__m256i *)(q + (i * 8 + 4 * n + g) * 512), _mm256_sub_epi8(c[g], k32));
                }
            }
        } else if (wtype == FL_TYPE_Q2_K) { /* 32 codes per step: (qs >> 2g) & 3; scales and mins per 16 */
            const fl_block_q2_K *blk = (const fl_block_q2_K *)row;
            const __m256i three = _mm256_set1_epi8(3);
            for (int64_t i = 0; i < K / FL_QK_K; i++) {
                const float d = _cvtsh_ss(blk[i].d), dmin = _cvtsh_ss(blk[i].dmin);
                for (int j = 0; j < 16; j++) {
                    const int64_t o = (j % 2) * nb * FL_AMX_ROWS + (i * 8 + j / 2) * FL_AMX_ROWS + r;
                    sc[o] = d * (float)(blk[i].scales[j] & 0xF);
                    mins[o] = dmin * (float)(blk[i].scales[j] >> 4);
                }
                for (int n = 0; n < 2; n++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(blk[i].qs + 32 * n));
                    for (int g = 0; g < 4; g++)
                        _mm256_storeu_si256((__m256i *)(q + (i * 8 + 4 * n + g) * 512), _mm256_and_si256(_mm256_srli_epi16(v, 2 * g), three));
                }
            }
        } else if (wtype == FL_TYPE_Q3_K) { /* 32 codes per step: (qs >> 2g) & 3, | hmask bit << 2, - 4 */
            const fl_block_q3_K *blk = (const fl_block_q3_K *)row;
            const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
            for (int64_t i = 0; i < K / FL_QK_K; i++) {
                const float d = _cvtsh_ss(blk[i].d);
                int8_t s16[16];
                fl_q3_K_scales(blk[i].scales, s16);
                for (int j = 0; j < 16; j++) sc[(j % 2) * nb * FL_AMX_ROWS + (i * 8 + j / 2) * FL_AMX_ROWS + r] = d * (float)s16[j];
                const __m256i h = _mm256_loadu_si256((const __m256i *)blk[i].hmask);
                for (int n = 0; n < 2; n++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(blk[i].qs + 32 * n));
                    for (int g = 0; g < 4; g++) {
                        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(v, 2 * g), three);
                        const __m256i hb = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4 * n + g), one), 2);
                        _mm256_storeu_si256((__m256i *)(q + (i * 8 + 4 * n + g) * 512), _mm256_sub_epi8(_mm256_or_si256(lo, hb), four));
                    }
                }
            }
        } else if (wtype != FL_TYPE_Q4_K) { /* the other types: the scalar row packer */
            fl_amx_pack_row(wtype, row, K, q, sc, fl_amx_has_mins(wtype) ? mins : NULL, r);
        } else { /* Q4_K */
            const fl_block_q4_K *blk = (const fl_block_q4_K *)row;
            for (int64_t i = 0; i < K / FL_QK_K; i++) {
                float s8[8], m8[8];
                fl_k4_scales_mins(blk[i].d, blk[i].dmin, blk[i].scales, s8, m8);
                for (int j = 0; j < 8; j++) {
                    sc[(i * 8 + j) * FL_AMX_ROWS + r] = s8[j];
                    mins[(i * 8 + j) * FL_AMX_ROWS + r] = m8[j];
                }
                for (int g = 0; g < 4; g++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(blk[i].qs + 32 * g));
                    _mm256_storeu_si256((__m256i *)(q + (i * 8 + 2 * g) * 512), _mm256_and_si256(v, m4));
                    _mm256_storeu_si256((__m256i *)(q + (i * 8 + 2 * g + 1) * 512), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
                }
            }
        }
    }
    /* after the codes: the rows just streamed in are in cache, so the gathers do not wait on memory */
    if (gather) gather_scales(w, ldw, nr, nb, wtype == FL_TYPE_Q8_0 ? 34 : 18, sc);
}

/* The -s d_x of each 16 codes of a block (v: its 32 codes), as fl_amx_act_pack_row: the codes
 * + 128 summed per 8 by vpsadbw, the offset taken off in int. */
static inline void half_sums(__m256i v, __m256i flip, float d, float *h0, float *h1) {
    int64_t s[4];
    _mm256_storeu_si256((__m256i *)s, _mm256_sad_epu8(_mm256_xor_si256(v, flip), _mm256_setzero_si256()));
    *h0 = -(float)(int)(s[0] + s[1] - 2048) * d;
    *h1 = -(float)(int)(s[2] + s[3] - 2048) * d;
}

/* fl_amx_act_pack_row with one 8-dword scatter per block (byte-identical). */
void fl_amx_act_pack_row_avx512(const fl_act_q8 *a, int64_t m, void *act) {
    if (m >= a->M) {
        fl_amx_act_pack_row(a, m, act);
        return;
    }
    const int64_t nb = a->nb, lane = m % FL_AMX_TOK;
    char *base = (char *)act + (size_t)(m / FL_AMX_TOK) * (size_t)nb * FL_AMX_ACT_BLOCK + lane * 4;
    const __m256i idx = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);
    const int8_t *q = a->qs + m * a->K;
    const float *d = a->d + m * nb, *ms = a->ms + m * nb;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++) {
        char *blk = base + b * FL_AMX_ACT_BLOCK;
        const __m256i v = _mm256_loadu_si256((const __m256i *)(q + b * 32));
        _mm256_i32scatter_epi32(blk, idx, v, 1);
        ((float *)(blk + 512))[0] = d[b];
        ((float *)(blk + 576))[0] = ms[b];
        half_sums(v, flip, d[b], (float *)(blk + 640), (float *)(blk + 704));
    }
}

/* Tokens m0 .. m0 + 7 (m0 a multiple of 8, all < a->M) at once, byte-identical to eight
 * fl_amx_act_pack_row calls: per block their 8 x 8 dwords of codes transposed in registers
 * (dword j of each token side by side, as row j of the tile), 8 stores instead of 8 scatters. */
void fl_amx_act_pack8_avx512(const fl_act_q8 *a, int64_t m0, void *act) {
    const int64_t nb = a->nb, lane = m0 % FL_AMX_TOK;
    char *base = (char *)act + (size_t)(m0 / FL_AMX_TOK) * (size_t)nb * FL_AMX_ACT_BLOCK + lane * 4;
    const int8_t *q = a->qs + m0 * a->K;
    const __m256i vm = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)nb));
    for (int64_t b = 0; b < nb; b++) {
        __m256i r[8], t[8], u[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(q + i * a->K + b * 32));
#pragma GCC unroll 4
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);     /* per 128-bit half: r_i.d0 r_i+1.d0 r_i.d1 r_i+1.d1 */
            t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]); /* ... d2, d3 */
        }
#pragma GCC unroll 2
        for (int i = 0; i < 8; i += 4) { /* u[i + j]: dword j (half 0) and 4 + j (half 1) of tokens i .. i + 3 */
            u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
            u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
            u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
            u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
        }
        char *blk = base + b * FL_AMX_ACT_BLOCK;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            _mm256_storeu_si256((__m256i *)(blk + j * 64), _mm256_permute2x128_si256(u[j], u[4 + j], 0x20));
            _mm256_storeu_si256((__m256i *)(blk + (4 + j) * 64), _mm256_permute2x128_si256(u[j], u[4 + j], 0x31));
        }
        _mm256_storeu_ps((float *)(blk + 512), _mm256_i32gather_ps(a->d + m0 * nb + b, vm, 4));
        _mm256_storeu_ps((float *)(blk + 576), _mm256_i32gather_ps(a->ms + m0 * nb + b, vm, 4));
        const __m256i flip = _mm256_set1_epi8((char)0x80);
        for (int i = 0; i < 8; i++)
            half_sums(r[i], flip, a->d[(m0 + i) * nb + b], (float *)(blk + 640) + i, (float *)(blk + 704) + i);
    }
}

/* ---- AMX-BF16 GEMM (prefill): weights and activations rounded to bf16, f32 sums in the tiles ---- */

/* Tiles: A0, A1 = 0, 1 (16 weight rows x 32 bf16), B0, B1 = 2, 3 (16 pairs x 16 tokens x 2
 * bf16), C[p][t] = 4 + 2p + t (16 rows x 16 tokens of f32), all 16 rows x 64 bytes. */
static const tile_config g_cfg_bf16 __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

void fl_amx_bf16_begin(void) { _tile_loadconfig(&g_cfg_bf16); }

/* 16 f32 into the 16 bf16 of the low (lo) and high (hi) halves of a dword pair: lane j of the
 * result holds values 2j, 2j + 1 of the 32 at p (round to nearest even, as fl_f32_to_bf16 with
 * denormals flushed). */
INLINE __m512 bf16_pairs(const float *p) {
    return _mm512_castsi512_ps((__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p)));
}

void fl_amx_bf16_act_pack_avx512(const float *x, int64_t M, int64_t K, int64_t mt, uint16_t *act) {
    const int64_t nb = K / 32, m0 = mt * FL_AMX_TOK;
    uint16_t *base = act + (size_t)mt * (size_t)nb * 512;
    for (int64_t b = 0; b < nb; b++) {
        __m512 v[16];
#pragma GCC unroll 16
        for (int t = 0; t < 16; t++) v[t] = m0 + t < M ? bf16_pairs(x + (m0 + t) * K + b * 32) : _mm512_setzero_ps();
        transpose16(v); /* v[j] lane t = token t's pair j */
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) _mm512_store_ps((float *)(base + b * 512 + j * 32), v[j]);
    }
}

void fl_amx_bf16_panel_row_avx512(const float *row, int64_t K, uint16_t *panel, int r) {
    for (int64_t b = 0; b < K / 32; b++) _mm512_store_ps((float *)(panel + b * 512 + r * 32), bf16_pairs(row + b * 32));
}

bool fl_amx_bf16_panel_row_q(int32_t wtype, const void *w, int64_t K, uint16_t *panel, int r) {
    if (wtype != FL_TYPE_Q4_0 && wtype != FL_TYPE_Q8_0) return false;
    for (int64_t b = 0; b < K / 32; b++) {
        __m512 lo, hi;
        if (wtype == FL_TYPE_Q8_0) fl_q8_0_block_ps((const fl_block_q8_0 *)w + b, &lo, &hi);
        else fl_q4_0_block_ps((const fl_block_q4_0 *)w + b, &lo, &hi);
        _mm512_store_si512(panel + b * 512 + r * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    return true;
}

/* Rows r0 .. r0 + 7 of the panel from one R8 group (kernels/matmul.h layout; g at the group's
 * block 0 of the chunk, K values): per block the codes of the 8 rows are regathered from their
 * 4-byte chunks with two rounds of dword permutes (Q8_0: [v][row] -> [row][v] over 8 chunks,
 * Q4_0 over 4), then each row's 32 values are d x code in f32 as in fl_q8_0_block_ps /
 * fl_q4_0_block_ps, rounded as there, so the panel bytes are those of fl_amx_bf16_panel_row_q on
 * the unpacked rows (Q4_0: the nibbles of four rows unpacked and less 8 in one go, in bytes). */
INLINE void r8_panel_group(const bool q8, const uint8_t *g, int64_t K, uint16_t *panel, int r0) {
    const size_t gb = q8 ? FL_R8_Q8_0_BLOCK : FL_R8_Q4_0_BLOCK;
    /* first round: lane 4 i + c = the two sources' chunk c (of 4) of row i (rows 4 + i for hi4) */
    const __m512i lo4 = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i hi4 = _mm512_add_epi32(lo4, _mm512_set1_epi32(4));
    /* second round (Q8_0): rows 2j, 2j + 1 as chunks 0-3 from the first source, 4-7 from the second */
    const __m512i pr0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i pr1 = _mm512_add_epi32(pr0, _mm512_set1_epi32(8));
    for (int64_t b = 0; b < K / 32; b++) {
        const uint8_t *blk = g + (size_t)b * gb;
        uint16_t d16[8];
        memcpy(d16, blk, sizeof d16);
        /* Q8_0: row i's codes at codes + 32 i (its block's order), two rows per vector */
        uint8_t codes[256] __attribute__((aligned(64)));
        const __m512i z0 = _mm512_loadu_si512(blk + 16), z1 = _mm512_loadu_si512(blk + 80);
        const __m512i a_lo = _mm512_permutex2var_epi32(z0, lo4, z1), a_hi = _mm512_permutex2var_epi32(z0, hi4, z1);
        if (q8) {
            const __m512i z2 = _mm512_loadu_si512(blk + 144), z3 = _mm512_loadu_si512(blk + 208);
            const __m512i b_lo = _mm512_permutex2var_epi32(z2, lo4, z3), b_hi = _mm512_permutex2var_epi32(z2, hi4, z3);
            _mm512_store_si512(codes, _mm512_permutex2var_epi32(a_lo, pr0, b_lo));
            _mm512_store_si512(codes + 64, _mm512_permutex2var_epi32(a_lo, pr1, b_lo));
            _mm512_store_si512(codes + 128, _mm512_permutex2var_epi32(a_hi, pr0, b_hi));
            _mm512_store_si512(codes + 192, _mm512_permutex2var_epi32(a_hi, pr1, b_hi));
        }
        /* the codes as signed bytes (Q4_0: low nibbles, values 0-15, then high nibbles, each
         * less 8), converted per 16 from memory; d x code in f32 as fl_q4_0_block_ps /
         * fl_q8_0_block_ps compute it, so the same bf16 */
        if (!q8) {
            const __m512i m4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
            const __m512i l0 = _mm512_sub_epi8(_mm512_and_si512(a_lo, m4), eight), l1 = _mm512_sub_epi8(_mm512_and_si512(a_hi, m4), eight);
            const __m512i h0 = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(a_lo, 4), m4), eight);
            const __m512i h1 = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(a_hi, 4), m4), eight);
            _mm512_store_si512(codes, l0);       /* row i: k 0-15 at 16 i, k 16-31 at 128 + 16 i */
            _mm512_store_si512(codes + 64, l1);
            _mm512_store_si512(codes + 128, h0);
            _mm512_store_si512(codes + 192, h1);
        }
        float d[8] __attribute__((aligned(32)));
        _mm256_store_ps(d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d16)));
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const uint8_t *c0 = q8 ? codes + 32 * i : codes + 16 * i, *c1 = q8 ? c0 + 16 : c0 + 128;
            const __m512 dv = _mm512_set1_ps(d[i]);
            const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)c0))), dv);
            const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)c1))), dv);
            _mm512_store_si512(panel + b * 512 + (r0 + i) * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

bool fl_amx_bf16_panel_r8(int32_t wtype, const void *g, int64_t K, uint16_t *panel, int r0) {
    if (wtype == FL_TYPE_Q8_0_R8) r8_panel_group(true, g, K, panel, r0);
    else if (wtype == FL_TYPE_Q4_0_R8) r8_panel_group(false, g, K, panel, r0);
    else return false;
    return true;
}

INLINE void bf16_tiles(const uint16_t *p0, size_t pstride, int64_t nb, const uint16_t *a0, size_t astride, int ntok,
                       float *y, int64_t ldy, int nr, bool acc, const int NP, const int NT) {
    const uint16_t *p1 = p0 + pstride, *a1 = a0 + astride;
    _tile_zero(4);
    if (NT == 2) _tile_zero(5);
    if (NP == 2) _tile_zero(6);
    if (NP == 2 && NT == 2) _tile_zero(7);
    for (int64_t b = 0; b < nb; b++) {
        /* the next block's activation tiles into L1 (AMX tile loads seem not to train the L1
         * prefetcher).  fl_matmul at 512 tokens, Q4_0_R8, 2 threads, 60 calls alternated with
         * the loop without it, median of the paired speedups in three runs: 1.06-1.10 /
         * 1.02-1.04 / 1.05-1.08 / 1.16-1.27 on 2048 x 2048 / 5632 x 2048 / 2048 x 5632 / 256 x
         * 2048.  Prefetching the panels as well, two or more blocks ahead, or the activations 8
         * blocks ahead into L2 was no better or slower (docs/QUANT.md). */
        if (b + 1 < nb)
            for (int l = 0; l < 1024; l += 64) {
                _mm_prefetch((const char *)(a0 + (b + 1) * 512) + l, _MM_HINT_T0);
                if (NT == 2) _mm_prefetch((const char *)(a1 + (b + 1) * 512) + l, _MM_HINT_T0);
            }
        _tile_loadd(0, p0 + b * 512, 64);
        _tile_loadd(2, a0 + b * 512, 64);
        _tile_dpbf16ps(4, 0, 2);
        if (NT == 2) {
            _tile_loadd(3, a1 + b * 512, 64);
            _tile_dpbf16ps(5, 0, 3);
        }
        if (NP == 2) {
            _tile_loadd(1, p1 + b * 512, 64);
            _tile_dpbf16ps(6, 1, 2);
            if (NT == 2) _tile_dpbf16ps(7, 1, 3);
        }
    }
    float cb[4][256] __attribute__((aligned(64)));
    _tile_stored(4, cb[0], 64);
    if (NT == 2) _tile_stored(5, cb[1], 64);
    if (NP == 2) _tile_stored(6, cb[2], 64);
    if (NP == 2 && NT == 2) _tile_stored(7, cb[3], 64);
    for (int p = 0; p < NP; p++)
        for (int t = 0; t < NT; t++) {
            __m512 c[16];
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++) c[r] = _mm512_load_ps(cb[2 * p + t] + 16 * r);
            store_tile(c, p == NP - 1 ? nr : FL_AMX_ROWS, ntok - 16 * t < 16 ? ntok - 16 * t : 16,
                       y + (int64_t)(16 * t) * ldy + 16 * p, ldy, acc);
        }
}

void fl_amx_bf16_gemm(const uint16_t *panel, size_t pstride, int np, int64_t K, const uint16_t *act, size_t astride,
                      int ntok, float *y, int64_t ldy, int nr, bool acc) {
    const int64_t nb = K / 32;
    if (np == 2 && ntok > 16) bf16_tiles(panel, pstride, nb, act, astride, ntok, y, ldy, nr, acc, 2, 2);
    else if (np == 2) bf16_tiles(panel, pstride, nb, act, astride, ntok, y, ldy, nr, acc, 2, 1);
    else if (ntok > 16) bf16_tiles(panel, pstride, nb, act, astride, ntok, y, ldy, nr, acc, 1, 2);
    else bf16_tiles(panel, pstride, nb, act, astride, ntok, y, ldy, nr, acc, 1, 1);
}
