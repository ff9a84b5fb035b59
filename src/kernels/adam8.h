/*
 * adam8.h - AdamW's element-wise update and 8-bit AdamW's state codes, AVX-512 (internal to
 * train/optim.c, whose scalar loops are the specification: these give the same bits).
 *
 *   fl_adam_update_avx512     g = g * gs (the gradient as read); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g;
 *                             p -= lr ((m / bc1) / (sqrt(v / bc2) + eps) + wd p)
 *                             (each operation rounded on its own, in that order, as the C does)
 *   fl_adam8_dequant_avx512   out[i] = map[q[i]] * scale
 *   fl_adam8_quant_avx512     absmax = max |x| (NaNs passed over); q[i] = the code nearest to
 *                             x[i] / absmax (x[i] * (1 / absmax), 0 when absmax is 0), from
 *                             the table optim.c builds (fl_adam8_codes): per bucket of 65536
 *                             floats (the top 16 bits) the code c of its first float and the
 *                             last low half t that takes it, past which the code is c + 1
 *                             (c - 1 for negative floats); biased exponents below e_lo take
 *                             `zero`, the rest (>= 2, infinities, NaN, buckets marked by bit 31)
 *                             `slow(map, x)`.
 */
#ifndef FL_ADAM8_H
#define FL_ADAM8_H

#include <stdint.h>

typedef struct {
    const float *map;        /* 256 codes, ascending */
    const uint32_t *tab;     /* [2][keys]: positive, negative */
    int keys, e_lo;          /* keys per sign; the table's first biased exponent (up to 127) */
    uint8_t zero;            /* the code of 0 */
    uint8_t (*slow)(const float *map, float x);
} fl_adam8_codes;

void fl_adam_update_avx512(float *p, const float *g, float gs, float *m, float *v, int64_t n, float b1, float b2,
                           float bc1, float bc2, float lr, float eps, float wd);
void fl_adam8_dequant_avx512(const float *map, const uint8_t *q, float scale, float *out, int64_t n);
void fl_adam8_quant_avx512(const fl_adam8_codes *c, const float *x, uint8_t *q, float *absmax, int64_t n);

#endif
