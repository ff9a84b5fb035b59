/* Paged flash attention: scalar kernel + naive reference (see paged_attn.h). */
#include "kv/paged_attn.h"

#include "core/status.h"
#include "core/threads.h"
#include "kernels/attn.h"
#include "kernels/convert.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"
#include "kernels/avx512/exp512.h"
#include "kernels/avx512/fp8_512.h"
#include "kernels/avx512/kvq_512.h"
#include "kv/kv_quant.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#define SPLIT_MAX_Q 4 /* sequences with at most this many query rows use split-K */
/* Query rows per work item otherwise (FL_PAGED_Q_TILE): each block is converted and transposed
 * once per tile.  One layer's prefill attention (32 / 4 heads of 64, f16, 2 threads), 32 against
 * 16 alternated in one process, median of the paired speedups: 1.02 / 1.03 / 1.05-1.06 at 512 /
 * 1024 / 2048 tokens, the same bits (rows are independent). */
#define Q_TILE FL_PAGED_Q_TILE
#define ALL_KV_ITEMS 2 /* all kv heads per work item only where each thread gets this many (all_kv_ok) */

/* ---- shared pieces: per-block online-softmax update and the in-order merge ---- */

/* One (query, head) softmax state: st[0] = running max m, st[1] = sum l, st[2..] = acc. */
static void state_init(float *st, int32_t hd) {
    st[0] = -INFINITY;
    st[1] = 0.0f;
    memset(st + 2, 0, sizeof(float) * (size_t)hd);
}

/* The two inner loops of a block update, each with a fixed summation order:
 *   scores: sc[j] = scale * (q . k_j)                    for rows j in [ja, jb)
 *   accum:  acc = acc * alpha + sum_j e[j] * v_j         rows added in increasing j
 * The portable versions are the reference; the AVX2 / AVX-512 ones (target attributes) are
 * picked once per call from fl_isa_get(), so every row of a call uses the same order and a
 * query's bits depend only on its data within one process. */

/* q . k: 16 lane sums (lane l takes dims d % 16 == l), the tail, then a fixed pairwise
 * reduction; constant-trip inner loops let the compiler vectorise without reordering. */
static float dot_f32(const float *restrict a, const float *restrict b, int32_t n) {
    float lane[16] = {0};
    int32_t d = 0;
    for (; d + 16 <= n; d += 16)
        for (int l = 0; l < 16; l++) lane[l] += a[d + l] * b[d + l];
    for (int l = 0; d < n; d++, l++) lane[l] += a[d] * b[d];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

static void scores_ref(const float *q, const float *kb, int32_t ja, int32_t jb, int32_t hd, float scale, float *sc) {
    for (int32_t j = ja; j < jb; j++) sc[j] = dot_f32(q, kb + (size_t)j * (size_t)hd, hd) * scale;
}

static void accum_ref(float *restrict acc, float alpha, const float *e, const float *restrict vb, int32_t ja, int32_t jb, int32_t hd) {
    for (int32_t d = 0; d < hd; d++) acc[d] *= alpha;
    for (int32_t j = ja; j < jb; j++) {
        const float *restrict v = vb + (size_t)j * (size_t)hd;
        const float ej = e[j];
        int32_t d = 0;
        for (; d + 16 <= hd; d += 16)
            for (int l = 0; l < 16; l++) acc[d + l] += ej * v[d + l];
        for (; d < hd; d++) acc[d] += ej * v[d];
    }
}

/* One key's dot as scores_avx2 sums it (two chains over the 16-dim steps, then a fixed
 * horizontal order). */
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))
AVX2_INLINE float hsum_scores_avx2(__m256 s0, __m256 s1) {
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

__attribute__((target("avx2,fma"))) static void scores_avx2(const float *q, const float *kb, int32_t ja, int32_t jb, int32_t hd, float scale, float *sc) {
    if (hd == 64) { /* q in 8 registers across the keys (half the loads), the same sums */
        __m256 qv[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) qv[c] = _mm256_loadu_ps(q + 8 * c);
        for (int32_t j = ja; j < jb; j++) {
            const float *k = kb + (size_t)j * 64;
            __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int c = 0; c < 8; c += 2) {
                s0 = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(k + 8 * c), s0);
                s1 = _mm256_fmadd_ps(qv[c + 1], _mm256_loadu_ps(k + 8 * c + 8), s1);
            }
            sc[j] = hsum_scores_avx2(s0, s1) * scale;
        }
        return;
    }
    for (int32_t j = ja; j < jb; j++) {
        const float *k = kb + (size_t)j * (size_t)hd;
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        int32_t d = 0;
        for (; d + 16 <= hd; d += 16) {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), s0);
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), s1);
        }
        if (d + 8 <= hd) {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), s0);
            d += 8;
        }
        float r = hsum_scores_avx2(s0, s1);
        for (; d < hd; d++) r += q[d] * k[d];
        sc[j] = r * scale;
    }
}

/* acc = acc * alpha + sum_j e[j] v_j, per dim in key order (the reference's arithmetic), up to 64
 * dims in 8 registers per pass over the keys: with one 8-dim register per pass each key's fma
 * waited for the previous one (the fma latency per key and 8 dims). */
__attribute__((target("avx2,fma"))) static void accum_avx2(float *restrict acc, float alpha, const float *e, const float *restrict vb, int32_t ja, int32_t jb, int32_t hd) {
    int32_t d = 0;
    for (; d + 64 <= hd; d += 64) {
        __m256 a[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) a[c] = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8 * c), _mm256_set1_ps(alpha));
        for (int32_t j = ja; j < jb; j++) {
            const __m256 ej = _mm256_set1_ps(e[j]);
            const float *v = vb + (size_t)j * (size_t)hd + d;
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) a[c] = _mm256_fmadd_ps(ej, _mm256_loadu_ps(v + 8 * c), a[c]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(acc + d + 8 * c, a[c]);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + d), _mm256_set1_ps(alpha));
        for (int32_t j = ja; j < jb; j++) a = _mm256_fmadd_ps(_mm256_set1_ps(e[j]), _mm256_loadu_ps(vb + (size_t)j * (size_t)hd + d), a);
        _mm256_storeu_ps(acc + d, a);
    }
    for (; d < hd; d++) {
        float a = acc[d] * alpha;
        for (int32_t j = ja; j < jb; j++) a = fmaf(e[j], vb[(size_t)j * (size_t)hd + d], a);
        acc[d] = a;
    }
}

/* AVX-512 with K transposed in the block scratch (kb[d * bs + j]): 16 keys' scores per vector,
 * dims d taken in four interleaved sums (d % 4), then (0 + 1) + (2 + 3); no horizontal
 * reductions.  Rows outside [ja, jb) are computed from whatever the scratch holds and not
 * stored. */
__attribute__((target("avx512f"))) static void scores_avx512_t(const float *q, const float *kt, int32_t ja, int32_t jb, int32_t hd, int32_t bs,
                                                             float scale, float *sc) {
    for (int32_t j0 = ja & ~15; j0 < jb; j0 += 16) {
        const int32_t nj = bs - j0 < 16 ? bs - j0 : 16;
        const __mmask16 lm = (__mmask16)(nj >= 16 ? 0xFFFFu : (1u << nj) - 1);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float *k = kt + j0;
        int32_t d = 0;
        for (; d + 4 <= hd; d += 4) {
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_maskz_loadu_ps(lm, k + (size_t)d * (size_t)bs), a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]), _mm512_maskz_loadu_ps(lm, k + (size_t)(d + 1) * (size_t)bs), a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 2]), _mm512_maskz_loadu_ps(lm, k + (size_t)(d + 2) * (size_t)bs), a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 3]), _mm512_maskz_loadu_ps(lm, k + (size_t)(d + 3) * (size_t)bs), a3);
        }
        for (; d < hd; d++) a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_maskz_loadu_ps(lm, k + (size_t)d * (size_t)bs), a0);
        const __m512 r = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)), _mm512_set1_ps(scale));
        const int32_t lo = ja > j0 ? ja - j0 : 0, hi = jb - j0 < 16 ? jb - j0 : 16;
        const __mmask16 sm = (__mmask16)(((hi >= 16 ? 0xFFFFu : (1u << hi) - 1)) & ~((1u << lo) - 1));
        _mm512_mask_storeu_ps(sc + j0, sm, r);
    }
}

/* acc = acc * alpha + sum_j e[j] v_j with even and odd rows in two chains (half the fma
 * latency per 16 dims), added at the end. */
__attribute__((target("avx512f"))) static void accum_avx512(float *restrict acc, float alpha, const float *e, const float *restrict vb, int32_t ja, int32_t jb, int32_t hd) {
    for (int32_t d = 0; d < hd; d += 16) {
        const __mmask16 m = hd - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (hd - d)) - 1);
        __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, acc + d), _mm512_set1_ps(alpha)), b = _mm512_setzero_ps();
        int32_t j = ja;
        for (; j + 2 <= jb; j += 2) {
            a = _mm512_fmadd_ps(_mm512_set1_ps(e[j]), _mm512_maskz_loadu_ps(m, vb + (size_t)j * (size_t)hd + d), a);
            b = _mm512_fmadd_ps(_mm512_set1_ps(e[j + 1]), _mm512_maskz_loadu_ps(m, vb + (size_t)(j + 1) * (size_t)hd + d), b);
        }
        if (j < jb) a = _mm512_fmadd_ps(_mm512_set1_ps(e[j]), _mm512_maskz_loadu_ps(m, vb + (size_t)j * (size_t)hd + d), a);
        _mm512_mask_storeu_ps(acc + d, m, _mm512_add_ps(a, b));
    }
}

static void exp_rows_libm(float *sc, int32_t n) {
    for (int32_t j = 0; j < n; j++) sc[j] = expf(sc[j]);
}

typedef struct vec_ops {
    void (*scores)(const float *q, const float *kb, int32_t ja, int32_t jb, int32_t hd, float scale, float *sc);
    /* non-NULL: K is kept transposed in the block scratch and scored with this instead */
    void (*scores_t)(const float *q, const float *kt, int32_t ja, int32_t jb, int32_t hd, int32_t bs, float scale, float *sc);
    void (*accum)(float *restrict acc, float alpha, const float *e, const float *restrict vb, int32_t ja, int32_t jb, int32_t hd);
    void (*exp_row)(float *sc, int32_t n); /* sc[j] = exp(sc[j]) */
    bool kt16; /* AVX2: blocks of <= 16 keys go to fl_attn_block16_avx2, K transposed at stride 16 */
} vec_ops;

static void exp_rows_poly(float *sc, int32_t n) { fl_expf_poly_row_avx512(sc, sc, n); }
static void exp_rows_poly_avx2(float *sc, int32_t n) { fl_expf_poly_row_avx2(sc, sc, n); }

static vec_ops pick_ops(void) {
    switch (fl_isa_get()) {
    case FL_ISA_AVX512: return (vec_ops){NULL, scores_avx512_t, accum_avx512, exp_rows_poly, false};
    case FL_ISA_AVX2: return (vec_ops){scores_avx2, NULL, accum_avx2, exp_rows_poly_avx2, true};
    default: return (vec_ops){scores_ref, NULL, accum_ref, exp_rows_libm, false};
    }
}

/* (the pieces of update16_n, below) */
#define U16_INLINE static inline __attribute__((always_inline, target("avx512f")))
/* GCC's trees for _mm512_mask_reduce_max_ps / _mm512_reduce_add_ps (halves, quarters, then pairs
 * within them, the operands of each max in its order, so the same bits) run on four vectors at
 * once: lane 4h of the result is v[h]'s.  Four of the heads' reductions share each shuffle. */
#define R4_OP(a, b) ((MAX) ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b))
U16_INLINE __m512 reduce4(const bool MAX, const __m512 v[4]) {
    const __m512 a01 = _mm512_shuffle_f32x4(v[0], v[1], 0x44), b01 = _mm512_shuffle_f32x4(v[0], v[1], 0xEE); /* low / high 256 bits */
    const __m512 a23 = _mm512_shuffle_f32x4(v[2], v[3], 0x44), b23 = _mm512_shuffle_f32x4(v[2], v[3], 0xEE);
    const __m512 s01 = R4_OP(b01, a01), s23 = R4_OP(b23, a23); /* the 8-lane halves' reductions, two heads each */
    const __m512 lo = _mm512_shuffle_f32x4(s01, s23, 0x88), hi = _mm512_shuffle_f32x4(s01, s23, 0xDD); /* 128-bit lane h: head h */
    const __m512 t6 = R4_OP(hi, lo);
    const __m512 t8 = R4_OP(t6, _mm512_permute_ps(t6, 0x4E)); /* {2, 3, 0, 1} */
    return R4_OP(t8, _mm512_permute_ps(t8, 0x11));             /* {1, 0, 1, 0} */
}
#undef R4_OP

/* Scores, max, exp and sum of N <= 4 heads (four chains of the 64 dims each: 4 N accumulators);
 * head h's state at st + h ss, its query at q + h hd; sc[h] gets its exp row, al[h] its
 * rescale factor. */
U16_INLINE void scores16_n(const int N, float *st, size_t ss, const float *q, const float *kt, int32_t ja, int32_t jb,
                           int32_t hd, int32_t bs, float scale, float (*sc)[16], float *al) {
    const __mmask16 vm = (__mmask16)(((jb >= 16 ? 0xFFFFu : (1u << jb) - 1)) & ~((1u << ja) - 1));
    const __mmask16 lm = (__mmask16)(bs >= 16 ? 0xFFFFu : (1u << bs) - 1);
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < N; h++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) a[h][c] = _mm512_setzero_ps();
    int32_t d = 0;
    for (; d + 4 <= hd; d += 4) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512 k = _mm512_maskz_loadu_ps(lm, kt + (size_t)(d + c) * (size_t)bs);
#pragma GCC unroll 4
            for (int h = 0; h < N; h++) a[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)h * (size_t)hd + (size_t)(d + c)]), k, a[h][c]);
        }
    }
    for (; d < hd; d++) {
        const __m512 k = _mm512_maskz_loadu_ps(lm, kt + (size_t)d * (size_t)bs);
#pragma GCC unroll 4
        for (int h = 0; h < N; h++) a[h][0] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)h * (size_t)hd + (size_t)d]), k, a[h][0]);
    }
    if (N == 4) { /* the same arithmetic, the reductions four at a time */
        __m512 r[4], e[4];
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            r[h] = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a[h][0], a[h][1]), _mm512_add_ps(a[h][2], a[h][3])), _mm512_set1_ps(scale));
            e[h] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vm, r[h]);
        }
        float mb[16] __attribute__((aligned(64))), sum[16] __attribute__((aligned(64))), m_new[4];
        _mm512_store_ps(mb, reduce4(true, e));
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            const float m0 = st[(size_t)h * ss];
            m_new[h] = m0 > mb[4 * h] ? m0 : mb[4 * h];
            al[h] = m0 == -INFINITY ? 0.0f : m0 == m_new[h] ? 1.0f : expf(m0 - m_new[h]);
            e[h] = fl_exp512(_mm512_sub_ps(r[h], _mm512_set1_ps(m_new[h])));
            _mm512_mask_storeu_ps(sc[h], vm, e[h]);
            e[h] = _mm512_maskz_mov_ps(vm, e[h]);
        }
        _mm512_store_ps(sum, reduce4(false, e));
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            float *sh = st + (size_t)h * ss;
            sh[1] = sh[1] * al[h] + sum[4 * h];
            sh[0] = m_new[h];
        }
        return;
    }
#pragma GCC unroll 4
    for (int h = 0; h < N; h++) {
        float *sh = st + (size_t)h * ss;
        const __m512 r = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a[h][0], a[h][1]), _mm512_add_ps(a[h][2], a[h][3])), _mm512_set1_ps(scale));
        const float mb = _mm512_mask_reduce_max_ps(vm, r);
        const float m_new = sh[0] > mb ? sh[0] : mb;
        al[h] = sh[0] == -INFINITY ? 0.0f : sh[0] == m_new ? 1.0f : expf(sh[0] - m_new); /* (expf(0) is 1: the call skipped) */
        const __m512 e = fl_exp512(_mm512_sub_ps(r, _mm512_set1_ps(m_new))); /* (every lane; those outside [ja, jb) masked off) */
        _mm512_mask_storeu_ps(sc[h], vm, e);
        sh[1] = sh[1] * al[h] + _mm512_mask_reduce_add_ps(vm, _mm512_maskz_mov_ps(vm, e));
        sh[0] = m_new;
    }
}

/* acc of N <= 8 heads: acc x al + the exp rows times the values (accum_avx512: even / odd keys in
 * two chains, added at the end), each value vector loaded once for the N heads */
U16_INLINE void values16_n(const int N, float *st, size_t ss, const float *vb, int32_t ja, int32_t jb, int32_t hd,
                           float (*sc)[16], const float *al) {
    for (int32_t d = 0; d < hd; d += 16) {
        const __mmask16 m = hd - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (hd - d)) - 1);
        __m512 x[8], y[8];
#pragma GCC unroll 8
        for (int h = 0; h < N; h++) {
            x[h] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, st + (size_t)h * ss + 2 + d), _mm512_set1_ps(al[h]));
            y[h] = _mm512_setzero_ps();
        }
        int32_t j = ja;
        for (; j + 2 <= jb; j += 2) {
            const __m512 v0 = _mm512_maskz_loadu_ps(m, vb + (size_t)j * (size_t)hd + d);
            const __m512 v1 = _mm512_maskz_loadu_ps(m, vb + (size_t)(j + 1) * (size_t)hd + d);
#pragma GCC unroll 8
            for (int h = 0; h < N; h++) {
                x[h] = _mm512_fmadd_ps(_mm512_set1_ps(sc[h][j]), v0, x[h]);
                y[h] = _mm512_fmadd_ps(_mm512_set1_ps(sc[h][j + 1]), v1, y[h]);
            }
        }
        if (j < jb) {
            const __m512 v0 = _mm512_maskz_loadu_ps(m, vb + (size_t)j * (size_t)hd + d);
#pragma GCC unroll 8
            for (int h = 0; h < N; h++) x[h] = _mm512_fmadd_ps(_mm512_set1_ps(sc[h][j]), v0, x[h]);
        }
#pragma GCC unroll 8
        for (int h = 0; h < N; h++) _mm512_mask_storeu_ps(st + (size_t)h * ss + 2 + d, m, _mm512_add_ps(x[h], y[h]));
    }
}

/* The AVX-512 block update for blocks of at most 16 keys (K transposed), for N heads of one KV
 * group at once (GQA: they read the same K and V block, so each load feeds N fmas; the two
 * 64-fma loops were bound by their loads).  Per head: the scores stay in one vector (the
 * arithmetic of scores_avx512_t), their max and sum are vector reductions, exp is the same
 * polynomial per lane, acc the arithmetic of accum_avx512; the same bits for every N, and as
 * the general path below except l, whose 16 terms are added as a tree instead of in key order.
 * The scalar max / subtract / sum loops and the scores' store and reload had made the per-row
 * bookkeeping cost about as much as the two 64-fma loops.  Scores in fours of heads (their
 * accumulators fill half the registers), the values of up to eight heads per load (TinyLlama's
 * group: one layer's prefill attention, 512-2048 tokens, 32 / 4 heads, alternated in one process
 * with fours throughout, median of the paired speedups 1.01-1.09, the same bits).  The heads'
 * states, queries and exp rows are addressed from one base each (head h at a fixed stride), and
 * update16_heads passes TinyLlama's and Llama's shape (head_dim 64, blocks of 16) as constants:
 * with arrays of eight pointers the fmas' broadcasts waited on reloads of the spilled pointers. */
U16_INLINE void update16_n(const int N, float *st, size_t ss, const float *q, const float *kt, const float *vb, int32_t ja,
                           int32_t jb, int32_t hd, int32_t bs, float scale) {
    float sc[8][16] __attribute__((aligned(64)));
    float al[8];
    if (N == 8) {
        scores16_n(4, st, ss, q, kt, ja, jb, hd, bs, scale, sc, al);
        scores16_n(4, st + 4 * ss, ss, q + 4 * (size_t)hd, kt, ja, jb, hd, bs, scale, sc + 4, al + 4);
    } else
        scores16_n(N, st, ss, q, kt, ja, jb, hd, bs, scale, sc, al);
    values16_n(N, st, ss, vb, ja, jb, hd, sc, al);
}

/* Heads [0, n) of one KV group, st / q at stride ss / hd floats: eights, a four, a pair, one. */
U16_INLINE void update16_heads_t(int32_t n, float *st, size_t ss, const float *q, int32_t hd, const float *kt, const float *vb,
                                 int32_t ja, int32_t jb, int32_t bs, float scale) {
    int32_t h = 0;
    for (; h + 8 <= n; h += 8) update16_n(8, st + (size_t)h * ss, ss, q + (size_t)h * (size_t)hd, kt, vb, ja, jb, hd, bs, scale);
    if (h + 4 <= n) {
        update16_n(4, st + (size_t)h * ss, ss, q + (size_t)h * (size_t)hd, kt, vb, ja, jb, hd, bs, scale);
        h += 4;
    }
    if (h + 2 <= n) {
        update16_n(2, st + (size_t)h * ss, ss, q + (size_t)h * (size_t)hd, kt, vb, ja, jb, hd, bs, scale);
        h += 2;
    }
    if (h < n) update16_n(1, st + (size_t)h * ss, ss, q + (size_t)h * (size_t)hd, kt, vb, ja, jb, hd, bs, scale);
}

__attribute__((target("avx512f"))) static void update16_heads(int32_t n, float *st, size_t ss, const float *q, int32_t hd,
                                                             const float *kt, const float *vb, int32_t ja, int32_t jb, int32_t bs,
                                                             float scale) {
    if (hd == 64 && bs == 16 && ss == 66) update16_heads_t(n, st, 66, q, 64, kt, vb, ja, jb, 16, scale);
    else update16_heads_t(n, st, ss, q, hd, kt, vb, ja, jb, bs, scale);
}

/* Fold keys/values kb[j], vb[j] for j in [ja, jb) (rows of the block scratch) into st:
 * one online-softmax step per block. */
static void state_update(const vec_ops *vo, float *st, const float *qh, const float *kb, const float *vb, int32_t ja, int32_t jb,
                         int32_t hd, int32_t bs, float scale, float *sc) {
    if (vo->scores_t) vo->scores_t(qh, kb, ja, jb, hd, bs, scale, sc);
    else vo->scores(qh, kb, ja, jb, hd, scale, sc);
    float mb = -INFINITY;
    for (int32_t j = ja; j < jb; j++) mb = sc[j] > mb ? sc[j] : mb; /* scores are finite: same as fmaxf, inlined */
    const float m_new = st[0] > mb ? st[0] : mb;
    const float alpha = st[0] == -INFINITY ? 0.0f : st[0] == m_new ? 1.0f : expf(st[0] - m_new); /* (expf(0) is 1) */
    float l = st[1] * alpha;
    for (int32_t j = ja; j < jb; j++) sc[j] -= m_new;
    vo->exp_row(sc + ja, jb - ja);
    for (int32_t j = ja; j < jb; j++) l += sc[j];
    vo->accum(st + 2, alpha, sc, vb, ja, jb, hd);
    st[0] = m_new;
    st[1] = l;
}

/* The scalar part of dst := merge(dst, src) by log-sum-exp: false when that is all (src holds
 * nothing, or dst held nothing and is now src's copy); else dst's max and sum are merged and *a,
 * *b are the factors of dst's and src's acc. */
static inline bool merge_head(float *dst, const float *src, int32_t hd, float *a, float *b) {
    if (src[1] == 0.0f) return false; /* partition without a visible key */
    if (dst[1] == 0.0f) {
        memcpy(dst, src, sizeof(float) * (size_t)(hd + 2));
        return false;
    }
    const float m = fmaxf(dst[0], src[0]);
    *a = dst[0] == m ? 1.0f : expf(dst[0] - m);
    *b = src[0] == m ? 1.0f : expf(src[0] - m); /* (one of them is 1) */
    dst[0] = m;
    dst[1] = dst[1] * *a + src[1] * *b;
    return true;
}

static void state_merge(float *dst, const float *src, int32_t hd) {
    float a, b;
    if (!merge_head(dst, src, hd, &a, &b)) return;
    for (int32_t d = 0; d < hd; d++) dst[2 + d] = dst[2 + d] * a + src[2 + d] * b;
}

/* The same arithmetic 16 dims at a time (products, then their sum, as the scalar loop, which
 * the build's baseline runs 4 at a time: ~4% of a 512-token prefill attention's samples). */
__attribute__((target("avx512f"))) static void state_merge_avx512(float *dst, const float *src, int32_t hd) {
    float a, b;
    if (!merge_head(dst, src, hd, &a, &b)) return;
    const __m512 av = _mm512_set1_ps(a), bv = _mm512_set1_ps(b);
    for (int32_t d = 0; d < hd; d += 16) {
        const __mmask16 k = hd - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (hd - d)) - 1);
        _mm512_mask_storeu_ps(dst + 2 + d, k, _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, dst + 2 + d), av),
                                                            _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + 2 + d), bv)));
    }
}

static void state_final(const float *st, float *o, int32_t hd) {
    const float il = st[1] > 0.0f ? 1.0f / st[1] : 0.0f;
    for (int32_t d = 0; d < hd; d++) o[d] = st[2 + d] * il;
}

/* The same products 16 at a time (the build's baseline does not vectorise the loop above; its
 * 64 scalar stores per head into the output rows, which the other thread had read last, took
 * most of phase 1 outside the block updates). */
__attribute__((target("avx512f"))) static void state_final_avx512(const float *st, float *o, int32_t hd) {
    const float il = st[1] > 0.0f ? 1.0f / st[1] : 0.0f;
    int32_t d = 0;
    for (; d + 16 <= hd; d += 16) _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(st + 2 + d), _mm512_set1_ps(il)));
    for (; d < hd; d++) o[d] = st[2 + d] * il;
}

/* ---- work decomposition ---- */

typedef struct plan {
    int64_t n_items;     /* phase-1 work items */
    int64_t n_merge;     /* phase-2 (split rows x heads) */
    size_t per_thread;   /* floats of scratch per thread */
    size_t n_partial;    /* floats of split-K partial states */
} plan;

static int32_t n_blocks_of(const fl_paged_kv *kv, const fl_paged_seq *s) {
    return (s->pos0 + s->n_q + kv->block_size - 1) / kv->block_size;
}
static int32_t n_parts_of(const fl_paged_kv *kv, const fl_paged_seq *s, const fl_paged_attn_params *pp) {
    return (n_blocks_of(kv, s) + pp->part_blocks - 1) / pp->part_blocks;
}
/* Which sequences take split-K (a work item per partition, their partial states merged in phase
 * 2): those with at most SPLIT_MAX_Q query rows and more than one partition, taken in order while
 * their partial states (rows x partitions) fit within n_seq x the most partitions of the call's
 * sequences.  That is what the planner reserves for them (max_seqs x the partitions of a whole
 * context, plan/plan_engine.c): without the limit a step of a few rows per sequence at a long
 * context (speculative drafts, a prompt's last tokens) needed up to SPLIT_MAX_Q x that.  The
 * others take the row tiles, which merge the same partitions in the same order: the same bits,
 * so which path a sequence takes never changes its result.  split_budget gives the limit,
 * take_split decides for the next sequence (*used: the partition rows taken so far). */
static int64_t split_budget(const fl_paged_kv *kv, const fl_paged_seq *seqs, int32_t n_seq, const fl_paged_attn_params *pp) {
    int32_t most = 0;
    for (int32_t s = 0; s < n_seq; s++)
        if (seqs[s].n_q > 0 && n_parts_of(kv, &seqs[s], pp) > most) most = n_parts_of(kv, &seqs[s], pp);
    return (int64_t)n_seq * most;
}
static bool take_split(const fl_paged_kv *kv, const fl_paged_seq *s, const fl_paged_attn_params *pp, int64_t budget, int64_t *used) {
    if (s->n_q <= 0 || s->n_q > SPLIT_MAX_Q || n_parts_of(kv, s, pp) <= 1) return false;
    const int64_t need = (int64_t)s->n_q * n_parts_of(kv, s, pp);
    if (*used + need > budget) return false;
    *used += need;
    return true;
}
/* Whether a sequence's work items may take all its kv heads at once (blocks outer, heads inner):
 * its rows' states for every head fit a tile's state buffer (rows x n_head_kv <= Q_TILE: decode
 * rows, a few drafts).  Its K and V rows are then read whole, one block after the other, where an
 * item per kv head reads a quarter of every row (TinyLlama's 4 kv heads: 128 of 512 bytes) and
 * comes back for the rest three items later.  One layer's decode attention (16-row f16 blocks,
 * 32 / 4 heads of 64, 22 layers cycled, 2 threads, a throwaway harness calling fl_paged_attn, the
 * two alternated): one sequence at 4096 tokens 11.1-11.4 against 13.3-13.5 ms, 16 sequences at
 * 48 tokens 2.31-2.62 against 3.15-3.38 ms. */
static bool all_kv_ok(const fl_paged_kv *kv, const fl_paged_seq *s) { return s->n_q > 0 && s->n_q * kv->n_head_kv <= Q_TILE; }

/* Work items of a sequence: per kv head (or, all_kv and all_kv_ok, for all of them) one per
 * partition where split, else one per tile of Q_TILE rows. */
static int64_t n_items_of(const fl_paged_kv *kv, const fl_paged_seq *s, const fl_paged_attn_params *pp, bool split, bool all_kv) {
    if (s->n_q <= 0) return 0;
    const int64_t heads = all_kv && all_kv_ok(kv, s) ? 1 : kv->n_head_kv;
    return heads * (split ? n_parts_of(kv, s, pp) : (s->n_q + Q_TILE - 1) / Q_TILE);
}

static int32_t k_rows(const fl_paged_kv *kv) { return kv->block_size < 16 ? 16 : kv->block_size; }

static plan make_plan(const fl_paged_kv *kv, const fl_paged_seq *seqs, int32_t n_seq, const fl_paged_attn_params *pp) {
    plan pl = {0};
    const size_t hd = (size_t)kv->head_dim, g = (size_t)(pp->n_head / kv->n_head_kv);
    const int64_t budget = split_budget(kv, seqs, n_seq, pp);
    int64_t used = 0;
    for (int32_t s = 0; s < n_seq; s++) {
        const bool split = take_split(kv, &seqs[s], pp, budget, &used);
        pl.n_items += n_items_of(kv, &seqs[s], pp, split, false);
        if (split) {
            pl.n_merge += (int64_t)seqs[s].n_q * pp->n_head;
            pl.n_partial += (size_t)n_parts_of(kv, &seqs[s], pp) * (size_t)seqs[s].n_q * (size_t)pp->n_head * (hd + 2);
        }
    }
    /* K and V block scratch (K for at least 16 keys: the AVX2 update's transposed K), scores,
     * running state and partition state for a tile */
    pl.per_thread = (size_t)(k_rows(kv) + kv->block_size) * hd + (size_t)kv->block_size + 2 * Q_TILE * g * (hd + 2);
    pl.per_thread = (pl.per_thread + 15) & ~(size_t)15; /* keep every thread's slice 64-aligned */
    return pl;
}

size_t fl_paged_attn_ws_size(const fl_paged_kv *kv, const fl_paged_seq *seqs, int32_t n_seq,
                             const fl_paged_attn_params *pp, int nth) {
    const plan pl = make_plan(kv, seqs, n_seq, pp);
    return sizeof(float) * (pl.per_thread * (size_t)(nth > 0 ? nth : 1) + pl.n_partial) +
           sizeof(int64_t) * 2 * ((size_t)n_seq + 1);
}

typedef struct job {
    const fl_paged_kv *kv;
    const fl_paged_seq *seqs;
    int32_t n_seq;
    const fl_paged_attn_params *pp;
    const float *q;
    float *out;
    plan pl;
    float *thread_ws;     /* [nth][per_thread] */
    float *partial;       /* split-K partial states */
    int64_t *item_base;   /* [n_seq + 1] first phase-1 item of each sequence */
    int64_t *part_base;   /* [n_seq + 1] first partial float of each split sequence */
    atomic_llong next;
    vec_ops ops;          /* dot / axpy variant for the whole call */
    bool all_kv;          /* the sequences that may (all_kv_ok) take all kv heads per item */
} job;

/* Dequantise rows [ja, jb) of block `id` for kv head kh from `src` (kv->k or kv->v, with its
 * fp8 scales `scl` or NULL) into dst (row j at j * hd). */
static void load_rows(const fl_paged_kv *kv, const uint8_t *src, const float *scl, int32_t id, int32_t kh, int32_t ja, int32_t jb,
                      float *dst) {
    FL_ASSERT(id > 0); /* the null block has no storage: only out-of-window blocks may be null */
    const size_t off = (size_t)(id - 1) * kv->block_bytes;
    const int32_t hd = kv->head_dim;
    if (kv->type == FL_TYPE_F16 || kv->type == FL_TYPE_BF16) { /* plain 16-bit rows: one SIMD conversion per head slice */
        const fl_convert_kernels *cv = fl_convert_kernels_get();
        void (*conv)(const uint16_t *, float *, int64_t) = kv->type == FL_TYPE_F16 ? cv->f16_to_f32 : cv->bf16_to_f32;
        for (int32_t j = ja; j < jb; j++)
            conv((const uint16_t *)(src + off + (size_t)j * kv->row_bytes) + (size_t)kh * (size_t)hd, dst + (size_t)j * (size_t)hd, hd);
        return;
    }
    const float sc = scl ? scl[(size_t)(id - 1) * (size_t)kv->n_head_kv + (size_t)kh] : 1.0f;
    for (int32_t j = ja; j < jb; j++)
        fl_kv_dequant(kv->type, src + off + (size_t)j * kv->row_bytes, (int64_t)kh * hd, hd, sc, dst + (size_t)j * (size_t)hd);
}

/* A 16 x 16 transpose in registers: r[j] lane d -> r[d] lane j (unpacks within 128-bit lanes,
 * then 128-bit lane shuffles).  Every loop unrolled, so r, t and u stay in registers: with the
 * loops left in, GCC kept the three arrays on the stack and each stage went through memory. */
#define T16_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl")))
T16_INLINE void transpose16_avx512(__m512 r[16]) {
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);     /* per lane a0 b0 a1 b1 */
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]); /* a2 b2 a3 b3 */
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* u[4i + k] lane L: column 4L + k of rows 4i .. 4i + 3 */
        u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), w0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
        const __m512 v1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), w1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
        r[k] = _mm512_shuffle_f32x4(v0, v1, 0x88);
        r[8 + k] = _mm512_shuffle_f32x4(v0, v1, 0xDD);
        r[4 + k] = _mm512_shuffle_f32x4(w0, w1, 0x88);
        r[12 + k] = _mm512_shuffle_f32x4(w0, w1, 0xDD);
    }
}

/* The element types the AVX-512 block loader reads. */
enum { L16_F16, L16_BF16, L16_E4M3, L16_E5M2, L16_Q8_0, L16_Q4_0 };

/* Elements [e, e + 16) of the row at `row` as f32: f16 / bf16 exact; fp8 sc x the code's value;
 * q8_0 d x q, q4_0 d x (q - 8) in groups of 32 (f16 d, then the codes; q4_0's low nibbles are
 * the group's first 16, the high ones the last), e a multiple of 16 -- each as fl_kv_dequant
 * computes it (one multiply), so the same bits.  m 0: zeros, and nothing is read. */
T16_INLINE __m512 load16_f32(const uint8_t *row, int64_t e, const int kind, __m512 sc, __mmask16 m) {
    switch (kind) {
    case L16_E4M3: case L16_E5M2: return _mm512_mul_ps(sc, fl_fp8x16_to_f32(row + e, kind == L16_E5M2, m));
    case L16_Q8_0: case L16_Q4_0: return m ? fl_kvq16_to_f32(row, e, kind == L16_Q8_0) : _mm512_setzero_ps();
    default: {
        const __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * e);
        return kind == L16_BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
    }
    }
}

T16_INLINE void load_block16_t(const fl_paged_kv *kv, const int kind, int32_t id, int32_t kh, int32_t ja, int32_t jb, float *kb, float *vb) {
    const int32_t hd = kv->head_dim;
    const size_t off = (size_t)(id - 1) * kv->block_bytes, rb = kv->row_bytes;
    const int64_t e0 = (int64_t)kh * hd; /* the head's first element in a row */
    const bool fp8 = kind == L16_E4M3 || kind == L16_E5M2;
    const size_t si = (size_t)(id - 1) * (size_t)kv->n_head_kv + (size_t)kh; /* (fp8: the block's scales for kh) */
    const __m512 sk = _mm512_set1_ps(fp8 ? kv->k_scale[si] : 1.0f), sv = _mm512_set1_ps(fp8 ? kv->v_scale[si] : 1.0f);
    __mmask16 rm[16]; /* rows outside [ja, jb): not read, zeros */
#pragma GCC unroll 16
    for (int32_t j = 0; j < 16; j++) rm[j] = (__mmask16)(j >= ja && j < jb ? 0xFFFF : 0);
    for (int32_t c = 0; c < hd; c += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int32_t j = 0; j < 16; j++) r[j] = load16_f32(kv->k + off + (size_t)j * rb, e0 + c, kind, sk, rm[j]);
        transpose16_avx512(r);
#pragma GCC unroll 16
        for (int32_t d = 0; d < 16; d++) _mm512_storeu_ps(kb + (size_t)(c + d) * 16, r[d]);
    }
    for (int32_t j = ja; j < jb; j++)
        for (int32_t c = 0; c < hd; c += 16)
            _mm512_storeu_ps(vb + (size_t)j * (size_t)hd + (size_t)c, load16_f32(kv->v + off + (size_t)j * rb, e0 + c, kind, sv, 0xFFFF));
}

/* load_block for AVX-512 on 16-row blocks of f16, bf16, fp8, q8_0 or q4_0 with head_dim a
 * multiple of 16 (32 for q8_0 / q4_0, whose groups then stay within a head): K converted and
 * transposed 16 x 16 in registers straight into kb (kb[d * 16 + j]; rows outside [ja, jb) as
 * zeros, which the scorer masks like the stale rows it had there before), V converted into vb,
 * the same values as the row conversions and the scalar transpose.  16 sequences at 32-64
 * positions, one decode row each, 22 layers of 4 x 64-dim kv heads (a microbenchmark with the
 * caches flushed between layers, the two alternated): 1.09-1.12x.  fp8, q8_0 and q4_0 rows had
 * gone through fl_kv_dequant and a scalar transpose of K. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void load_block16_avx512(const fl_paged_kv *kv, int32_t id, int32_t kh,
                                                                                  int32_t ja, int32_t jb, float *kb, float *vb) {
    FL_ASSERT(id > 0);
    switch (kv->type) {
    case FL_TYPE_BF16: load_block16_t(kv, L16_BF16, id, kh, ja, jb, kb, vb); break;
    case FL_TYPE_FP8_E4M3: load_block16_t(kv, L16_E4M3, id, kh, ja, jb, kb, vb); break;
    case FL_TYPE_FP8_E5M2: load_block16_t(kv, L16_E5M2, id, kh, ja, jb, kb, vb); break;
    case FL_TYPE_Q8_0: load_block16_t(kv, L16_Q8_0, id, kh, ja, jb, kb, vb); break;
    case FL_TYPE_Q4_0: load_block16_t(kv, L16_Q4_0, id, kh, ja, jb, kb, vb); break;
    default: load_block16_t(kv, L16_F16, id, kh, ja, jb, kb, vb); break;
    }
}

/* Whether load_block16_avx512 takes a block of this layer (with the AVX-512 scorer). */
static bool fast16_ok(const fl_paged_kv *kv) {
    if (kv->block_size != 16 || kv->head_dim % 16) return false;
    switch (kv->type) {
    case FL_TYPE_F16: case FL_TYPE_BF16: case FL_TYPE_FP8_E4M3: case FL_TYPE_FP8_E5M2: return true;
    case FL_TYPE_Q8_0: case FL_TYPE_Q4_0: return kv->head_dim % 32 == 0;
    default: return false;
    }
}

/* K and V rows [ja, jb) of block `id` for kv head kh: V into vb (row j at j * hd), K into kb
 * the same way, or transposed (kb[d * bs + j], through vb first) when the scorer wants it, or
 * transposed at stride 16 for the AVX2 update (kt16). */
static void load_block(const fl_paged_kv *kv, int32_t id, int32_t kh, int32_t ja, int32_t jb, float *kb, float *vb, bool k_t,
                       bool kt16) {
    if (kt16) {
        load_rows(kv, kv->k, kv->k_scale, id, kh, ja, jb, vb);
        fl_attn_kt16_avx2(vb, kv->head_dim, ja, jb, kb);
    } else if (k_t) {
        const int32_t hd = kv->head_dim, bs = kv->block_size;
        load_rows(kv, kv->k, kv->k_scale, id, kh, ja, jb, vb);
        for (int32_t j = ja; j < jb; j++)
            for (int32_t d = 0; d < hd; d++) kb[(size_t)d * (size_t)bs + (size_t)j] = vb[(size_t)j * (size_t)hd + (size_t)d];
    } else
        load_rows(kv, kv->k, kv->k_scale, id, kh, ja, jb, kb);
    load_rows(kv, kv->v, kv->v_scale, id, kh, ja, jb, vb);
}

/* Bring kv heads [kh, kh + nkh) of every row of block `id` in K and V into the cache with demand
 * loads, one byte of each line: the block the loop takes next arrives while this one is
 * scored (a block's rows are row_bytes apart, and its conversion waits on each row's load, the
 * update between two blocks being longer than the out-of-order window).  Software prefetches
 * (T0 or T1, 1, 2 or 4 blocks ahead, whole rows or one head's slice) changed nothing
 * measurable on the Zen 5 VM, where these loads made one layer's decode attention at 4096 tokens
 * (22 layers cycled, 2 threads, a throwaway harness calling fl_paged_attn) take 7.4 against
 * 11.2 ms, and 16 sequences at 48 tokens 1.74 against 2.11 ms; two blocks ahead 7.8 / 1.92.  (An
 * earlier T1 prefetch here had measured 0.80-0.85x the time of none on another machine.) */
static void warm_block(const fl_paged_kv *kv, int32_t id, int32_t kh, int32_t nkh) {
    if (id <= 0) return;
    const size_t slice = kv->row_bytes / (size_t)kv->n_head_kv, off = (size_t)(id - 1) * kv->block_bytes + (size_t)kh * slice;
    uint8_t x = 0;
    for (int32_t j = 0; j < kv->block_size; j++)
        for (size_t l = 0; l < (size_t)nkh * slice; l += 64) x ^= kv->k[off + (size_t)j * kv->row_bytes + l] ^ kv->v[off + (size_t)j * kv->row_bytes + l];
    __asm__ volatile("" : : "r"(x)); /* (the loads are the point) */
}

/* States for rows [ra, rb) of sequence s (relative rows), the heads of kv heads [kh0, kh0 + nkh),
 * over blocks [b_lo, b_hi): each block for each of those kv heads in turn (a head's blocks come
 * in the same order whatever nkh is, so the same bits).  st: [(rb - ra)][nkh g][hd + 2],
 * initialised here. */
static void run_blocks(const job *jb_, const fl_paged_seq *s, int32_t kh0, int32_t nkh, int32_t ra, int32_t rb, int32_t b_lo,
                       int32_t b_hi, float *st, float *kb, float *vb, float *sc) {
    const fl_paged_kv *kv = jb_->kv;
    const fl_paged_attn_params *pp = jb_->pp;
    const int32_t hd = kv->head_dim, bs = kv->block_size, g = pp->n_head / kv->n_head_kv, w = pp->window;
    const size_t ss = (size_t)hd + 2;
    for (int32_t i = 0; i < (rb - ra) * nkh * g; i++) state_init(st + (size_t)i * ss, hd);
    const int32_t p_first = s->pos0 + ra, p_last = s->pos0 + rb - 1;
    const bool kt16 = jb_->ops.kt16 && bs <= 16;
    const bool fast16 = jb_->ops.scores_t == scores_avx512_t && fast16_ok(kv);
    const int32_t lo_tile = w > 0 && p_first - w + 1 > 0 ? p_first - w + 1 : 0;
    for (int32_t b = b_lo; b < b_hi; b++) {
        const int32_t j0 = b * bs;
        const int32_t ja = lo_tile > j0 ? lo_tile - j0 : 0;        /* first block row anyone sees */
        const int32_t jz = p_last - j0 + 1 < bs ? p_last - j0 + 1 : bs; /* one past the last */
        if (ja >= jz) continue;
        if (b + 1 < b_hi) warm_block(kv, s->blocks[b + 1], kh0, nkh);
        for (int32_t kh = kh0; kh < kh0 + nkh; kh++) {
            if (fast16) load_block16_avx512(kv, s->blocks[b], kh, ja, jz, kb, vb);
            else load_block(kv, s->blocks[b], kh, ja, jz, kb, vb, jb_->ops.scores_t != NULL, kt16);
            for (int32_t r = ra; r < rb; r++) {
                const int32_t p = s->pos0 + r;
                const int32_t lo = w > 0 && p - w + 1 > 0 ? p - w + 1 : 0;
                const int32_t ra_ = lo > j0 ? lo - j0 : 0, rz = p - j0 + 1 < bs ? p - j0 + 1 : bs;
                if (ra_ >= rz) continue; /* nothing of this block is visible to row r */
                const float *q_r = jb_->q + ((size_t)(s->q0 + r) * (size_t)pp->n_head + (size_t)(kh * g)) * (size_t)hd;
                float *st_r = st + ((size_t)(r - ra) * (size_t)nkh + (size_t)(kh - kh0)) * (size_t)g * ss;
                if (jb_->ops.scores_t == scores_avx512_t && bs <= 16) /* the group's heads together */
                    update16_heads(g, st_r, ss, q_r, hd, kb, vb, ra_, rz, bs, pp->scale);
                else if (kt16) fl_attn_block16_avx2(g, st_r, ss, q_r, hd, kb, vb, ra_, rz, pp->scale);
                else
                    for (int32_t gi = 0; gi < g; gi++)
                        state_update(&jb_->ops, st_r + (size_t)gi * ss, q_r + (size_t)gi * (size_t)hd, kb, vb, ra_, rz, hd, bs, pp->scale, sc);
            }
        }
    }
}

/* The kv heads of each of sq's items (all of them, or one). */
static int32_t item_heads(const job *J, const fl_paged_seq *sq) { return J->all_kv && all_kv_ok(J->kv, sq) ? J->kv->n_head_kv : 1; }

/* The first block of item it (sequence s or a later one) for its kv heads. */
static void warm_item(const job *J, int32_t s, int64_t it) {
    while (J->item_base[s + 1] <= it) s++;
    const fl_paged_seq *sq = &J->seqs[s];
    const int64_t local = it - J->item_base[s];
    const int32_t nkh = item_heads(J, sq);
    if (J->part_base[s + 1] > J->part_base[s]) { /* (split-K) */
        const int32_t nparts = n_parts_of(J->kv, sq, J->pp);
        warm_block(J->kv, sq->blocks[(local % nparts) * J->pp->part_blocks], (int32_t)(local / nparts) * nkh, nkh);
    } else {
        /* (block 0 of the table; where a sliding window has dropped it, the null block: nothing) */
        warm_block(J->kv, sq->blocks[0], (int32_t)(local / ((sq->n_q + Q_TILE - 1) / Q_TILE)) * nkh, nkh);
    }
}

static void phase1(void *ctx, int ith, int nth) {
    job *J = ctx;
    const fl_paged_kv *kv = J->kv;
    const fl_paged_attn_params *pp = J->pp;
    const int32_t hd = kv->head_dim, bs = kv->block_size, g = pp->n_head / kv->n_head_kv;
    const size_t ss = (size_t)hd + 2;
    float *kb = J->thread_ws + (size_t)ith * J->pl.per_thread;
    float *vb = kb + (size_t)k_rows(kv) * (size_t)hd;
    float *sc = vb + (size_t)bs * (size_t)hd;
    float *run = sc + bs;                       /* [Q_TILE][g][hd + 2] merged so far */
    float *part = run + (size_t)Q_TILE * (size_t)g * ss; /* [Q_TILE][g][hd + 2] one partition */
    (void)nth;
    int32_t s = 0;
    int64_t nx = atomic_fetch_add(&J->next, 1);
    for (;;) {
        /* each thread holds the item after its current one, whose first block is warmed
         * meanwhile (a decode step's items are one to a few blocks each) */
        const int64_t it = nx;
        if (it >= J->pl.n_items) break;
        nx = atomic_fetch_add(&J->next, 1);
        while (J->item_base[s + 1] <= it) s++; /* items are taken in increasing order per thread */
        if (nx < J->pl.n_items) warm_item(J, s, nx);
        const fl_paged_seq *sq = &J->seqs[s];
        const int64_t local = it - J->item_base[s];
        const int32_t nblk = n_blocks_of(kv, sq), P = pp->part_blocks, nparts = n_parts_of(kv, sq, pp);
        const int32_t nkh = item_heads(J, sq), gh = nkh * g; /* the item's kv heads, their query heads */
        if (J->part_base[s + 1] > J->part_base[s]) {
            /* split-K: one partition for all rows of this sequence; partial state out */
            const int32_t kh = (int32_t)(local / nparts) * nkh, pi = (int32_t)(local % nparts);
            const int32_t b_hi = (pi + 1) * P < nblk ? (pi + 1) * P : nblk;
            run_blocks(J, sq, kh, nkh, 0, sq->n_q, pi * P, b_hi, part, kb, vb, sc);
            for (int32_t r = 0; r < sq->n_q; r++) /* (the item's heads are consecutive in both) */
                memcpy(J->partial + J->part_base[s] +
                           (((size_t)pi * (size_t)sq->n_q + (size_t)r) * (size_t)pp->n_head + (size_t)(kh * g)) * ss,
                       part + (size_t)r * (size_t)gh * ss, sizeof(float) * ss * (size_t)gh);
        } else {
            /* a tile of rows, all partitions in order, merged as they come */
            const int32_t ntile = (sq->n_q + Q_TILE - 1) / Q_TILE;
            const int32_t kh = (int32_t)(local / ntile) * nkh, ti = (int32_t)(local % ntile);
            const int32_t ra = ti * Q_TILE, rb = ra + Q_TILE < sq->n_q ? ra + Q_TILE : sq->n_q;
            const bool v512 = J->ops.scores_t == scores_avx512_t;
            /* the first partition straight into run (merging into an empty state is a copy, or
             * nothing where no key was visible: the state run_blocks starts from) */
            for (int32_t pi = 0; pi < nparts; pi++) {
                const int32_t b_hi = (pi + 1) * P < nblk ? (pi + 1) * P : nblk;
                run_blocks(J, sq, kh, nkh, ra, rb, pi * P, b_hi, pi ? part : run, kb, vb, sc);
                if (pi)
                    for (int32_t i = 0; i < (rb - ra) * gh; i++)
                        (v512 ? state_merge_avx512 : state_merge)(run + (size_t)i * ss, part + (size_t)i * ss, hd);
            }
            void (*final)(const float *, float *, int32_t) = v512 ? state_final_avx512 : state_final;
            for (int32_t r = ra; r < rb; r++)
                for (int32_t hh = 0; hh < gh; hh++)
                    final(run + ((size_t)(r - ra) * (size_t)gh + (size_t)hh) * ss,
                          J->out + ((size_t)(sq->q0 + r) * (size_t)pp->n_head + (size_t)(kh * g + hh)) * (size_t)hd, hd);
        }
    }
}

/* Merge the split-K partials of each (row, head) in partition order. */
static void phase2(void *ctx, int ith, int nth) {
    job *J = ctx;
    const int32_t hd = J->kv->head_dim, nh = J->pp->n_head;
    const size_t ss = (size_t)hd + 2;
    float *run = J->thread_ws + (size_t)ith * J->pl.per_thread;
    void (*merge)(float *, const float *, int32_t) = J->ops.scores_t == scores_avx512_t ? state_merge_avx512 : state_merge;
    int64_t k = 0;
    for (int32_t s = 0; s < J->n_seq; s++) {
        const fl_paged_seq *sq = &J->seqs[s];
        if (J->part_base[s + 1] == J->part_base[s]) continue; /* (not split) */
        const int32_t nparts = n_parts_of(J->kv, sq, J->pp);
        for (int32_t r = 0; r < sq->n_q; r++)
            for (int32_t h = 0; h < nh; h++, k++) {
                if (k % nth != ith) continue;
                state_init(run, hd);
                for (int32_t pi = 0; pi < nparts; pi++)
                    merge(run, J->partial + J->part_base[s] + (((size_t)pi * (size_t)sq->n_q + (size_t)r) * (size_t)nh + (size_t)h) * ss, hd);
                state_final(run, J->out + ((size_t)(sq->q0 + r) * (size_t)nh + (size_t)h) * (size_t)hd, hd);
            }
    }
}

void fl_paged_attn(const fl_paged_kv *kv, const fl_paged_seq *seqs, int32_t n_seq,
                   const fl_paged_attn_params *pp, const float *q, float *out, void *ws) {
    FL_ASSERT(pp->n_head % kv->n_head_kv == 0 && pp->part_blocks >= 1);
    const int nth = fl_threads_get();
    job J = {.kv = kv, .seqs = seqs, .n_seq = n_seq, .pp = pp, .q = q, .out = out, .ops = pick_ops()};
    J.pl = make_plan(kv, seqs, n_seq, pp);
    J.thread_ws = ws;
    J.partial = J.thread_ws + J.pl.per_thread * (size_t)nth;
    J.item_base = (int64_t *)(J.partial + J.pl.n_partial);
    J.part_base = J.item_base + n_seq + 1;
    J.item_base[0] = J.part_base[0] = 0;
    const size_t ss = (size_t)kv->head_dim + 2;
    const int64_t budget = split_budget(kv, seqs, n_seq, pp);
    /* all kv heads per item where that leaves the threads ALL_KV_ITEMS items each (one sequence's
     * decode at a short context keeps an item per kv head, or a thread would idle) */
    int64_t used = 0, n_all = 0;
    for (int32_t s = 0; s < n_seq; s++) n_all += n_items_of(kv, &seqs[s], pp, take_split(kv, &seqs[s], pp, budget, &used), true);
    J.all_kv = kv->n_head_kv > 1 && n_all >= (int64_t)ALL_KV_ITEMS * nth;
    used = 0;
    for (int32_t s = 0; s < n_seq; s++) { /* (as make_plan: a split sequence has partial states) */
        const bool split = take_split(kv, &seqs[s], pp, budget, &used);
        J.item_base[s + 1] = J.item_base[s] + n_items_of(kv, &seqs[s], pp, split, J.all_kv);
        J.part_base[s + 1] = J.part_base[s];
        if (split)
            J.part_base[s + 1] += (int64_t)((size_t)n_parts_of(kv, &seqs[s], pp) * (size_t)seqs[s].n_q * (size_t)pp->n_head * ss);
    }
    J.pl.n_items = J.item_base[n_seq];
    atomic_init(&J.next, 0);
    if (J.pl.n_items) fl_parallel(phase1, &J);
    if (J.pl.n_merge) fl_parallel(phase2, &J);
}

/* ---- naive reference ---- */

void fl_paged_attn_naive(const fl_paged_kv *kv, const fl_paged_seq *seqs, int32_t n_seq,
                         const fl_paged_attn_params *pp, const float *q, float *out) {
    const int32_t hd = kv->head_dim, bs = kv->block_size, g = pp->n_head / kv->n_head_kv;
    FL_ASSERT(hd <= 512);
    float kr[512], vr[512];
    double acc[512];
    for (int32_t s = 0; s < n_seq; s++) {
        const fl_paged_seq *sq = &seqs[s];
        for (int32_t r = 0; r < sq->n_q; r++) {
            const int32_t p = sq->pos0 + r;
            const int32_t lo = pp->window > 0 && p - pp->window + 1 > 0 ? p - pp->window + 1 : 0;
            for (int32_t h = 0; h < pp->n_head; h++) {
                const int32_t kh = h / g;
                const float *qh = q + ((size_t)(sq->q0 + r) * (size_t)pp->n_head + (size_t)h) * (size_t)hd;
                double mx = -INFINITY, l = 0;
                for (int pass = 0; pass < 2; pass++) {
                    for (int32_t j = lo; j <= p; j++) {
                        const int32_t id = sq->blocks[j / bs];
                        FL_ASSERT(id > 0);
                        const size_t ro = (size_t)(id - 1) * kv->block_bytes + (size_t)(j % bs) * kv->row_bytes;
                        const size_t si = (size_t)(id - 1) * (size_t)kv->n_head_kv + (size_t)kh;
                        fl_kv_dequant(kv->type, kv->k + ro, (int64_t)kh * hd, hd, kv->k_scale ? kv->k_scale[si] : 1.0f, kr);
                        double sdot = 0;
                        for (int32_t d = 0; d < hd; d++) sdot += (double)qh[d] * kr[d];
                        sdot *= pp->scale;
                        if (pass == 0) {
                            if (sdot > mx) mx = sdot;
                            continue;
                        }
                        fl_kv_dequant(kv->type, kv->v + ro, (int64_t)kh * hd, hd, kv->v_scale ? kv->v_scale[si] : 1.0f, vr);
                        const double e = exp(sdot - mx);
                        l += e;
                        for (int32_t d = 0; d < hd; d++) acc[d] = (j == lo ? 0.0 : acc[d]) + e * vr[d];
                    }
                }
                float *o = out + ((size_t)(sq->q0 + r) * (size_t)pp->n_head + (size_t)h) * (size_t)hd;
                for (int32_t d = 0; d < hd; d++) o[d] = (float)(acc[d] / l);
            }
        }
    }
}
