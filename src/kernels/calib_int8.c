/* Calibration of the int8 multiply-add peak and of the read bandwidth (see calib_int8.h). */
#include "kernels/calib_int8.h"
#include "core/clock.h"
#include "core/alloc.h"
#include "core/threads.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct { uint64_t iters; double t[256]; uint64_t macs[256]; bool avx512, amx; } peak_ctx;

static void peak_task(void *p, int ith, int nth) {
    peak_ctx *c = p;
    (void)nth;
    const double t0 = fl_clock_s();
    c->macs[ith] = c->amx ? fl_calib_int8_loop_amx(c->iters) : c->avx512 ? fl_calib_int8_loop_avx512(c->iters) : fl_calib_int8_loop_avx2(c->iters);
    c->t[ith] = fl_clock_s() - t0;
}

/* The calibrations run on at most one thread per CPU the process may use: the machine's rate,
 * and a calibration of -t 256 on 2 CPUs ran 128 loops per CPU (over 60 s). */
static int calib_threads(int nth) {
    const int cpus = fl_threads_cpus();
    if (nth > cpus) nth = cpus;
    if (nth > 256) nth = 256;
    return nth < 1 ? 1 : nth;
}

static double peak_gops(int nth, double seconds, bool amx) {
    nth = calib_threads(nth);
    if (fl_isa_best() == FL_ISA_REF) return 0;
    peak_ctx c;
    memset(&c, 0, sizeof c);
    c.avx512 = fl_isa_best() == FL_ISA_AVX512;
    c.amx = amx;
    /* size the loop with a short single-thread probe */
    c.iters = 1 << 16;
    peak_task(&c, 0, 1);
    double per_iter = c.t[0] / (double)c.iters;
    c.iters = (uint64_t)(seconds / (per_iter > 0 ? per_iter : 1e-9));
    if (c.iters < 1000) c.iters = 1000;
    double best = 0;
    for (int rep = 0; rep < 2; rep++) {
        fl_parallel_n(peak_task, &c, nth);
        double ops = 0, tmax = 0;
        for (int i = 0; i < nth; i++) {
            ops += 2.0 * (double)c.macs[i];
            if (c.t[i] > tmax) tmax = c.t[i];
        }
        if (tmax > 0 && ops / tmax / 1e9 > best) best = ops / tmax / 1e9;
    }
    return best;
}

double fl_calib_int8_peak_gops(int nth, double seconds) { return peak_gops(nth, seconds, false); }

double fl_calib_amx_int8_peak_gops(int nth, double seconds) {
    return fl_amx_usable() ? peak_gops(nth, seconds, true) : 0;
}

typedef struct { const char *buf; size_t bytes; int loop; uint64_t sink[256]; } bw_ctx;

static void bw_task(void *p, int ith, int nth) {
    bw_ctx *c = p;
    size_t per = (c->bytes / (size_t)nth) & ~(size_t)4095;
    const char *s = c->buf + per * (size_t)ith;
    if (c->loop == 0) c->sink[ith] += fl_calib_read_avx2(s, per);
    else if (c->loop == 1) c->sink[ith] += fl_calib_read_avx512(s, per, 0, 0);
    else c->sink[ith] += fl_calib_read_avx512(s, per, (size_t)fl_gemv_pf_near, (size_t)fl_gemv_pf_far); /* the GEMVs' prefetch */
}

/* The best rate of `reps` timed passes of each read loop over buf (faulted in). */
static double bw_passes(int nth, const char *buf, size_t bytes, int reps) {
    bw_ctx c;
    memset(&c, 0, sizeof c);
    c.buf = buf;
    c.bytes = bytes;
    double best = 0;
    const int nloops = fl_isa_best() == FL_ISA_AVX512 ? 3 : 1;
    for (int rep = 0; rep < reps; rep++)
        for (c.loop = 0; c.loop < nloops; c.loop++) {
            const double t0 = fl_clock_s();
            fl_parallel_n(bw_task, &c, nth);
            const double dt = fl_clock_s() - t0;
            const double per = (double)((bytes / (size_t)nth) & ~(size_t)4095) * nth;
            if (dt > 0 && per / dt / 1e9 > best) best = per / dt / 1e9;
        }
    return best;
}

fl_calib_bw *fl_calib_bw_new(int nth, size_t bytes) {
    nth = calib_threads(nth);
    if (fl_isa_best() == FL_ISA_REF) return NULL;
    (void)fl_isa_get(); /* (sets the GEMVs' prefetch distances the third read loop uses) */
    bytes &= ~(size_t)4095;
    if (bytes < 4096 * (size_t)nth) return NULL;
    fl_calib_bw *b = fl_alloc(FL_MEM_SCRATCH, sizeof *b, 64);
    if (!b) return NULL;
    b->buf = fl_alloc(FL_MEM_SCRATCH, bytes, 4096);
    if (!b->buf) {
        fl_free(FL_MEM_SCRATCH, b, sizeof *b);
        return NULL;
    }
    b->bytes = bytes;
    b->nth = nth;
    /* huge pages where the kernel grants them, as --no-mmap weights get (fl_mmap_open_read), so
     * the calibrated rate is the best this buffer can be read at; a hint, ignored without THP */
    fl_mem_advise_huge(b->buf, bytes); /* (fl_alloc's own hint starts at 8 MiB) */
    for (size_t i = 0; i < bytes; i += 64) b->buf[i] = (char)i; /* fault in every page */
    (void)bw_passes(nth, b->buf, bytes, 1);                    /* warm-up */
    return b;
}

double fl_calib_bw_measure(fl_calib_bw *b, int reps) { return b ? bw_passes(b->nth, b->buf, b->bytes, reps < 1 ? 1 : reps) : -1; }

void fl_calib_bw_free(fl_calib_bw *b) {
    if (!b) return;
    fl_free(FL_MEM_SCRATCH, b->buf, b->bytes);
    fl_free(FL_MEM_SCRATCH, b, sizeof *b);
}

double fl_calib_mem_bandwidth_gbs(int nth, size_t bytes) {
    fl_calib_bw *b = fl_calib_bw_new(nth, bytes);
    if (!b) return -1;
    const double best = fl_calib_bw_measure(b, 3);
    fl_calib_bw_free(b);
    return best;
}
