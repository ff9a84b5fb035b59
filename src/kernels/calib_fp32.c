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

/* CPU time of the calling thread: time the thread was descheduled (other processes on a shared
 * machine) does not count, so the result is the peak of the core, not of our share of it. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile float calib_sink;

__attribute__((target("avx512f,fma"))) static void loop_avx512(long iters) {
    __m512 acc[CALIB_ACC];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CALIB_ACC; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++) /* unrolled so that acc stays in registers (see loop_avx2) */
#pragma GCC unroll 16
        for (int i = 0; i < CALIB_ACC; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    for (int i = 1; i < CALIB_ACC; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
    calib_sink = _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,fma"))) static void loop_avx2(long iters) {
    __m256 acc[CALIB_ACC];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CALIB_ACC; i++) acc[i] = _mm256_set1_ps((float)i);
    /* unrolled so that acc stays in registers: rolled, GCC kept acc on the stack and the loop
     * timed store-to-load forwarding, not FMAs */
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 16
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
#pragma GCC unroll 16
        for (int i = 0; i < CALIB_ACC; i++) acc[i] = acc[i] * 0.999999f + 1e-7f;
    float s = 0.0f;
    for (int i = 0; i < CALIB_ACC; i++) s += acc[i];
    calib_sink = s;
}

typedef struct calib_ctx {
    fl_isa isa;
    long iters;
    double secs[256]; /* CPU seconds of each thread */
} calib_ctx;

static void calib_task(void *p, int ith, int nth) {
    calib_ctx *c = p;
    (void)nth;
    const double t0 = now_s();
    if (c->isa == FL_ISA_AVX512) loop_avx512(c->iters);
    else if (c->isa == FL_ISA_AVX2) loop_avx2(c->iters);
    else loop_ref(c->iters);
    if (ith < 256) c->secs[ith] = now_s() - t0;
}

double fl_calib_fp32_peak_gflops_isa(fl_isa isa, int n_threads) {
    if (isa > fl_isa_best()) isa = fl_isa_best();
    if (n_threads <= 0) n_threads = fl_threads_get();
    const int lanes = isa == FL_ISA_AVX512 ? 16 : isa == FL_ISA_AVX2 ? 8 : 1;
    if (n_threads > 256) n_threads = 256;
    calib_ctx c = {.isa = isa, .iters = 100000}, *cp = &c;
    /* size the loop to ~20 ms on one thread */
    calib_task(cp, 0, 1);
    if (cp->secs[0] > 0) cp->iters = (long)((double)cp->iters * 0.01 / cp->secs[0]) + 1;
    /* per thread: the best of 20 short tries (GFLOP per CPU second); the sum over threads */
    double best[256] = {0}, total = 0.0;
    for (int rep = 0; rep < 20; rep++) {
        fl_parallel_n(calib_task, cp, n_threads);
        for (int t = 0; t < n_threads; t++) {
            const double gf = cp->secs[t] > 0 ? 2.0 * lanes * CALIB_ACC * (double)cp->iters / cp->secs[t] * 1e-9 : 0.0;
            if (gf > best[t]) best[t] = gf;
        }
    }
    for (int t = 0; t < n_threads; t++) total += best[t];
    return total;
}

double fl_calib_fp32_peak_gflops(int n_threads) { return fl_calib_fp32_peak_gflops_isa(fl_isa_get(), n_threads); }
