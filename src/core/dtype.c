#include "core/dtype.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#define QK_K 256

/* ggml's block sizes and bytes per block (ggml.c type_traits), plus fitllm's own types. */
static const fl_type_info type_info[FL_TYPE_GGML_COUNT] = {
    [FL_TYPE_F32] = {"f32", 1, 4, false},
    [FL_TYPE_F16] = {"f16", 1, 2, false},
    [FL_TYPE_Q4_0] = {"q4_0", 32, 18, true},
    [FL_TYPE_Q4_1] = {"q4_1", 32, 20, true},
    [FL_TYPE_Q5_0] = {"q5_0", 32, 22, true},
    [FL_TYPE_Q5_1] = {"q5_1", 32, 24, true},
    [FL_TYPE_Q8_0] = {"q8_0", 32, 34, true},
    [FL_TYPE_Q8_1] = {"q8_1", 32, 36, true},
    [FL_TYPE_Q2_K] = {"q2_K", QK_K, 84, true},
    [FL_TYPE_Q3_K] = {"q3_K", QK_K, 110, true},
    [FL_TYPE_Q4_K] = {"q4_K", QK_K, 144, true},
    [FL_TYPE_Q5_K] = {"q5_K", QK_K, 176, true},
    [FL_TYPE_Q6_K] = {"q6_K", QK_K, 210, true},
    [FL_TYPE_Q8_K] = {"q8_K", QK_K, 292, true},
    [FL_TYPE_IQ2_XXS] = {"iq2_xxs", QK_K, 66, true},
    [FL_TYPE_IQ2_XS] = {"iq2_xs", QK_K, 74, true},
    [FL_TYPE_IQ3_XXS] = {"iq3_xxs", QK_K, 98, true},
    [FL_TYPE_IQ1_S] = {"iq1_s", QK_K, 50, true},
    [FL_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, true},
    [FL_TYPE_IQ3_S] = {"iq3_s", QK_K, 110, true},
    [FL_TYPE_IQ2_S] = {"iq2_s", QK_K, 82, true},
    [FL_TYPE_IQ4_XS] = {"iq4_xs", QK_K, 136, true},
    [FL_TYPE_I8] = {"i8", 1, 1, false},
    [FL_TYPE_I16] = {"i16", 1, 2, false},
    [FL_TYPE_I32] = {"i32", 1, 4, false},
    [FL_TYPE_I64] = {"i64", 1, 8, false},
    [FL_TYPE_F64] = {"f64", 1, 8, false},
    [FL_TYPE_IQ1_M] = {"iq1_m", QK_K, 56, true},
    [FL_TYPE_BF16] = {"bf16", 1, 2, false},
    [FL_TYPE_TQ1_0] = {"tq1_0", QK_K, 54, true},
    [FL_TYPE_TQ2_0] = {"tq2_0", QK_K, 66, true},
    [FL_TYPE_MXFP4] = {"mxfp4", 32, 17, true},
};

/* fitllm-only load-time types.  NF4: 64 4-bit codes (32 bytes) + one 8-bit double-quantized
 * scale per block; the per-256-block f32 second-level scale is amortized into bits/weight. */
static const fl_type_info type_info_ext[] = {
    {"fp8_e4m3", 1, 1, true},
    {"fp8_e5m2", 1, 1, true},
    {"nf4", 64, 33, true},
    {"q4_0_r8", 32, 18, true},
    {"q8_0_r8", 32, 34, true},
    {"q4_K_r16", QK_K, 144, true},
    {"q6_K_r16", QK_K, 210, true},
    {"q5_K_r16", QK_K, 176, true},
    {"q3_K_r16", QK_K, 110, true},
    {"q2_K_r16", QK_K, 84, true},
    {"q4_1_r16", 32, 20, true},
    {"q5_0_r16", 32, 22, true},
    {"q5_1_r16", 32, 24, true},
    {"iq4_nl_r16", 32, 18, true},
};

const fl_type_info *fl_type_get(int32_t t) {
    if (t >= 0 && t < FL_TYPE_GGML_COUNT) return type_info[t].name ? &type_info[t] : NULL;
    if (t >= FL_TYPE_FP8_E4M3 && t < FL_TYPE_COUNT_MAX) return &type_info_ext[t - FL_TYPE_FP8_E4M3];
    return NULL;
}

const char *fl_type_name(int32_t t) {
    const fl_type_info *ti = fl_type_get(t);
    return ti ? ti->name : "?";
}

int32_t fl_type_from_name(const char *name) {
    for (int32_t t = 0; t < FL_TYPE_COUNT_MAX; t++) {
        const fl_type_info *ti = fl_type_get(t);
        if (ti && !strcasecmp(ti->name, name)) return t;
    }
    if (!strcasecmp(name, "fp8")) return FL_TYPE_FP8_E4M3;
    return -1;
}

size_t fl_type_row_size(int32_t t, int64_t n) {
    const fl_type_info *ti = fl_type_get(t);
    if (!ti || n < 0 || n % ti->blck_size) return 0;
    /* load-time weight types with row-level scales (kernels/quant.h): nf4 adds an f32 per group
     * of 256 blocks, fp8_e4m3 an f32 per row */
    if (t == FL_TYPE_NF4) return (size_t)(n / 64) * 33 + (size_t)((n / 64 + 255) / 256) * 4;
    if (t == FL_TYPE_FP8_E4M3) return (size_t)n + 4;
    return (size_t)(n / ti->blck_size) * (size_t)ti->type_size;
}

double fl_type_bits_per_weight(int32_t t) {
    const fl_type_info *ti = fl_type_get(t);
    if (!ti) return 0;
    double bpw = 8.0 * ti->type_size / ti->blck_size;
    if (t == FL_TYPE_NF4) bpw += 32.0 / (64.0 * 256.0); /* f32 scale per 256 blocks */
    return bpw;
}

/* ---- f16 ---- */
static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float fl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0x1F) return u2f(sign | 0x7F800000u | (man << 13) | (man ? 0x400000u : 0));
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t fl_f32_to_f16(float f) {
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00 | (uint16_t)((a >> 13) & 0x3FF); /* NaN, quiet */
    if (a >= 0x477FF000u) return sign | 0x7C00;  /* rounds to >= 65536 -> inf */
    if (a < 0x38800000u) {                        /* below f16 normal range: subnormal or 0 */
        /* value * 2^24 (exact: a power of two) rounded to an integer, to nearest even. */
        float r = nearbyintf(u2f(a) * 16777216.0f);
        return sign | (uint16_t)r;
    }
    /* normal: rebias exponent, round mantissa 23 -> 10 bits to nearest even */
    uint32_t m = a - 0x38000000u; /* exponent -112 */
    uint32_t lsb = (m >> 13) & 1;
    m += 0xFFF + lsb;
    return sign | (uint16_t)(m >> 13);
}

/* ---- bf16 ---- */
float fl_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t fl_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* ---- fp8 ----
 * Generic decoder/encoder for a 1.E.M format with bias b.  The encoder rounds to nearest even
 * in double (exact: every fp8 value and every f32 is a double, and the scaling is by powers of
 * two), then saturates.  ieee_special: the all-ones exponent is inf/NaN (e5m2); otherwise only
 * the all-ones code is NaN (e4m3fn). */
static float fp8_decode(uint8_t v, int ebits, int mbits, int bias, int ieee_special) {
    int sign = v >> 7;
    int e = (v >> mbits) & ((1 << ebits) - 1);
    int m = v & ((1 << mbits) - 1);
    float r;
    if (ieee_special && e == (1 << ebits) - 1) r = m ? NAN : INFINITY;
    else if (!ieee_special && e == (1 << ebits) - 1 && m == (1 << mbits) - 1) r = NAN;
    else if (e == 0) r = ldexpf((float)m, 1 - bias - mbits);
    else r = ldexpf((float)((1 << mbits) | m), e - bias - mbits);
    return sign ? -r : r;
}

static uint8_t fp8_encode(float f, int ebits, int mbits, int bias, int ieee_special, double maxv, uint8_t max_code) {
    uint8_t sign = signbit(f) ? 0x80 : 0;
    if (isnan(f)) return sign | 0x7F;
    double a = fabs((double)f);
    if (isinf(f)) return ieee_special ? (uint8_t)(sign | (((1 << ebits) - 1) << mbits)) : (sign | max_code);
    if (a == 0) return sign;
    int emin = 1 - bias;
    int e;
    frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    if (e < emin) e = emin;
    double q = ldexp(1.0, e - mbits);
    double r = nearbyint(a / q) * q; /* RNE */
    if (r > maxv) return sign | max_code;
    if (r == 0) return sign;
    int e2;
    frexp(r, &e2);
    e2 -= 1;
    if (e2 < emin) { /* subnormal */
        int mant = (int)(r / ldexp(1.0, emin - mbits));
        return sign | (uint8_t)mant;
    }
    int mant = (int)(r / ldexp(1.0, e2 - mbits)) - (1 << mbits);
    return sign | (uint8_t)(((e2 + bias) << mbits) | mant);
}

float fl_fp8_e4m3_to_f32(uint8_t v) { return fp8_decode(v, 4, 3, 7, 0); }
uint8_t fl_f32_to_fp8_e4m3(float f) { return fp8_encode(f, 4, 3, 7, 0, 448.0, 0x7E); }
float fl_fp8_e5m2_to_f32(uint8_t v) { return fp8_decode(v, 5, 2, 15, 1); }
uint8_t fl_f32_to_fp8_e5m2(float f) { return fp8_encode(f, 5, 2, 15, 1, 57344.0, 0x7B); }
