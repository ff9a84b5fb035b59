/*
 * calib_fp32.h - the machine's measured fp32 FMA peak, from a small calibration loop.
 *
 * The loop runs 12 independent FMA chains (enough to cover FMA latency x 2 ports) on vectors of
 * the chosen ISA (AVX-512: 16 lanes, AVX2: 8, ref: scalar multiply-add) on n_threads threads,
 * ~10 ms per try, 20 tries.  Each thread's rate is FLOP per second of its own CPU time
 * (CLOCK_THREAD_CPUTIME_ID), so time stolen by other processes on a shared machine does not
 * lower the peak; the result is the sum of each thread's best try.  Counts 2 FLOP per lane per
 * FMA.  Benchmarks divide their FLOP per CPU second by this.  Reentrant; ~0.2 s; no allocation.
 */
#ifndef FL_CALIB_FP32_H
#define FL_CALIB_FP32_H

#include "kernels/dispatch.h"

/* Peak GFLOP/s for fl_isa_get() on n_threads threads (<= 0: fl_threads_get()). */
double fl_calib_fp32_peak_gflops(int n_threads);
/* Same for a given ISA (clamped to what the CPU supports). */
double fl_calib_fp32_peak_gflops_isa(fl_isa isa, int n_threads);

#endif
