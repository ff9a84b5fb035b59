/* int8 peak loop and a 512-bit streaming read loop for the bandwidth calibration.
 *
 * int8 peak loop: 12 independent vpdpbusd accumulator chains (covers the 4-5 cycle latency on
 * two ports).  Each vpdpbusd on zmm is 64 u8 x s8 multiply-adds. */
#include "kernels/calib_int8.h"

#include <immintrin.h>

uint64_t fl_calib_int8_loop_avx512(uint64_t iters) {
    __m512i a0 = _mm512_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m512i a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
    for (uint64_t i = 0; i < iters; i++) {
        a0 = _mm512_dpbusd_epi32(a0, u, s); a1 = _mm512_dpbusd_epi32(a1, u, s);
        a2 = _mm512_dpbusd_epi32(a2, u, s); a3 = _mm512_dpbusd_epi32(a3, u, s);
        a4 = _mm512_dpbusd_epi32(a4, u, s); a5 = _mm512_dpbusd_epi32(a5, u, s);
        a6 = _mm512_dpbusd_epi32(a6, u, s); a7 = _mm512_dpbusd_epi32(a7, u, s);
        a8 = _mm512_dpbusd_epi32(a8, u, s); a9 = _mm512_dpbusd_epi32(a9, u, s);
        a10 = _mm512_dpbusd_epi32(a10, u, s); a11 = _mm512_dpbusd_epi32(a11, u, s);
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));
    }
    __m512i t = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    t = _mm512_add_epi32(t, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    volatile int sink = _mm512_reduce_add_epi32(t);
    (void)sink;
    return iters * 12 * 64;
}

uint64_t fl_calib_read_avx512(const void *p, size_t bytes, size_t prefetch) {
    const char *c = p;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 256 <= bytes; i += 256) {
        if (prefetch) /* the same software prefetch the GEMV uses; past the end it is harmless */
            for (int l = 0; l < 256; l += 64) _mm_prefetch(c + i + prefetch + l, _MM_HINT_T0);
        s0 = _mm512_add_epi64(s0, _mm512_load_si512((const void *)(c + i)));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512((const void *)(c + i + 64)));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512((const void *)(c + i + 128)));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512((const void *)(c + i + 192)));
    }
    uint64_t r = (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
    for (; i < bytes; i++) r += (uint8_t)c[i];
    return r;
}
