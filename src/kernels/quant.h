/*
 * quant.h - block layouts of the quantized weight types, their scalar reference dequantizers
 * and quantizers, activation quantization for integer dot products, and load-time quantization.
 *
 * Layouts follow ggml's documented block formats byte for byte (little-endian, packed):
 *   q4_0  {f16 d; u8 qs[16]}                 x = d * (q - 8), q = nibbles (low: 0..15, high: 16..31)
 *   q4_1  {f16 d, m; u8 qs[16]}              x = d * q + m
 *   q5_0  {f16 d; u8 qh[4]; u8 qs[16]}       x = d * (q - 16), 5th bit from qh (bit j / j+16)
 *   q5_1  {f16 d, m; u8 qh[4]; u8 qs[16]}    x = d * q + m
 *   q8_0  {f16 d; i8 qs[32]}                 x = d * q
 *   q2_K  {u8 scales[16]; u8 qs[64]; f16 d, dmin}        16 sub-blocks of 16, 4-bit scale/min
 *   q3_K  {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d} 16 sub-blocks, 6-bit signed scales
 *   q4_K  {f16 d, dmin; u8 scales[12]; u8 qs[128]}        8 sub-blocks of 32, 6-bit scale/min
 *   q5_K  {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
 *   q6_K  {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
 *   q8_K  {f32 d; i8 qs[256]; i16 bsums[16]}  (activations only)
 *   iq4_nl {f16 d; u8 qs[16]}                x = d * kvalues[q] (16-entry non-linear table)
 * fitllm-only load-time types (never written to GGUF), rows self-contained:
 *   nf4       per group of up to 256 blocks: f32 gscale, then per block of 64: {u8 sc; u8 qs[32]}
 *             (QLoRA double quantization: block absmax ~= sc * gscale; x = absmax * NF4[q],
 *             q low nibble = element j, high nibble = element j + 32)
 *   fp8_e4m3  per row: f32 scale, then K e4m3 bytes; x = scale * e4m3(q)
 * Row sizes come from fl_type_row_size (core/dtype.h).
 *
 * All functions here are pure (no allocation, no global state) and thread-safe.  Row lengths
 * must be multiples of the block size (callers check with fl_type_row_size != 0).
 */
#ifndef FL_QUANT_H
#define FL_QUANT_H

#include "core/dtype.h"
#include "fitllm.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FL_QK 32
#define FL_QK_K 256

typedef struct { uint16_t d; uint8_t qs[16]; } fl_block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } fl_block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } fl_block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } fl_block_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } fl_block_q8_0;
typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } fl_block_q2_K;
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } fl_block_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } fl_block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } fl_block_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } fl_block_q6_K;
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } fl_block_q8_K;
typedef struct { uint16_t d; uint8_t qs[16]; } fl_block_iq4_nl;

_Static_assert(sizeof(fl_block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(fl_block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(fl_block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(fl_block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(fl_block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(fl_block_q2_K) == 84, "q2_K");
_Static_assert(sizeof(fl_block_q3_K) == 110, "q3_K");
_Static_assert(sizeof(fl_block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(fl_block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(fl_block_q6_K) == 210, "q6_K");
_Static_assert(sizeof(fl_block_q8_K) == 292, "q8_K");
_Static_assert(sizeof(fl_block_iq4_nl) == 18, "iq4_nl");

extern const int8_t fl_iq4nl_values[16];
extern const float fl_nf4_values[16];
/* Block b (of 64 values) of an NF4 row: its scale gscale * sc (the scalar dequantizer's product)
 * in *amax, and its 32 code bytes (low nibble element j, high nibble element j + 32). */
static inline const uint8_t *fl_nf4_block(const void *row, int64_t b, float *amax) {
    const uint8_t *g = (const uint8_t *)row + (size_t)(b >> 8) * (4 + 256 * 33), *blk = g + 4 + (size_t)(b & 255) * 33;
    float gs;
    memcpy(&gs, g, 4);
    *amax = gs * (float)blk[0];
    return blk + 1;
}
/* The index of the NF4 value nearest to v (the lower on a tie): fl_nf4_code_ref compares all 16
 * (the specification), fl_nf4_code brackets v by halves (the quantizer's; the same answer for
 * every float). */
uint8_t fl_nf4_code(float v);
uint8_t fl_nf4_code_ref(float v);

/* ---- dequantization (scalar reference; k elements, a multiple of the block size) ---- */
void fl_dequant_q4_0(const void *src, float *y, int64_t k);
void fl_dequant_q4_1(const void *src, float *y, int64_t k);
void fl_dequant_q5_0(const void *src, float *y, int64_t k);
void fl_dequant_q5_1(const void *src, float *y, int64_t k);
void fl_dequant_q8_0(const void *src, float *y, int64_t k);
void fl_dequant_q2_K(const void *src, float *y, int64_t k);
void fl_dequant_q3_K(const void *src, float *y, int64_t k);
/* Scale and min of sub-block j (0..7) from a q4_K / q5_K block's 12-byte 6-bit table. */
void fl_q4_K_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *mn);
/* All 8 of fl_q4_K_scale_min's scales and mins at once, as bytes, with 32-bit masks (sub-blocks
 * 0-3 in the low 6 bits of bytes 0-7, 4-7 split over bytes 8-11 and the top bits of 0-7); the
 * SIMD kernels load them as vectors. */
static inline void fl_k4_scale_min_bytes(const uint8_t *scales, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t w0, w1, w2;
    memcpy(&w0, scales, 4);
    memcpy(&w1, scales + 4, 4);
    memcpy(&w2, scales + 8, 4);
    const uint32_t s[2] = {w0 & 0x3F3F3F3Fu, (w2 & 0x0F0F0F0Fu) | (((w0 >> 6) & 0x03030303u) << 4)};
    const uint32_t m[2] = {w1 & 0x3F3F3F3Fu, ((w2 >> 4) & 0x0F0F0F0Fu) | (((w1 >> 6) & 0x03030303u) << 4)};
    memcpy(sc, s, 8);
    memcpy(mn, m, 8);
}
/* The 8 sub-block scales d sc_j and mins dmin m_j of a Q4_K / Q5_K super-block (d and dmin are
 * its f16 fields; the products as the dequantizers form them). */
void fl_k4_scales_mins(uint16_t d, uint16_t dmin, const uint8_t *scales, float sc[8], float mn[8]);
/* Q3_K's 16 signed 6-bit sub-block scales (low 4 bits in bytes 0..7, high 2 in bytes 8..11). */
void fl_q3_K_scales(const uint8_t *scales, int8_t out[16]);
/* The 32 codes of one Q4_1 / Q5_0 / Q5_1 / IQ4_NL block as the format defines them (Q5_0: the
 * 5-bit code - 16, IQ4_NL: its table values, Q4_1 / Q5_1 unsigned), its scale *d and min *m
 * (0 for the types without one): value j = d * c[j] + m. */
void fl_b32_block_codes(int32_t wtype, const void *blk, int c[32], float *d, float *m);
void fl_dequant_q4_K(const void *src, float *y, int64_t k);
void fl_dequant_q5_K(const void *src, float *y, int64_t k);
void fl_dequant_q6_K(const void *src, float *y, int64_t k);
void fl_dequant_q8_K(const void *src, float *y, int64_t k);
void fl_dequant_iq4_nl(const void *src, float *y, int64_t k);
void fl_dequant_nf4(const void *src, float *y, int64_t k);
void fl_dequant_fp8_e4m3(const void *src, float *y, int64_t k);

/* ---- quantization (scalar reference) ----
 * Legacy types (q4_0 q4_1 q5_0 q5_1 q8_0) round to nearest exactly like ggml's *_ref
 * quantizers (byte-identical blocks).  K-quants search sub-block scales/mins to minimise the
 * squared reconstruction error.  Returns FL_ERR_UNSUPPORTED for types without a quantizer. */
fl_status fl_quantize_row(int32_t type, const float *x, void *dst, int64_t k);
/* Does `type` have a quantizer (fl_quantize_row / fl_quantize_tensor)? */
int fl_quantize_supported(int32_t type);
/* Bytes needed for nrows x K of dst_type (0 if K is not a multiple of the block size). */
size_t fl_quantize_size(int32_t dst_type, int64_t nrows, int64_t K);
/* Quantize nrows x K f32 values (row-major) into dst (fl_quantize_size bytes), threaded with
 * fl_parallel.  Any type with a quantizer, plus F32/F16/BF16 (conversion).  Errors:
 * FL_ERR_INVALID (K not a multiple of the block), FL_ERR_UNSUPPORTED. */
fl_status fl_quantize_tensor(int32_t dst_type, const float *src, int64_t nrows, int64_t K, void *dst);

/* ---- activations for integer dot products ---- */
void fl_quantize_row_q8_0(const float *x, fl_block_q8_0 *y, int64_t k); /* == ggml q8_0 ref */
void fl_quantize_row_q8_K(const float *x, fl_block_q8_K *y, int64_t k);

#endif
