/*
 * ops.h - the element-wise and row ops of the llama forward, as free functions.
 *
 * Argument order follows llm.c (outputs first, then inputs, then dims) so that a *_backward
 * can sit beside each *_forward with the same order.  Activations are f32 row-major:
 * N rows (tokens) of C channels.  `out` may alias the input unless noted.
 *
 *   rmsnorm   out[n][c] = inp[n][c] / sqrt(mean_c(inp[n]^2) + eps) * weight[c]
 *   rope      llama "normal" pairing (adjacent pairs): for head h and i < rope_dim/2,
 *             (x0, x1) = x[h][2i], x[h][2i+1];  theta = pos * freq_scale * base^(-2i/rope_dim)
 *             x[h][2i] = x0 cos - x1 sin,  x[h][2i+1] = x0 sin + x1 cos;  dims >= rope_dim pass.
 *   softmax   out[n][c] = exp(inp[n][c] - max) / sum   (per row)
 *   silu      out = x * sigmoid(x)
 *   swiglu    out[i] = silu(gate[i]) * up[i]
 *   add       out[i] = a[i] + b[i]
 *   embed     out[n] = row tokens[n] of W (any type fl_dequant_row expands), f32
 *
 * fl_ops_kernels() returns the table for the current ISA (kernels/dispatch.h); the *_ref
 * functions are the specification and are always available.  All functions are
 * single-threaded and reentrant; callers split rows across threads.
 */
#ifndef FL_OPS_H
#define FL_OPS_H

#include "core/tensor.h"
#include <stdint.h>

void fl_rmsnorm_forward(float *out, const float *inp, const float *weight, int64_t N, int64_t C, float eps);
void fl_rope_forward(float *out, const float *inp, const int32_t *pos, int64_t N, int64_t n_head, int64_t head_dim,
                     int64_t rope_dim, float freq_base, float freq_scale);
void fl_softmax_forward(float *out, const float *inp, int64_t N, int64_t C);
void fl_silu_forward(float *out, const float *inp, int64_t n);
void fl_swiglu_forward(float *out, const float *gate, const float *up, int64_t n);
void fl_add_forward(float *out, const float *a, const float *b, int64_t n);
void fl_embed_forward(float *out, const fl_tensor *W, const int32_t *tokens, int64_t N);

/* per-ISA row kernels of the hot ops (same semantics as the *_forward above, one row) */
typedef struct fl_ops_kernels {
    void (*rmsnorm_row)(float *out, const float *inp, const float *weight, int64_t C, float eps);
    void (*swiglu)(float *out, const float *gate, const float *up, int64_t n);
    float (*dot)(const float *a, const float *b, int64_t n);           /* sum a[i] b[i] */
    void (*axpy)(float *y, float a, const float *x, int64_t n);        /* y += a x */
    void (*scale)(float *y, float a, int64_t n);                       /* y *= a */
    void (*expf_poly)(float *y, const float *x, int64_t n);            /* y = fl_expf_poly(x), bitwise */
    int64_t (*argmax)(const float *x, int64_t n);                     /* fl_argmax_f32_ref's index */
    /* y[m][c] = sum_j x[m][j] W[c][j] for M rows of x [M][K] and N rows of W [N][K], K small
     * (a LoRA adapter's B: K = its rank); y's rows ldy apart.  The matmul's row dots reduce a
     * vector per output, which costs more than the products when K is a few lanes: this keeps
     * 16 outputs in a vector, one fma per j (the order of j, so the ref's sums, up to fma's
     * single rounding) */
    void (*mm_smallk)(float *y, int64_t ldy, const float *x, int64_t M, const float *W, int64_t N, int64_t K);
} fl_ops_kernels;

const fl_ops_kernels *fl_ops_kernels_get(void);

/* exp(x) by the polynomial llama.cpp's CPU backend evaluates 16 (or 8) lanes at a time (after
 * ARM's optimized-routines expf): n = round(x / ln 2) by the 1.5 * 2^23 shift, b = x - n ln 2 in
 * two parts, a degree-5 polynomial in b, times 2^n; 0 or inf once |n| > 192.  Within ~1.5 ulp
 * of expf.  Used where matching its logits needs the same roundings: SwiGLU (every element)
 * and the attention softmax of the contiguous f16 cache. */
float fl_expf_poly(float x);
void fl_rmsnorm_row_ref(float *out, const float *inp, const float *weight, int64_t C, float eps);
void fl_swiglu_ref(float *out, const float *gate, const float *up, int64_t n);
float fl_dot_f32_ref(const float *a, const float *b, int64_t n);
void fl_axpy_f32_ref(float *y, float a, const float *x, int64_t n);
void fl_scale_f32_ref(float *y, float a, int64_t n);
void fl_expf_poly_row_ref(float *y, const float *x, int64_t n);
/* The first index of the largest of x[0..n) as `for i: if (x[i] > x[best]) best = i` finds it
 * from best = 0 (a NaN never compares larger; x[0] NaN gives 0); n >= 1.  The SIMD versions take
 * the maximum and then its first index, or this loop for a row with a NaN. */
int64_t fl_argmax_f32_ref(const float *x, int64_t n);
void fl_mm_smallk_f32_ref(float *y, int64_t ldy, const float *x, int64_t M, const float *W, int64_t N, int64_t K);
void fl_mm_smallk_f32_avx512(float *y, int64_t ldy, const float *x, int64_t M, const float *W, int64_t N, int64_t K);
int64_t fl_argmax_f32_avx512(const float *x, int64_t n);
int64_t fl_argmax_f32_avx2(const float *x, int64_t n);
void fl_rmsnorm_row_avx512(float *out, const float *inp, const float *weight, int64_t C, float eps);
void fl_swiglu_avx512(float *out, const float *gate, const float *up, int64_t n);
float fl_dot_f32_avx512(const float *a, const float *b, int64_t n);
void fl_axpy_f32_avx512(float *y, float a, const float *x, int64_t n);
void fl_scale_f32_avx512(float *y, float a, int64_t n);
void fl_expf_poly_row_avx512(float *y, const float *x, int64_t n);
void fl_rmsnorm_row_avx2(float *out, const float *inp, const float *weight, int64_t C, float eps);
void fl_swiglu_avx2(float *out, const float *gate, const float *up, int64_t n);
float fl_dot_f32_avx2(const float *a, const float *b, int64_t n);
void fl_axpy_f32_avx2(float *y, float a, const float *x, int64_t n);
void fl_scale_f32_avx2(float *y, float a, int64_t n);
void fl_expf_poly_row_avx2(float *y, const float *x, int64_t n);

#endif
