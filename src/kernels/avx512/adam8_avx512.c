/* AdamW's update and 8-bit AdamW's codes on 16 lanes (see adam8.h); train/optim.c's scalar
 * loops are the specification, and these give the same bits (test_train_optim). */
#include "kernels/adam8.h"

#include <immintrin.h>
#include <math.h>

static inline __mmask16 tail(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

void fl_adam_update_avx512(float *p, const float *g, float gs, float *m, float *v, int64_t n, float b1, float b2,
                           float bc1, float bc2, float lr, float eps, float wd) {
    const __m512 vgs = _mm512_set1_ps(gs);
    const __m512 vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2), c1 = _mm512_set1_ps(1.0f - b1),
                 c2 = _mm512_set1_ps(1.0f - b2), vbc1 = _mm512_set1_ps(bc1), vbc2 = _mm512_set1_ps(bc2),
                 vlr = _mm512_set1_ps(lr), veps = _mm512_set1_ps(eps), vwd = _mm512_set1_ps(wd);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = tail(n - i);
        const __m512 gi = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, g + i), vgs);
        __m512 mi = _mm512_maskz_loadu_ps(k, m + i), vi = _mm512_maskz_loadu_ps(k, v + i);
        __m512 pi = _mm512_maskz_loadu_ps(k, p + i);
        mi = _mm512_add_ps(_mm512_mul_ps(vb1, mi), _mm512_mul_ps(c1, gi));
        vi = _mm512_add_ps(_mm512_mul_ps(vb2, vi), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
        const __m512 mh = _mm512_div_ps(mi, vbc1), vh = _mm512_div_ps(vi, vbc2);
        const __m512 upd = _mm512_add_ps(_mm512_div_ps(mh, _mm512_add_ps(_mm512_sqrt_ps(vh), veps)), _mm512_mul_ps(vwd, pi));
        pi = _mm512_sub_ps(pi, _mm512_mul_ps(vlr, upd));
        _mm512_mask_storeu_ps(m + i, k, mi);
        _mm512_mask_storeu_ps(v + i, k, vi);
        _mm512_mask_storeu_ps(p + i, k, pi);
    }
}

/* map[idx] for 16 codes from the 256-entry map in 16 registers: a 32-entry permute of each pair
 * by the low 5 bits, then bits 5, 6 and 7 pick (3x faster than a gather here) */
static inline __m512 lut256(const __m512 t[16], __m512i idx) {
    /* (written out: as loops over arrays, GCC at -O2 keeps the table and the picks in memory) */
    __m512 a0 = _mm512_permutex2var_ps(t[0], idx, t[1]), a1 = _mm512_permutex2var_ps(t[2], idx, t[3]);
    __m512 a2 = _mm512_permutex2var_ps(t[4], idx, t[5]), a3 = _mm512_permutex2var_ps(t[6], idx, t[7]);
    __m512 a4 = _mm512_permutex2var_ps(t[8], idx, t[9]), a5 = _mm512_permutex2var_ps(t[10], idx, t[11]);
    __m512 a6 = _mm512_permutex2var_ps(t[12], idx, t[13]), a7 = _mm512_permutex2var_ps(t[14], idx, t[15]);
    const __mmask16 b5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32)),
                    b6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64)),
                    b7 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(128));
    a0 = _mm512_mask_mov_ps(a0, b5, a1);
    a2 = _mm512_mask_mov_ps(a2, b5, a3);
    a4 = _mm512_mask_mov_ps(a4, b5, a5);
    a6 = _mm512_mask_mov_ps(a6, b5, a7);
    a0 = _mm512_mask_mov_ps(a0, b6, a2);
    a4 = _mm512_mask_mov_ps(a4, b6, a6);
    return _mm512_mask_mov_ps(a0, b7, a4);
}

void fl_adam8_dequant_avx512(const float *map, const uint8_t *q, float scale, float *out, int64_t n) {
    const __m512 s = _mm512_set1_ps(scale);
    const __m512 t[16] = {_mm512_loadu_ps(map),       _mm512_loadu_ps(map + 16),  _mm512_loadu_ps(map + 32),
                          _mm512_loadu_ps(map + 48),  _mm512_loadu_ps(map + 64),  _mm512_loadu_ps(map + 80),
                          _mm512_loadu_ps(map + 96),  _mm512_loadu_ps(map + 112), _mm512_loadu_ps(map + 128),
                          _mm512_loadu_ps(map + 144), _mm512_loadu_ps(map + 160), _mm512_loadu_ps(map + 176),
                          _mm512_loadu_ps(map + 192), _mm512_loadu_ps(map + 208), _mm512_loadu_ps(map + 224),
                          _mm512_loadu_ps(map + 240)};
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = tail(n - i);
        const __m512i idx = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, q + i));
        _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(lut256(t, idx), s));
    }
}

void fl_adam8_quant_avx512(const fl_adam8_codes *c, const float *x, uint8_t *q, float *absmax, int64_t n) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 ax = _mm512_abs_ps(_mm512_maskz_loadu_ps(tail(n - i), x + i));
        a = _mm512_max_ps(ax, a); /* a NaN in ax gives the second operand, a */
    }
    const float am = _mm512_reduce_max_ps(a);
    *absmax = am;
    const float inv = am > 0.0f ? 1.0f / am : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i one = _mm512_set1_epi32(1), e_lo = _mm512_set1_epi32(c->e_lo), e_hi = _mm512_set1_epi32(127),
                  ff = _mm512_set1_epi32(0xff), lo16 = _mm512_set1_epi32(0xffff), sbit = _mm512_set1_epi32(INT32_MIN),
                  key_lo = _mm512_set1_epi32(c->e_lo * 128), keys = _mm512_set1_epi32(c->keys),
                  zero = _mm512_set1_epi32(c->zero);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = tail(n - i);
        const __m512 xi = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vinv);
        const __m512i u = _mm512_castps_si512(xi);
        const __m512i e = _mm512_and_si512(_mm512_srli_epi32(u, 23), ff);
        const __mmask16 tiny = k & _mm512_cmplt_epi32_mask(e, e_lo);
        const __mmask16 neg = _mm512_test_epi32_mask(u, sbit);
        __mmask16 in = k & _mm512_cmpge_epi32_mask(e, e_lo) & _mm512_cmple_epi32_mask(e, e_hi);
        /* index: sign * keys + (top 15 bits below the sign) - the first key */
        const __m512i key = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x7fff)), key_lo);
        const __m512i idx = _mm512_mask_add_epi32(key, neg, key, keys);
        const __m512i t = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), in, idx, c->tab, 4);
        in &= (__mmask16)~_mm512_test_epi32_mask(t, sbit); /* marked buckets: the slow way */
        __m512i code = _mm512_and_si512(_mm512_srli_epi32(t, 16), ff);
        const __mmask16 past = in & _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, lo16), _mm512_and_si512(t, lo16));
        code = _mm512_mask_add_epi32(code, past & (__mmask16)~neg, code, one);
        code = _mm512_mask_sub_epi32(code, past & neg, code, one);
        code = _mm512_mask_mov_epi32(code, tiny, zero);
        in |= tiny;
        _mm_mask_storeu_epi8(q + i, in, _mm512_cvtepi32_epi8(code));
        __mmask16 rest = k & (__mmask16)~in;
        if (rest) {
            float xs[16];
            _mm512_storeu_ps(xs, xi);
            for (int j = 0; j < 16; j++)
                if (rest >> j & 1) q[i + j] = c->slow(c->map, xs[j]);
        }
    }
}
