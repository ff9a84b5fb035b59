/* Q4_0 in groups of 8 interleaved rows (FL_TYPE_Q4_0_R8, layout in kernels/matmul.h): packing,
 * unpacking and the f32 expansion of one row. */
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <string.h>

void fl_q4_0_r8_pack(const void *rows, size_t ldw, int64_t K, void *group) {
    const int64_t nb = K / 32;
    for (int64_t b = 0; b < nb; b++) {
        unsigned char *o = (unsigned char *)group + (size_t)b * FL_R8_BLOCK;
        for (int i = 0; i < FL_R8_ROWS; i++) {
            const fl_block_q4_0 *p = (const fl_block_q4_0 *)((const char *)rows + (size_t)i * ldw) + b;
            memcpy(o + 2 * i, &p->d, 2);
            for (int q = 0; q < 4; q++) memcpy(o + 16 + 32 * q + 4 * i, p->qs + 4 * q, 4);
        }
    }
}

void fl_q4_0_r8_repack(void *rows, size_t ldw, int64_t K, void *tmp) {
    memcpy(tmp, rows, (size_t)FL_R8_ROWS * ldw);
    fl_q4_0_r8_pack(tmp, ldw, K, rows);
}

void fl_q4_0_r8_unpack_row(const void *group, int i, int64_t K, void *row) {
    const int64_t nb = K / 32;
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *g = (const unsigned char *)group + (size_t)b * FL_R8_BLOCK;
        fl_block_q4_0 *p = (fl_block_q4_0 *)row + b;
        memcpy(&p->d, g + 2 * i, 2);
        for (int q = 0; q < 4; q++) memcpy(p->qs + 4 * q, g + 16 + 32 * q + 4 * i, 4);
    }
}

void fl_q4_0_r8_dequant_row(const void *data, size_t ldw, int64_t r, float *dst, int64_t K) {
    const unsigned char *g = (const unsigned char *)data + (size_t)(r / FL_R8_ROWS) * FL_R8_ROWS * ldw;
    const int i = (int)(r % FL_R8_ROWS);
    for (int64_t b = 0; b < K / 32; b++) {
        fl_block_q4_0 blk;
        const unsigned char *gb = g + (size_t)b * FL_R8_BLOCK;
        memcpy(&blk.d, gb + 2 * i, 2);
        for (int q = 0; q < 4; q++) memcpy(blk.qs + 4 * q, gb + 16 + 32 * q + 4 * i, 4);
        fl_dequant_q4_0(&blk, dst + b * 32, 32);
    }
}
