/* AVX2 int8 peak loop (vpmaddubsw, 32 MACs per instruction, 8 independent chains folded with
 * vpmaddwd every step) and a streaming read loop for the bandwidth calibration. */
#include "kernels/calib_int8.h"

#include <immintrin.h>

uint64_t fl_calib_int8_loop_avx2(uint64_t iters) {
    __m256i a0 = _mm256_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, t0, t1, t2, t3;
    const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    /* In asm: written with intrinsics, the product of two constants was hoisted out of the loop
     * (and the 8 chains shared it), so the loop timed stack adds, not multiplies: it read 160-296
     * GOP/s on 2 Zen 3 cores whose vpmaddubsw + vpmaddwd rate is ~375. */
#define CHAIN(a, t) "vpmaddubsw %[s], %[u], %[" #t "]\n\tvpmaddwd %[o], %[" #t "], %[" #t "]\n\tvpaddd %[" #t "], %[" #a "], %[" #a "]\n\t"
    for (uint64_t it = 0; it < iters; it++)
        __asm__ volatile(CHAIN(a0, t0) CHAIN(a1, t1) CHAIN(a2, t2) CHAIN(a3, t3) CHAIN(a4, t0) CHAIN(a5, t1) CHAIN(a6, t2)
                             CHAIN(a7, t3)
                         : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                           [a6] "+x"(a6), [a7] "+x"(a7), [t0] "=&x"(t0), [t1] "=&x"(t1), [t2] "=&x"(t2), [t3] "=&x"(t3)
                         : [u] "x"(u), [s] "x"(s), [o] "x"(ones));
#undef CHAIN
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                       _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    volatile int sink = _mm256_extract_epi32(t, 0);
    (void)sink;
    return iters * 8 * 32;
}

uint64_t fl_calib_read_avx2(const void *p, size_t bytes) {
    const char *c = p;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)(c + i)));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(c + i + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(c + i + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(c + i + 96)));
    }
    s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t r = (uint64_t)_mm256_extract_epi64(s0, 0) + (uint64_t)_mm256_extract_epi64(s0, 3);
    for (; i < bytes; i++) r += (uint8_t)c[i];
    return r;
}
