/*
 * convert.h - row conversions between f32 and the 16/8-bit float formats, per ISA.
 * The scalar reference is core/dtype.h's per-element functions; the SIMD variants must give
 * bit-identical results (tested exhaustively in tests/test_dtype.c).
 */
#ifndef FL_CONVERT_H
#define FL_CONVERT_H

#include <stdint.h>

typedef struct fl_convert_kernels {
    void (*f16_to_f32)(const uint16_t *x, float *y, int64_t n);
    void (*f32_to_f16)(const float *x, uint16_t *y, int64_t n);
    void (*bf16_to_f32)(const uint16_t *x, float *y, int64_t n);
    void (*f32_to_bf16)(const float *x, uint16_t *y, int64_t n);
} fl_convert_kernels;

const fl_convert_kernels *fl_convert_kernels_get(void);

/* y[i] = f16(x[i]) as f32 (round to nearest even through f16); x == y allowed. */
void fl_round_f16_row(const float *x, float *y, int64_t n);

/* variants (exposed for parity tests) */
void fl_f16_to_f32_row_ref(const uint16_t *x, float *y, int64_t n);
void fl_f32_to_f16_row_ref(const float *x, uint16_t *y, int64_t n);
void fl_bf16_to_f32_row_ref(const uint16_t *x, float *y, int64_t n);
void fl_f32_to_bf16_row_ref(const float *x, uint16_t *y, int64_t n);
void fl_f16_to_f32_row_avx2(const uint16_t *x, float *y, int64_t n);
void fl_f32_to_f16_row_avx2(const float *x, uint16_t *y, int64_t n);
void fl_bf16_to_f32_row_avx512(const uint16_t *x, float *y, int64_t n);
void fl_f32_to_bf16_row_avx512(const float *x, uint16_t *y, int64_t n);
void fl_f16_to_f32_row_avx512(const uint16_t *x, float *y, int64_t n);
void fl_f32_to_f16_row_avx512(const float *x, uint16_t *y, int64_t n);

#endif
