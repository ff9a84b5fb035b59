/* AVX2 integer tiles (Q8_0 / Q4_0 weights x 8-bit activations) and the f32 dot.
 * One ymm holds one block of 32 codes.  maddubs multiplies unsigned by signed bytes: Q4_0
 * nibbles enter as 0..15 and the -8 offset is removed by starting the block's int32 lanes at
 * -(activation code sum) (fl_act_q8.sv); Q8_0 uses |w| and sign(x, w).  Tiles of 2 rows x 2
 * tokens keep the accumulators in registers.  Reference: fl_gemm_q8_ref. */
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

INLINE __m256i block_dot(int32_t wtype, const char *w, int64_t b, __m256i x, __m256i init, float *dw) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (wtype == FL_TYPE_Q8_0) {
        const fl_block_q8_0 *p = (const fl_block_q8_0 *)w + b;
        *dw = _cvtsh_ss(p->d);
        const __m256i wv = _mm256_loadu_si256((const __m256i *)p->qs);
        const __m256i s16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(x, wv));
        (void)init;
        return _mm256_madd_epi16(s16, ones);
    } else {
        const fl_block_q4_0 *p = (const fl_block_q4_0 *)w + b;
        *dw = _cvtsh_ss(p->d);
        const __m128i q = _mm_loadu_si128((const __m128i *)p->qs);
        const __m128i m4 = _mm_set1_epi8(0x0F);
        const __m256i wv = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(q, m4)),
                                                   _mm_and_si128(_mm_srli_epi16(q, 4), m4), 1);
        return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wv, x), ones), init);
    }
}

INLINE void tile(int32_t wtype, const char *w, size_t ldw, const fl_act_q8 *a, int64_t m0, float *y, int64_t ldy,
                 const int NR, const int NT) {
    __m256 acc[2][2];
    #pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    const int64_t nb = a->nb, K = a->K;
    for (int64_t b = 0; b < nb; b++) {
        __m256i xv[2], iv[2];
        float dx[2];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const int64_t mb = (m0 + t) * nb + b;
            xv[t] = _mm256_loadu_si256((const __m256i *)(a->qs + (m0 + t) * K + b * 32));
            iv[t] = _mm256_loadu_si256((const __m256i *)(a->sv + mb * 8));
            dx[t] = a->d[mb];
        }
        #pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                float dw;
                const __m256i p = block_dot(wtype, w + r * ldw, b, xv[t], iv[t], &dw);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * dx[t]), acc[r][t]);
            }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[r][t]), _mm256_extractf128_ps(acc[r][t], 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            y[t * ldy + r] = _mm_cvtss_f32(s);
        }
}

void fl_gemm_q8_avx2(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt,
                     float *y, int64_t ldy) {
    const char *wc = w;
    for (int r = 0; r < nr; r += 2)
        for (int t = 0; t < nt; t += 2) {
            const char *wr = wc + r * ldw;
            float *yt = y + t * ldy + r;
            if (r + 2 <= nr && t + 2 <= nt) tile(wtype, wr, ldw, a, m0 + t, yt, ldy, 2, 2);
            else if (r + 2 <= nr) tile(wtype, wr, ldw, a, m0 + t, yt, ldy, 2, 1);
            else if (t + 2 <= nt) tile(wtype, wr, ldw, a, m0 + t, yt, ldy, 1, 2);
            else tile(wtype, wr, ldw, a, m0 + t, yt, ldy, 1, 1);
        }
}

float fl_dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    s0 = _mm256_add_ps(s0, s1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}
