/* AVX2 int8 peak loop (vpmaddubsw, 32 MACs per instruction, 8 independent chains folded with
 * vpmaddwd every step) and a streaming read loop for the bandwidth calibration. */
#include "kernels/calib_int8.h"

#include <immintrin.h>

uint64_t fl_calib_int8_loop_avx2(uint64_t iters) {
    __m256i a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm256_set1_epi32(i);
    const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    for (uint64_t it = 0; it < iters; it++)
        for (int i = 0; i < 8; i++) a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
    __m256i t = a[0];
    for (int i = 1; i < 8; i++) t = _mm256_add_epi32(t, a[i]);
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
