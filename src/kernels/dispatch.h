/*
 * dispatch.h - which instruction set the kernels use.
 *
 * fl_isa() is decided once from cpu.h (best of avx512 > avx2 > ref) and can be forced with the
 * environment variable FL_KERNELS=ref|avx2|avx512 (a request above what the CPU has falls back
 * to the best available, with a warning).  Each kernel family keeps its own table of function
 * pointers, filled from fl_isa() on first use; hot code calls through the table, never through
 * #ifdefs.  fl_isa_set() overrides at run time (tests compare variants this way).
 */
#ifndef FL_DISPATCH_H
#define FL_DISPATCH_H

typedef enum fl_isa { FL_ISA_REF = 0, FL_ISA_AVX2 = 1, FL_ISA_AVX512 = 2 } fl_isa;

fl_isa fl_isa_get(void);
fl_isa fl_isa_best(void);            /* what the CPU supports */
void fl_isa_set(fl_isa isa);         /* clamps to fl_isa_best() */
const char *fl_isa_name(fl_isa isa);
/* Incremented each time the ISA changes, so cached tables know to refresh. */
unsigned fl_isa_generation(void);

#endif
