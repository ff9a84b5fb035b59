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
    /* In asm: written with intrinsics, the chains that started equal and took the same operands
     * were merged (only a0..a5 were pinned), so the loop ran 7 vpdpbusd and counted 12: it read
     * 1521-1579 GOP/s on 2 Zen 4 cores whose vpdpbusd rate is ~1 zmm per cycle (~900). */
#define DP(a) "vpdpbusd %[s], %[u], %[" #a "]\n\t"
    for (uint64_t it = 0; it < iters; it++)
        __asm__ volatile(DP(a0) DP(a1) DP(a2) DP(a3) DP(a4) DP(a5) DP(a6) DP(a7) DP(a8) DP(a9) DP(a10) DP(a11)
                         : [a0] "+v"(a0), [a1] "+v"(a1), [a2] "+v"(a2), [a3] "+v"(a3), [a4] "+v"(a4), [a5] "+v"(a5),
                           [a6] "+v"(a6), [a7] "+v"(a7), [a8] "+v"(a8), [a9] "+v"(a9), [a10] "+v"(a10), [a11] "+v"(a11)
                         : [u] "v"(u), [s] "v"(s));
#undef DP
    __m512i t = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    t = _mm512_add_epi32(t, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    uint32_t lane[16], sum = 0; /* (in unsigned arithmetic: GCC's _mm512_reduce_add_epi32 wraps in signed int, undefined) */
    _mm512_storeu_si512(lane, t);
    for (int l = 0; l < 16; l++) sum += lane[l];
    volatile uint32_t sink = sum;
    (void)sink;
    return iters * 12 * 64;
}

uint64_t fl_calib_read_avx512(const void *p, size_t bytes, size_t near, size_t far) {
    const char *c = p;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 256 <= bytes; i += 256) {
        /* the software prefetch the GEMVs use (fl_gemv_pf_near / _far); past the end it is harmless */
        if (near)
            for (int l = 0; l < 256; l += 64) _mm_prefetch(c + i + near + l, _MM_HINT_T0);
        if (far)
            for (int l = 0; l < 256; l += 64) _mm_prefetch(c + i + far + l, _MM_HINT_T1);
        s0 = _mm512_add_epi64(s0, _mm512_load_si512((const void *)(c + i)));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512((const void *)(c + i + 64)));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512((const void *)(c + i + 128)));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512((const void *)(c + i + 192)));
    }
    /* the lanes summed in unsigned arithmetic (GCC's _mm512_reduce_add_epi64 adds in signed long
     * long, undefined where the sums of a large buffer wrap, as UBSan reports) */
    uint64_t lane[8];
    _mm512_storeu_si512(lane, _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
    uint64_t r = 0;
    for (int l = 0; l < 8; l++) r += lane[l];
    for (; i < bytes; i++) r += (uint8_t)c[i];
    return r;
}
