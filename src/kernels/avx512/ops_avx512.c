/* AVX-512 variants of the hot forward ops (spec: kernels/ref/ops.c).  Each zmm lane holds one
 * element of the row; tails (n % 16) go through a masked load/store. */
#include "kernels/ops.h"
#include "kernels/avx512/exp512.h"

#include <immintrin.h>
#include <math.h>

static inline __mmask16 tail_mask(int64_t n) { return (__mmask16)((1u << n) - 1u); }

float fl_dot_f32_avx512(const float *a, const float *b, int64_t n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

void fl_axpy_f32_avx512(float *y, float a, const float *x, int64_t n) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* 16 rows of W at a time: column j of the 16 gathered into a vector (once per block, for every
 * row of x), then per row of x one fma per j with x[m][j] broadcast; rows past N masked. */
void fl_mm_smallk_f32_avx512(float *y, int64_t ldy, const float *x, int64_t M, const float *W, int64_t N, int64_t K) {
    enum { KMAX = 64 };
    if (K > KMAX) {
        fl_mm_smallk_f32_ref(y, ldy, x, M, W, N, K);
        return;
    }
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)K));
    __m512 col[KMAX];
    for (int64_t c = 0; c < N; c += 16) {
        const __mmask16 m = N - c >= 16 ? (__mmask16)0xFFFF : tail_mask(N - c);
        const float *wc = W + c * K;
        for (int64_t j = 0; j < K; j++) col[j] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, rows, wc + j, 4);
        for (int64_t r = 0; r < M; r++) {
            const float *xr = x + r * K;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t j = 0; j < K; j++) acc = _mm512_fmadd_ps(_mm512_set1_ps(xr[j]), col[j], acc);
            _mm512_mask_storeu_ps(y + r * ldy + c, m, acc);
        }
    }
}

void fl_scale_f32_avx512(float *y, float a, int64_t n) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(va, _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

void fl_rmsnorm_row_avx512(float *out, const float *inp, const float *weight, int64_t C, float eps) {
    /* f32 squares summed in double (as the reference): 8 products per step, widened */
    __m512d acc = _mm512_setzero_pd();
    int64_t j = 0;
    for (; j + 8 <= C; j += 8) {
        const __m256 v = _mm256_loadu_ps(inp + j);
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_mul_ps(v, v)));
    }
    double ss = _mm512_reduce_add_pd(acc);
    for (; j < C; j++) ss += (double)(inp[j] * inp[j]);
    const __m512 rstd = _mm512_set1_ps(1.0f / sqrtf((float)(ss / (double)C) + eps));
    int64_t i = 0;
    for (; i + 16 <= C; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(inp + i), rstd), _mm512_loadu_ps(weight + i)));
    if (i < C) {
        const __mmask16 m = tail_mask(C - i);
        _mm512_mask_storeu_ps(out + i, m,
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, inp + i), rstd),
                                            _mm512_maskz_loadu_ps(m, weight + i)));
    }
}

void fl_expf_poly_row_avx512(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, fl_exp512(_mm512_loadu_ps(x + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, fl_exp512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

static inline __m512 swiglu512(__m512 g, __m512 u) {
    const __m512 e = fl_exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

/* silu(g) u = g / (1 + exp(-g)) u with exp512 on every lane (the tail masked): the arithmetic
 * of llama.cpp's CPU SwiGLU, which its logits depend on (see fl_expf_poly). */
void fl_swiglu_avx512(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, swiglu512(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(out + i, m, swiglu512(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i)));
    }
}

/* fl_argmax_f32_ref: the maximum over 16 lanes (NaN-free rows; a NaN sends the row to the
 * reference loop), then the first index holding it (-0 and +0 compare equal, as in the loop). */
int64_t fl_argmax_f32_avx512(const float *x, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, v);
    }
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, v);
    }
    if (nan) return fl_argmax_f32_ref(x, n);
    const float mx = _mm512_reduce_max_ps(m);
    const __m512 mv = _mm512_set1_ps(mx);
    for (i = 0; i + 16 <= n; i += 16) {
        const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), mv, _CMP_EQ_OQ);
        if (eq) return i + __builtin_ctz(eq);
    }
    for (; i < n; i++)
        if (x[i] == mx) return i;
    return 0; /* (not reached: the maximum is one of the values) */
}
