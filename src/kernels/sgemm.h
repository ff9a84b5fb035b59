/*
 * sgemm.h - f32 matrix products for the trainer: C (+)= op(A) op(B).
 *
 *   fl_sgemm(flags, M, N, K, A, lda, B, ldb, C, ldc)
 *     C[M][N] = op(A)[M][K] * op(B)[K][N]     (FL_SGEMM_ACC: C += the product)
 *     op(A) = A, an M x K row-major matrix with row stride lda, or with FL_SGEMM_TA the
 *             transpose of a K x M one (A[k][m] at A + k * lda + m);
 *     op(B) = B, K x N row-major (stride ldb), or with FL_SGEMM_TB the transpose of an N x K one.
 *   The trainer's three products of a linear layer y = x W^T (x: tokens x I, W: O x I) are
 *   y = x W^T (TB), dx += dy W (ACC) and dW += dy^T x (TA | ACC).
 *
 * fl_sgemm_ref is the specification: for each element, the products summed in k order from 0 in
 * f32 (then added to C under ACC).  The fast path (kernels/sgemm.c) blocks K by FL_SGEMM_KC:
 * each block's products are summed in k order, then added to C, so results differ from the
 * reference by rounding only; they do not depend on the thread count.  It packs, per thread,
 * a K-block of up to FL_SGEMM_NC columns of op(B) into panels of NR columns (FL_MEM_SCRATCH,
 * one allocation per call: exactly fl_sgemm_scratch_bytes(M, N, K, nth) for nth =
 * fl_threads_get()), and runs an MR x NR register tile over them and A in place (AVX-512
 * 12 x 32, AVX2 6 x 16, portable C 4 x 16) on fl_parallel's threads, which take (rows,
 * columns) chunks from a counter.  If the scratch cannot be had it computes
 * the same bits without packing, one element at a time (slowly; no error).  M, N or K of 0 is a no-op
 * (K of 0 without ACC zeroes C).  Chosen from fl_isa_get().
 */
#ifndef FL_SGEMM_H
#define FL_SGEMM_H

#include <stddef.h>
#include <stdint.h>

enum { FL_SGEMM_TA = 1, FL_SGEMM_TB = 2, FL_SGEMM_ACC = 4 };

#define FL_SGEMM_KC 256 /* k per packed block */
#define FL_SGEMM_NC 256 /* the most columns one chunk packs */

void fl_sgemm(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
              float *C, int64_t ldc);
void fl_sgemm_ref(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                  float *C, int64_t ldc);
/* The FL_MEM_SCRATCH fl_sgemm allocates for these sizes on nth threads with the current ISA
 * (0 where it packs nothing). */
size_t fl_sgemm_scratch_bytes(int64_t M, int64_t N, int64_t K, int nth);

/* ---- the register tiles (internal: kernels/sgemm.c and its ISA files) ----
 * C[r][j] (+)= sum over k < kc of a[r * rsa + k * csa] * bp[k * NR + j] for r < mr (<= MR),
 * j < nr (<= NR): A read in place (rsa or csa is 1), B a packed panel bp[kc][NR]; stored, or
 * added to C (row stride ldc) when acc. */
typedef void (*fl_sgemm_tile_fn)(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C,
                                 int64_t ldc, int mr, int nr, int acc);
void fl_sgemm_tile_avx512(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C, int64_t ldc,
                          int mr, int nr, int acc);
void fl_sgemm_tile_avx2(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C, int64_t ldc,
                        int mr, int nr, int acc);
void fl_sgemm_tile_generic(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C, int64_t ldc,
                           int mr, int nr, int acc);
/* op(B) = B^T packed for one panel: dst[k][j] = B[j * ldb + k] for k < kc, j < nr, 0 for nr <= j < NR */
void fl_sgemm_pack_bt_avx512(int64_t kc, int nr, const float *B, int64_t ldb, float *dst, int NR);

#endif
