/* The AMX-INT8 GEMM's data layouts and its scalar definition (see matmul.h, "AMX-INT8 GEMM"):
 * panel and activation-tile packers, and the tile product on packed data.  None of this needs
 * AMX, so the layouts are checked on every machine; kernels/amx runs the same product in tiles. */
#include "kernels/matmul.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "kernels/dispatch.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int g_amx = -1, g_amx_bf16 = -1;

/* A switch that is on unless set off, or unless the environment variable says "0" */
static bool switch_on(int *sw, const char *env) {
    if (*sw < 0) {
        const char *e = getenv(env);
        *sw = (e && strcmp(e, "0") == 0) ? 0 : 1;
    }
    return *sw == 1;
}

void fl_matmul_set_amx(bool on) { g_amx = on ? 1 : 0; }

bool fl_amx_usable(void) { return switch_on(&g_amx, "FL_AMX") && fl_isa_get() == FL_ISA_AVX512 && fl_cpu_amx_request(); }

bool fl_amx_type(int32_t wtype) {
    switch (wtype) {
    case FL_TYPE_Q8_0: case FL_TYPE_Q4_0: case FL_TYPE_Q4_1: case FL_TYPE_Q5_0: case FL_TYPE_Q5_1:
    case FL_TYPE_IQ4_NL: case FL_TYPE_Q4_K: case FL_TYPE_Q5_K: case FL_TYPE_Q6_K: case FL_TYPE_Q3_K: case FL_TYPE_Q2_K: return true;
    default: return false;
    }
}

bool fl_amx_half(int32_t wtype) { return wtype == FL_TYPE_Q6_K || wtype == FL_TYPE_Q3_K || wtype == FL_TYPE_Q2_K; }

bool fl_amx_has_mins(int32_t wtype) {
    return wtype == FL_TYPE_Q4_1 || wtype == FL_TYPE_Q5_1 || wtype == FL_TYPE_Q4_K || wtype == FL_TYPE_Q5_K || wtype == FL_TYPE_Q2_K;
}

int fl_amx_arrays(int32_t wtype) { return (fl_amx_half(wtype) ? 2 : 1) * (fl_amx_has_mins(wtype) ? 2 : 1); }

size_t fl_amx_panel_bytes(int32_t wtype, int64_t K) {
    const size_t nb = (size_t)(K / 32);
    return (size_t)FL_AMX_ROWS * (size_t)K + nb * FL_AMX_ROWS * 4 * (size_t)fl_amx_arrays(wtype);
}

size_t fl_amx_act_bytes(int64_t M, int64_t K) {
    const size_t tiles = (size_t)((M + FL_AMX_TOK - 1) / FL_AMX_TOK);
    return tiles * (size_t)(K / 32) * FL_AMX_ACT_BLOCK;
}

void fl_amx_act_pack_row(const fl_act_q8 *a, int64_t m, void *act) {
    const int64_t nb = a->nb, lane = m % FL_AMX_TOK;
    char *base = (char *)act + (size_t)(m / FL_AMX_TOK) * (size_t)nb * FL_AMX_ACT_BLOCK;
    for (int64_t b = 0; b < nb; b++) {
        char *blk = base + b * FL_AMX_ACT_BLOCK;
        float *dx = (float *)(blk + 512), *ms = dx + 16, *mh = ms + 16;
        if (m >= a->M) {
            for (int kq = 0; kq < 8; kq++) memset(blk + kq * 64 + lane * 4, 0, 4);
            dx[lane] = 0;
            ms[lane] = 0;
            mh[lane] = mh[16 + lane] = 0;
            continue;
        }
        const int8_t *q = a->qs + m * a->K + b * 32;
        for (int kq = 0; kq < 8; kq++) memcpy(blk + kq * 64 + lane * 4, q + kq * 4, 4);
        dx[lane] = a->d[m * nb + b];
        ms[lane] = a->ms[m * nb + b];
        for (int h = 0; h < 2; h++) { /* each 16 codes' -s d_x (Q2_K's mins per half block) */
            int s = 0;
            for (int k = 0; k < 16; k++) s += q[16 * h + k];
            mh[16 * h + lane] = -(float)s * dx[lane];
        }
    }
}

void fl_amx_pack_q6_K_row(const fl_block_q6_K *blk, int64_t K, int8_t *q, float *sc, int r) {
    const int64_t nb = K / 32;
    for (int64_t i = 0; i < K / FL_QK_K; i++) {
        const float d = fl_f16_to_f32(blk[i].d);
        int8_t c[FL_QK_K];
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = blk[i].ql + 64 * n, *qh = blk[i].qh + 32 * n;
            for (int l = 0; l < 32; l++) {
                c[128 * n + l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                c[128 * n + l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                c[128 * n + l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                c[128 * n + l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        for (int jb = 0; jb < 8; jb++) memcpy(q + (i * 8 + jb) * 512, c + 32 * jb, 32);
        for (int j = 0; j < 16; j++) /* sub-block j: half j % 2 of block j / 2 */
            sc[(j % 2) * nb * FL_AMX_ROWS + (i * 8 + j / 2) * FL_AMX_ROWS + r] = d * (float)blk[i].scales[j];
    }
}

/* Q3_K: code ((qs >> 2g) & 3) - (hmask bit ? 0 : 4) in -4..3 (element e of a super-block: byte
 * 32 (e / 128) + e % 32 of qs at bits 2g, g = e % 128 / 32, hmask byte e % 32 at bit
 * 4 (e / 128) + g), scale d sc_j per 16 codes in the Q6_K layout (half j % 2 of block j / 2). */
static void pack_q3_K_row(const fl_block_q3_K *blk, int64_t K, int8_t *q, float *sc, int r) {
    const int64_t nb = K / 32;
    for (int64_t i = 0; i < K / FL_QK_K; i++) {
        const float d = fl_f16_to_f32(blk[i].d);
        int8_t s16[16];
        fl_q3_K_scales(blk[i].scales, s16);
        for (int e = 0; e < FL_QK_K; e++) {
            const int n = e / 128, g = e % 128 / 32, ll = e % 32;
            const int c = ((blk[i].qs[32 * n + ll] >> (2 * g)) & 3) - ((blk[i].hmask[ll] >> (4 * n + g)) & 1 ? 0 : 4);
            q[(i * 8 + e / 32) * 512 + e % 32] = (int8_t)c;
        }
        for (int j = 0; j < 16; j++)
            sc[(j % 2) * nb * FL_AMX_ROWS + (i * 8 + j / 2) * FL_AMX_ROWS + r] = d * (float)s16[j];
    }
}

/* Q2_K: code (qs >> 2g) & 3 in 0..3 (element e of a super-block: byte 32 (e / 128) + e % 32 of
 * qs at bits 2g, g = e % 128 / 32), per 16 codes j the scale d (sc_j & 15) and the min
 * dmin (sc_j >> 4), both in the half-block layout: sc (and mn) [half j % 2][block j / 2]. */
static void pack_q2_K_row(const fl_block_q2_K *blk, int64_t K, int8_t *q, float *sc, float *mn, int r) {
    const int64_t nb = K / 32;
    for (int64_t i = 0; i < K / FL_QK_K; i++) {
        const float d = fl_f16_to_f32(blk[i].d), dmin = fl_f16_to_f32(blk[i].dmin);
        for (int e = 0; e < FL_QK_K; e++)
            q[(i * 8 + e / 32) * 512 + e % 32] = (int8_t)((blk[i].qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3);
        for (int j = 0; j < 16; j++) {
            const int64_t o = (j % 2) * nb * FL_AMX_ROWS + (i * 8 + j / 2) * FL_AMX_ROWS + r;
            sc[o] = d * (float)(blk[i].scales[j] & 0xF);
            mn[o] = dmin * (float)(blk[i].scales[j] >> 4);
        }
    }
}

void fl_amx_pack_row(int32_t wtype, const void *row, int64_t K, int8_t *q, float *sc, float *mn, int r) {
    const int64_t nb = K / 32;
    switch (wtype) {
    case FL_TYPE_Q6_K: fl_amx_pack_q6_K_row(row, K, q, sc, r); return;
    case FL_TYPE_Q3_K: pack_q3_K_row(row, K, q, sc, r); return;
    case FL_TYPE_Q2_K: pack_q2_K_row(row, K, q, sc, mn, r); return;
    case FL_TYPE_Q4_1: case FL_TYPE_Q5_1: case FL_TYPE_Q5_0: case FL_TYPE_IQ4_NL: {
        const size_t bsz = fl_type_row_size(wtype, 32);
        for (int64_t b = 0; b < nb; b++) {
            int c[32];
            float d, m;
            fl_b32_block_codes(wtype, (const char *)row + b * bsz, c, &d, &m);
            for (int j = 0; j < 32; j++) q[b * 512 + j] = (int8_t)c[j];
            sc[b * FL_AMX_ROWS + r] = d;
            if (mn) mn[b * FL_AMX_ROWS + r] = -m; /* + m d_x s = -m * ms */
        }
        return;
    }
    case FL_TYPE_Q5_K:
        for (int64_t i = 0; i < K / FL_QK_K; i++) {
            const fl_block_q5_K *blk = (const fl_block_q5_K *)row + i;
            float s8[8], m8[8];
            fl_k4_scales_mins(blk->d, blk->dmin, blk->scales, s8, m8);
            for (int j = 0; j < 8; j++) {
                const int64_t b = i * 8 + j;
                sc[b * FL_AMX_ROWS + r] = s8[j];
                mn[b * FL_AMX_ROWS + r] = m8[j];
                const uint8_t *ql = blk->qs + (j / 2) * 32;
                for (int l = 0; l < 32; l++)
                    q[b * 512 + l] = (int8_t)((j % 2 ? ql[l] >> 4 : ql[l] & 0xF) + ((blk->qh[l] >> j) & 1 ? 16 : 0));
            }
        }
        return;
    default: return;
    }
}

void fl_amx_panel_zero_row(int32_t wtype, int64_t K, void *panel, int r) {
    const int64_t nb = K / 32;
    int8_t *q = (int8_t *)panel + r * 32;
    float *sc = (float *)((int8_t *)panel + FL_AMX_ROWS * K);
    for (int64_t b = 0; b < nb; b++) memset(q + b * 512, 0, 32);
    for (int k = 0; k < fl_amx_arrays(wtype); k++)
        for (int64_t b = 0; b < nb; b++) sc[(k * nb + b) * FL_AMX_ROWS + r] = 0;
}

void fl_amx_panel_pack_ref(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, void *panel) {
    const int64_t nb = K / 32;
    int8_t *codes = panel;
    float *sc = (float *)(codes + FL_AMX_ROWS * K), *mins = sc + (fl_amx_half(wtype) ? 2 : 1) * nb * FL_AMX_ROWS;
    for (int r = 0; r < FL_AMX_ROWS; r++) {
        int8_t *q = codes + r * 32; /* block b of row r at q + b * 512 */
        const char *row = (const char *)w + (size_t)r * ldw;
        if (r >= nr) {
            fl_amx_panel_zero_row(wtype, K, panel, r);
            continue;
        }
        if (wtype == FL_TYPE_Q8_0) {
            const fl_block_q8_0 *blk = (const fl_block_q8_0 *)row;
            for (int64_t b = 0; b < nb; b++) {
                memcpy(q + b * 512, blk[b].qs, 32);
                sc[b * FL_AMX_ROWS + r] = fl_f16_to_f32(blk[b].d);
            }
        } else if (wtype == FL_TYPE_Q4_0) {
            const fl_block_q4_0 *blk = (const fl_block_q4_0 *)row;
            for (int64_t b = 0; b < nb; b++) {
                for (int l = 0; l < 16; l++) {
                    q[b * 512 + l] = (int8_t)((blk[b].qs[l] & 0xF) - 8);
                    q[b * 512 + l + 16] = (int8_t)((blk[b].qs[l] >> 4) - 8);
                }
                sc[b * FL_AMX_ROWS + r] = fl_f16_to_f32(blk[b].d);
            }
        } else if (wtype != FL_TYPE_Q4_K) {
            fl_amx_pack_row(wtype, row, K, q, sc, fl_amx_has_mins(wtype) ? mins : NULL, r);
        } else { /* Q4_K */
            const fl_block_q4_K *blk = (const fl_block_q4_K *)row;
            for (int64_t i = 0; i < K / FL_QK_K; i++) {
                float s8[8], m8[8];
                fl_k4_scales_mins(blk[i].d, blk[i].dmin, blk[i].scales, s8, m8);
                for (int j = 0; j < 8; j++) {
                    const int64_t b = i * 8 + j;
                    sc[b * FL_AMX_ROWS + r] = s8[j];
                    mins[b * FL_AMX_ROWS + r] = m8[j];
                    const uint8_t *qs = blk[i].qs + (j / 2) * 32;
                    for (int l = 0; l < 32; l++) q[b * 512 + l] = (int8_t)(j % 2 ? qs[l] >> 4 : qs[l] & 0xF);
                }
            }
        }
    }
}

void fl_amx_gemm_ref(int32_t wtype, const void *panel, int64_t K, const void *act, int64_t mt, int nt, float *y,
                     int64_t ldy, int nr) {
    const int64_t nb = K / 32;
    const int8_t *codes = panel;
    const int halves = fl_amx_half(wtype) ? 2 : 1, len = 32 / halves; /* Q6_K, Q3_K, Q2_K: a scale per 16 codes */
    const float *sc = (const float *)(codes + FL_AMX_ROWS * K), *mins = sc + halves * nb * FL_AMX_ROWS;
    const char *base = (const char *)act + (size_t)mt * (size_t)nb * FL_AMX_ACT_BLOCK;
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++) {
            float acc = 0;
            for (int64_t b = 0; b < nb; b++) {
                const char *blk = base + b * FL_AMX_ACT_BLOCK;
                const float *dx = (const float *)(blk + 512), *ms = dx + 16, *mh = ms + 16;
                for (int h = 0; h < halves; h++) {
                    int32_t is = 0;
                    for (int k = h * len; k < (h + 1) * len; k++)
                        is += codes[(b * 16 + r) * 32 + k] * ((const int8_t *)blk)[(k / 4) * 64 + t * 4 + k % 4];
                    acc += (float)is * (sc[h * nb * FL_AMX_ROWS + b * FL_AMX_ROWS + r] * dx[t]);
                    if (fl_amx_has_mins(wtype) && halves == 2) acc += mins[h * nb * FL_AMX_ROWS + b * FL_AMX_ROWS + r] * mh[16 * h + t];
                }
                if (fl_amx_has_mins(wtype) && halves == 1) acc += mins[b * FL_AMX_ROWS + r] * ms[t];
            }
            y[t * ldy + r] = acc;
        }
}

/* ---- AMX-BF16 GEMM: layouts and scalar definition ---- */

void fl_matmul_set_amx_bf16(bool on) { g_amx_bf16 = on ? 1 : 0; }

bool fl_amx_bf16_usable(void) {
    return switch_on(&g_amx_bf16, "FL_AMX_BF16") && fl_cpu()->amx_bf16 && fl_cpu()->avx512bf16 && fl_amx_usable();
}

size_t fl_amx_bf16_panel_bytes(int64_t K) { return (size_t)FL_AMX_ROWS * (size_t)K * sizeof(uint16_t); }

size_t fl_amx_bf16_act_bytes(int64_t M, int64_t K) {
    const size_t tiles = (size_t)((M + FL_AMX_TOK - 1) / FL_AMX_TOK);
    return tiles * (size_t)FL_AMX_TOK * (size_t)K * sizeof(uint16_t);
}

uint16_t fl_amx_bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7F800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u); /* zero or denormal: signed zero */
    return fl_f32_to_bf16(f);
}

void fl_amx_bf16_act_pack_ref(const float *x, int64_t M, int64_t K, int64_t mt, uint16_t *act) {
    const int64_t nb = K / 32;
    uint16_t *base = act + (size_t)mt * (size_t)nb * 512;
    for (int t = 0; t < FL_AMX_TOK; t++) {
        const int64_t m = mt * FL_AMX_TOK + t;
        for (int64_t k = 0; k < K; k++) base[(k / 32) * 512 + (k % 32 / 2) * 32 + t * 2 + k % 2] = m < M ? fl_amx_bf16_round(x[m * K + k]) : 0;
    }
}

void fl_amx_bf16_panel_row_ref(const float *row, int64_t K, uint16_t *panel, int r) {
    for (int64_t k = 0; k < K; k++) panel[(k / 32) * 512 + r * 32 + k % 32] = row ? fl_amx_bf16_round(row[k]) : 0;
}

void fl_amx_bf16_gemm_ref(const uint16_t *panel, int64_t K, const uint16_t *act, int nt, float *y, int64_t ldy, int nr,
                          bool acc) {
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++) {
            float s = 0;
            for (int64_t k = 0; k < K; k++)
                s = fmaf(fl_bf16_to_f32(panel[(k / 32) * 512 + r * 32 + k % 32]),
                         fl_bf16_to_f32(act[(k / 32) * 512 + (k % 32 / 2) * 32 + t * 2 + k % 2]), s);
            y[t * ldy + r] = acc ? y[t * ldy + r] + s : s;
        }
}
