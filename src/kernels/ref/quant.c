/* Scalar reference dequantizers: the specification of every block layout in kernels/quant.h.
 * Arithmetic follows ggml's order (scale products in f32, then times the integer code) so the
 * results are bit-identical to ggml's dequantize_row_* functions. */
#include "kernels/quant.h"

#include <string.h>

const int8_t fl_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* The NF4 code book (QLoRA, Dettmers et al. 2023, appendix E). */
const float fl_nf4_values[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

#define H2F(x) fl_f16_to_f32(x)

void fl_dequant_q4_0(const void *src, float *y, int64_t k) {
    const fl_block_q4_0 *b = src;
    for (int64_t i = 0; i < k / FL_QK; i++, y += FL_QK) {
        const float d = H2F(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[i].qs[j] & 0x0F) - 8) * d;
            y[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void fl_dequant_q4_1(const void *src, float *y, int64_t k) {
    const fl_block_q4_1 *b = src;
    for (int64_t i = 0; i < k / FL_QK; i++, y += FL_QK) {
        const float d = H2F(b[i].d), m = H2F(b[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[i].qs[j] & 0x0F) * d + m;
            y[j + 16] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

void fl_dequant_q5_0(const void *src, float *y, int64_t k) {
    const fl_block_q5_0 *b = src;
    for (int64_t i = 0; i < k / FL_QK; i++, y += FL_QK) {
        const float d = H2F(b[i].d);
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            y[j] = (float)(((b[i].qs[j] & 0x0F) | h0) - 16) * d;
            y[j + 16] = (float)(((b[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

void fl_dequant_q5_1(const void *src, float *y, int64_t k) {
    const fl_block_q5_1 *b = src;
    for (int64_t i = 0; i < k / FL_QK; i++, y += FL_QK) {
        const float d = H2F(b[i].d), m = H2F(b[i].m);
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            y[j] = (float)((b[i].qs[j] & 0x0F) | h0) * d + m;
            y[j + 16] = (float)((b[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

void fl_dequant_q8_0(const void *src, float *y, int64_t k) {
    const fl_block_q8_0 *b = src;
    for (int64_t i = 0; i < k / FL_QK; i++, y += FL_QK) {
        const float d = H2F(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

void fl_dequant_q2_K(const void *src, float *y, int64_t k) {
    const fl_block_q2_K *b = src;
    for (int64_t i = 0; i < k / FL_QK_K; i++) {
        const float d = H2F(b[i].d), dmin = H2F(b[i].dmin);
        const uint8_t *q = b[i].qs;
        int is = 0;
        for (int n = 0; n < FL_QK_K; n += 128) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = b[i].scales[is++];
                    const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
                }
            }
            q += 32;
        }
    }
}

void fl_q3_K_scales(const uint8_t *s, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
        int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

void fl_dequant_q3_K(const void *src, float *y, int64_t k) {
    const fl_block_q3_K *b = src;
    for (int64_t i = 0; i < k / FL_QK_K; i++) {
        const float d_all = H2F(b[i].d);
        int8_t sc[16];
        fl_q3_K_scales(b[i].scales, sc);
        const uint8_t *q = b[i].qs;
        uint8_t m = 1;
        int is = 0;
        for (int n = 0; n < FL_QK_K; n += 128) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int half = 0; half < 2; half++) {
                    const float dl = d_all * (float)sc[is++];
                    for (int l = 0; l < 16; l++) {
                        const int ll = l + 16 * half;
                        *y++ = dl * (float)(((q[ll] >> shift) & 3) - ((b[i].hmask[ll] & m) ? 0 : 4));
                    }
                }
            }
            q += 32;
        }
    }
}

/* Scale and min j (0..7) of q4_K/q5_K's 12-byte packed 6-bit table. */
static inline void k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void fl_q4_K_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) { k4_scale_min(j, q, d, m); }

void fl_k4_scales_mins(uint16_t d16, uint16_t dmin16, const uint8_t *scales, float sc[8], float mn[8]) {
    const float d = H2F(d16), dmin = H2F(dmin16);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        k4_scale_min(j, scales, &s, &m);
        sc[j] = d * (float)s;
        mn[j] = dmin * (float)m;
    }
}

void fl_b32_block_codes(int32_t wtype, const void *blk, int c[32], float *d, float *m) {
    const uint8_t *qs;
    uint32_t qh = 0;
    *m = 0;
    if (wtype == FL_TYPE_Q4_1) {
        const fl_block_q4_1 *b = blk;
        qs = b->qs; *d = H2F(b->d); *m = H2F(b->m);
    } else if (wtype == FL_TYPE_Q5_0) {
        const fl_block_q5_0 *b = blk;
        qs = b->qs; *d = H2F(b->d);
        memcpy(&qh, b->qh, 4);
    } else if (wtype == FL_TYPE_Q5_1) {
        const fl_block_q5_1 *b = blk;
        qs = b->qs; *d = H2F(b->d); *m = H2F(b->m);
        memcpy(&qh, b->qh, 4);
    } else { /* IQ4_NL */
        const fl_block_iq4_nl *b = blk;
        qs = b->qs; *d = H2F(b->d);
    }
    for (int j = 0; j < 32; j++) {
        int v = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
        if (wtype == FL_TYPE_IQ4_NL) v = fl_iq4nl_values[v];
        else if (wtype != FL_TYPE_Q4_1) v |= (int)((qh >> j) & 1) << 4; /* bit j: code j's fifth bit */
        c[j] = wtype == FL_TYPE_Q5_0 ? v - 16 : v;
    }
}

void fl_dequant_q4_K(const void *src, float *y, int64_t k) {
    const fl_block_q4_K *b = src;
    for (int64_t i = 0; i < k / FL_QK_K; i++) {
        const float d = H2F(b[i].d), dmin = H2F(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int j = 0; j < 8; j += 2, q += 32) {
            uint8_t sc, m;
            k4_scale_min(j, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            k4_scale_min(j + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

void fl_dequant_q5_K(const void *src, float *y, int64_t k) {
    const fl_block_q5_K *b = src;
    for (int64_t i = 0; i < k / FL_QK_K; i++) {
        const float d = H2F(b[i].d), dmin = H2F(b[i].dmin);
        const uint8_t *ql = b[i].qs, *qh = b[i].qh;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            k4_scale_min(j, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            k4_scale_min(j + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

void fl_dequant_q6_K(const void *src, float *y, int64_t k) {
    const fl_block_q6_K *b = src;
    for (int64_t i = 0; i < k / FL_QK_K; i++) {
        const float d = H2F(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int n = 0; n < FL_QK_K; n += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

void fl_dequant_q8_K(const void *src, float *y, int64_t k) {
    const fl_block_q8_K *b = src;
    for (int64_t i = 0; i < k / FL_QK_K; i++)
        for (int j = 0; j < FL_QK_K; j++) *y++ = b[i].d * (float)b[i].qs[j];
}

void fl_dequant_iq4_nl(const void *src, float *y, int64_t k) {
    const fl_block_iq4_nl *b = src;
    for (int64_t i = 0; i < k / FL_QK; i++, y += FL_QK) {
        const float d = H2F(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)fl_iq4nl_values[b[i].qs[j] & 0xF];
            y[j + 16] = d * (float)fl_iq4nl_values[b[i].qs[j] >> 4];
        }
    }
}

void fl_dequant_nf4(const void *src, float *y, int64_t k) {
    const uint8_t *p = src;
    int64_t nb = k / 64;
    for (int64_t g = 0; g < nb; g += 256) {
        float gscale;
        memcpy(&gscale, p, 4);
        p += 4;
        const int64_t ng = nb - g < 256 ? nb - g : 256;
        for (int64_t i = 0; i < ng; i++, p += 33, y += 64) {
            const float amax = gscale * (float)p[0];
            for (int j = 0; j < 32; j++) {
                y[j] = amax * fl_nf4_values[p[1 + j] & 0xF];
                y[j + 32] = amax * fl_nf4_values[p[1 + j] >> 4];
            }
        }
    }
}

void fl_dequant_fp8_e4m3(const void *src, float *y, int64_t k) {
    const uint8_t *p = src;
    float s;
    memcpy(&s, p, 4);
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = fl_fp8_e4m3_to_f32((uint8_t)i);
    for (int64_t j = 0; j < k; j++) y[j] = s * lut[p[4 + j]];
}
