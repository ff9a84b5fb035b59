#include "core/cpu.h"

#include <cpuid.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

static fl_cpu_features g_cpu;
static int g_cpu_done;

static uint64_t xgetbv0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

/* AMX tile state enabled in XCR0 (XTILECFG + XTILEDATA, bits 17 and 18). */
static bool amx_os_enabled(void) { return ((xgetbv0() >> 17) & 3) == 3; }

/* Linux hands out the 8 KiB AMX tile state only to processes that ask (arch_prctl
 * ARCH_REQ_XCOMP_PERM for XTILEDATA, feature 18); the grant covers every thread.  Asked once,
 * on first use, so processes that never run the tiles keep the smaller signal frames. */
static int g_amx_grant = -1;

bool fl_cpu_amx_request(void) {
    int g = __atomic_load_n(&g_amx_grant, __ATOMIC_ACQUIRE);
    if (g < 0) {
        g = 0;
#if defined(__linux__) && defined(SYS_arch_prctl)
        if (fl_cpu()->amx_int8) g = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
#endif
        __atomic_store_n(&g_amx_grant, g, __ATOMIC_RELEASE); /* idempotent: racing threads agree */
    }
    return g == 1;
}

static void detect(fl_cpu_features *f) {
    unsigned a, b, c, d;
    memset(f, 0, sizeof *f);
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    f->intel = b == 0x756E6547 && d == 0x49656E69 && c == 0x6C65746E; /* "Genu" "ineI" "ntel" */
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = (c >> 27) & 1;
    f->sse42 = (c >> 20) & 1;
    bool avx_hw = (c >> 28) & 1, fma_hw = (c >> 12) & 1, f16c_hw = (c >> 29) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm_ok = (xcr0 & 0x6) == 0x6;          /* SSE + AVX state */
    bool zmm_ok = ymm_ok && (xcr0 & 0xE0) == 0xE0; /* opmask + ZMM_Hi256 + Hi16_ZMM */
    f->avx = avx_hw && ymm_ok;
    f->fma = fma_hw && f->avx;
    f->f16c = f16c_hw && f->avx;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f->avx2 = ((b >> 5) & 1) && f->avx;
        f->avx512f = ((b >> 16) & 1) && zmm_ok;
        f->avx512dq = ((b >> 17) & 1) && f->avx512f;
        f->avx512bw = ((b >> 30) & 1) && f->avx512f;
        f->avx512vl = ((b >> 31) & 1) && f->avx512f;
        f->avx512vnni = ((c >> 11) & 1) && f->avx512f;
        f->avx512vbmi = ((c >> 1) & 1) && f->avx512f;
        f->amx_int8 = ((d >> 24) & 1) && ((d >> 25) & 1) && f->avx512f && amx_os_enabled();
        f->amx_bf16 = f->amx_int8 && ((d >> 22) & 1);
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
        f->avx512bf16 = ((a >> 5) & 1) && f->avx512f;
        f->avxvnni = ((a >> 4) & 1) && f->avx;
    }
    unsigned brand[12];
    if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
        for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002 + i, &brand[4 * i], &brand[4 * i + 1], &brand[4 * i + 2], &brand[4 * i + 3]);
        memcpy(f->brand, brand, 48);
        f->brand[48] = 0;
    }
}

const fl_cpu_features *fl_cpu(void) {
    if (!__atomic_load_n(&g_cpu_done, __ATOMIC_ACQUIRE)) {
        fl_cpu_features f;
        detect(&f);
        g_cpu = f; /* idempotent: racing threads write the same bytes */
        __atomic_store_n(&g_cpu_done, 1, __ATOMIC_RELEASE);
    }
    return &g_cpu;
}

const char *fl_cpu_best_isa(void) {
    const fl_cpu_features *f = fl_cpu();
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni && f->fma && f->f16c) return "avx512";
    if (f->avx2 && f->fma && f->f16c) return "avx2";
    return "ref";
}
