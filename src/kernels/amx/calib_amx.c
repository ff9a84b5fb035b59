/* AMX-INT8 peak loop (see calib_int8.h): 4 independent TDPBSSD on full tiles (16 x 64 bytes),
 * each 16 x 16 x 64 multiply-adds. */
#include "kernels/amx/amx.h"
#include "kernels/calib_int8.h"

#include <immintrin.h>
#include <stdint.h>


static const tile_config g_full __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

uint64_t fl_calib_int8_loop_amx(uint64_t iters) {
    static const int8_t ones[16 * 64] __attribute__((aligned(64))) = {1};
    int32_t out[256] __attribute__((aligned(64)));
    _tile_loadconfig(&g_full);
    _tile_loadd(0, ones, 64);
    _tile_loadd(1, ones, 64);
    _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
    for (uint64_t i = 0; i < iters; i++) {
        _tile_dpbssd(4, 0, 1); _tile_dpbssd(5, 0, 1);
        _tile_dpbssd(6, 1, 0); _tile_dpbssd(7, 1, 0);
    }
    _tile_stored(4, out, 64);
    volatile int32_t sink = out[0];
    (void)sink;
    _tile_release();
    return iters * 4 * 16 * 16 * 64;
}
