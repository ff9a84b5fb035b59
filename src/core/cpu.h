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
    bool amx_int8; /* AMX-TILE + AMX-INT8, and the OS granted this process the tile state */
    char brand[49];
} fl_cpu_features;

const fl_cpu_features *fl_cpu(void);
/* "avx512" when F+BW+VL+VNNI are usable, else "avx2" when AVX2+FMA+F16C, else "ref". */
const char *fl_cpu_best_isa(void);

#endif
