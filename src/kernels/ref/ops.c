/* Scalar reference of the forward ops (the specification; see kernels/ops.h). */
#include "kernels/ops.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"

#include <math.h>

void fl_rmsnorm_row_ref(float *out, const float *inp, const float *weight, int64_t C, float eps) {
    /* sum of f32 squares in double, mean rounded to f32, then (x * rstd) * w: llama.cpp's order */
    double ss = 0.0;
    for (int64_t c = 0; c < C; c++) ss += (double)(inp[c] * inp[c]);
    const float rstd = 1.0f / sqrtf((float)(ss / (double)C) + eps);
    for (int64_t c = 0; c < C; c++) out[c] = inp[c] * rstd * weight[c];
}

float fl_expf_poly(float x) {
    const float shift = 0x1.8p23f;
    const float n = fmaf(x, 0x1.715476p+0f, shift) - shift;             /* round(x / ln 2) */
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x)); /* x - n ln 2 */
    const float u = b * b;
    const float p = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                         fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
    return ldexpf(p, (int)n);
}

void fl_swiglu_ref(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + fl_expf_poly(-g)) * up[i];
    }
}

float fl_dot_f32_ref(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void fl_axpy_f32_ref(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void fl_mm_smallk_f32_ref(float *y, int64_t ldy, const float *x, int64_t M, const float *W, int64_t N, int64_t K) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < N; c++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < K; j++) acc += x[m * K + j] * W[c * K + j];
            y[m * ldy + c] = acc;
        }
}

void fl_scale_f32_ref(float *y, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}

void fl_expf_poly_row_ref(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fl_expf_poly(x[i]);
}

int64_t fl_argmax_f32_ref(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static const fl_ops_kernels ops_ref = {fl_rmsnorm_row_ref, fl_swiglu_ref, fl_dot_f32_ref, fl_axpy_f32_ref,
                                       fl_scale_f32_ref, fl_expf_poly_row_ref, fl_argmax_f32_ref, fl_mm_smallk_f32_ref};
static const fl_ops_kernels ops_avx512 = {fl_rmsnorm_row_avx512, fl_swiglu_avx512, fl_dot_f32_avx512,
                                          fl_axpy_f32_avx512, fl_scale_f32_avx512, fl_expf_poly_row_avx512,
                                          fl_argmax_f32_avx512, fl_mm_smallk_f32_avx512};

/* (AVX2 takes the reference for mm_smallk, which the compiler vectorizes over j) */
static const fl_ops_kernels ops_avx2 = {fl_rmsnorm_row_avx2, fl_swiglu_avx2, fl_dot_f32_avx2,
                                        fl_axpy_f32_avx2, fl_scale_f32_avx2, fl_expf_poly_row_avx2,
                                        fl_argmax_f32_avx2, fl_mm_smallk_f32_ref};

const fl_ops_kernels *fl_ops_kernels_get(void) {
    const fl_isa isa = fl_isa_get();
    return isa == FL_ISA_AVX512 ? &ops_avx512 : isa == FL_ISA_AVX2 ? &ops_avx2 : &ops_ref;
}

void fl_rmsnorm_forward(float *out, const float *inp, const float *weight, int64_t N, int64_t C, float eps) {
    const fl_ops_kernels *k = fl_ops_kernels_get();
    for (int64_t n = 0; n < N; n++) k->rmsnorm_row(out + n * C, inp + n * C, weight, C, eps);
}

void fl_rope_forward(float *out, const float *inp, const int32_t *pos, int64_t N, int64_t n_head, int64_t head_dim,
                     int64_t rope_dim, float freq_base, float freq_scale) {
    /* theta_i = p * tscale^i by repeated f32 products, as llama.cpp computes its angles; their
     * cosines and sines once per token for all its heads */
    const float tscale = powf(freq_base, -2.0f / (float)rope_dim);
    const int64_t np = rope_dim / 2;
    float cs[np > 0 ? np : 1], sn[np > 0 ? np : 1];
    for (int64_t n = 0; n < N; n++) {
        float theta = (float)pos[n] * freq_scale;
        for (int64_t i = 0; i < np; i++, theta *= tscale) {
            cs[i] = cosf(theta);
            sn[i] = sinf(theta);
        }
        for (int64_t h = 0; h < n_head; h++) {
            const float *x = inp + (n * n_head + h) * head_dim;
            float *y = out + (n * n_head + h) * head_dim;
            for (int64_t i = 0; i < np; i++) {
                const float c = cs[i], s = sn[i];
                const float x0 = x[2 * i], x1 = x[2 * i + 1];
                y[2 * i] = x0 * c - x1 * s;
                y[2 * i + 1] = x0 * s + x1 * c;
            }
            for (int64_t d = rope_dim; d < head_dim; d++) y[d] = x[d];
        }
    }
}

void fl_softmax_forward(float *out, const float *inp, int64_t N, int64_t C) {
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        float mx = -INFINITY;
        for (int64_t c = 0; c < C; c++) mx = x[c] > mx ? x[c] : mx;
        float sum = 0.0f;
        for (int64_t c = 0; c < C; c++) {
            y[c] = expf(x[c] - mx);
            sum += y[c];
        }
        for (int64_t c = 0; c < C; c++) y[c] /= sum;
    }
}

void fl_silu_forward(float *out, const float *inp, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = inp[i] / (1.0f + expf(-inp[i]));
}

void fl_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    fl_ops_kernels_get()->swiglu(out, gate, up, n);
}

void fl_add_forward(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void fl_embed_forward(float *out, const fl_tensor *W, const int32_t *tokens, int64_t N) {
    const int64_t C = W->ne[0];
    for (int64_t n = 0; n < N; n++)
        fl_dequant_row(W->type, (const char *)W->data + (size_t)tokens[n] * W->nb[1], out + n * C, C);
}
