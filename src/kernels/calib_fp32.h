/*
 * calib_fp32.h - the machine's measured fp32 FMA peak, from a small calibration loop.
 *
 * The loop runs 12 independent FMA chains (enough to cover FMA latency x 2 ports) on vectors of
 * the chosen ISA (AVX-512: 16 lanes, AVX2: 8, ref: scalar fmaf) on n_threads threads for about
 * 50 ms each try and keeps the best of 3 tries.  Counts 2 FLOP per lane per FMA.  Used by the
 * benchmarks to report "% of peak".  Thread-safe; takes ~0.2 s; allocates nothing.
 */
#ifndef FL_CALIB_FP32_H
#define FL_CALIB_FP32_H

#include "kernels/dispatch.h"

/* Peak GFLOP/s for fl_isa_get() on n_threads threads (<= 0: fl_threads_get()). */
double fl_calib_fp32_peak_gflops(int n_threads);
/* Same for a given ISA (clamped to what the CPU supports). */
double fl_calib_fp32_peak_gflops_isa(fl_isa isa, int n_threads);

#endif
