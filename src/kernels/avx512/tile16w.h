/* Inline asm shared by the AVX-512 tiles that take 16 tokens per pass (r8_avx512.c, the Q4_K /
 * Q4_0 / Q8_0 panels in matmul_avx512.c): the activation codes as broadcast memory operands, and
 * f32 sums kept in memory.  Internal to kernels/avx512. */
#ifndef FL_KERNELS_AVX512_TILE16W_H
#define FL_KERNELS_AVX512_TILE16W_H

#include <immintrin.h>
#include <stdint.h>

/* acc + w (unsigned bytes) . the 4 signed bytes at x broadcast to all 16 lanes, the broadcast
 * folded into the instruction */
static inline __attribute__((always_inline)) __m512i fl_dpbusd_bcast16(__m512i acc, __m512i w, const int32_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
    return acc;
}

/* *acc += a * b, *acc read and written in memory: with 16 tokens' int32 sums in registers, GCC
 * otherwise keeps the 16 f32 sums in registers too and spills the int32 sums the loop needs */
static inline __attribute__((always_inline)) void fl_acc_fma(__m512 *acc, __m512 a, __m512 b) {
    __asm__("vfmadd213ps %[m], %[b], %[a]\n\tvmovaps %[a], %[m]" : [a] "+v"(a), [m] "+m"(*acc) : [b] "v"(b));
}

/* *acc = (a * b + *acc) + mv * (*x broadcast), the two fmas in that order, *acc in memory */
static inline __attribute__((always_inline)) void fl_acc_fma2(__m512 *acc, __m512 a, __m512 b, __m512 mv, const float *x) {
    __asm__("vfmadd213ps %[m], %[b], %[a]\n\tvfmadd231ps %[x]%{1to16%}, %[mv], %[a]\n\tvmovaps %[a], %[m]"
            : [a] "+v"(a), [m] "+m"(*acc)
            : [b] "v"(b), [mv] "v"(mv), [x] "m"(*x));
}

#endif
