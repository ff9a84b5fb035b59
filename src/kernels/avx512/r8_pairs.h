/* What the 16-row tiles on the R8 groups share (the VNNI tiles in r8_avx512.c and the AMX-INT8
 * ones in kernels/amx/r8_amx.c): the software prefetch along a pair of groups, and the walk over
 * a matrix's rows in pairs of groups.  Internal to kernels/avx512 and kernels/amx. */
#ifndef FL_KERNELS_AVX512_R8_PAIRS_H
#define FL_KERNELS_AVX512_R8_PAIRS_H

#include "kernels/matmul.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* software prefetch along each group, two distances (bytes): into L2 well ahead, and from there
 * into L1 a block or two ahead.  16 tokens, 2 x 256 MiB of groups streamed through the VNNI tile
 * (a microbenchmark, 2 threads): 1.5 KiB into L1 alone 575-610 GOP/s, with 4 KiB into L2 602-650
 * (one thread 288-294 against 314-335); the AMX tile measured the same at 256-1024 / 2-16 KiB. */
#define FL_R8_PF 512
#define FL_R8_PF_L2 4096

/* Both prefetches of block b of the pair (ga, gb = ga + gbytes, or ga twice); past a group's end,
 * the same place in the next pair's groups. */
static inline __attribute__((always_inline)) void fl_r8_prefetch(const char *ga, const char *gb, int64_t b, size_t bb,
                                                                 size_t gbytes) {
    const size_t o = (size_t)b * bb + FL_R8_PF, o2 = (size_t)b * bb + FL_R8_PF_L2;
    const size_t skip = o >= gbytes ? gbytes : 0, skip2 = o2 >= gbytes ? gbytes : 0;
    for (size_t l = 0; l < bb; l += 64) {
        _mm_prefetch(ga + o + skip + l, _MM_HINT_T0);
        _mm_prefetch(gb + o + skip + l, _MM_HINT_T0);
        _mm_prefetch(ga + o2 + skip2 + l, _MM_HINT_T1);
        _mm_prefetch(gb + o2 + skip2 + l, _MM_HINT_T1);
    }
}

/* A tile of 16 rows (groups ga, gb; gb == ga computes rows 0-7 twice and stores the 8 of rm) x
 * the tokens of the 16-token records at act. */
typedef void (*fl_r8_pair_fn)(const char *ga, const char *gb, const char *act, int64_t nb, float *y, int64_t ldy, __mmask16 rm);

/* The tiles for 9..16 tokens as functions of that type, and their table: NAME##9 .. NAME##16
 * call KERNEL(Q8, ga, gb, act, nb, n, y, ldy, rm) with n a constant. */
#define FL_R8_PAIR_FN(name, kernel, q8, n)                                                                     \
    static void name(const char *ga, const char *gb, const char *act, int64_t nb, float *y, int64_t ldy, __mmask16 rm) { \
        kernel(q8, ga, gb, act, nb, n, y, ldy, rm);                                                            \
    }
#define FL_R8_PAIR_FNS(name, kernel, q8)                                                                       \
    FL_R8_PAIR_FN(name##9, kernel, q8, 9) FL_R8_PAIR_FN(name##10, kernel, q8, 10) FL_R8_PAIR_FN(name##11, kernel, q8, 11) \
    FL_R8_PAIR_FN(name##12, kernel, q8, 12) FL_R8_PAIR_FN(name##13, kernel, q8, 13)                          \
    FL_R8_PAIR_FN(name##14, kernel, q8, 14) FL_R8_PAIR_FN(name##15, kernel, q8, 15)                          \
    FL_R8_PAIR_FN(name##16, kernel, q8, 16)
#define FL_R8_PAIR_ROW(name) {name##9, name##10, name##11, name##12, name##13, name##14, name##15, name##16}

/* f over rows [0, nr) of the groups at w (nr a multiple of 8): pairs of groups, a last lone group
 * computed twice with 8 rows stored. */
static inline void fl_r8_pairs(fl_r8_pair_fn f, const void *w, size_t ldw, int nr, const void *act, int64_t nb, float *y,
                               int64_t ldy) {
    const size_t gs = (size_t)FL_R8_ROWS * ldw;
    for (int r = 0; r < nr; r += 16) {
        const char *ga = (const char *)w + (size_t)(r / FL_R8_ROWS) * gs;
        const bool two = nr - r >= 16;
        f(ga, two ? ga + gs : ga, (const char *)act, nb, y + r, ldy, two ? (__mmask16)0xFFFF : (__mmask16)0x00FF);
    }
}

#endif
