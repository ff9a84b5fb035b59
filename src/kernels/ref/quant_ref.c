/* Scalar reference quantizers (f32 -> blocks).
 *
 * Legacy types: round to nearest with the scale from the element of largest magnitude (q*_0)
 * or from the range (q*_1), computed in f32 exactly as ggml's reference quantizers do, so the
 * blocks are byte-identical to llama-quantize's.  K-quants: each sub-block's scale (and min)
 * is fitted by a small search over candidate scales with a least-squares refit, the sub-block
 * scales are quantized against the super-block scale, and finally every code is re-rounded
 * against the scale it will actually be decoded with. */
#include "kernels/quant.h"
#include "core/status.h"
#include "core/threads.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#define F2H(x) fl_f32_to_f16(x)
#define H2F(x) fl_f16_to_f32(x)

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- legacy types ---- */

static void quant_q4_0(const float *x, fl_block_q4_0 *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK; i++, x += FL_QK) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d = max / -8, id = d ? 1.0f / d : 0.0f;
        y[i].d = F2H(d);
        for (int j = 0; j < 16; j++) {
            const int a = clampi((int8_t)(x[j] * id + 8.5f), -128, 15);
            const int b = clampi((int8_t)(x[16 + j] * id + 8.5f), -128, 15);
            y[i].qs[j] = (uint8_t)(a | (b << 4));
        }
    }
}

static void quant_q4_1(const float *x, fl_block_q4_1 *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK; i++, x += FL_QK) {
        float mn = FLT_MAX, mx = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < mn) mn = x[j];
            if (x[j] > mx) mx = x[j];
        }
        const float d = (mx - mn) / 15, id = d ? 1.0f / d : 0.0f;
        y[i].d = F2H(d);
        y[i].m = F2H(mn);
        for (int j = 0; j < 16; j++) {
            const int a = clampi((int8_t)((x[j] - mn) * id + 0.5f), -128, 15);
            const int b = clampi((int8_t)((x[16 + j] - mn) * id + 0.5f), -128, 15);
            y[i].qs[j] = (uint8_t)(a | (b << 4));
        }
    }
}

static void quant_q5_0(const float *x, fl_block_q5_0 *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK; i++, x += FL_QK) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d = max / -16, id = d ? 1.0f / d : 0.0f;
        y[i].d = F2H(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const int a = clampi((int8_t)(x[j] * id + 16.5f), -128, 31);
            const int b = clampi((int8_t)(x[16 + j] * id + 16.5f), -128, 31);
            y[i].qs[j] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
            qh |= (uint32_t)((a & 0x10) >> 4) << j;
            qh |= (uint32_t)((b & 0x10) >> 4) << (j + 16);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

static void quant_q5_1(const float *x, fl_block_q5_1 *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK; i++, x += FL_QK) {
        float mn = FLT_MAX, mx = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < mn) mn = x[j];
            if (x[j] > mx) mx = x[j];
        }
        const float d = (mx - mn) / 31, id = d ? 1.0f / d : 0.0f;
        y[i].d = F2H(d);
        y[i].m = F2H(mn);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const int a = (uint8_t)((x[j] - mn) * id + 0.5f);
            const int b = (uint8_t)((x[16 + j] - mn) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
            qh |= (uint32_t)((a & 0x10) >> 4) << j;
            qh |= (uint32_t)((b & 0x10) >> 4) << (j + 16);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

void fl_quantize_row_q8_0(const float *x, fl_block_q8_0 *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK; i++, x += FL_QK) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        y[i].d = F2H(d);
        for (int j = 0; j < 32; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void fl_quantize_row_q8_K(const float *x, fl_block_q8_K *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK_K; i++, x += FL_QK_K) {
        float amax = 0;
        for (int j = 0; j < FL_QK_K; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        y[i].d = d;
        for (int j = 0; j < FL_QK_K; j++) y[i].qs[j] = (int8_t)clampi((int)lrintf(x[j] * id), -127, 127);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += y[i].qs[g * 16 + j];
            y[i].bsums[g] = (int16_t)s;
        }
    }
}

/* ---- K-quant helpers ---- */

/* Fit x ~= s * q + mn with q in [0, nmax], mn <= 0 (affine, for q2_K/q4_K/q5_K sub-blocks).
 * Tries a range of scales around (max - min) / nmax, refits (s, mn) by least squares for each
 * candidate code assignment, keeps the lowest squared error (the first of equals).  Returns
 * s >= 0 and -mn >= 0.  The candidates go AFFINE_G at a time through each loop over x, each with
 * its own sums in the same order as one at a time (same results), so that the sums' dependency
 * chains overlap. */
#define AFFINE_STEPS 12 /* candidates -12 .. 12 */
#define AFFINE_G 5      /* divides 2 * AFFINE_STEPS + 1 */
static void fit_affine(const float *x, int n, int nmax, float *out_s, float *out_m) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
    }
    if (mn > 0) mn = 0;
    if (mx <= mn) { *out_s = 0; *out_m = -mn; return; }
    double sx = 0;
    for (int i = 0; i < n; i++) sx += x[i];
    float best_s = (mx - mn) / nmax, best_mn = mn, best_err = FLT_MAX;
    for (int step0 = -AFFINE_STEPS; step0 <= AFFINE_STEPS; step0 += AFFINE_G) {
        float iscale[AFFINE_G];
        double sq[AFFINE_G] = {0}, sqq[AFFINE_G] = {0}, sxq[AFFINE_G] = {0}, s[AFFINE_G], m[AFFINE_G];
        bool skip[AFFINE_G];
        for (int g = 0; g < AFFINE_G; g++) {
            iscale[g] = (nmax + 0.08f * (step0 + g)) / (mx - mn);
            skip[g] = iscale[g] <= 0;
        }
        for (int i = 0; i < n; i++)
#pragma GCC unroll 8
            for (int g = 0; g < AFFINE_G; g++) {
                const int q = clampi((int)lrintf((x[i] - mn) * iscale[g]), 0, nmax);
                sq[g] += q; sqq[g] += (double)q * q; sxq[g] += (double)x[i] * q;
            }
        for (int g = 0; g < AFFINE_G; g++) { /* least squares for x = s q + m */
            const double det = n * sqq[g] - sq[g] * sq[g];
            if (det > 0) {
                s[g] = (n * sxq[g] - sq[g] * sx) / det;
                m[g] = (sx - s[g] * sq[g]) / n;
            } else { s[g] = 0; m[g] = sx / n; }
            if (m[g] > 0) { m[g] = 0; s[g] = sqq[g] > 0 ? sxq[g] / sqq[g] : 0; }
            if (s[g] < 0) skip[g] = true;
        }
        float err[AFFINE_G] = {0};
        for (int i = 0; i < n; i++)
#pragma GCC unroll 8
            for (int g = 0; g < AFFINE_G; g++) {
                /* error with codes re-rounded against the fitted (s, m) */
                const int qi = s[g] > 0 ? clampi((int)lrintf((float)((x[i] - m[g]) / s[g])), 0, nmax) : 0;
                const float e = (float)(s[g] * qi + m[g]) - x[i];
                err[g] += e * e;
            }
        for (int g = 0; g < AFFINE_G; g++)
            if (!skip[g] && err[g] < best_err) { best_err = err[g]; best_s = (float)s[g]; best_mn = (float)m[g]; }
    }
    *out_s = best_s;
    *out_m = -best_mn;
}

/* Fit x ~= s * q with q in [qmin, qmax] (symmetric, for q3_K/q6_K).  s may be negative.  As
 * fit_affine, SYM_G candidates at a time, each summed in its own order. */
#define SYM_STEPS 10 /* candidates -10 .. 10 per side */
#define SYM_G 7      /* divides 2 * SYM_STEPS + 1 */
static float fit_sym(const float *x, int n, int qmin, int qmax) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    if (amax == 0) return 0;
    float best_s = 0, best_err = FLT_MAX;
    for (int side = 0; side < 2; side++) {
        const int target = side ? qmin : qmax; /* map the extreme element to qmin or qmax */
        for (int step0 = -SYM_STEPS; step0 <= SYM_STEPS; step0 += SYM_G) {
            float s0[SYM_G], s[SYM_G];
            bool skip[SYM_G];
            double sxq[SYM_G] = {0}, sqq[SYM_G] = {0};
            for (int g = 0; g < SYM_G; g++) {
                const float t = (float)target * (1.0f + 0.02f * (step0 + g));
                s0[g] = t == 0 ? 0 : max / t;
                skip[g] = s0[g] == 0;
                if (skip[g]) s0[g] = 1; /* any finite value: its sums are not used */
            }
            for (int i = 0; i < n; i++)
#pragma GCC unroll 8
                for (int g = 0; g < SYM_G; g++) {
                    const int q = clampi((int)lrintf(x[i] / s0[g]), qmin, qmax);
                    sxq[g] += (double)x[i] * q; sqq[g] += (double)q * q;
                }
            for (int g = 0; g < SYM_G; g++) {
                if (sqq[g] <= 0) skip[g] = true;
                s[g] = skip[g] ? 1 : (float)(sxq[g] / sqq[g]);
                if (s[g] == 0) { skip[g] = true; s[g] = 1; }
            }
            float err[SYM_G] = {0};
            for (int i = 0; i < n; i++)
#pragma GCC unroll 8
                for (int g = 0; g < SYM_G; g++) {
                    const int q = clampi((int)lrintf(x[i] / s[g]), qmin, qmax);
                    const float e = s[g] * q - x[i];
                    err[g] += e * e;
                }
            for (int g = 0; g < SYM_G; g++)
                if (!skip[g] && err[g] < best_err) { best_err = err[g]; best_s = s[g]; }
        }
    }
    return best_s;
}

/* Pack 8 (scale, min) 6-bit pairs into q4_K/q5_K's 12 bytes. */
static void pack_k4_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12]) {
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

/* Affine K-quant core shared by q2_K (16x16, 4-bit scales), q4_K and q5_K (8x32, 6-bit):
 * produces per-element codes L[256], per-sub-block quantized scale/min, and d/dmin (f16). */
static void kquant_affine(const float *x, int nsub, int nmax, int scale_max, uint8_t *L, uint8_t *qsc,
                          uint8_t *qm, uint16_t *d16, uint16_t *dmin16) {
    const int sub = FL_QK_K / nsub;
    float s[16], m[16], max_s = 0, max_m = 0;
    for (int j = 0; j < nsub; j++) {
        fit_affine(x + j * sub, sub, nmax, &s[j], &m[j]);
        if (s[j] > max_s) max_s = s[j];
        if (m[j] > max_m) max_m = m[j];
    }
    const float d = max_s / scale_max, dmin = max_m / scale_max;
    *d16 = F2H(d);
    *dmin16 = F2H(dmin);
    const float dq = H2F(*d16), dmq = H2F(*dmin16);
    for (int j = 0; j < nsub; j++) {
        qsc[j] = (uint8_t)clampi(dq > 0 ? (int)lrintf(s[j] / dq) : 0, 0, scale_max);
        qm[j] = (uint8_t)clampi(dmq > 0 ? (int)lrintf(m[j] / dmq) : 0, 0, scale_max);
        const float ds = dq * qsc[j], dm = dmq * qm[j];
        for (int i = 0; i < sub; i++) {
            const float v = x[j * sub + i];
            L[j * sub + i] = (uint8_t)(ds > 0 ? clampi((int)lrintf((v + dm) / ds), 0, nmax) : 0);
        }
    }
}

static void quant_q2_K(const float *x, fl_block_q2_K *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK_K; i++, x += FL_QK_K) {
        uint8_t L[256], sc[16], m[16];
        kquant_affine(x, 16, 3, 15, L, sc, m, &y[i].d, &y[i].dmin);
        for (int j = 0; j < 16; j++) y[i].scales[j] = (uint8_t)(sc[j] | (m[j] << 4));
        memset(y[i].qs, 0, 64);
        for (int e = 0; e < 256; e++) {
            const int n = e / 128, r = e % 128, j = r / 32, ll = r % 32;
            y[i].qs[n * 32 + ll] |= (uint8_t)(L[e] << (2 * j));
        }
    }
}

static void quant_q4_K(const float *x, fl_block_q4_K *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK_K; i++, x += FL_QK_K) {
        uint8_t L[256], sc[8], m[8];
        kquant_affine(x, 8, 15, 63, L, sc, m, &y[i].d, &y[i].dmin);
        pack_k4_scales(sc, m, y[i].scales);
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) y[i].qs[p * 32 + l] = (uint8_t)(L[p * 64 + l] | (L[p * 64 + 32 + l] << 4));
    }
}

static void quant_q5_K(const float *x, fl_block_q5_K *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK_K; i++, x += FL_QK_K) {
        uint8_t L[256], sc[8], m[8];
        kquant_affine(x, 8, 31, 63, L, sc, m, &y[i].d, &y[i].dmin);
        pack_k4_scales(sc, m, y[i].scales);
        memset(y[i].qh, 0, 32);
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) {
                const int a = L[p * 64 + l], b = L[p * 64 + 32 + l];
                y[i].qs[p * 32 + l] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
                y[i].qh[l] |= (uint8_t)(((a >> 4) << (2 * p)) | ((b >> 4) << (2 * p + 1)));
            }
    }
}

/* Symmetric K-quant core (q3_K: q in [-4,3], 6-bit signed scales; q6_K: [-32,31], int8). */
static void kquant_sym(const float *x, int qmin, int qmax, int sc_lo, int sc_hi, int8_t *L, int8_t *qsc,
                       uint16_t *d16) {
    float s[16], amax = 0, max = 0;
    for (int j = 0; j < 16; j++) {
        s[j] = fit_sym(x + j * 16, 16, qmin, qmax);
        if (fabsf(s[j]) > amax) { amax = fabsf(s[j]); max = s[j]; }
    }
    /* map the largest scale to sc_lo (the longer side of the signed range) */
    const float d = max / sc_lo;
    *d16 = F2H(d);
    const float dq = H2F(*d16);
    for (int j = 0; j < 16; j++) {
        qsc[j] = (int8_t)clampi(dq != 0 ? (int)lrintf(s[j] / dq) : 0, sc_lo, sc_hi);
        const float ds = dq * qsc[j];
        for (int i = 0; i < 16; i++)
            L[j * 16 + i] = (int8_t)(ds != 0 ? clampi((int)lrintf(x[j * 16 + i] / ds), qmin, qmax) : 0);
    }
}

static void quant_q3_K(const float *x, fl_block_q3_K *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK_K; i++, x += FL_QK_K) {
        int8_t L[256], sc[16];
        kquant_sym(x, -4, 3, -32, 31, L, sc, &y[i].d);
        memset(y[i].scales, 0, 12);
        for (int j = 0; j < 16; j++) {
            const int v = sc[j] + 32;
            if (j < 8) y[i].scales[j] |= (uint8_t)(v & 0xF);
            else y[i].scales[j - 8] |= (uint8_t)((v & 0xF) << 4);
            y[i].scales[8 + (j & 3)] |= (uint8_t)((v >> 4) << (2 * (j >> 2)));
        }
        memset(y[i].qs, 0, 64);
        memset(y[i].hmask, 0, 32);
        for (int e = 0; e < 256; e++) {
            const int v = L[e] + 4, n = e / 128, r = e % 128, j = r / 32, ll = r % 32;
            y[i].qs[n * 32 + ll] |= (uint8_t)((v & 3) << (2 * j));
            if (v & 4) y[i].hmask[ll] |= (uint8_t)(1 << (n * 4 + j));
        }
    }
}

static void quant_q6_K(const float *x, fl_block_q6_K *y, int64_t k) {
    for (int64_t i = 0; i < k / FL_QK_K; i++, x += FL_QK_K) {
        int8_t L[256];
        kquant_sym(x, -32, 31, -128, 127, L, y[i].scales, &y[i].d);
        memset(y[i].qh, 0, 64);
        for (int n = 0; n < 2; n++)
            for (int l = 0; l < 32; l++) {
                const int e = n * 128 + l;
                const int q1 = L[e] + 32, q2 = L[e + 32] + 32, q3 = L[e + 64] + 32, q4 = L[e + 96] + 32;
                y[i].ql[n * 64 + l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                y[i].ql[n * 64 + l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                y[i].qh[n * 32 + l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
    }
}

/* Nearest entry of the (ascending) IQ4_NL table: how many of its 15 midpoints v is above (what
 * a binary search over them gives, without the branches it mispredicted about every other step:
 * the quantizer below takes 3200 codes per block, and a TinyLlama-shaped `fitllm synth --type
 * IQ4_NL` ran for more than 15 minutes).  The midpoints are integers or halves 12 or more apart,
 * so each unit cell [n - 128, n - 127) holds at most one: base[n] counts those below the cell,
 * mid[n] is the one inside (or +inf).  v + 128 may round up to the next integer when v is just
 * below one, but no midpoint lies between v and that integer. */
typedef struct {
    uint8_t base[256];
    float mid[256];
} iq4nl_cells;

static void iq4nl_cells_init(iq4nl_cells *L) {
    for (int n = 0; n < 256; n++) {
        L->base[n] = 0;
        L->mid[n] = INFINITY;
        for (int i = 0; i < 15; i++) {
            const float m = 0.5f * (float)(fl_iq4nl_values[i] + fl_iq4nl_values[i + 1]);
            if (m < (float)(n - 128)) L->base[n]++;
            else if (m < (float)(n - 127)) L->mid[n] = m;
        }
    }
}

static int iq4nl_code(const iq4nl_cells *L, float v) {
    if (!(v >= -128.0f)) return 0; /* (and NaN, as the search gave) */
    if (v >= 128.0f) return 15;
    int n = (int)(v + 128.0f);
    if (n > 255) n = 255;
    return L->base[n] + (v > L->mid[n]);
}
/* Search d over candidates that map the extreme element near either end of the table, with a
 * least-squares refit of d for each code assignment; keep the smallest squared error. */
static void quant_iq4_nl(const float *x, fl_block_iq4_nl *y, int64_t k) {
    iq4nl_cells cells, *mid = &cells;
    iq4nl_cells_init(mid);
    for (int64_t i = 0; i < k / FL_QK; i++, x += FL_QK) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        float best_d = 0, best_err = FLT_MAX;
        for (int side = 0; side < 2 && amax > 0; side++) {
            for (int step = -12; step <= 12; step++) {
                const float t = (side ? fl_iq4nl_values[15] : fl_iq4nl_values[0]) * (1.0f + 0.015f * step);
                const float id = t / max;
                double sxq = 0, sqq = 0;
                for (int j = 0; j < 32; j++) {
                    const float v = fl_iq4nl_values[iq4nl_code(mid, x[j] * id)];
                    sxq += (double)x[j] * v; sqq += (double)v * v;
                }
                if (sqq <= 0) continue;
                const float d = fl_f16_to_f32(F2H((float)(sxq / sqq)));
                if (d == 0) continue;
                float err = 0;
                for (int j = 0; j < 32; j++) {
                    const float e = d * fl_iq4nl_values[iq4nl_code(mid, x[j] / d)] - x[j];
                    err += e * e;
                }
                if (err < best_err) { best_err = err; best_d = d; }
            }
        }
        y[i].d = F2H(best_d);
        uint8_t q[32];
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)(best_d != 0 ? iq4nl_code(mid, x[j] / best_d) : 8);
        for (int j = 0; j < 16; j++) y[i].qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

uint8_t fl_nf4_code_ref(float v) {
    int best = 0;
    for (int c = 1; c < 16; c++)
        if (fabsf(v - fl_nf4_values[c]) < fabsf(v - fl_nf4_values[best])) best = c;
    return (uint8_t)best;
}

/* fl_nf4_code_ref's answer without its 15 comparisons: the values are sorted and at least 0.07
 * apart, so the distances fall to the nearest value and rise after it with no ties but between
 * the two values around v (below 2 in magnitude, where a float's rounding is far finer than the
 * gaps); the lower index keeps a tie, as the loop's strict < does.  Other values (beyond 2 the
 * distances can round equal; infinities, NaN) take the loop; the quantizer's are within ~1.4. */
uint8_t fl_nf4_code(float v) {
    if (!(fabsf(v) < 2.0f)) return fl_nf4_code_ref(v);
    int c = 0; /* the count of values <= v, by halves */
    for (int h = 8; h > 0; h >>= 1)
        if (fl_nf4_values[c + h - 1] <= v) c += h;
    if (c == 0) return 0;
    if (c == 16) return 15;
    return (uint8_t)(fabsf(v - fl_nf4_values[c]) < fabsf(v - fl_nf4_values[c - 1]) ? c : c - 1);
}

static void quant_nf4(const float *x, void *dst, int64_t k) {
    uint8_t *p = dst;
    const int64_t nb = k / 64;
    for (int64_t g = 0; g < nb; g += 256) {
        const int64_t ng = nb - g < 256 ? nb - g : 256;
        float gmax = 0;
        for (int64_t i = 0; i < ng * 64; i++) { /* fmaxf's answers, without its calls */
            const float a = fabsf(x[g * 64 + i]);
            gmax = a > gmax ? a : gmax;
        }
        const float gscale = gmax / 255;
        memcpy(p, &gscale, 4);
        p += 4;
        for (int64_t i = 0; i < ng; i++, p += 33) {
            const float *xb = x + (g + i) * 64;
            float amax = 0;
            for (int j = 0; j < 64; j++) {
                const float a = fabsf(xb[j]);
                amax = a > amax ? a : amax;
            }
            int sc = gscale > 0 ? (int)lrintf(amax / gscale) : 0;
            sc = clampi(sc, amax > 0 ? 1 : 0, 255);
            p[0] = (uint8_t)sc;
            const float a = gscale * (float)sc, ia = a > 0 ? 1.0f / a : 0.0f;
            for (int j = 0; j < 32; j++) p[1 + j] = (uint8_t)(fl_nf4_code(xb[j] * ia) | (fl_nf4_code(xb[j + 32] * ia) << 4));
        }
    }
}

static void quant_fp8_e4m3(const float *x, void *dst, int64_t k) {
    uint8_t *p = dst;
    float amax = 0;
    for (int64_t j = 0; j < k; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float s = amax / FL_FP8_E4M3_MAX, is = s > 0 ? 1.0f / s : 0.0f;
    memcpy(p, &s, 4);
    for (int64_t j = 0; j < k; j++) p[4 + j] = fl_f32_to_fp8_e4m3(x[j] * is);
}

int fl_quantize_supported(int32_t type) {
    switch (type) {
    case FL_TYPE_Q4_0: case FL_TYPE_Q4_1: case FL_TYPE_Q5_0: case FL_TYPE_Q5_1: case FL_TYPE_Q8_0:
    case FL_TYPE_Q2_K: case FL_TYPE_Q3_K: case FL_TYPE_Q4_K: case FL_TYPE_Q5_K: case FL_TYPE_Q6_K:
    case FL_TYPE_Q8_K: case FL_TYPE_IQ4_NL: case FL_TYPE_NF4: case FL_TYPE_FP8_E4M3:
    case FL_TYPE_F32: case FL_TYPE_F16: case FL_TYPE_BF16:
        return 1;
    default: return 0;
    }
}

fl_status fl_quantize_row(int32_t type, const float *x, void *dst, int64_t k) {
    if (!fl_type_row_size(type, k))
        return fl_set_error(FL_ERR_INVALID, "quantize: row of %lld is not a multiple of %s's block", (long long)k, fl_type_name(type));
    switch (type) {
    case FL_TYPE_Q4_0: quant_q4_0(x, dst, k); break;
    case FL_TYPE_Q4_1: quant_q4_1(x, dst, k); break;
    case FL_TYPE_Q5_0: quant_q5_0(x, dst, k); break;
    case FL_TYPE_Q5_1: quant_q5_1(x, dst, k); break;
    case FL_TYPE_Q8_0: fl_quantize_row_q8_0(x, dst, k); break;
    case FL_TYPE_Q2_K: quant_q2_K(x, dst, k); break;
    case FL_TYPE_Q3_K: quant_q3_K(x, dst, k); break;
    case FL_TYPE_Q4_K: quant_q4_K(x, dst, k); break;
    case FL_TYPE_Q5_K: quant_q5_K(x, dst, k); break;
    case FL_TYPE_Q6_K: quant_q6_K(x, dst, k); break;
    case FL_TYPE_Q8_K: fl_quantize_row_q8_K(x, dst, k); break;
    case FL_TYPE_IQ4_NL: quant_iq4_nl(x, dst, k); break;
    case FL_TYPE_NF4: quant_nf4(x, dst, k); break;
    case FL_TYPE_FP8_E4M3: quant_fp8_e4m3(x, dst, k); break;
    case FL_TYPE_F32: memcpy(dst, x, (size_t)k * 4); break;
    case FL_TYPE_F16: for (int64_t i = 0; i < k; i++) ((uint16_t *)dst)[i] = fl_f32_to_f16(x[i]); break;
    case FL_TYPE_BF16: for (int64_t i = 0; i < k; i++) ((uint16_t *)dst)[i] = fl_f32_to_bf16(x[i]); break;
    default: return fl_set_error(FL_ERR_UNSUPPORTED, "quantize: no quantizer for type %s", fl_type_name(type));
    }
    return FL_OK;
}

size_t fl_quantize_size(int32_t dst_type, int64_t nrows, int64_t K) {
    if (nrows < 0) return 0;
    return (size_t)nrows * fl_type_row_size(dst_type, K);
}

typedef struct { int32_t type; const float *src; int64_t nrows, K; char *dst; size_t rs; } qt_ctx;

static void qt_task(void *p, int ith, int nth) {
    qt_ctx *c = p;
    int64_t lo, hi;
    fl_split_range(c->nrows, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) fl_quantize_row(c->type, c->src + r * c->K, c->dst + (size_t)r * c->rs, c->K);
}

fl_status fl_quantize_tensor(int32_t dst_type, const float *src, int64_t nrows, int64_t K, void *dst) {
    if (!fl_quantize_supported(dst_type))
        return fl_set_error(FL_ERR_UNSUPPORTED, "quantize: no quantizer for type %s", fl_type_name(dst_type));
    const size_t rs = fl_type_row_size(dst_type, K);
    if (!rs || nrows < 0)
        return fl_set_error(FL_ERR_INVALID, "quantize: row of %lld is not a multiple of %s's block", (long long)K, fl_type_name(dst_type));
    qt_ctx c = {dst_type, src, nrows, K, dst, rs};
    fl_parallel(qt_task, &c);
    return FL_OK;
}
