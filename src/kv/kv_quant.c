/* KV row codecs (see kv_quant.h): scalar, with AVX-512 paths for fp8 (both ways), q8_0 / q4_0 decode
 * and q8_0 / q4_0 encode that give the same bytes.  The attention kernel calls the decoders per
 * head slice. */
#include "kv/kv_quant.h"

#include "kernels/avx512/fp8_512.h"
#include "kernels/avx512/kvq_512.h"
#include "kernels/convert.h"
#include "kernels/dispatch.h"

#include <immintrin.h>

#include <math.h>
#include <pthread.h>
#include <string.h>

#define QK 32 /* elements per q8_0 / q4_0 group */

/* fp8 decoding tables (256 entries each), filled once from core/dtype.h's scalar decoders. */
static float lut_e4m3[256], lut_e5m2[256];
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;
static void lut_init(void) {
    for (int i = 0; i < 256; i++) {
        lut_e4m3[i] = fl_fp8_e4m3_to_f32((uint8_t)i);
        lut_e5m2[i] = fl_fp8_e5m2_to_f32((uint8_t)i);
    }
}

bool fl_kv_type_ok(int32_t t) {
    switch (t) {
    case FL_TYPE_F32: case FL_TYPE_F16: case FL_TYPE_BF16: case FL_TYPE_FP8_E4M3:
    case FL_TYPE_FP8_E5M2: case FL_TYPE_Q8_0: case FL_TYPE_Q4_0: return true;
    default: return false;
    }
}

bool fl_kv_type_scaled(int32_t t) { return t == FL_TYPE_FP8_E4M3 || t == FL_TYPE_FP8_E5M2; }

float fl_kv_type_max(int32_t t) {
    return t == FL_TYPE_FP8_E4M3 ? FL_FP8_E4M3_MAX : t == FL_TYPE_FP8_E5M2 ? FL_FP8_E5M2_MAX : 0.0f;
}

size_t fl_kv_row_bytes(int32_t t, int64_t n) {
    if (n <= 0 || !fl_kv_type_ok(t)) return 0;
    switch (t) {
    case FL_TYPE_F32: return (size_t)n * 4;
    case FL_TYPE_F16: case FL_TYPE_BF16: return (size_t)n * 2;
    case FL_TYPE_FP8_E4M3: case FL_TYPE_FP8_E5M2: return (size_t)n;
    case FL_TYPE_Q8_0: return n % QK ? 0 : (size_t)(n / QK) * (2 + QK);
    case FL_TYPE_Q4_0: return n % QK ? 0 : (size_t)(n / QK) * (2 + QK / 2);
    default: return 0;
    }
}

static void quant_q8_0(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t g = 0; g < n / QK; g++, x += QK, dst += 2 + QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = fl_f32_to_f16(d);
        memcpy(dst, &dh, 2);
        int8_t *q = (int8_t *)(dst + 2);
        for (int j = 0; j < QK; j++) q[j] = (int8_t)lrintf(x[j] * id);
    }
}

static void quant_q4_0(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t g = 0; g < n / QK; g++, x += QK, dst += 2 + QK / 2) {
        float amax = 0.0f, vmax = 0.0f; /* the value of largest magnitude, with its sign */
        for (int j = 0; j < QK; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                vmax = x[j];
            }
        const float d = vmax / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = fl_f32_to_f16(d);
        memcpy(dst, &dh, 2);
        uint8_t *qs = dst + 2;
        for (int j = 0; j < QK / 2; j++) {
            int a = (int)(x[j] * id + 8.5f), b = (int)(x[j + QK / 2] * id + 8.5f);
            a = a < 0 ? 0 : a > 15 ? 15 : a;
            b = b < 0 ? 0 : b > 15 ? 15 : b;
            qs[j] = (uint8_t)(a | (b << 4));
        }
    }
}

/* q8_0 / q4_0 encode of whole groups on AVX-512: the scalar loops' arithmetic per lane, so the
 * same bytes (test_kv test_kv_q_quant_variants).  The max skips NaN as fmaxf does (a NaN lane
 * leaves the running max, the second operand, in place); the codes round to nearest even as
 * lrintf does in the default mode, or truncate as the (int) cast does, and keep their low byte
 * as the (int8_t) cast does.  The scale's f16 is fl_f32_to_f16's.  A 256-value row (TinyLlama's
 * 4 kv heads), one thread, in cache (a throwaway microbenchmark): q8_0 1576 -> 51 ns, q4_0 656
 * -> 87 ns, where lrintf per element had cost ~1.5 us per K or V row of every layer a token. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void quant_q8_0_avx512(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t g = 0; g < n / QK; g++, x += QK, dst += 2 + QK) {
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        const __m512 m = _mm512_max_ps(_mm512_abs_ps(x1), _mm512_max_ps(_mm512_abs_ps(x0), _mm512_setzero_ps()));
        const float amax = _mm512_reduce_max_ps(m);
        const float d = amax / 127.0f;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = fl_f32_to_f16(d);
        memcpy(dst, &dh, 2);
        const __m512 vid = _mm512_set1_ps(id);
        _mm_storeu_si128((__m128i *)(dst + 2), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x0, vid))));
        _mm_storeu_si128((__m128i *)(dst + 18), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x1, vid))));
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void quant_q4_0_avx512(const float *x, uint8_t *dst, int64_t n) {
    const __m512 half = _mm512_set1_ps(8.5f);
    const __m512i zero = _mm512_setzero_si512(), fifteen = _mm512_set1_epi32(15);
    for (int64_t g = 0; g < n / QK; g++, x += QK, dst += 2 + QK / 2) {
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        const __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1);
        /* the first element of the largest magnitude (the scalar loop keeps the first: a strict >),
         * 0 where every magnitude is 0 or NaN */
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a1, _mm512_max_ps(a0, _mm512_setzero_ps())));
        const __m512 va = _mm512_set1_ps(amax);
        const uint32_t hit = (uint32_t)_mm512_cmp_ps_mask(a0, va, _CMP_EQ_OQ) | (uint32_t)_mm512_cmp_ps_mask(a1, va, _CMP_EQ_OQ) << 16;
        const float vmax = amax > 0.0f ? x[__builtin_ctz(hit)] : 0.0f;
        const float d = vmax / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = fl_f32_to_f16(d);
        memcpy(dst, &dh, 2);
        const __m512 vid = _mm512_set1_ps(id);
        __m512i c0 = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(x0, vid), half));
        __m512i c1 = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(x1, vid), half));
        c0 = _mm512_min_epi32(_mm512_max_epi32(c0, zero), fifteen);
        c1 = _mm512_min_epi32(_mm512_max_epi32(c1, zero), fifteen);
        _mm_storeu_si128((__m128i *)(dst + 2), _mm512_cvtepi32_epi8(_mm512_or_si512(c0, _mm512_slli_epi32(c1, 4))));
    }
}

/* fp8 encode of 16-element pieces (n a multiple of 16): code(x x (1 / scale)), the product in
 * float as the scalar loop below, so the same bytes (fl_f32x16_to_fp8 matched the scalar encoders
 * on all 2^32 floats; test_kv test_fp8_quant_variants samples them). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void quant_fp8_avx512(const float *x, uint8_t *dst, bool e5m2, int64_t n, float is) {
    const __m512 vis = _mm512_set1_ps(is);
    for (int64_t i = 0; i < n; i += 16) _mm_storeu_si128((__m128i *)(dst + i), fl_f32x16_to_fp8(_mm512_mul_ps(_mm512_loadu_ps(x + i), vis), e5m2));
}

void fl_kv_quant(int32_t t, const float *x, void *dst, int64_t n, float scale) {
    switch (t) {
    case FL_TYPE_F32: memcpy(dst, x, (size_t)n * 4); break;
    case FL_TYPE_F16: fl_convert_kernels_get()->f32_to_f16(x, dst, n); break;
    case FL_TYPE_BF16: fl_convert_kernels_get()->f32_to_bf16(x, dst, n); break;
    case FL_TYPE_FP8_E4M3: {
        const float is = scale > 0.0f ? 1.0f / scale : 0.0f;
        if (n % 16 == 0 && fl_isa_get() == FL_ISA_AVX512) quant_fp8_avx512(x, dst, false, n, is);
        else
            for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = fl_f32_to_fp8_e4m3(x[i] * is);
        break;
    }
    case FL_TYPE_FP8_E5M2: {
        const float is = scale > 0.0f ? 1.0f / scale : 0.0f;
        if (n % 16 == 0 && fl_isa_get() == FL_ISA_AVX512) quant_fp8_avx512(x, dst, true, n, is);
        else
            for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = fl_f32_to_fp8_e5m2(x[i] * is);
        break;
    }
    case FL_TYPE_Q8_0: (fl_isa_get() == FL_ISA_AVX512 ? quant_q8_0_avx512 : quant_q8_0)(x, dst, n); break;
    case FL_TYPE_Q4_0: (fl_isa_get() == FL_ISA_AVX512 ? quant_q4_0_avx512 : quant_q4_0)(x, dst, n); break;
    default: break;
    }
}

/* q8_0 / q4_0 decode of 16-element pieces (e0 and n multiples of 16, fl_kvq16_to_f32): the
 * same single multiply per element as the scalar loops below, so the same bits. */
__attribute__((target("avx512f"))) static void dequant_q_avx512(const uint8_t *s, bool q8, int64_t e0, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, fl_kvq16_to_f32(s, e0 + i, q8));
}

/* fp8 decode of 16-element pieces (n a multiple of 16): scale x the code's value, one multiply
 * per element as the table loop below, so the same bits (test_kv test_fp8_dequant_variants). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void dequant_fp8_avx512(const uint8_t *s, bool e5m2, int64_t n, float scale,
                                                                                  float *out) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(sc, fl_fp8x16_to_f32(s + i, e5m2, 0xFFFF)));
}

void fl_kv_dequant(int32_t t, const void *src, int64_t e0, int64_t n, float scale, float *out) {
    const uint8_t *s = src;
    switch (t) {
    case FL_TYPE_F32: memcpy(out, (const float *)src + e0, (size_t)n * 4); break;
    /* the dispatched row converters give the same bits as the scalar ones (tests/test_core.c) */
    case FL_TYPE_F16: fl_convert_kernels_get()->f16_to_f32((const uint16_t *)src + e0, out, n); break;
    case FL_TYPE_BF16: fl_convert_kernels_get()->bf16_to_f32((const uint16_t *)src + e0, out, n); break;
    case FL_TYPE_FP8_E4M3:
        if (n % 16 == 0 && fl_isa_get() == FL_ISA_AVX512) {
            dequant_fp8_avx512(s + e0, false, n, scale, out);
            break;
        }
        pthread_once(&lut_once, lut_init);
        for (int64_t i = 0; i < n; i++) out[i] = scale * lut_e4m3[s[e0 + i]];
        break;
    case FL_TYPE_FP8_E5M2:
        if (n % 16 == 0 && fl_isa_get() == FL_ISA_AVX512) {
            dequant_fp8_avx512(s + e0, true, n, scale, out);
            break;
        }
        pthread_once(&lut_once, lut_init);
        for (int64_t i = 0; i < n; i++) out[i] = scale * lut_e5m2[s[e0 + i]];
        break;
    case FL_TYPE_Q8_0:
        if (e0 % 16 == 0 && n % 16 == 0 && fl_isa_get() == FL_ISA_AVX512) {
            dequant_q_avx512(s, true, e0, n, out);
            break;
        }
        /* one group (and one scale conversion) at a time */
        for (int64_t e = e0, i = 0; i < n;) {
            const uint8_t *g = s + (e / QK) * (2 + QK);
            uint16_t dh;
            memcpy(&dh, g, 2);
            const float d = fl_f16_to_f32(dh);
            const int8_t *q = (const int8_t *)(g + 2);
            for (int64_t j = e % QK; j < QK && i < n; j++, i++, e++) out[i] = d * (float)q[j];
        }
        break;
    case FL_TYPE_Q4_0:
        if (e0 % 16 == 0 && n % 16 == 0 && fl_isa_get() == FL_ISA_AVX512) {
            dequant_q_avx512(s, false, e0, n, out);
            break;
        }
        for (int64_t e = e0, i = 0; i < n;) {
            const uint8_t *g = s + (e / QK) * (2 + QK / 2);
            uint16_t dh;
            memcpy(&dh, g, 2);
            const float d = fl_f16_to_f32(dh);
            for (int64_t j = e % QK; j < QK && i < n; j++, i++, e++) {
                const int q = j < QK / 2 ? (g[2 + j] & 15) : (g[2 + j - QK / 2] >> 4);
                out[i] = d * (float)(q - 8);
            }
        }
        break;
    default: break;
    }
}
