/* Q4_0 / Q8_0 in groups of 8 interleaved rows (FL_TYPE_Q4_0_R8 / Q8_0_R8) and Q4_K / Q5_K / Q6_K
 * in groups of 16 (FL_TYPE_Q4_K_R16 / Q5_K_R16 / Q6_K_R16), layouts in kernels/matmul.h: packing,
 * unpacking and the f32 expansion of one row. */
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <string.h>

int32_t fl_r8_load_type(int32_t type, int64_t rows, bool repack) {
    const fl_isa isa = fl_isa_get();
    if (!repack || fl_matmul_llama_order() || fl_matmul_f32_act() || rows <= 0) return type;
    /* Q4_K, Q5_K, Q6_K: AVX-512 without AMX (with it, its int8 tiles take the steps of 13 tokens or more on
     * the file's rows) */
    if (type == FL_TYPE_Q4_K || type == FL_TYPE_Q5_K || type == FL_TYPE_Q6_K)
        return isa == FL_ISA_AVX512 && !fl_amx_usable() && rows % FL_K16_ROWS == 0
                   ? (type == FL_TYPE_Q4_K ? FL_TYPE_Q4_K_R16 : type == FL_TYPE_Q5_K ? FL_TYPE_Q5_K_R16 : FL_TYPE_Q6_K_R16)
                   : type;
    /* with AMX, where its bf16 tiles take the prefill steps on the groups (fl_amx_bf16_panel_r8) */
    const bool on = isa == FL_ISA_AVX2 || (isa == FL_ISA_AVX512 && (!fl_amx_usable() || fl_amx_bf16_usable()));
    return on && fl_r8_of(type) >= 0 && rows % FL_R8_ROWS == 0 ? fl_r8_of(type) : type;
}

int fl_r8_group_rows(int32_t type) {
    return fl_k16_type(type) ? FL_K16_ROWS : fl_r8_base(type) >= 0 ? FL_R8_ROWS : 0;
}

int32_t fl_r8_base(int32_t type) {
    return type == FL_TYPE_Q4_0_R8 ? FL_TYPE_Q4_0 : type == FL_TYPE_Q8_0_R8 ? FL_TYPE_Q8_0 : -1;
}
int32_t fl_r8_of(int32_t type) {
    return type == FL_TYPE_Q4_0 ? FL_TYPE_Q4_0_R8 : type == FL_TYPE_Q8_0 ? FL_TYPE_Q8_0_R8 : -1;
}

/* code bytes per row and block: Q4_0 16 (two nibbles each), Q8_0 32 */
static size_t qs_bytes(int32_t type) { return fl_r8_base(type) == FL_TYPE_Q8_0 ? 32 : 16; }
size_t fl_r8_block_bytes(int32_t type) { return fl_r8_base(type) == FL_TYPE_Q8_0 ? FL_R8_Q8_0_BLOCK : FL_R8_Q4_0_BLOCK; }

/* Q4_K_R16: super-block b of the group from / to the 16 rows' blocks (offsets as in matmul.h) */
/* (Q5_K_R16: the same with qh; Q4_K and Q5_K share d, dmin and scales at the start) */
static void k16_pack_block(const unsigned char *rows, size_t ldw, int64_t b, unsigned char *o, bool q5) {
    const size_t bs = q5 ? sizeof(fl_block_q5_K) : sizeof(fl_block_q4_K);
    for (int i = 0; i < FL_K16_ROWS; i++) {
        const unsigned char *blk = rows + (size_t)i * ldw + (size_t)b * bs;
        const fl_block_q4_K *p = (const fl_block_q4_K *)blk;
        const uint8_t *qs = q5 ? ((const fl_block_q5_K *)blk)->qs : p->qs;
        memcpy(o + 2 * i, &p->d, 2);
        memcpy(o + 32 + 2 * i, &p->dmin, 2);
        for (int k = 0; k < 12; k++) o[FL_K16_SCALES + FL_K16_ROWS * k + i] = p->scales[k];
        for (int v = 0; v < 32; v++) memcpy(o + (q5 ? FL_K16_Q5_QS : FL_K16_QS) + 64 * v + 4 * i, qs + 4 * v, 4);
        for (int v = 0; v < 8 && q5; v++) memcpy(o + FL_K16_Q5_QH + 64 * v + 4 * i, ((const fl_block_q5_K *)blk)->qh + 4 * v, 4);
    }
}
static void k16_unpack_block(const unsigned char *g, int i, void *blk, bool q5) {
    fl_block_q4_K *p = blk;
    uint8_t *qs = q5 ? ((fl_block_q5_K *)blk)->qs : p->qs;
    memcpy(&p->d, g + 2 * i, 2);
    memcpy(&p->dmin, g + 32 + 2 * i, 2);
    for (int k = 0; k < 12; k++) p->scales[k] = g[FL_K16_SCALES + FL_K16_ROWS * k + i];
    for (int v = 0; v < 32; v++) memcpy(qs + 4 * v, g + (q5 ? FL_K16_Q5_QS : FL_K16_QS) + 64 * v + 4 * i, 4);
    for (int v = 0; v < 8 && q5; v++) memcpy(((fl_block_q5_K *)blk)->qh + 4 * v, g + FL_K16_Q5_QH + 64 * v + 4 * i, 4);
}
/* Q6_K_R16: the same */
static void k16_q6_pack_block(const unsigned char *rows, size_t ldw, int64_t b, unsigned char *o) {
    for (int i = 0; i < FL_K16_ROWS; i++) {
        const fl_block_q6_K *p = (const fl_block_q6_K *)(rows + (size_t)i * ldw) + b;
        memcpy(o + 2 * i, &p->d, 2);
        for (int k = 0; k < 16; k++) o[FL_K16_Q6_SCALES + FL_K16_ROWS * k + i] = (unsigned char)p->scales[k];
        for (int u = 0; u < 32; u++) memcpy(o + FL_K16_Q6_QL + 64 * u + 4 * i, p->ql + 4 * u, 4);
        for (int u = 0; u < 16; u++) memcpy(o + FL_K16_Q6_QH + 64 * u + 4 * i, p->qh + 4 * u, 4);
    }
}
static void k16_q6_unpack_block(const unsigned char *g, int i, fl_block_q6_K *p) {
    memcpy(&p->d, g + 2 * i, 2);
    for (int k = 0; k < 16; k++) p->scales[k] = (int8_t)g[FL_K16_Q6_SCALES + FL_K16_ROWS * k + i];
    for (int u = 0; u < 32; u++) memcpy(p->ql + 4 * u, g + FL_K16_Q6_QL + 64 * u + 4 * i, 4);
    for (int u = 0; u < 16; u++) memcpy(p->qh + 4 * u, g + FL_K16_Q6_QH + 64 * u + 4 * i, 4);
}
_Static_assert(FL_K16_Q6_QH + 16 * 64 == FL_K16_Q6_BLOCK, "q6_K_r16 super-block");
_Static_assert(FL_K16_QS + 32 * 64 == FL_K16_BLOCK, "q4_K_r16 super-block");
_Static_assert(FL_K16_Q5_QS + 32 * 64 == FL_K16_Q5_BLOCK, "q5_K_r16 super-block");
static size_t k16_block_bytes(int32_t type) {
    return type == FL_TYPE_Q4_K_R16 ? FL_K16_BLOCK : type == FL_TYPE_Q5_K_R16 ? FL_K16_Q5_BLOCK : FL_K16_Q6_BLOCK;
}

/* (both block types are the f16 d, then the codes) */
void fl_r8_pack(int32_t type, const void *rows, size_t ldw, int64_t K, void *group) {
    if (type == FL_TYPE_Q4_K_R16 || type == FL_TYPE_Q5_K_R16) {
        for (int64_t b = 0; b < K / 256; b++)
            k16_pack_block(rows, ldw, b, (unsigned char *)group + (size_t)b * k16_block_bytes(type), type == FL_TYPE_Q5_K_R16);
        return;
    }
    if (type == FL_TYPE_Q6_K_R16) {
        for (int64_t b = 0; b < K / 256; b++) k16_q6_pack_block(rows, ldw, b, (unsigned char *)group + (size_t)b * FL_K16_Q6_BLOCK);
        return;
    }
    const size_t q = qs_bytes(type), bsz = 2 + q, gb = fl_r8_block_bytes(type);
    for (int64_t b = 0; b < K / 32; b++) {
        unsigned char *o = (unsigned char *)group + (size_t)b * gb;
        for (int i = 0; i < FL_R8_ROWS; i++) {
            const unsigned char *p = (const unsigned char *)rows + (size_t)i * ldw + (size_t)b * bsz;
            memcpy(o + 2 * i, p, 2);
            for (size_t v = 0; v < q / 4; v++) memcpy(o + 16 + 32 * v + 4 * i, p + 2 + 4 * v, 4);
        }
    }
}

void fl_r8_repack(int32_t type, void *rows, size_t ldw, int64_t K, void *tmp) {
    memcpy(tmp, rows, (size_t)fl_r8_group_rows(type) * ldw);
    fl_r8_pack(type, tmp, ldw, K, rows);
}

void fl_r8_unpack_row(int32_t type, const void *group, int i, int64_t K, void *row) {
    if (type == FL_TYPE_Q4_K_R16 || type == FL_TYPE_Q5_K_R16) {
        const bool q5 = type == FL_TYPE_Q5_K_R16;
        for (int64_t b = 0; b < K / 256; b++)
            k16_unpack_block((const unsigned char *)group + (size_t)b * k16_block_bytes(type), i,
                             (char *)row + (size_t)b * (q5 ? sizeof(fl_block_q5_K) : sizeof(fl_block_q4_K)), q5);
        return;
    }
    if (type == FL_TYPE_Q6_K_R16) {
        for (int64_t b = 0; b < K / 256; b++)
            k16_q6_unpack_block((const unsigned char *)group + (size_t)b * FL_K16_Q6_BLOCK, i, (fl_block_q6_K *)row + b);
        return;
    }
    const size_t q = qs_bytes(type), bsz = 2 + q, gb = fl_r8_block_bytes(type);
    for (int64_t b = 0; b < K / 32; b++) {
        const unsigned char *g = (const unsigned char *)group + (size_t)b * gb;
        unsigned char *p = (unsigned char *)row + (size_t)b * bsz;
        memcpy(p, g + 2 * i, 2);
        for (size_t v = 0; v < q / 4; v++) memcpy(p + 2 + 4 * v, g + 16 + 32 * v + 4 * i, 4);
    }
}

void fl_r8_dequant_row(int32_t type, const void *data, size_t ldw, int64_t r, float *dst, int64_t K) {
    if (fl_k16_type(type)) {
        const unsigned char *g = (const unsigned char *)data + (size_t)(r / FL_K16_ROWS) * FL_K16_ROWS * ldw;
        const bool q6 = type == FL_TYPE_Q6_K_R16, q5 = type == FL_TYPE_Q5_K_R16;
        for (int64_t b = 0; b < K / 256; b++) {
            union { fl_block_q4_K q4; fl_block_q5_K q5; fl_block_q6_K q6; } blk;
            if (q6) k16_q6_unpack_block(g + (size_t)b * FL_K16_Q6_BLOCK, (int)(r % FL_K16_ROWS), &blk.q6);
            else k16_unpack_block(g + (size_t)b * k16_block_bytes(type), (int)(r % FL_K16_ROWS), &blk, q5);
            fl_dequant_row(q6 ? FL_TYPE_Q6_K : q5 ? FL_TYPE_Q5_K : FL_TYPE_Q4_K, &blk, dst + b * 256, 256);
        }
        return;
    }
    const unsigned char *g = (const unsigned char *)data + (size_t)(r / FL_R8_ROWS) * FL_R8_ROWS * ldw;
    const size_t q = qs_bytes(type), gb = fl_r8_block_bytes(type);
    const int i = (int)(r % FL_R8_ROWS);
    for (int64_t b = 0; b < K / 32; b++) {
        unsigned char blk[34];
        const unsigned char *s = g + (size_t)b * gb;
        memcpy(blk, s + 2 * i, 2);
        for (size_t v = 0; v < q / 4; v++) memcpy(blk + 2 + 4 * v, s + 16 + 32 * v + 4 * i, 4);
        fl_dequant_row(fl_r8_base(type), blk, dst + b * 32, 32);
    }
}
