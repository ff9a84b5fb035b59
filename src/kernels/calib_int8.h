/*
 * calib_int8.h - calibration loops for the machine's limits, used to report speeds as a
 * fraction of what the hardware can do.
 *
 *   fl_calib_int8_peak_gops(nth, seconds)  int8 multiply-add peak in GOP/s (1 MAC = 2 ops) on
 *       nth threads: independent vpdpbusd chains on zmm registers (AVX-512 VNNI), or
 *       vpmaddubsw + vpmaddwd on AVX2 (counted the same way), from registers only.
 *   fl_calib_mem_bandwidth_gbs(nth, bytes)  read bandwidth in GB/s (1e9 bytes/s): nth threads
 *       each stream their slice of a `bytes` buffer (make it several times the last-level
 *       cache), the best of 3 passes after a warm-up for each read loop: plain loads, and on
 *       AVX-512 also 512-bit loads with and without the GEMV's software prefetch (the highest
 *       rate any of them reaches is the figure kernels are compared with).  Allocates the buffer (FL_MEM_SCRATCH);
 *       returns a negative value if it cannot.
 *   fl_calib_bw_new(nth, bytes) / fl_calib_bw_measure(b, reps) / fl_calib_bw_free(b)  the same
 *       buffer kept (allocated and faulted in once, NULL if it cannot be): each measure is the
 *       best of `reps` passes of each read loop, so a benchmark can read the bandwidth right
 *       before and after each round of its own work and report per-round ratios (this
 *       machine's rate moves by up to 2x from one second to the next).
 *   fl_calib_amx_int8_peak_gops(nth, seconds)  the same for AMX-INT8 tiles (4 independent
 *       TDPBSSD on full 16 x 64 tiles), 0 where fl_amx_usable() is false.  The int8 peak that
 *       speeds are reported against stays the VNNI one; this is printed beside it.
 * All run on fl_parallel_n teams of at most fl_threads_cpus() threads (nth beyond the CPUs the
 * process may use measures nothing more, and took nth / CPUs times as long); not for concurrent use
 * with other heavy work.
 */
#ifndef FL_CALIB_INT8_H
#define FL_CALIB_INT8_H

#include <stddef.h>
#include <stdint.h>

double fl_calib_int8_peak_gops(int nth, double seconds);
double fl_calib_mem_bandwidth_gbs(int nth, size_t bytes);
typedef struct fl_calib_bw { char *buf; size_t bytes; int nth; } fl_calib_bw;
fl_calib_bw *fl_calib_bw_new(int nth, size_t bytes);
double fl_calib_bw_measure(fl_calib_bw *b, int reps);
void fl_calib_bw_free(fl_calib_bw *b);

/* ISA loops (kernels/avx512, kernels/avx2): run `iters` iterations, return int8 MACs done. */
uint64_t fl_calib_int8_loop_avx512(uint64_t iters);
uint64_t fl_calib_int8_loop_avx2(uint64_t iters);
uint64_t fl_calib_int8_loop_amx(uint64_t iters); /* kernels/amx; loads and releases its own tiles */
double fl_calib_amx_int8_peak_gops(int nth, double seconds);
/* Sum of a buffer's bytes as 64-bit lanes (touches every cache line once). */
uint64_t fl_calib_read_avx2(const void *p, size_t bytes);
/* The same with 512-bit loads, and software prefetch into L1 `near` and into L2 `far` bytes ahead
 * where they are non-zero. */
uint64_t fl_calib_read_avx512(const void *p, size_t bytes, size_t near, size_t far);

#endif
