/* Scalar reference matmul and row dequantization for the float weight types.
 * Quantized block types plug into fl_dequant_row's switch (kernels/quant). */
#include "kernels/matmul.h"
#include "core/dtype.h"
#include "kernels/quant.h"
#include "core/status.h"
#include "core/threads.h"

#include "core/alloc.h"

#include <math.h>
#include <string.h>

fl_status fl_matmul_supported(int32_t type) {
    switch (type) {
    case FL_TYPE_F32: case FL_TYPE_F16: case FL_TYPE_BF16:
    case FL_TYPE_Q4_0: case FL_TYPE_Q4_1: case FL_TYPE_Q5_0: case FL_TYPE_Q5_1: case FL_TYPE_Q8_0:
    case FL_TYPE_Q2_K: case FL_TYPE_Q3_K: case FL_TYPE_Q4_K: case FL_TYPE_Q5_K: case FL_TYPE_Q6_K:
    case FL_TYPE_Q8_K: case FL_TYPE_IQ4_NL: case FL_TYPE_NF4: case FL_TYPE_FP8_E4M3: case FL_TYPE_Q4_0_R8: case FL_TYPE_Q8_0_R8:
    case FL_TYPE_Q4_K_R16: case FL_TYPE_Q5_K_R16: case FL_TYPE_Q6_K_R16: case FL_TYPE_Q3_K_R16: case FL_TYPE_Q2_K_R16:
    case FL_TYPE_Q4_1_R16: case FL_TYPE_Q5_0_R16: case FL_TYPE_Q5_1_R16: case FL_TYPE_IQ4_NL_R16:
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
    case FL_TYPE_Q4_0_R8: case FL_TYPE_Q8_0_R8: FL_ASSERT(!"an R8 row is not addressable alone (fl_r8_dequant_row)"); break;
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

float fl_mm_dot_f32_ref(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* _mm512_reduce_add_ps's order on 16 lanes: (l + l+8), (l + l+4), then (0 + 2) + (1 + 3). */
static float reduce16_ref(const float *v) {
    float t8[8], t4[4];
    for (int l = 0; l < 8; l++) t8[l] = v[l + 8] + v[l];
    for (int l = 0; l < 4; l++) t4[l] = t8[l + 4] + t8[l];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

/* fl_mm_dot_f32_avx512's order in scalar code (16 lanes of fused multiply-adds), so the
 * reference ISA gives the SIMD paths' bits. */
float fl_mm_dot_ggml_ref(const float *a, const float *b, int64_t n, bool f16_rows) {
    float s[4][16] = {{0}};
    if (n % 16 == 0) {
        for (int64_t i = 0; i < n; i += 16)
            for (int l = 0; l < 16; l++) s[0][l] = fmaf(a[i + l], b[i + l], s[0][l]);
        return reduce16_ref(s[0]);
    }
    const int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++) s[j][l] = fmaf(a[i + 16 * j + l], b[i + 16 * j + l], s[j][l]);
    float v[16];
    for (int l = 0; l < 16; l++) v[l] = (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]);
    return fl_dot_tail_ggml(a, b, np, n, reduce16_ref(v), f16_rows);
}

void fl_matmul_ref(const fl_tensor *W, const float *x, float *y, int64_t M) {
    const int64_t K = W->ne[0], N = W->ne[1];
    float row[K > 0 ? K : 1];
    for (int64_t n = 0; n < N; n++) {
        if (fl_r8_group_rows(W->type)) fl_r8_dequant_row(W->type, W->data, W->nb[1], n, row, K);
        else fl_dequant_row(W->type, (const char *)W->data + (size_t)n * W->nb[1], row, K);
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * K;
            float s = 0;
            for (int64_t k = 0; k < K; k++) s += row[k] * xm[k];
            y[m * N + n] = s;
        }
    }
}

/* fl_dot_f32_ref lives in ref/ops.c (declared in ops.h and matmul.h). */

/* ---- 8-bit activations ---- */

size_t fl_act_q8_bytes(int64_t M, int64_t K) {
    const int64_t nb = K / 32;
    const size_t qs = ((size_t)(M * K) + 63) & ~(size_t)63, d = (size_t)(M * nb) * 4;
    const size_t d64 = (d + 63) & ~(size_t)63, v = (size_t)(M * nb) * 32;
    const size_t q4 = M == 1 ? qs + (((size_t)nb * 16 + 63) & ~(size_t)63) : 0; /* M == 1: qs4 and sv4 */
    return qs + 4 * d64 + (((size_t)(M * nb) * 8 + 63) & ~(size_t)63) + 2 * v + q4; /* d, s, ms, o4; o6 */
}

fl_status fl_act_q8_alloc(fl_act_q8 *a, int64_t M, int64_t K) {
    memset(a, 0, sizeof *a);
    if (M <= 0 || K <= 0 || K % 32) return fl_set_error(FL_ERR_INVALID, "act_q8: bad shape %lld x %lld", (long long)M, (long long)K);
    const int64_t nb = K / 32;
    const size_t qs = ((size_t)(M * K) + 63) & ~(size_t)63, d = (size_t)(M * nb) * 4;
    const size_t d64 = (d + 63) & ~(size_t)63, v = (size_t)(M * nb) * 32;
    a->bytes = fl_act_q8_bytes(M, K);
    a->mem = fl_alloc(FL_MEM_SCRATCH, a->bytes, 64);
    if (!a->mem) return FL_ERR_NOMEM; /* fl_alloc set the message */
    char *p = a->mem;
    a->M = M; a->K = K; a->nb = nb;
    a->qs = (int8_t *)p; p += qs;
    a->d = (float *)p; p += d64;
    a->s = (int32_t *)p; p += d64;
    a->dv = (float *)p; p += v;
    a->sv = (int32_t *)p; p += v;
    a->ms = (float *)p; p += d64;
    a->o4 = (int32_t *)p; p += d64;
    a->o6 = (int32_t *)p; p += ((size_t)(M * nb) * 8 + 63) & ~(size_t)63;
    a->qs4 = M == 1 ? (int8_t *)p : NULL;
    a->sv4 = M == 1 ? (int32_t *)(p + qs) : NULL;
    return FL_OK;
}

void fl_act_q8_free(fl_act_q8 *a) {
    if (a->mem) fl_free(FL_MEM_SCRATCH, a->mem, a->bytes);
    memset(a, 0, sizeof *a);
}

size_t fl_act16_bytes(int64_t M, int64_t K) {
    return (size_t)((M + FL_ACT16_TOKENS - 1) / FL_ACT16_TOKENS) * (size_t)(K / 32) * FL_ACT16_REC;
}

void fl_act16_pack_blocks(const fl_act_q8 *a, int64_t m, void *act, int64_t b0, int64_t b1) {
    const int64_t nb = a->nb, t = m % FL_ACT16_TOKENS;
    char *g = (char *)act + (size_t)(m / FL_ACT16_TOKENS) * (size_t)nb * FL_ACT16_REC;
    for (int64_t b = b0; b < b1; b++) {
        char *r = g + (size_t)b * FL_ACT16_REC;
        const int32_t s = a->s[m * nb + b], o4 = -8 * s, o8 = -128 * s;
        memcpy(r + t * 32, a->qs + m * a->K + b * 32, 32);
        memcpy(r + FL_ACT16_CODES + 4 * t, &o4, 4);
        memcpy(r + FL_ACT16_CODES + 4 * (FL_ACT16_TOKENS + t), &o8, 4);
        memcpy(r + FL_ACT16_CODES + 4 * (2 * FL_ACT16_TOKENS + t), &a->d[m * nb + b], 4);
        memcpy(r + FL_ACT16_CODES + 4 * (3 * FL_ACT16_TOKENS + t), &a->ms[m * nb + b], 4);
    }
}

void fl_act16_pack_row(const fl_act_q8 *a, int64_t m, void *act) { fl_act16_pack_blocks(a, m, act, 0, a->nb); }

void fl_act_q8_quantize_row(fl_act_q8 *a, int64_t m, const float *x) {
    int8_t *q = a->qs + m * a->K;
    for (int64_t b = 0; b < a->nb; b++) {
        const float *xb = x + b * 32;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        /* as ggml's q8_0 activations: codes rint(x * 127 / amax), scale amax / 127 rounded to f16 */
        const float d = fl_f16_to_f32(fl_f32_to_f16(amax / 127)), id = amax > 0 ? 127.0f / amax : 0.0f;
        int s = 0;
        for (int j = 0; j < 32; j++) {
            int v = (int)lrintf(xb[j] * id);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            q[b * 32 + j] = (int8_t)v;
            s += v;
        }
        fl_act_q8_set_block(a, m * a->nb + b, d, s);
    }
    fl_act_q8_order_q4(a, m);
}

void fl_act_q8_order_q4(fl_act_q8 *a, int64_t m) {
    const int8_t *q = a->qs + m * a->K;
    for (int64_t b = 0; b < a->nb; b++) { /* o4 and o6 serve the AVX2 panels and the Q3_K / Q2_K row dots */
        int lo = 0, hi = 0, h[2][2] = {{0, 0}, {0, 0}}; /* h[half][k % 4 >= 2] */
        for (int j = 0; j < 32; j++) {
            if (j % 4 < 2) lo += q[b * 32 + j];
            else hi += q[b * 32 + j];
            h[j / 16][j % 4 >= 2] += q[b * 32 + j];
        }
        a->o4[m * a->nb + b] = (int32_t)(((uint32_t)(uint16_t)(int16_t)(-8 * hi) << 16) | (uint16_t)(int16_t)(-8 * lo));
        for (int i = 0; i < 2; i++)
            a->o6[(m * a->nb + b) * 2 + i] = (int32_t)(((uint32_t)(uint16_t)(int16_t)(-32 * h[i][1]) << 16) | (uint16_t)(int16_t)(-32 * h[i][0]));
    }
    if (!a->qs4) return;
    int8_t *o = a->qs4 + m * a->K;
    for (int64_t b = 0; b < a->nb; b++)
        for (int l = 0; l < 4; l++) a->sv4[(m * a->nb + b) * 4 + l] = -2 * a->s[m * a->nb + b];
    for (int64_t g = 0; g + 4 <= a->nb; g += 4) /* per 4 blocks: the 4 low halves, then the 4 high halves */
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 16; j++) {
                o[g * 32 + k * 16 + j] = q[(g + k) * 32 + j];
                o[g * 32 + 64 + k * 16 + j] = q[(g + k) * 32 + 16 + j];
            }
}

/* Integer dot of one weight row (Q8_0 / Q4_0) with token m: sum over blocks of
 * d_w * d_x * (sum of code products), the int sum exact. */
static float dot_q8_row(int32_t wtype, const void *w, const fl_act_q8 *a, int64_t m) {
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    float sum = 0;
    for (int64_t b = 0; b < a->nb; b++) {
        int32_t is = 0;
        float dw;
        if (wtype == FL_TYPE_Q8_0) {
            const fl_block_q8_0 *blk = (const fl_block_q8_0 *)w + b;
            dw = fl_f16_to_f32(blk->d);
            for (int j = 0; j < 32; j++) is += blk->qs[j] * x[b * 32 + j];
        } else {
            const fl_block_q4_0 *blk = (const fl_block_q4_0 *)w + b;
            dw = fl_f16_to_f32(blk->d);
            for (int j = 0; j < 16; j++)
                is += ((blk->qs[j] & 0xF) - 8) * x[b * 32 + j] + ((blk->qs[j] >> 4) - 8) * x[b * 32 + j + 16];
        }
        sum += dw * dx[b] * (float)is;
    }
    return sum;
}

/* Row i of the Q4_0_R8 / Q8_0_R8 group g with token m: dot_q8_row's arithmetic on the same
 * codes. */
static float dot_r8_row(int32_t wtype, const void *g, int i, const fl_act_q8 *a, int64_t m) {
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    const size_t gbytes = fl_r8_block_bytes(wtype);
    const bool q8 = wtype == FL_TYPE_Q8_0_R8;
    float sum = 0;
    for (int64_t b = 0; b < a->nb; b++) {
        const unsigned char *gb = (const unsigned char *)g + (size_t)b * gbytes;
        uint16_t d;
        memcpy(&d, gb + 2 * i, 2);
        int32_t is = 0;
        if (q8)
            for (int j = 0; j < 32; j++) is += (int8_t)gb[16 + 32 * (j / 4) + 4 * i + j % 4] * x[b * 32 + j];
        else
            for (int j = 0; j < 16; j++) {
                const unsigned char q = gb[16 + 32 * (j / 4) + 4 * i + j % 4];
                is += ((q & 0xF) - 8) * x[b * 32 + j] + ((q >> 4) - 8) * x[b * 32 + j + 16];
            }
        sum += fl_f16_to_f32(d) * dx[b] * (float)is;
    }
    return sum;
}

/* Q4_1 / Q5_0 / Q5_1 / IQ4_NL row with 8-bit activations: per block d_w d_x * (sum of code
 * products, codes as the format defines them: Q5_0 - 16, IQ4_NL its table values), plus for
 * Q4_1 / Q5_1 m * d_x * (activation code sum). */
static float dot_b32_row(int32_t wtype, const void *w, const fl_act_q8 *a, int64_t m) {
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    const int32_t *sx = a->s + m * a->nb;
    const size_t bsz = fl_type_row_size(wtype, 32);
    float sum = 0, mins = 0;
    for (int64_t b = 0; b < a->nb; b++) {
        int c[32];
        float d, mn;
        fl_b32_block_codes(wtype, (const char *)w + b * bsz, c, &d, &mn);
        int32_t is = 0;
        for (int j = 0; j < 32; j++) is += c[j] * x[b * 32 + j];
        sum += d * dx[b] * (float)is;
        mins += mn * dx[b] * (float)sx[b];
    }
    return sum + mins;
}

/* Q2_K row with 8-bit activations in blocks of 32: per 16-code sub-block j (scale byte sc),
 * d (sc & 15) * d_x * sum(q x) - dmin (sc >> 4) * d_x * sum(x), group g = 0..7 of 32 codes taking
 * bits 2 (g % 4) of qs[32 (g / 4) + l] (ref/quant.c's order). */
static float dot_q2_K_row(const void *w, const fl_act_q8 *a, int64_t m) {
    const fl_block_q2_K *blk = w;
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    float sum = 0, mins = 0;
    for (int64_t i = 0; i < a->K / FL_QK_K; i++) {
        const float d = fl_f16_to_f32(blk[i].d), dmin = fl_f16_to_f32(blk[i].dmin);
        for (int g = 0; g < 8; g++)
            for (int h = 0; h < 2; h++) {
                const uint8_t sc = blk[i].scales[2 * g + h];
                int32_t is = 0, xs = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    const int8_t xv = x[i * FL_QK_K + 32 * g + l];
                    is += ((blk[i].qs[32 * (g / 4) + l] >> (2 * (g % 4))) & 3) * xv;
                    xs += xv;
                }
                sum += d * (float)(sc & 0xF) * dx[i * 8 + g] * (float)is;
                mins += dmin * (float)(sc >> 4) * dx[i * 8 + g] * (float)xs;
            }
    }
    return sum - mins;
}

/* Q3_K row with 8-bit activations in blocks of 32: per 16-code sub-block j, d sc_j * d_x of its
 * 32-block * sum(code x), code = two bits - (hmask bit clear ? 4 : 0) (ref/quant.c's order:
 * group g = 0..7 of 32 codes takes bits 2 (g % 4) of qs[32 (g / 4) + l] and bit g of hmask[l]). */
static float dot_q3_K_row(const void *w, const fl_act_q8 *a, int64_t m) {
    const fl_block_q3_K *blk = w;
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    float sum = 0;
    for (int64_t i = 0; i < a->K / FL_QK_K; i++) {
        const float d = fl_f16_to_f32(blk[i].d);
        int8_t sc[16];
        fl_q3_K_scales(blk[i].scales, sc);
        for (int g = 0; g < 8; g++)
            for (int h = 0; h < 2; h++) {
                int32_t is = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    const int c = ((blk[i].qs[32 * (g / 4) + l] >> (2 * (g % 4))) & 3) - ((blk[i].hmask[l] >> g) & 1 ? 0 : 4);
                    is += c * x[i * FL_QK_K + 32 * g + l];
                }
                sum += d * (float)sc[2 * g + h] * dx[i * 8 + g] * (float)is;
            }
    }
    return sum;
}

/* Q4_K / Q5_K row with 8-bit activations in blocks of 32 (one per sub-block): per sub-block j
 * of super-block i, (d sc_j) d_x * sum(q x) - (dmin m_j) * d_x * (code sum); Q5_K's codes add
 * 16 where bit j of qh[l] is set. */
static float dot_k4_row(const void *w, const fl_act_q8 *a, int64_t m, bool q5) {
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    const int32_t *sx = a->s + m * a->nb;
    float sum = 0, mins = 0;
    for (int64_t i = 0; i < a->K / FL_QK_K; i++) {
        const fl_block_q4_K *b4 = (const fl_block_q4_K *)w + i;
        const fl_block_q5_K *b5 = (const fl_block_q5_K *)w + i;
        float sc[8], mn[8];
        if (q5) fl_k4_scales_mins(b5->d, b5->dmin, b5->scales, sc, mn);
        else fl_k4_scales_mins(b4->d, b4->dmin, b4->scales, sc, mn);
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = (q5 ? b5->qs : b4->qs) + (j / 2) * 32;
            const int8_t *xb = x + i * FL_QK_K + j * 32;
            int32_t is = 0;
            for (int l = 0; l < 32; l++)
                is += ((j % 2 ? q[l] >> 4 : q[l] & 0xF) + (q5 && (b5->qh[l] >> j) & 1 ? 16 : 0)) * xb[l];
            const int64_t b = i * 8 + j;
            sum += sc[j] * dx[b] * (float)is;
            mins += mn[j] * dx[b] * (float)sx[b];
        }
    }
    return sum - mins;
}
static float dot_q4_K_row(const void *w, const fl_act_q8 *a, int64_t m) { return dot_k4_row(w, a, m, false); }
static float dot_q5_K_row(const void *w, const fl_act_q8 *a, int64_t m) { return dot_k4_row(w, a, m, true); }

/* Q6_K row with 8-bit activations in blocks of 32: per 16-code sub-block, d sc * d_x of its
 * 32-block * sum((q - 32) x). */
static float dot_q6_K_row(const void *w, const fl_act_q8 *a, int64_t m) {
    const fl_block_q6_K *blk = w;
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    float sum = 0;
    for (int64_t i = 0; i < a->K / FL_QK_K; i++) {
        const float d = fl_f16_to_f32(blk[i].d);
        int8_t q[FL_QK_K];
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = blk[i].ql + 64 * n, *qh = blk[i].qh + 32 * n;
            for (int l = 0; l < 32; l++) {
                q[128 * n + l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                q[128 * n + l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                q[128 * n + l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                q[128 * n + l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        for (int j = 0; j < 16; j++) {
            int32_t is = 0;
            for (int l = 0; l < 16; l++) is += q[16 * j + l] * x[i * FL_QK_K + 16 * j + l];
            sum += d * (float)blk[i].scales[j] * dx[i * 8 + j / 2] * (float)is;
        }
    }
    return sum;
}

void fl_gemm_q8_ref(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt,
                    float *y, int64_t ldy) {
    if (wtype == FL_TYPE_Q4_1 || wtype == FL_TYPE_Q5_0 || wtype == FL_TYPE_Q5_1 || wtype == FL_TYPE_IQ4_NL) {
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < nr; r++) y[t * ldy + r] = dot_b32_row(wtype, (const char *)w + r * ldw, a, m0 + t);
        return;
    }
    if (fl_k16_type(wtype)) { /* the R16 types: w at a group's first row, nr a multiple of 16: each row
                               * unpacked to the base type's blocks and computed as that row */
        FL_ASSERT(nr % FL_K16_ROWS == 0);
        const int32_t base = fl_k16_base(wtype);
        const size_t rb = fl_type_row_size(base, a->K);
        uint64_t buf[rb / 8 + 1];
        for (int r = 0; r < nr; r++) {
            fl_r8_unpack_row(wtype, (const char *)w + (size_t)(r / FL_K16_ROWS) * FL_K16_ROWS * ldw, r % FL_K16_ROWS, a->K, buf);
            fl_gemm_q8_ref(base, buf, rb, 1, a, m0, nt, y + r, ldy);
        }
        return;
    }
    float (*row)(const void *, const fl_act_q8 *, int64_t) = wtype == FL_TYPE_Q4_K   ? dot_q4_K_row
                                                             : wtype == FL_TYPE_Q5_K ? dot_q5_K_row
                                                             : wtype == FL_TYPE_Q6_K ? dot_q6_K_row
                                                             : wtype == FL_TYPE_Q3_K ? dot_q3_K_row
                                                             : wtype == FL_TYPE_Q2_K ? dot_q2_K_row
                                                                                     : NULL;
    if (row) {
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < nr; r++) y[t * ldy + r] = row((const char *)w + r * ldw, a, m0 + t);
        return;
    }
    if (fl_r8_base(wtype) >= 0) { /* w at a group's first row, nr a multiple of 8 */
        FL_ASSERT(nr % FL_R8_ROWS == 0);
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < nr; r++)
                y[t * ldy + r] = dot_r8_row(wtype, (const char *)w + (size_t)(r / FL_R8_ROWS) * FL_R8_ROWS * ldw, r % FL_R8_ROWS, a, m0 + t);
        return;
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++) y[t * ldy + r] = dot_q8_row(wtype, (const char *)w + r * ldw, a, m0 + t);
}

/* ---- llama.cpp's order (fl_matmul_set_llama_order) ----
 * ggml's x86 integer dots (vec_dot_q8_0_q8_0 / q4_0 / q5_0 and the tinyBLAS GEMM) keep 8
 * float lanes: lane l takes the exact int sum of codes 4l..4l+3 of each block, converted to
 * f32 and fused-multiply-added with the block's d_w * d_x; blocks go in order, and the 8 lanes
 * are reduced as (l + l+4), then (0 + 2) + (1 + 3).  Every step is an IEEE f32 operation, so
 * this scalar code gives the same bits as those SIMD kernels. */

/* The 32 signed weight codes of block b of a Q8_0 / Q4_0 / Q5_0 row and its scale. */
static float block_codes(int32_t wtype, const void *w, int64_t b, int8_t *q) {
    if (wtype == FL_TYPE_Q8_0) {
        const fl_block_q8_0 *blk = (const fl_block_q8_0 *)w + b;
        memcpy(q, blk->qs, 32);
        return fl_f16_to_f32(blk->d);
    }
    if (wtype == FL_TYPE_Q4_0) {
        const fl_block_q4_0 *blk = (const fl_block_q4_0 *)w + b;
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((blk->qs[j] & 0xF) - 8);
            q[j + 16] = (int8_t)((blk->qs[j] >> 4) - 8);
        }
        return fl_f16_to_f32(blk->d);
    }
    const fl_block_q5_0 *blk = (const fl_block_q5_0 *)w + b;
    uint32_t qh;
    memcpy(&qh, blk->qh, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((blk->qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
        q[j + 16] = (int8_t)(((blk->qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
    return fl_f16_to_f32(blk->d);
}

float fl_dot_q8_llama(int32_t wtype, const void *w, const fl_act_q8 *a, int64_t m) {
    const int8_t *x = a->qs + m * a->K;
    const float *dx = a->d + m * a->nb;
    float acc[8] = {0};
    for (int64_t b = 0; b < a->nb; b++) {
        int8_t q[32];
        const float d = block_codes(wtype, w, b, q) * dx[b];
        for (int l = 0; l < 8; l++) {
            int32_t is = 0;
            for (int k = 4 * l; k < 4 * l + 4; k++) is += q[k] * x[b * 32 + k];
            acc[l] = fmaf(d, (float)is, acc[l]);
        }
    }
    const float v0 = acc[4] + acc[0], v1 = acc[5] + acc[1], v2 = acc[6] + acc[2], v3 = acc[7] + acc[3];
    return (v0 + v2) + (v1 + v3);
}

/* ---- row panels (see matmul.h): layout reference ---- */

#define PANEL_BLOCK (FL_PANEL_ROWS * 4 + FL_PANEL_ROWS * 32)

size_t fl_panel_bytes(int64_t K) { return (size_t)(K / 32) * PANEL_BLOCK; }

size_t fl_panel_bytes_for(int32_t wtype, int64_t K) {
    if (fl_k16_type(wtype)) wtype = fl_k16_base(wtype); /* (their panels are the base type's) */
    const size_t extra = fl_panel_has_mins(wtype) ? FL_PANEL_ROWS * 4   /* mins */
                         : wtype == FL_TYPE_Q6_K || wtype == FL_TYPE_Q3_K ? FL_PANEL_ROWS * 8 /* 2 scale words */
                         : wtype == FL_TYPE_Q2_K ? FL_PANEL_ROWS * 20 /* 2 scale, 2 min words, dmin */
                                                  : 0;
    return fl_panel_bytes(K) + (size_t)(K / 32) * extra;
}

/* A Q6_K panel's scale words of block b: [i][row] (sc_i, sc_i) as int16 pairs, the scales of
 * the block's two 16-code halves i. */
static int32_t *q6_words(void *panel, int64_t nb, int64_t b, int i) {
    return (int32_t *)((char *)panel + nb * PANEL_BLOCK) + (b * 2 + i) * FL_PANEL_ROWS;
}
/* A Q2_K panel's words of block b: [i][row], i = 0, 1 (sc, sc) and 2, 3 (m, m) of its two halves;
 * then after all of them [K / 32][16] f32 dmin. */
static int32_t *q2_words(void *panel, int64_t nb, int64_t b, int i) {
    return (int32_t *)((char *)panel + nb * PANEL_BLOCK) + (b * 4 + i) * FL_PANEL_ROWS;
}
static float *q2_dmin(void *panel, int64_t nb, int64_t b) {
    return (float *)((char *)panel + nb * PANEL_BLOCK) + nb * 4 * FL_PANEL_ROWS + b * FL_PANEL_ROWS;
}
static int32_t i16_pair(int lo, int hi) { return (int32_t)(((uint32_t)(uint16_t)(int16_t)hi << 16) | (uint16_t)(int16_t)lo); }

void fl_panel_pack_ref(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, void *panel) {
    const int64_t nb = K / 32;
    for (int64_t b = 0; b < nb; b++) {
        char *pb = (char *)panel + b * PANEL_BLOCK;
        float *dw = (float *)pb;
        uint8_t *q = (uint8_t *)pb + FL_PANEL_ROWS * 4;
        for (int r = 0; r < FL_PANEL_ROWS; r++) {
            uint8_t codes[32];
            if (r >= nr) {
                dw[r] = 0;
                memset(codes, 0, sizeof codes);
                if (fl_panel_has_mins(wtype)) ((float *)((char *)panel + nb * PANEL_BLOCK))[b * FL_PANEL_ROWS + r] = 0;
                if (wtype == FL_TYPE_Q6_K || wtype == FL_TYPE_Q3_K)
                    for (int i = 0; i < 2; i++) q6_words(panel, nb, b, i)[r] = 0;
                if (wtype == FL_TYPE_Q2_K) {
                    for (int i = 0; i < 4; i++) q2_words(panel, nb, b, i)[r] = 0;
                    q2_dmin(panel, nb, b)[r] = 0;
                }
            } else if (wtype == FL_TYPE_Q2_K) { /* 32-block b: shift 2 (b % 4) of qs[32 ((b % 8) / 4) ..] */
                const fl_block_q2_K *blk = (const fl_block_q2_K *)((const char *)w + r * ldw) + b / 8;
                const int j = (int)(b % 8), n = j / 4, jj = j % 4;
                dw[r] = fl_f16_to_f32(blk->d);
                q2_dmin(panel, nb, b)[r] = fl_f16_to_f32(blk->dmin);
                for (int i = 0; i < 2; i++) {
                    const int sc = blk->scales[2 * j + i] & 0xF, mn = blk->scales[2 * j + i] >> 4;
                    q2_words(panel, nb, b, i)[r] = i16_pair(sc, sc);
                    q2_words(panel, nb, b, 2 + i)[r] = i16_pair(mn, mn);
                }
                for (int l = 0; l < 32; l++) codes[l] = (uint8_t)((blk->qs[32 * n + l] >> (2 * jj)) & 3);
            } else if (wtype == FL_TYPE_Q3_K) { /* 32-block b: shift 2 (b % 4) of qs[32 ((b % 8) / 4) ..], hmask bit b % 8 */
                const fl_block_q3_K *blk = (const fl_block_q3_K *)((const char *)w + r * ldw) + b / 8;
                const int j = (int)(b % 8), n = j / 4, jj = j % 4;
                int8_t sc16[16];
                fl_q3_K_scales(blk->scales, sc16);
                dw[r] = fl_f16_to_f32(blk->d);
                q6_words(panel, nb, b, 0)[r] = i16_pair(sc16[2 * j], sc16[2 * j]);
                q6_words(panel, nb, b, 1)[r] = i16_pair(sc16[2 * j + 1], sc16[2 * j + 1]);
                for (int l = 0; l < 32; l++) /* code 0..7 = value + 4 */
                    codes[l] = (uint8_t)(((blk->qs[32 * n + l] >> (2 * jj)) & 3) | (((blk->hmask[l] >> j) & 1) << 2));
            } else if (wtype == FL_TYPE_Q6_K) { /* 32-block b = quarter b % 4 of half (b % 8) / 4 of super-block b / 8 */
                const fl_block_q6_K *blk = (const fl_block_q6_K *)((const char *)w + r * ldw) + b / 8;
                const int n = (int)(b % 8) / 4, qq = (int)(b % 4);
                dw[r] = fl_f16_to_f32(blk->d);
                const int lo = blk->scales[8 * n + 2 * qq], hi = blk->scales[8 * n + 2 * qq + 1];
                q6_words(panel, nb, b, 0)[r] = i16_pair(lo, lo);
                q6_words(panel, nb, b, 1)[r] = i16_pair(hi, hi);
                for (int l = 0; l < 32; l++)
                    codes[l] = (uint8_t)(((blk->ql[64 * n + 32 * (qq % 2) + l] >> (4 * (qq / 2))) & 0xF) |
                                         (((blk->qh[32 * n + l] >> (2 * qq)) & 3) << 4));
            } else if (wtype == FL_TYPE_Q8_0) {
                const fl_block_q8_0 *blk = (const fl_block_q8_0 *)((const char *)w + r * ldw) + b;
                dw[r] = fl_f16_to_f32(blk->d);
                for (int j = 0; j < 32; j++) codes[j] = (uint8_t)(blk->qs[j] + 128);
            } else if (wtype == FL_TYPE_Q4_K || wtype == FL_TYPE_Q5_K) { /* Q5_K: the same fields, qh before qs */
                const bool q5 = wtype == FL_TYPE_Q5_K;
                const fl_block_q4_K *b4 = (const fl_block_q4_K *)((const char *)w + r * ldw) + b / 8;
                const fl_block_q5_K *b5 = (const fl_block_q5_K *)((const char *)w + r * ldw) + b / 8;
                const int j = (int)(b % 8);
                const uint8_t *qs = q5 ? b5->qs : b4->qs;
                uint8_t sc, mn;
                fl_q4_K_scale_min(j, q5 ? b5->scales : b4->scales, &sc, &mn);
                dw[r] = fl_f16_to_f32(q5 ? b5->d : b4->d) * (float)sc;
                /* Q5_K sums (q - 16) x: its mins word carries the 16 d sc_j back (16 dw is exact) */
                ((float *)((char *)panel + nb * PANEL_BLOCK))[b * FL_PANEL_ROWS + r] =
                    fl_f16_to_f32(q5 ? b5->dmin : b4->dmin) * (float)mn - (q5 ? 16 * dw[r] : 0.0f);
                for (int l = 0; l < 32; l++)
                    codes[l] = (uint8_t)((j % 2 ? qs[(j / 2) * 32 + l] >> 4 : qs[(j / 2) * 32 + l] & 0xF) + (q5 && (b5->qh[l] >> j) & 1 ? 16 : 0));
            } else if (wtype == FL_TYPE_Q4_1 || wtype == FL_TYPE_Q5_0 || wtype == FL_TYPE_Q5_1) {
                const char *row = (const char *)w + r * ldw;
                const fl_block_q4_1 *b41 = (const fl_block_q4_1 *)row + b;
                const fl_block_q5_0 *b50 = (const fl_block_q5_0 *)row + b;
                const fl_block_q5_1 *b51 = (const fl_block_q5_1 *)row + b;
                const uint8_t *qs = wtype == FL_TYPE_Q4_1 ? b41->qs : wtype == FL_TYPE_Q5_0 ? b50->qs : b51->qs;
                uint32_t qh = 0;
                if (wtype != FL_TYPE_Q4_1) memcpy(&qh, wtype == FL_TYPE_Q5_0 ? b50->qh : b51->qh, 4);
                dw[r] = fl_f16_to_f32(wtype == FL_TYPE_Q4_1 ? b41->d : wtype == FL_TYPE_Q5_0 ? b50->d : b51->d);
                /* the mins word: d q + m = d (q - 16) + (16 d + m) for Q5_1 (16 dw is exact) */
                ((float *)((char *)panel + nb * PANEL_BLOCK))[b * FL_PANEL_ROWS + r] =
                    wtype == FL_TYPE_Q4_1 ? -fl_f16_to_f32(b41->m) : wtype == FL_TYPE_Q5_0 ? 0.0f : -(16 * dw[r] + fl_f16_to_f32(b51->m));
                for (int j = 0; j < 16; j++) {
                    codes[j] = (uint8_t)((qs[j] & 0xF) | ((qh >> j) & 1) << 4);
                    codes[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
                }
            } else {
                const fl_block_q4_0 *blk = (const fl_block_q4_0 *)((const char *)w + r * ldw) + b;
                dw[r] = fl_f16_to_f32(blk->d);
                for (int j = 0; j < 16; j++) { /* IQ4_NL: its table values + 128 */
                    codes[j] = wtype == FL_TYPE_IQ4_NL ? (uint8_t)(fl_iq4nl_values[blk->qs[j] & 0xF] + 128) : blk->qs[j] & 0xF;
                    codes[j + 16] = wtype == FL_TYPE_IQ4_NL ? (uint8_t)(fl_iq4nl_values[blk->qs[j] >> 4] + 128) : blk->qs[j] >> 4;
                }
            }
            for (int k = 0; k < 32; k++) q[(k / 4) * FL_PANEL_ROWS * 4 + r * 4 + k % 4] = codes[k];
        }
    }
}

void fl_panel_gemm_ref(int32_t wtype, const void *panel, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                       int64_t ldy) {
    const bool q6 = wtype == FL_TYPE_Q6_K || wtype == FL_TYPE_Q3_K; /* scales per 16 codes */
    const int32_t off16 = wtype == FL_TYPE_Q6_K ? 32 : 4;
    const bool q2 = wtype == FL_TYPE_Q2_K; /* a scale and a min per 16 codes */
    const int32_t off = fl_panel_offset(wtype);
    const float *mins = fl_panel_has_mins(wtype) ? (const float *)((const char *)panel + a->nb * PANEL_BLOCK) : NULL;
    for (int t = 0; t < nt; t++) {
        const int64_t m = m0 + t;
        for (int r = 0; r < nr; r++) {
            float sum = 0;
            for (int64_t b = 0; b < a->nb; b++) {
                const char *pb = (const char *)panel + b * PANEL_BLOCK;
                const uint8_t *q = (const uint8_t *)pb + FL_PANEL_ROWS * 4;
                const int8_t *x = a->qs + m * a->K + b * 32;
                int32_t is = -off * a->s[m * a->nb + b];
                /* Q6_K (Q3_K): each half's code sum times its scale, less 32 (4) x its scale x the half's activation sum */
                const int32_t sc[2] = {q6 ? (int16_t)q6_words((void *)panel, a->nb, b, 0)[r] : q2 ? (int16_t)q2_words((void *)panel, a->nb, b, 0)[r] : 1,
                                       q6 ? (int16_t)q6_words((void *)panel, a->nb, b, 1)[r] : q2 ? (int16_t)q2_words((void *)panel, a->nb, b, 1)[r] : 1};
                for (int k = 0; k < 32; k++) is += sc[k / 16] * q[(k / 4) * FL_PANEL_ROWS * 4 + r * 4 + k % 4] * x[k];
                if (q6)
                    for (int k = 0; k < 32; k++) is -= off16 * sc[k / 16] * x[k];
                sum += ((const float *)pb)[r] * a->d[m * a->nb + b] * (float)is;
                if (q2) { /* Q2_K: less dmin x its half-block mins x the halves' activation sums */
                    int32_t im = 0;
                    for (int k = 0; k < 32; k++) im += (int16_t)q2_words((void *)panel, a->nb, b, 2 + k / 16)[r] * x[k];
                    sum -= q2_dmin((void *)panel, a->nb, b)[r] * a->d[m * a->nb + b] * (float)im;
                }
                if (mins) sum += mins[b * FL_PANEL_ROWS + r] * a->ms[m * a->nb + b];
            }
            y[t * ldy + r] = sum;
        }
    }
}
