/*
 * calib_fp32.c - fp32 FMA peak calibration (see calib_fp32.h).  The SIMD loops use target
 * attributes so this file builds with the baseline flags; they only run when cpu.h says so.
 */
#include "kernels/calib_fp32.h"

#include "core/threads.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <time.h>

#define CALIB_ACC 12

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile float calib_sink;

__attribute__((target("avx512f,fma"))) static void loop_avx512(long iters) {
    __m512 acc[CALIB_ACC];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CALIB_ACC; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < CALIB_ACC; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    for (int i = 1; i < CALIB_ACC; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
    calib_sink = _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,fma"))) static void loop_avx2(long iters) {
    __m256 acc[CALIB_ACC];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CALIB_ACC; i++) acc[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < CALIB_ACC; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    for (int i = 1; i < CALIB_ACC; i++) acc[0] = _mm256_add_ps(acc[0], acc[i]);
    float t[8];
    _mm256_storeu_ps(t, acc[0]);
    calib_sink = t[0] + t[7];
}

static void loop_ref(long iters) {
    float acc[CALIB_ACC];
    for (int i = 0; i < CALIB_ACC; i++) acc[i] = (float)i;
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < CALIB_ACC; i++) acc[i] = acc[i] * 0.999999f + 1e-7f;
    float s = 0.0f;
    for (int i = 0; i < CALIB_ACC; i++) s += acc[i];
    calib_sink = s;
}

typedef struct calib_ctx {
    fl_isa isa;
    long iters;
} calib_ctx;

static void calib_task(void *p, int ith, int nth) {
    const calib_ctx *c = p;
    (void)ith, (void)nth;
    if (c->isa == FL_ISA_AVX512) loop_avx512(c->iters);
    else if (c->isa == FL_ISA_AVX2) loop_avx2(c->iters);
    else loop_ref(c->iters);
}

double fl_calib_fp32_peak_gflops_isa(fl_isa isa, int n_threads) {
    if (isa > fl_isa_best()) isa = fl_isa_best();
    if (n_threads <= 0) n_threads = fl_threads_get();
    const int lanes = isa == FL_ISA_AVX512 ? 16 : isa == FL_ISA_AVX2 ? 8 : 1;
    calib_ctx c = {isa, 100000};
    /* size the loop to ~50 ms on one thread */
    double t0 = now_s();
    calib_task(&c, 0, 1);
    double dt = now_s() - t0;
    if (dt > 0) c.iters = (long)((double)c.iters * 0.05 / dt) + 1;
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        t0 = now_s();
        fl_parallel_n(calib_task, &c, n_threads);
        dt = now_s() - t0;
        const double gf = 2.0 * lanes * CALIB_ACC * (double)c.iters * n_threads / dt * 1e-9;
        if (gf > best) best = gf;
    }
    return best;
}

double fl_calib_fp32_peak_gflops(int n_threads) { return fl_calib_fp32_peak_gflops_isa(fl_isa_get(), n_threads); }
