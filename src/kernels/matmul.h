/*
 * matmul.h - weight x activation products, dispatched on the weight's block type.
 *
 * Layout (GGUF/ggml): a weight W has ne[0] = K (input features, the contiguous row) and
 * ne[1] = N (output features); row n is fl_type_row_size(type, K) bytes at data + n * nb[1].
 * Activations are f32, row-major: x [M][K] (M tokens), y [M][N].
 *
 *   fl_matmul(W, x, y, M)    y[m][n] = sum_k W[n][k] * x[m][k]     (threaded with fl_parallel)
 *
 * M == 1 (decode) and M > 1 (prefill) may take different paths (GEMV vs tiled GEMM); both must
 * agree with fl_matmul_ref, the plain scalar specification (dequantize a row, dot in double-free
 * f32).  fl_dequant_row(type, src, dst, K) expands one row of any supported type to f32.
 * Unsupported types return FL_ERR_UNSUPPORTED from fl_matmul_supported().
 */
#ifndef FL_MATMUL_H
#define FL_MATMUL_H

#include "core/tensor.h"
#include "fitllm.h"

/* FL_OK if W's type can be used by fl_matmul, else FL_ERR_UNSUPPORTED with a message. */
fl_status fl_matmul_supported(int32_t type);
/* Expand one row of K elements of `type` to f32 (K a multiple of the block size). */
void fl_dequant_row(int32_t type, const void *src, float *dst, int64_t K);
/* y [M][N] = x [M][K] . W^T, threaded. */
void fl_matmul(const fl_tensor *W, const float *x, float *y, int64_t M);
/* Scalar reference (single thread, dequantize row + f32 dot). */
void fl_matmul_ref(const fl_tensor *W, const float *x, float *y, int64_t M);

#endif
