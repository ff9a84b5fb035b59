/* Tests of src/train/optim.c: AdamW vs a double reference, the 8-bit dynamic code tables and
 * block-wise quantization, 8-bit AdamW tracking fp32 AdamW, clipping, LR schedules. */
#include "test.h"

#include "core/threads.h"
#include "kernels/dispatch.h"
#include "kernels/adam8.h"
#include "train/optim.h"

#include <stdlib.h>
#include <string.h>

static void test_adamw_reference(void **state) {
    (void)state;
    const int64_t n = 10;
    float p[10], g[10];
    double pd[10], m[10] = {0}, v[10] = {0};
    for (int i = 0; i < n; i++) pd[i] = p[i] = 0.1f * (float)(i - 4);
    fl_optimizer_config cfg = fl_optim_default();
    cfg.weight_decay = 0.1f;
    const int64_t ranges[2] = {3, 7}; /* decay only on [3, 7) */
    fl_optim *o;
    assert_int_equal(fl_optim_new(&cfg, n, ranges, 1, &o), FL_OK);
    assert_int_equal(fl_optim_state_bytes(o), 2 * n * sizeof(float));
    for (int t = 1; t <= 5; t++) {
        for (int i = 0; i < n; i++) g[i] = (float)(0.3 * sin(i + t) + 0.01 * i);
        const float lr = 0.01f * (float)t;
        fl_optim_step(o, p, g, lr);
        for (int i = 0; i < n; i++) {
            m[i] = 0.9 * m[i] + 0.1 * g[i];
            v[i] = 0.95 * v[i] + 0.05 * (double)g[i] * g[i];
            const double mh = m[i] / (1 - pow(0.9, t)), vh = v[i] / (1 - pow(0.95, t));
            const double wd = (i >= 3 && i < 7) ? 0.1 : 0.0;
            pd[i] -= lr * (mh / (sqrt(vh) + 1e-8) + wd * pd[i]);
        }
    }
    for (int i = 0; i < n; i++) CHECK_NEAR(p[i], pd[i], 1e-5);
    assert_int_equal(fl_optim_steps(o), 5);
    fl_optim_free(o);
    fl_test_mem_zero();
}

/* The optimizer's code search against the binary search, for every code and the midpoints
 * between neighbours (each +- 4 ulps), a million values in [-1.5, 1.5], a million bit
 * patterns (zeros, denormals, infinities and NaNs among them), and each bucket of its table
 * at its ends and where its code changes. */
static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void check_code(int s, float x) {
    const uint8_t a = fl_optim_code(s, x), b = fl_optim_code_ref(s, x);
    if (a != b) fail_msg("map %d, x %.9g (0x%08x): code %d, binary search %d", s, x, u_of(x), a, b);
}

static void test_code_search(void **state) {
    (void)state;
    for (int s = 0; s < 2; s++) {
        const float *map = fl_optim_dynamic_map(s);
        for (int i = 0; i < 256; i++) {
            const float pts[2] = {map[i], i < 255 ? 0.5f * (map[i] + map[i + 1]) : 1.0f};
            for (int p = 0; p < 2; p++)
                for (int d = -4; d <= 4; d++) {
                    check_code(s, f_of(u_of(pts[p]) + (uint32_t)d));
                    check_code(s, -f_of(u_of(pts[p]) + (uint32_t)d));
                }
        }
        uint64_t r = 0x9e3779b97f4a7c15ull + (uint64_t)s;
        for (int i = 0; i < 1000000; i++) {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            check_code(s, (float)((double)(r >> 11) / 9007199254740992.0 * 3.0 - 1.5));
            check_code(s, f_of((uint32_t)(r >> 32)));
        }
        check_code(s, 0.0f);
        check_code(s, -0.0f);
        check_code(s, NAN);
        check_code(s, INFINITY);
        check_code(s, -INFINITY);
        /* every bucket of 65536 floats (the top 16 bits) from 2^-26 to 2, both signs: its ends
         * and the floats around the one where the binary search's code changes (found here by
         * bisection, the codes being monotone), by the scalar table and, for |x| <= 1 in blocks
         * whose absmax is 1, by the AVX-512 quantizer */
        float blk[256];
        int nb = 1;
        blk[0] = 1.0f;
        for (uint32_t top = (127 - 26) << 7; top < 128 << 7; top++) {
            for (uint32_t neg = 0; neg < 2; neg++) {
                const uint32_t b = neg << 31 | top << 16;
                const uint8_t c0 = fl_optim_code_ref(s, f_of(b));
                uint32_t lo = 0, hi = 0xffff;
                if (fl_optim_code_ref(s, f_of(b | hi)) == c0) lo = hi;
                while (hi - lo > 1) {
                    const uint32_t mid = (lo + hi) / 2;
                    if (fl_optim_code_ref(s, f_of(b | mid)) == c0) lo = mid;
                    else hi = mid;
                }
                const uint32_t at[9] = {0, 1, 2, lo - 1, lo, lo + 1, lo + 2, 0xfffe, 0xffff};
                for (int j = 0; j < 9; j++) {
                    if (at[j] > 0xffff) continue;
                    const float x = f_of(b | at[j]);
                    check_code(s, x);
                    if (fabsf(x) <= 1.0f) blk[nb++] = x;
                    if (nb == 256 || (top == (128 << 7) - 1 && neg && j == 8)) {
                        if (fl_isa_best() >= FL_ISA_AVX512) {
                            uint8_t q[256];
                            float am;
                            fl_isa_set(FL_ISA_AVX512);
                            fl_optim_quantize_blockwise(blk, q, &am, nb, 256, s);
                            fl_isa_set(fl_isa_best());
                            assert_true(am == 1.0f);
                            for (int i = 0; i < nb; i++)
                                if (q[i] != fl_optim_code_ref(s, blk[i]))
                                    fail_msg("AVX-512, map %d, x %.9g (0x%08x): code %d, binary search %d", s, blk[i],
                                             u_of(blk[i]), q[i], fl_optim_code_ref(s, blk[i]));
                        }
                        nb = 1;
                    }
                }
            }
        }
    }
}

/* The AVX-512 kernels against the scalar loops: both optimizers, weight-decay ranges that cut
 * blocks, an odd length, gradients from 1e-12 to 10 with zeros, six steps; every parameter and
 * state byte equal.  Then block-wise quantization of zeros, tiny, huge and NaN values. */
static void test_simd_bits(void **state) {
    (void)state;
    if (fl_isa_best() < FL_ISA_AVX512) skip();
    const int64_t n = 5000 + 37;
    const int64_t ranges[4] = {100, 1234, 2000, 4999};
    float *p[2], *g = malloc((size_t)n * sizeof(float));
    assert_non_null(g);
    for (int kind = 0; kind < 2; kind++) {
        fl_optimizer_config cfg = fl_optim_default();
        cfg.kind = kind ? FL_OPTIMIZER_ADAMW8BIT : FL_OPTIMIZER_ADAMW;
        fl_optim *o[2];
        for (int v = 0; v < 2; v++) {
            assert_int_equal(fl_optim_new(&cfg, n, ranges, 2, &o[v]), FL_OK);
            p[v] = malloc((size_t)n * sizeof(float));
            assert_non_null(p[v]);
            for (int64_t i = 0; i < n; i++) p[v][i] = (float)sin(0.1 * (double)i);
        }
        uint64_t r = 88172645463325252ull;
        for (int step = 0; step < 6; step++) {
            for (int64_t i = 0; i < n; i++) {
                r ^= r << 13;
                r ^= r >> 7;
                r ^= r << 17;
                const double u = (double)(r >> 11) / 9007199254740992.0;
                g[i] = i % 97 == 0 ? 0.0f : (float)((u - 0.5) * pow(10.0, (double)(i % 14) - 12.0));
            }
            for (int v = 0; v < 2; v++) {
                fl_isa_set(v ? FL_ISA_AVX512 : FL_ISA_REF);
                fl_optim_step(o[v], p[v], g, 1e-3f);
            }
            fl_isa_set(fl_isa_best());
            assert_memory_equal(p[0], p[1], (size_t)n * sizeof(float));
            for (int i = 0;; i++) {
                void *d0, *d1;
                size_t b0, b1;
                const char *n0, *n1;
                if (fl_optim_state(o[0], i, &d0, &b0, &n0) != FL_OK) break;
                assert_int_equal(fl_optim_state(o[1], i, &d1, &b1, &n1), FL_OK);
                assert_int_equal(b0, b1);
                assert_memory_equal(d0, d1, b0);
            }
        }
        for (int v = 0; v < 2; v++) {
            fl_optim_free(o[v]);
            free(p[v]);
        }
    }
    free(g);
    /* the dequantizer's table lookup (permutes, not a gather): every code of both maps, and a tail */
    for (int sgn = 0; sgn < 2; sgn++) {
        const float *map = fl_optim_dynamic_map(sgn);
        uint8_t c[256];
        float out[256];
        for (int i = 0; i < 256; i++) c[i] = (uint8_t)(i * 167 + 13); /* each code once, shuffled */
        for (int len = 256; len >= 249; len -= 7) {
            memset(out, 0, sizeof out);
            fl_adam8_dequant_avx512(map, c, 0.37f, out, len);
            for (int i = 0; i < 256; i++)
                if (out[i] != (i < len ? map[c[i]] * 0.37f : 0.0f)) fail_msg("dequant map %d, code %d: %g", sgn, c[i], out[i]);
        }
    }
    float x[300];
    uint8_t q[2][300];
    float am[2][2];
    for (int i = 0; i < 300; i++) x[i] = (float)sin(i) * (i % 3 == 0 ? 1e-30f : i % 3 == 1 ? 1.0f : 0.0f);
    x[7] = NAN;
    x[200] = 3e38f;
    for (int sgn = 0; sgn < 2; sgn++) {
        for (int v = 0; v < 2; v++) {
            fl_isa_set(v ? FL_ISA_AVX512 : FL_ISA_REF);
            fl_optim_quantize_blockwise(x, q[v], am[v], 300, 256, sgn);
        }
        fl_isa_set(fl_isa_best());
        assert_memory_equal(q[0], q[1], 300);
        assert_memory_equal(am[0], am[1], sizeof am[0]);
    }
    fl_test_mem_zero();
}

static void test_dynamic_maps(void **state) {
    (void)state;
    for (int s = 0; s < 2; s++) {
        const float *map = fl_optim_dynamic_map(s);
        for (int i = 1; i < 256; i++) assert_true(map[i] > map[i - 1]); /* sorted, distinct */
        assert_true(map[255] == 1.0f);
        if (s) assert_true(map[0] < -0.9f && map[0] > -1.0f);
        else assert_true(map[0] == 0.0f);
        int has0 = 0;
        for (int i = 0; i < 256; i++) has0 |= map[i] == 0.0f;
        assert_true(has0);
    }
    /* block-wise round trip: relative error small near the block max, exact absmax */
    const int64_t n = 1000;
    const int32_t bs = 256;
    float x[1000], y[1000], am[4];
    uint8_t q[1000];
    for (int i = 0; i < n; i++) x[i] = (float)(sin(i * 0.37) * pow(10.0, -(i % 5)));
    fl_optim_quantize_blockwise(x, q, am, n, bs, 1);
    fl_optim_dequantize_blockwise(q, am, y, n, bs, 1);
    for (int b = 0; b < 4; b++) {
        float mx = 0;
        for (int i = b * bs; i < n && i < (b + 1) * bs; i++) mx = fmaxf(mx, fabsf(x[i]));
        assert_true(am[b] == mx);
    }
    for (int i = 0; i < n; i++) {
        const float a = am[i / bs], rel = fabsf(x[i]) / a;
        /* dynamic map: relative error bounded for values within 2 decades of absmax */
        if (rel > 1e-2f) assert_true(fabsf(y[i] - x[i]) <= 0.2f * fabsf(x[i]));
        if (rel > 0.1f) assert_true(fabsf(y[i] - x[i]) <= 0.008f * a);
    }
    fl_test_mem_zero();
}

/* minimize sum_i c_i (p_i - t_i)^2 with both optimizers; 8-bit tracks fp32 */
static double quad_loss(const float *p, int64_t n, float *g) {
    double l = 0;
    for (int64_t i = 0; i < n; i++) {
        const double c = 1.0 + (double)(i % 7), t = sin((double)i);
        l += c * (p[i] - t) * (p[i] - t);
        if (g) g[i] = (float)(2 * c * (p[i] - t));
    }
    return l;
}

static void test_adamw8bit_tracks_fp32(void **state) {
    (void)state;
    fl_threads_set(2);
    const int64_t n = 3000; /* 12 blocks, last one partial */
    const size_t nb = (size_t)n * sizeof(float);
    float *p32 = fl_calloc(FL_MEM_MISC, (size_t)n, 4), *p8 = fl_calloc(FL_MEM_MISC, (size_t)n, 4);
    float *g = fl_calloc(FL_MEM_MISC, (size_t)n, 4);
    fl_optimizer_config c32 = fl_optim_default(), c8 = fl_optim_default();
    c32.weight_decay = c8.weight_decay = 0.0f;
    c8.kind = FL_OPTIMIZER_ADAMW8BIT;
    fl_optim *o32, *o8;
    assert_int_equal(fl_optim_new(&c32, n, NULL, -1, &o32), FL_OK);
    assert_int_equal(fl_optim_new(&c8, n, NULL, -1, &o8), FL_OK);
    /* state bytes: 8 per param vs 2 per param + 8 per block of 256 */
    assert_int_equal(fl_optim_state_bytes(o32), 8 * (size_t)n);
    assert_int_equal(fl_optim_state_bytes(o8), 2 * (size_t)n + 8 * 12);
    assert_int_equal(fl_mem_current(FL_MEM_OPTIM), 8 * (size_t)n + 2 * (size_t)n + 8 * 12);
    const double l0 = quad_loss(p32, n, NULL);
    for (int t = 0; t < 300; t++) {
        quad_loss(p32, n, g);
        fl_optim_step(o32, p32, g, 0.02f);
        quad_loss(p8, n, g);
        fl_optim_step(o8, p8, g, 0.02f);
    }
    const double l32 = quad_loss(p32, n, NULL), l8 = quad_loss(p8, n, NULL);
    assert_true(l32 < 0.01 * l0);
    assert_true(l8 < 0.02 * l0);
    double diff = 0;
    for (int64_t i = 0; i < n; i++) diff = fmax(diff, fabs(p32[i] - p8[i]));
    assert_true(diff < 0.1);
    /* state enumeration for checkpoints */
    void *d;
    size_t bytes;
    const char *name;
    assert_int_equal(fl_optim_state(o8, 3, &d, &bytes, &name), FL_OK);
    assert_string_equal(name, "adam8.absmax_v");
    assert_int_equal(fl_optim_state(o8, 4, &d, &bytes, &name), FL_ERR_RANGE);
    fl_optim_free(o32);
    fl_optim_free(o8);
    fl_free(FL_MEM_MISC, p32, nb);
    fl_free(FL_MEM_MISC, p8, nb);
    fl_free(FL_MEM_MISC, g, nb);
    fl_test_mem_zero();
}

/* ZeRO shards: optimizers over [0, a) and [a, n) with a on a block boundary, stepped with the same
 * gradients, hold exactly the slices fl_optim_state_unit names of one optimizer over [0, n)
 * (what lets a checkpoint's states be read back for any number of ranks). */
static void test_state_slices(void **state) {
    (void)state;
    fl_threads_set(2);
    for (int k = 0; k < 2; k++) {
        const int64_t n = 3000, a = 1280; /* 5 blocks of 256, then 6.7 */
        fl_optimizer_config c = fl_optim_default();
        c.kind = k ? FL_OPTIMIZER_ADAMW8BIT : FL_OPTIMIZER_ADAMW;
        fl_optim *whole, *lo, *hi;
        assert_int_equal(fl_optim_new(&c, n, NULL, -1, &whole), FL_OK);
        assert_int_equal(fl_optim_new(&c, a, NULL, -1, &lo), FL_OK);
        assert_int_equal(fl_optim_new(&c, n - a, NULL, -1, &hi), FL_OK);
        float *p = fl_calloc(FL_MEM_MISC, (size_t)n, 4), *q = fl_calloc(FL_MEM_MISC, (size_t)n, 4);
        float *g = fl_calloc(FL_MEM_MISC, (size_t)n, 4);
        for (int step = 0; step < 5; step++) {
            quad_loss(p, n, g);
            fl_optim_step(whole, p, g, 1e-2f);
            quad_loss(q, n, g);
            fl_optim_step(lo, q, g, 1e-2f);
            fl_optim_step(hi, q + a, g + a, 1e-2f);
        }
        assert_memory_equal(p, q, (size_t)n * 4);
        int ns = 0;
        for (int i = 0;; i++, ns++) {
            void *dw, *dl, *dh;
            size_t bw, bl, bh, unit;
            const char *name;
            int64_t per;
            if (fl_optim_state(whole, i, &dw, &bw, &name) != FL_OK) break;
            assert_int_equal(fl_optim_state_unit(whole, i, &per, &unit), FL_OK);
            assert_int_equal(fl_optim_state(lo, i, &dl, &bl, &name), FL_OK);
            assert_int_equal(fl_optim_state(hi, i, &dh, &bh, &name), FL_OK);
            assert_int_equal(a % per, 0);
            const size_t cut = (size_t)(a / per) * unit;
            assert_int_equal(bl, cut);
            assert_int_equal(bw, bl + bh);
            assert_memory_equal(dw, dl, bl);
            assert_memory_equal((const char *)dw + cut, dh, bh);
            if (k && i >= 2) assert_int_equal(per, 256);
        }
        int64_t per;
        size_t unit;
        assert_int_equal(ns, k ? 4 : 2);
        assert_int_equal(fl_optim_state_unit(whole, ns, &per, &unit), FL_ERR_RANGE);
        fl_free(FL_MEM_MISC, p, (size_t)n * 4);
        fl_free(FL_MEM_MISC, q, (size_t)n * 4);
        fl_free(FL_MEM_MISC, g, (size_t)n * 4);
        fl_optim_free(whole);
        fl_optim_free(lo);
        fl_optim_free(hi);
    }
    fl_test_mem_zero();
}

static void test_clip_and_schedule(void **state) {
    (void)state;
    float g[4] = {3, 4, 0, 0};
    CHECK_NEAR(fl_grad_clip(g, 4, 10.0), 5.0, 1e-9);
    assert_true(g[0] == 3.0f); /* under the limit: untouched */
    CHECK_NEAR(fl_grad_clip(g, 4, 1.0), 5.0, 1e-9);
    CHECK_NEAR(g[0], 0.6, 1e-6);
    CHECK_NEAR(g[1], 0.8, 1e-6);
    g[2] = INFINITY;
    assert_true(isinf(fl_grad_clip(g, 4, 1.0)));
    /* a long vector: the norm of a sum in long double, the same bits on 1 and 2 threads, every
     * element scaled (the parts and the threads cut it unevenly) */
    const int64_t n = 100003;
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    assert_non_null(a);
    assert_non_null(b);
    long double ss = 0;
    for (int64_t i = 0; i < n; i++) {
        a[i] = b[i] = (float)sin((double)i) * (float)(1 + i % 7);
        ss += (long double)a[i] * a[i];
    }
    fl_threads_set(1);
    const double n1 = fl_grad_clip(a, n, 1.0);
    fl_threads_set(2);
    const double n2 = fl_grad_clip(b, n, 1.0);
    assert_memory_equal(&n1, &n2, sizeof n1);
    assert_memory_equal(a, b, (size_t)n * sizeof(float));
    CHECK_NEAR(n1, sqrtl(ss), 1e-12 * n1);
    CHECK_NEAR(a[n - 1], sin((double)(n - 1)) * (1 + (n - 1) % 7) / n1, 1e-6);
    /* the clip's scale applied as the optimizer reads the gradient (the trainer's way) gives the
     * bits of clipping in place and then stepping, on each ISA and for both optimizers; the
     * gradient itself is left as it was */
    for (int kind = 0; kind < 2; kind++) {
        for (int isa = 0; isa < 2; isa++) {
            if (isa && fl_isa_best() < FL_ISA_AVX512) continue;
            fl_isa_set(isa ? FL_ISA_AVX512 : FL_ISA_REF);
            fl_optimizer_config cfg = fl_optim_default();
            cfg.kind = kind ? FL_OPTIMIZER_ADAMW8BIT : FL_OPTIMIZER_ADAMW;
            fl_optim *o1, *o2;
            assert_int_equal(fl_optim_new(&cfg, n, NULL, -1, &o1), FL_OK);
            assert_int_equal(fl_optim_new(&cfg, n, NULL, -1, &o2), FL_OK);
            float *p1 = malloc((size_t)n * sizeof(float)), *p2 = malloc((size_t)n * sizeof(float)),
                  *g0 = malloc((size_t)n * sizeof(float));
            assert_true(p1 && p2 && g0);
            for (int64_t i = 0; i < n; i++) p1[i] = p2[i] = (float)cos((double)i);
            for (int step = 0; step < 3; step++) {
                for (int64_t i = 0; i < n; i++) a[i] = b[i] = g0[i] = (float)sin((double)(i + step)) * (float)(1 + (i + step) % 5);
                const double max = step == 1 ? 1e9 : 3.0; /* (step 1: not clipped) */
                const double na = fl_grad_clip(a, n, max);
                fl_optim_step(o1, p1, a, 1e-2f);
                const double nb = fl_grad_norm(b, n);
                assert_memory_equal(&na, &nb, sizeof na);
                assert_true(step == 1 ? fl_grad_clip_scale(nb, max) == 1.0f : fl_grad_clip_scale(nb, max) < 1.0f);
                fl_optim_step_scaled(o2, p2, b, 1e-2f, fl_grad_clip_scale(nb, max));
                assert_memory_equal(b, g0, (size_t)n * sizeof(float));
                assert_memory_equal(p1, p2, (size_t)n * sizeof(float));
                for (int i = 0;; i++) {
                    void *d1, *d2;
                    size_t b1, b2;
                    const char *n1s, *n2s;
                    if (fl_optim_state(o1, i, &d1, &b1, &n1s) != FL_OK) break;
                    assert_int_equal(fl_optim_state(o2, i, &d2, &b2, &n2s), FL_OK);
                    assert_memory_equal(d1, d2, b1);
                }
            }
            fl_optim_free(o1);
            fl_optim_free(o2);
            free(p1);
            free(p2);
            free(g0);
        }
    }
    fl_isa_set(fl_isa_best());
    assert_true(fl_grad_clip_scale(INFINITY, 1.0) == 1.0f && fl_grad_clip_scale(5.0, 0.0) == 1.0f);
    free(a);
    free(b);
    /* warmup 10, total 110, lr 1, min 0.1 */
    CHECK_NEAR(fl_lr_at(FL_LR_COSINE, 0, 10, 110, 1.0f, 0.1f), 0.1, 1e-6);
    CHECK_NEAR(fl_lr_at(FL_LR_COSINE, 9, 10, 110, 1.0f, 0.1f), 1.0, 1e-6);
    CHECK_NEAR(fl_lr_at(FL_LR_COSINE, 10, 10, 110, 1.0f, 0.1f), 1.0, 1e-6);
    CHECK_NEAR(fl_lr_at(FL_LR_COSINE, 109, 10, 110, 1.0f, 0.1f), 0.1, 1e-6);
    CHECK_NEAR(fl_lr_at(FL_LR_COSINE, 10 + 99 / 2.0, 10, 110, 1.0f, 0.1f), 0.55, 0.02);
    CHECK_NEAR(fl_lr_at(FL_LR_LINEAR, 109, 10, 110, 1.0f, 0.1f), 0.1, 1e-6);
    CHECK_NEAR(fl_lr_at(FL_LR_LINEAR, 59, 10, 110, 1.0f, 0.0f), 0.5050505, 1e-5);
    CHECK_NEAR(fl_lr_at(FL_LR_CONSTANT, 50, 10, 110, 1.0f, 0.1f), 1.0, 1e-9);
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_reference), cmocka_unit_test(test_dynamic_maps), cmocka_unit_test(test_code_search), cmocka_unit_test(test_simd_bits),
        cmocka_unit_test(test_adamw8bit_tracks_fp32), cmocka_unit_test(test_clip_and_schedule),
        cmocka_unit_test(test_state_slices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
