#include "core/dtype.h"
#include "kernels/convert.h"
#include "kernels/dispatch.h"

void fl_f16_to_f32_row_ref(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fl_f16_to_f32(x[i]);
}
void fl_f32_to_f16_row_ref(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fl_f32_to_f16(x[i]);
}
void fl_bf16_to_f32_row_ref(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fl_bf16_to_f32(x[i]);
}
void fl_f32_to_bf16_row_ref(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fl_f32_to_bf16(x[i]);
}

static const fl_convert_kernels k_ref = {fl_f16_to_f32_row_ref, fl_f32_to_f16_row_ref,
                                         fl_bf16_to_f32_row_ref, fl_f32_to_bf16_row_ref};
static const fl_convert_kernels k_avx2 = {fl_f16_to_f32_row_avx2, fl_f32_to_f16_row_avx2,
                                          fl_bf16_to_f32_row_ref, fl_f32_to_bf16_row_ref};
static const fl_convert_kernels k_avx512 = {fl_f16_to_f32_row_avx512, fl_f32_to_f16_row_avx512,
                                            fl_bf16_to_f32_row_avx512, fl_f32_to_bf16_row_avx512};

const fl_convert_kernels *fl_convert_kernels_get(void) {
    switch (fl_isa_get()) {
    case FL_ISA_AVX512: return &k_avx512;
    case FL_ISA_AVX2: return &k_avx2;
    default: return &k_ref;
    }
}

void fl_round_f16_row(const float *x, float *y, int64_t n) {
    const fl_convert_kernels *cv = fl_convert_kernels_get();
    uint16_t h[256];
    for (int64_t i = 0; i < n; i += 256) {
        const int64_t m = n - i < 256 ? n - i : 256;
        cv->f32_to_f16(x + i, h, m);
        cv->f16_to_f32(h, y + i, m);
    }
}
