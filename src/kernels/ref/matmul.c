/* Scalar reference matmul and row dequantization for the float weight types.
 * Quantized block types plug into fl_dequant_row's switch (kernels/quant). */
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "core/status.h"
#include "core/threads.h"

#include <string.h>

fl_status fl_matmul_supported(int32_t type) {
    switch (type) {
    case FL_TYPE_F32: case FL_TYPE_F16: case FL_TYPE_BF16:
    case FL_TYPE_Q4_0: case FL_TYPE_Q4_1: case FL_TYPE_Q5_0: case FL_TYPE_Q5_1: case FL_TYPE_Q8_0:
    case FL_TYPE_Q2_K: case FL_TYPE_Q3_K: case FL_TYPE_Q4_K: case FL_TYPE_Q5_K: case FL_TYPE_Q6_K:
    case FL_TYPE_Q8_K: case FL_TYPE_IQ4_NL: case FL_TYPE_NF4: case FL_TYPE_FP8_E4M3:
        return FL_OK;
    default: return fl_set_error(FL_ERR_UNSUPPORTED, "weight type %s is not supported by matmul", fl_type_name(type));
    }
}

void fl_dequant_row(int32_t type, const void *src, float *dst, int64_t K) {
    switch (type) {
    case FL_TYPE_F32: memcpy(dst, src, (size_t)K * 4); break;
    case FL_TYPE_F16: for (int64_t i = 0; i < K; i++) dst[i] = fl_f16_to_f32(((const uint16_t *)src)[i]); break;
    case FL_TYPE_BF16: for (int64_t i = 0; i < K; i++) dst[i] = fl_bf16_to_f32(((const uint16_t *)src)[i]); break;
    case FL_TYPE_Q4_0: fl_dequant_q4_0(src, dst, K); break;
    case FL_TYPE_Q4_1: fl_dequant_q4_1(src, dst, K); break;
    case FL_TYPE_Q5_0: fl_dequant_q5_0(src, dst, K); break;
    case FL_TYPE_Q5_1: fl_dequant_q5_1(src, dst, K); break;
    case FL_TYPE_Q8_0: fl_dequant_q8_0(src, dst, K); break;
    case FL_TYPE_Q2_K: fl_dequant_q2_K(src, dst, K); break;
    case FL_TYPE_Q3_K: fl_dequant_q3_K(src, dst, K); break;
    case FL_TYPE_Q4_K: fl_dequant_q4_K(src, dst, K); break;
    case FL_TYPE_Q5_K: fl_dequant_q5_K(src, dst, K); break;
    case FL_TYPE_Q6_K: fl_dequant_q6_K(src, dst, K); break;
    case FL_TYPE_Q8_K: fl_dequant_q8_K(src, dst, K); break;
    case FL_TYPE_IQ4_NL: fl_dequant_iq4_nl(src, dst, K); break;
    case FL_TYPE_NF4: fl_dequant_nf4(src, dst, K); break;
    case FL_TYPE_FP8_E4M3: fl_dequant_fp8_e4m3(src, dst, K); break;
    default: FL_ASSERT(!"fl_dequant_row: unsupported type");
    }
}

void fl_matmul_ref(const fl_tensor *W, const float *x, float *y, int64_t M) {
    const int64_t K = W->ne[0], N = W->ne[1];
    float row[K > 0 ? K : 1];
    for (int64_t n = 0; n < N; n++) {
        fl_dequant_row(W->type, (const char *)W->data + (size_t)n * W->nb[1], row, K);
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * K;
            float s = 0;
            for (int64_t k = 0; k < K; k++) s += row[k] * xm[k];
            y[m * N + n] = s;
        }
    }
}

typedef struct { const fl_tensor *W; const float *x; float *y; int64_t M; } mm_ctx;

/* Each thread takes a slice of output rows (weights read once per step for all M tokens). */
static void mm_task(void *p, int ith, int nth) {
    mm_ctx *c = p;
    const int64_t K = c->W->ne[0], N = c->W->ne[1];
    int64_t lo, hi;
    fl_split_range(N, ith, nth, &lo, &hi);
    float row[K > 0 ? K : 1];
    for (int64_t n = lo; n < hi; n++) {
        fl_dequant_row(c->W->type, (const char *)c->W->data + (size_t)n * c->W->nb[1], row, K);
        for (int64_t m = 0; m < c->M; m++) {
            const float *xm = c->x + m * K;
            float s = 0;
            for (int64_t k = 0; k < K; k++) s += row[k] * xm[k];
            c->y[m * N + n] = s;
        }
    }
}

void fl_matmul(const fl_tensor *W, const float *x, float *y, int64_t M) {
    mm_ctx c = {W, x, y, M};
    fl_parallel(mm_task, &c);
}
