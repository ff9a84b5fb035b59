/* AVX2 variants of the hot forward ops (spec: kernels/ref/ops.c), the AVX-512 ones' twins: each
 * ymm lane holds one element of the row; tails (n % 8) go through masked loads and stores.
 * SwiGLU and the polynomial exp give the reference's bits: the same fused multiply-adds, and
 * 2^n applied in two exact-or-once-rounded power-of-two products where the reference calls
 * ldexpf (so denormal results round as ldexpf rounds them). */
#include "kernels/avx2/exp_avx2.h"
#include "kernels/ops.h"

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>

static inline __m256i tail_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float fl_dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    if (i < n) {
        const __m256i m = tail_mask(n - i);
        acc1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc1);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
}

void fl_axpy_f32_avx2(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        const __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(va, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m)));
    }
}

void fl_scale_f32_avx2(float *y, float a, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    if (i < n) {
        const __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(va, _mm256_maskload_ps(y + i, m)));
    }
}

void fl_rmsnorm_row_avx2(float *out, const float *inp, const float *weight, int64_t C, float eps) {
    /* f32 squares summed in double (as the reference): 4 products per step, widened */
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
    int64_t j = 0;
    for (; j + 8 <= C; j += 8) {
        const __m256 v = _mm256_loadu_ps(inp + j), sq = _mm256_mul_ps(v, v);
        acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(acc0, acc1));
    double ss = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; j < C; j++) ss += (double)(inp[j] * inp[j]);
    const __m256 rstd = _mm256_set1_ps(1.0f / sqrtf((float)(ss / (double)C) + eps));
    int64_t i = 0;
    for (; i + 8 <= C; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(inp + i), rstd), _mm256_loadu_ps(weight + i)));
    if (i < C) {
        const __m256i m = tail_mask(C - i);
        _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(inp + i, m), rstd), _mm256_maskload_ps(weight + i, m)));
    }
}

/* fl_exp_avx2 (kernels/avx2/exp_avx2.h) 8 lanes at a time, the tail masked */
void fl_expf_poly_row_avx2(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, fl_exp_avx2(_mm256_loadu_ps(x + i)));
    if (i < n) {
        const __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(y + i, m, fl_exp_avx2(_mm256_maskload_ps(x + i, m)));
    }
}

static inline __m256 swiglu256(__m256 g, __m256 u) {
    const __m256 e = fl_exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

/* silu(g) u = g / (1 + exp(-g)) u with fl_exp_avx2 on every lane (the tail masked), as the reference. */
void fl_swiglu_avx2(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, swiglu256(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        const __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(out + i, m, swiglu256(_mm256_maskload_ps(gate + i, m), _mm256_maskload_ps(up + i, m)));
    }
}

/* fl_argmax_f32_ref: the maximum over 8 lanes (NaN-free rows; a NaN sends the row to the
 * reference loop), then the first index holding it. */
int64_t fl_argmax_f32_avx2(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
    }
    float mx = -INFINITY;
    bool has_nan = _mm256_movemask_ps(nan) != 0;
    for (; i < n; i++) {
        if (x[i] != x[i]) has_nan = true;
        mx = x[i] > mx ? x[i] : mx;
    }
    if (has_nan) return fl_argmax_f32_ref(x, n);
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++) mx = lanes[l] > mx ? lanes[l] : mx;
    const __m256 mv = _mm256_set1_ps(mx);
    for (i = 0; i + 8 <= n; i += 8) {
        const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
        if (eq) return i + __builtin_ctz((unsigned)eq);
    }
    for (; i < n; i++)
        if (x[i] == mx) return i;
    return 0; /* (not reached: the maximum is one of the values) */
}
