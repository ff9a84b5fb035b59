/*
 * cpu.h - x86-64 feature detection with cpuid + XGETBV (the OS must save the wide registers).
 * fl_cpu() is computed once and cached; thread-safe after the first call.
 */
#ifndef FL_CPU_H
#define FL_CPU_H

#include <stdbool.h>

typedef struct fl_cpu_features {
    bool sse42, avx, fma, f16c, avx2;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16, avx512vbmi;
    bool avxvnni;
    bool amx_int8; /* AMX-TILE + AMX-INT8 with the tile state enabled by the OS (XCR0) */
    bool amx_bf16; /* AMX-BF16 as well (with amx_int8) */
    bool intel;    /* vendor GenuineIntel (the GEMV's prefetch distances differ: kernels/matmul.h) */
    char brand[49];
} fl_cpu_features;

const fl_cpu_features *fl_cpu(void);
/* Ask the OS for this process's AMX tile state (Linux arch_prctl; once, on first call); true if
 * granted.  Kernels call it before their first tile instruction (fl_amx_usable does). */
bool fl_cpu_amx_request(void);
/* "avx512" when F+BW+VL+VNNI are usable, else "avx2" when AVX2+FMA+F16C, else "ref". */
const char *fl_cpu_best_isa(void);

#endif
