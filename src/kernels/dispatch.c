#include "kernels/dispatch.h"
#include "core/cpu.h"
#include "core/log.h"
#include "kernels/matmul.h"

#include <stdlib.h>
#include <string.h>

static int g_isa = -1;
static unsigned g_gen = 1;

fl_isa fl_isa_best(void) {
    const char *b = fl_cpu_best_isa();
    if (!strcmp(b, "avx512")) return FL_ISA_AVX512;
    if (!strcmp(b, "avx2")) return FL_ISA_AVX2;
    return FL_ISA_REF;
}

const char *fl_isa_name(fl_isa isa) {
    switch (isa) {
    case FL_ISA_AVX512: return "avx512";
    case FL_ISA_AVX2: return "avx2";
    default: return "ref";
    }
}

void fl_isa_set(fl_isa isa) {
    fl_isa best = fl_isa_best();
    if (isa > best) {
        FL_LOG_WARN("%s: %s not supported by this CPU, using %s", __func__, fl_isa_name(isa), fl_isa_name(best));
        isa = best;
    }
    g_isa = (int)isa;
    fl_gemv_prefetch_defaults();
    g_gen++;
}

fl_isa fl_isa_get(void) {
    if (g_isa < 0) {
        const char *e = getenv("FL_KERNELS");
        fl_isa want = fl_isa_best();
        if (e && *e) {
            if (!strcmp(e, "ref")) want = FL_ISA_REF;
            else if (!strcmp(e, "avx2")) want = FL_ISA_AVX2;
            else if (!strcmp(e, "avx512")) want = FL_ISA_AVX512;
            else FL_LOG_WARN("FL_KERNELS=%s not understood (ref|avx2|avx512)", e);
        }
        fl_isa_set(want);
    }
    return (fl_isa)g_isa;
}

unsigned fl_isa_generation(void) {
    (void)fl_isa_get();
    return g_gen;
}
