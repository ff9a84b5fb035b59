/*
 * dtype.h - element and block types: the ggml type table and scalar conversions.
 *
 * fl_type uses ggml's numbering, so a GGUF tensor's type field maps to it directly.  Every type
 * ggml has defined is listed with its block size and bytes per block, including those fitllm
 * cannot compute with yet; numbers ggml retired are "removed" (not valid in files).
 *
 * Scalar conversions (the reference; SIMD row variants live in kernels/):
 *   f16   IEEE binary16, round-to-nearest-even, overflow -> inf, NaN kept quiet.
 *   bf16  upper half of f32 with round-to-nearest-even, NaN -> quiet NaN.
 *   fp8 e4m3 (OCP "E4M3FN" / NVIDIA): bias 7, no infinities, S.1111.111 is NaN, max 448.
 *         Encoding saturates: |x| > 448 (and +-inf) -> +-448; NaN -> 0x7F|sign.
 *   fp8 e5m2 (OCP / NVIDIA): bias 15, IEEE-like with inf and NaN, max 57344.
 *         Encoding saturates finite overflow to +-57344; inf stays inf; NaN -> 0x7F|sign.
 */
#ifndef FL_DTYPE_H
#define FL_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum fl_type {
    FL_TYPE_F32 = 0, FL_TYPE_F16 = 1, FL_TYPE_Q4_0 = 2, FL_TYPE_Q4_1 = 3,
    FL_TYPE_Q5_0 = 6, FL_TYPE_Q5_1 = 7, FL_TYPE_Q8_0 = 8, FL_TYPE_Q8_1 = 9,
    FL_TYPE_Q2_K = 10, FL_TYPE_Q3_K = 11, FL_TYPE_Q4_K = 12, FL_TYPE_Q5_K = 13, FL_TYPE_Q6_K = 14,
    FL_TYPE_Q8_K = 15, FL_TYPE_IQ2_XXS = 16, FL_TYPE_IQ2_XS = 17, FL_TYPE_IQ3_XXS = 18,
    FL_TYPE_IQ1_S = 19, FL_TYPE_IQ4_NL = 20, FL_TYPE_IQ3_S = 21, FL_TYPE_IQ2_S = 22,
    FL_TYPE_IQ4_XS = 23, FL_TYPE_I8 = 24, FL_TYPE_I16 = 25, FL_TYPE_I32 = 26, FL_TYPE_I64 = 27,
    FL_TYPE_F64 = 28, FL_TYPE_IQ1_M = 29, FL_TYPE_BF16 = 30, FL_TYPE_TQ1_0 = 34, FL_TYPE_TQ2_0 = 35,
    FL_TYPE_MXFP4 = 39,
    FL_TYPE_GGML_COUNT = 40, /* ggml numbers are < this */
    /* fitllm-only types (never written to GGUF files): */
    FL_TYPE_FP8_E4M3 = 100, FL_TYPE_FP8_E5M2 = 101, FL_TYPE_NF4 = 102,
    /* Q4_0 / Q8_0 repacked at load for the AVX2 kernels: groups of 8 rows interleaved (layout in
     * kernels/matmul.h); a row alone is not addressable, the bytes per 32 weights of the base type */
    FL_TYPE_Q4_0_R8 = 103, FL_TYPE_Q8_0_R8 = 104,
    /* Q4_K / Q6_K / Q5_K / Q3_K / Q2_K repacked at load for the AVX-512 kernels: groups of 16 rows
     * interleaved (layout in kernels/matmul.h), 144 / 210 / 176 / 110 / 84 bytes per 256 weights as
     * the base type */
    FL_TYPE_Q4_K_R16 = 105, FL_TYPE_Q6_K_R16 = 106, FL_TYPE_Q5_K_R16 = 107, FL_TYPE_Q3_K_R16 = 108, FL_TYPE_Q2_K_R16 = 109,
    /* Q4_1 / Q5_0 / Q5_1 / IQ4_NL the same way (blocks of 32: 20 / 22 / 24 / 18 bytes per 32 weights) */
    FL_TYPE_Q4_1_R16 = 110, FL_TYPE_Q5_0_R16 = 111, FL_TYPE_Q5_1_R16 = 112, FL_TYPE_IQ4_NL_R16 = 113,
    FL_TYPE_COUNT_MAX = 114
} fl_type;

typedef struct fl_type_info {
    const char *name;     /* "q4_K" style as ggml names it; NULL for removed/unknown numbers */
    int32_t blck_size;    /* elements per block */
    int32_t type_size;    /* bytes per block */
    bool is_quantized;
} fl_type_info;

/* Info for t, or NULL if t is not a known type number. */
const fl_type_info *fl_type_get(int32_t t);
const char *fl_type_name(int32_t t); /* "?" if unknown */
/* Type by case-insensitive name ("Q4_K", "f16", "nf4"); returns -1 if unknown. */
int32_t fl_type_from_name(const char *name);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size or t unknown.
 * The load-time weight types carry row-level scales (layouts in kernels/quant.h): nf4 rows add
 * an f32 per group of 256 blocks, fp8_e4m3 rows an f32 scale in front. */
size_t fl_type_row_size(int32_t t, int64_t n);
double fl_type_bits_per_weight(int32_t t);

/* ---- scalar conversions ---- */
float fl_f16_to_f32(uint16_t h);
uint16_t fl_f32_to_f16(float f);
float fl_bf16_to_f32(uint16_t h);
uint16_t fl_f32_to_bf16(float f);
float fl_fp8_e4m3_to_f32(uint8_t v);
uint8_t fl_f32_to_fp8_e4m3(float f);
float fl_fp8_e5m2_to_f32(uint8_t v);
uint8_t fl_f32_to_fp8_e5m2(float f);

#define FL_FP8_E4M3_MAX 448.0f
#define FL_FP8_E5M2_MAX 57344.0f

#endif
