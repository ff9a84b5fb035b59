/*
 * kv_quant.h - K/V element types of the paged cache and their row codecs.
 *
 * A cache row is one token's K (or V) for all kv heads: n = n_head_kv * head_dim elements,
 * stored in the cache's type:
 *   f32, f16, bf16     plain elements
 *   fp8_e4m3/e5m2      one byte per element, divided by a scale kept outside the row
 *                      (kv_cache keeps one f32 scale per (block, kv head): x ~ scale * fp8(x/scale))
 *   q8_0               ggml layout: groups of 32 = f16 scale d + 32 int8, x ~ d * q
 *   q4_0               ggml layout: groups of 32 = f16 scale d + 16 bytes of nibbles,
 *                      element j in the low nibble of byte j, element j+16 in the high one,
 *                      x ~ d * (q - 8)
 * Groups of 32 run along the whole token row, so a head narrower than 32 (stories260K has 8)
 * shares its group with its neighbours; n must be a multiple of 32 for q8_0/q4_0.
 *
 * fl_kv_dequant() decodes any element range [e0, e0 + n) of a row; the attention kernel calls
 * it per head slice while it loads K/V ("dequantise on load"), never producing a full f32 copy.
 * All functions are pure and thread-safe.  f16/bf16 use the dispatched row converters; fp8 has
 * AVX-512 paths both ways, q8_0 for decoding 16-aligned slices, and q8_0 / q4_0 for encoding
 * whole rows; all give the scalar reference's bytes.
 */
#ifndef FL_KV_QUANT_H
#define FL_KV_QUANT_H

#include "core/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True if t can be a KV cache type (f32 f16 bf16 fp8_e4m3 fp8_e5m2 q8_0 q4_0). */
bool fl_kv_type_ok(int32_t t);
/* True for the fp8 types (they need the external per-(block, head) scale). */
bool fl_kv_type_scaled(int32_t t);
/* Bytes of one row of n elements; 0 if t is not a KV type or n does not fit its groups. */
size_t fl_kv_row_bytes(int32_t t, int64_t n);
/* Largest finite magnitude of an fp8 type (448 or 57344); 0 for the others. */
float fl_kv_type_max(int32_t t);

/* Encode x[0..n) (a whole row, or for fp8 any slice) into dst.  For fp8 the stored value is
 * x / scale (scale > 0); other types ignore scale.  For q8_0/q4_0 the encoded range must
 * start at a group boundary and n must be a multiple of 32. */
void fl_kv_quant(int32_t t, const float *x, void *dst, int64_t n, float scale);
/* Decode elements [e0, e0 + n) of the row starting at src into out[0..n). fp8: multiplied by
 * scale. */
void fl_kv_dequant(int32_t t, const void *src, int64_t e0, int64_t n, float scale, float *out);

#endif
