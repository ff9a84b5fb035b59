/* AVX2 block update of paged attention (kv/paged_attn.c; contract in kernels/attn.h): a block
 * of at most 16 keys for the heads of one KV group, with K transposed (16 keys of a dim in two
 * ymm), so that one load of a dim's keys serves two heads' fmas and the scores of a block come
 * out as two vectors per head, with no horizontal sum per key.
 *
 * Per head, whatever the number of heads taken together (a query's bits must not depend on how
 * the heads of its group are split):
 * - scores: dims in two chains (even, odd), added, times scale;
 * - m = max(m, max of the visible scores); alpha = expf(m_old - m) (0 for an empty state);
 *   p = fl_exp_avx2(s - m) on visible keys, 0 elsewhere;
 * - l = l alpha + the 16 p added as a tree;
 * - acc = acc alpha + sum_j p_j v_j, keys in increasing order per dim (the arithmetic of the
 *   row-major accum of paged_attn.c). */
#include "kernels/attn.h"
#include "kernels/avx2/exp_avx2.h"
#include "kernels/avx2/f16x8_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#define INLINE static inline __attribute__((always_inline))

/* 8 x 8 transpose: r[i] row i (8 floats) -> r[d] column d */
INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    #pragma GCC unroll 8
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    #pragma GCC unroll 8
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    #pragma GCC unroll 8
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

void fl_attn_kt16_avx2(const float *rows, int32_t hd, int32_t ja, int32_t jz, float *kt) {
    int32_t d = 0;
    for (; d + 8 <= hd; d += 8)
        #pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            __m256 r[8];
            #pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const int32_t j = 8 * h + i;
                r[i] = j >= ja && j < jz ? _mm256_loadu_ps(rows + (size_t)j * (size_t)hd + d) : _mm256_setzero_ps();
            }
            transpose8(r);
            #pragma GCC unroll 8
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(kt + (size_t)(d + i) * 16 + 8 * h, r[i]);
        }
    for (; d < hd; d++)
        for (int32_t j = 0; j < 16; j++) kt[(size_t)d * 16 + j] = j >= ja && j < jz ? rows[(size_t)j * (size_t)hd + d] : 0.0f;
}

INLINE float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc[h][d0, d0 + 8 NC) = alpha_h acc + sum_j p[h][j] v_j, N heads x NC vectors of 8 dims */
INLINE void accum_n(const int N, const int NC, float *const *acc, const float *al, const float (*p)[16], const float *vb,
                    int32_t ja, int32_t jb, int32_t hd, int32_t d0) {
    __m256 x[2][4];
    #pragma GCC unroll 8
    for (int h = 0; h < N; h++)
        #pragma GCC unroll 8
        for (int c = 0; c < NC; c++) x[h][c] = _mm256_mul_ps(_mm256_loadu_ps(acc[h] + d0 + 8 * c), _mm256_set1_ps(al[h]));
    for (int32_t j = ja; j < jb; j++) {
        const float *v = vb + (size_t)j * (size_t)hd + d0;
        __m256 vv[4];
        #pragma GCC unroll 8
        for (int c = 0; c < NC; c++) vv[c] = _mm256_loadu_ps(v + 8 * c);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) __asm__("" : "+x"(vv[c])); /* (see the scores) */
        #pragma GCC unroll 8
        for (int h = 0; h < N; h++) {
            const __m256 e = _mm256_set1_ps(p[h][j]);
            #pragma GCC unroll 8
            for (int c = 0; c < NC; c++) x[h][c] = _mm256_fmadd_ps(e, vv[c], x[h][c]);
        }
    }
    #pragma GCC unroll 8
    for (int h = 0; h < N; h++)
        #pragma GCC unroll 8
        for (int c = 0; c < NC; c++) _mm256_storeu_ps(acc[h] + d0 + 8 * c, x[h][c]);
}

/* N (1 or 2) heads: st[h] = {m, l, acc[hd]}, q[h] the query */
INLINE void update_n(const int N, float *const *st, const float *const *q, const float *kt, const float *vb, int32_t ja,
                     int32_t jb, int32_t hd, float scale) {
    __m256 a[2][2][2]; /* [head][keys 0..7, 8..15][dims even, odd] */
    #pragma GCC unroll 8
    for (int h = 0; h < N; h++)
        #pragma GCC unroll 8
        for (int k = 0; k < 2; k++) a[h][k][0] = a[h][k][1] = _mm256_setzero_ps();
    int32_t d = 0;
    for (; d + 2 <= hd; d += 2) {
        const float *k0 = kt + (size_t)d * 16, *k1 = k0 + 16;
        __m256 k00 = _mm256_loadu_ps(k0), k01 = _mm256_loadu_ps(k0 + 8);
        __m256 k10 = _mm256_loadu_ps(k1), k11 = _mm256_loadu_ps(k1 + 8);
        /* in registers: as memory operands GCC loaded them again for the second head, and the
         * loads, not the fmas, set the pace */
        __asm__("" : "+x"(k00), "+x"(k01), "+x"(k10), "+x"(k11));
        #pragma GCC unroll 8
        for (int h = 0; h < N; h++) {
            const __m256 q0 = _mm256_broadcast_ss(q[h] + d), q1 = _mm256_broadcast_ss(q[h] + d + 1);
            a[h][0][0] = _mm256_fmadd_ps(q0, k00, a[h][0][0]);
            a[h][1][0] = _mm256_fmadd_ps(q0, k01, a[h][1][0]);
            a[h][0][1] = _mm256_fmadd_ps(q1, k10, a[h][0][1]);
            a[h][1][1] = _mm256_fmadd_ps(q1, k11, a[h][1][1]);
        }
    }
    if (d < hd) {
        const __m256 k00 = _mm256_loadu_ps(kt + (size_t)d * 16), k01 = _mm256_loadu_ps(kt + (size_t)d * 16 + 8);
        #pragma GCC unroll 8
        for (int h = 0; h < N; h++) {
            const __m256 q0 = _mm256_broadcast_ss(q[h] + d);
            a[h][0][0] = _mm256_fmadd_ps(q0, k00, a[h][0][0]);
            a[h][1][0] = _mm256_fmadd_ps(q0, k01, a[h][1][0]);
        }
    }
    const __m256i idx0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), idx1 = _mm256_add_epi32(idx0, _mm256_set1_epi32(8));
    const __m256i lo = _mm256_set1_epi32(ja - 1), hi = _mm256_set1_epi32(jb);
    const __m256 vis0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(idx0, lo), _mm256_cmpgt_epi32(hi, idx0)));
    const __m256 vis1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(idx1, lo), _mm256_cmpgt_epi32(hi, idx1)));
    const __m256 ninf = _mm256_set1_ps(-INFINITY), sv = _mm256_set1_ps(scale);
    float p[2][16], al[2], *acc[2];
    #pragma GCC unroll 8
    for (int h = 0; h < N; h++) {
        const __m256 s0 = _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_add_ps(a[h][0][0], a[h][0][1]), sv), vis0);
        const __m256 s1 = _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_add_ps(a[h][1][0], a[h][1][1]), sv), vis1);
        const float mb = hmax8(_mm256_max_ps(s0, s1));
        const float m_new = st[h][0] > mb ? st[h][0] : mb;
        al[h] = st[h][0] == -INFINITY ? 0.0f : st[h][0] == m_new ? 1.0f : expf(st[h][0] - m_new); /* (expf(0) is 1) */
        const __m256 mv = _mm256_set1_ps(m_new);
        const __m256 p0 = _mm256_and_ps(fl_exp_avx2(_mm256_sub_ps(s0, mv)), vis0);
        const __m256 p1 = _mm256_and_ps(fl_exp_avx2(_mm256_sub_ps(s1, mv)), vis1);
        _mm256_storeu_ps(p[h], p0);
        _mm256_storeu_ps(p[h] + 8, p1);
        st[h][1] = st[h][1] * al[h] + fl_hsum8_avx2(_mm256_add_ps(p0, p1));
        st[h][0] = m_new;
        acc[h] = st[h] + 2;
    }
    d = 0;
    for (; d + 32 <= hd; d += 32) accum_n(N, 4, acc, al, (const float(*)[16])p, vb, ja, jb, hd, d);
    for (; d + 8 <= hd; d += 8) accum_n(N, 1, acc, al, (const float(*)[16])p, vb, ja, jb, hd, d);
    for (; d < hd; d++)
        #pragma GCC unroll 8
        for (int h = 0; h < N; h++) {
            float x = acc[h][d] * al[h];
            for (int32_t j = ja; j < jb; j++) x = fmaf(p[h][j], vb[(size_t)j * (size_t)hd + d], x);
            acc[h][d] = x;
        }
}

void fl_attn_block16_avx2(int32_t n, float *st, size_t ss, const float *q, int32_t hd, const float *kt, const float *vb,
                          int32_t ja, int32_t jb, float scale) {
    int32_t h = 0;
    for (; h + 2 <= n; h += 2) {
        float *const s2[2] = {st + (size_t)h * ss, st + (size_t)(h + 1) * ss};
        const float *const q2[2] = {q + (size_t)h * (size_t)hd, q + (size_t)(h + 1) * (size_t)hd};
        update_n(2, s2, q2, kt, vb, ja, jb, hd, scale);
    }
    if (h < n) {
        float *const s1[1] = {st + (size_t)h * ss};
        const float *const q1[1] = {q + (size_t)h * (size_t)hd};
        update_n(1, s1, q1, kt, vb, ja, jb, hd, scale);
    }
}
