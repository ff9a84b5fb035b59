/* Q4_0 / Q8_0 in groups of 8 interleaved rows (FL_TYPE_Q4_0_R8 / Q8_0_R8) and Q4_K / Q5_K / Q6_K /
 * Q3_K / Q2_K / Q4_1 / Q5_0 / Q5_1 / IQ4_NL in groups of 16 (FL_TYPE_Q4_K_R16 ... IQ4_NL_R16), layouts in kernels/matmul.h: packing,
 * unpacking and the f32 expansion of one row. */
#include "core/status.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <stddef.h>
#include <string.h>

int32_t fl_r8_load_type(int32_t type, int64_t rows, bool repack) {
    const fl_isa isa = fl_isa_get();
    if (!repack || fl_matmul_llama_order() || fl_matmul_f32_act() || rows <= 0) return type;
    /* Q4_K, Q5_K, Q6_K, Q3_K, Q2_K: AVX-512 without AMX (with it, its int8 tiles take the steps of 13 tokens or more on
     * the file's rows) */
    const int32_t k16 = type == FL_TYPE_Q4_K   ? FL_TYPE_Q4_K_R16
                        : type == FL_TYPE_Q5_K ? FL_TYPE_Q5_K_R16
                        : type == FL_TYPE_Q6_K ? FL_TYPE_Q6_K_R16
                        : type == FL_TYPE_Q3_K ? FL_TYPE_Q3_K_R16
                        : type == FL_TYPE_Q2_K ? FL_TYPE_Q2_K_R16
                        : type == FL_TYPE_Q4_1 ? FL_TYPE_Q4_1_R16
                        : type == FL_TYPE_Q5_0 ? FL_TYPE_Q5_0_R16
                        : type == FL_TYPE_Q5_1 ? FL_TYPE_Q5_1_R16
                        : type == FL_TYPE_IQ4_NL ? FL_TYPE_IQ4_NL_R16
                                               : -1;
    if (k16 >= 0) return isa == FL_ISA_AVX512 && !fl_amx_usable() && rows % FL_K16_ROWS == 0 ? k16 : type;
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

/* The R16 types: each field of the base block, the 16 rows side by side (matmul.h).  A field
 * of `len` bytes at `src` in a row's block is elements of `e` bytes (f16 scalars 2, scale bytes
 * 1 or, Q3_K / Q2_K, pairs of them 2, codes 4; e 5: Q5_0's / Q5_1's qh, 4 bytes rearranged by
 * fl_b16_qh_word); element k of row i goes to byte dst + (16 k + i) e of the group's block. */
typedef struct {
    uint16_t src, len, dst, e;
} k16_field;
typedef struct {
    size_t bs; /* bytes of the base block */
    int qk;    /* its weights */
    int nf;
    k16_field f[5];
} k16_layout;
#define QH5 5 /* (k16_field.e of a fifth-bits word) */
static const k16_layout *k16_layout_of(int32_t type) {
    static const k16_layout q4 = {144, 256, 4, {{0, 2, 0, 2}, {2, 2, 32, 2}, {4, 12, FL_K16_SCALES, 1}, {16, 128, FL_K16_QS, 4}}};
    static const k16_layout q5 = {176, 256, 5, {{0, 2, 0, 2}, {2, 2, 32, 2}, {4, 12, FL_K16_SCALES, 1}, {16, 32, FL_K16_Q5_QH, 4}, {48, 128, FL_K16_Q5_QS, 4}}};
    static const k16_layout q6 = {210, 256, 4, {{0, 128, FL_K16_Q6_QL, 4}, {128, 64, FL_K16_Q6_QH, 4}, {192, 16, FL_K16_Q6_SCALES, 1}, {208, 2, 0, 2}}};
    static const k16_layout q3 = {110, 256, 4, {{0, 32, FL_K16_Q3_HM, 4}, {32, 64, FL_K16_Q3_QS, 4}, {96, 12, FL_K16_Q3_SCALES, 2}, {108, 2, 0, 2}}};
    static const k16_layout q2 = {84, 256, 4, {{0, 16, FL_K16_Q2_SCALES, 2}, {16, 64, FL_K16_Q2_QS, 4}, {80, 2, 0, 2}, {82, 2, 32, 2}}};
    static const k16_layout q41 = {20, 32, 3, {{0, 2, 0, 2}, {2, 2, 32, 2}, {4, 16, 64, 4}}};
    static const k16_layout q50 = {22, 32, 3, {{0, 2, 0, 2}, {2, 4, 32, QH5}, {6, 16, 96, 4}}};
    static const k16_layout q51 = {24, 32, 4, {{0, 2, 0, 2}, {2, 2, 32, 2}, {4, 4, 64, QH5}, {8, 16, 128, 4}}};
    static const k16_layout iq4 = {18, 32, 2, {{0, 2, 0, 2}, {2, 16, 32, 4}}};
    switch (type) {
    case FL_TYPE_Q4_K_R16: return &q4;
    case FL_TYPE_Q5_K_R16: return &q5;
    case FL_TYPE_Q6_K_R16: return &q6;
    case FL_TYPE_Q3_K_R16: return &q3;
    case FL_TYPE_Q4_1_R16: return &q41;
    case FL_TYPE_Q5_0_R16: return &q50;
    case FL_TYPE_Q5_1_R16: return &q51;
    case FL_TYPE_IQ4_NL_R16: return &iq4;
    default: FL_ASSERT(type == FL_TYPE_Q2_K_R16); return &q2;
    }
}
_Static_assert(offsetof(fl_block_q4_K, qs) == 16 && offsetof(fl_block_q5_K, qh) == 16 && offsetof(fl_block_q5_K, qs) == 48, "q4_K / q5_K fields");
_Static_assert(offsetof(fl_block_q6_K, qh) == 128 && offsetof(fl_block_q6_K, scales) == 192 && offsetof(fl_block_q6_K, d) == 208, "q6_K fields");
_Static_assert(offsetof(fl_block_q3_K, qs) == 32 && offsetof(fl_block_q3_K, scales) == 96 && offsetof(fl_block_q3_K, d) == 108, "q3_K fields");
_Static_assert(offsetof(fl_block_q2_K, qs) == 16 && offsetof(fl_block_q2_K, d) == 80 && offsetof(fl_block_q2_K, dmin) == 82, "q2_K fields");
_Static_assert(FL_K16_Q6_QH + 16 * 64 == FL_K16_Q6_BLOCK, "q6_K_r16 super-block");
_Static_assert(FL_K16_QS + 32 * 64 == FL_K16_BLOCK, "q4_K_r16 super-block");
_Static_assert(FL_K16_Q5_QS + 32 * 64 == FL_K16_Q5_BLOCK, "q5_K_r16 super-block");
_Static_assert(FL_K16_Q3_QS + 16 * 64 == FL_K16_Q3_BLOCK, "q3_K_r16 super-block");
_Static_assert(FL_K16_Q2_QS + 16 * 64 == FL_K16_Q2_BLOCK, "q2_K_r16 super-block");

/* row i's block <-> its place in the group's super-block sb (to_group: block -> sb); the copies
 * of constant size (1, 2, 4 bytes) so that they compile to moves, not calls (the loader runs
 * this for every weight) */
static inline void k16_copy(unsigned char *to, const unsigned char *from, int e, bool to_group) {
    if (e == QH5) {
        uint32_t w;
        memcpy(&w, from, 4);
        w = to_group ? fl_b16_qh_word(w) : fl_b16_qh_unword(w);
        memcpy(to, &w, 4);
    } else if (e == 4) memcpy(to, from, 4);
    else if (e == 2) memcpy(to, from, 2);
    else *to = *from;
}
static void k16_move(const k16_layout *l, unsigned char *blk, unsigned char *sb, int i, bool to_group) {
    for (int f = 0; f < l->nf; f++) {
        const k16_field *x = &l->f[f];
        const int e = x->e == QH5 ? 4 : x->e;
        for (int k = 0; k < x->len / e; k++) {
            unsigned char *p = blk + x->src + k * e, *q = sb + x->dst + (size_t)(FL_K16_ROWS * k + i) * e;
            if (to_group) k16_copy(q, p, x->e, true);
            else k16_copy(p, q, x->e, false);
        }
    }
}

/* (both block types are the f16 d, then the codes) */
void fl_r8_pack(int32_t type, const void *rows, size_t ldw, int64_t K, void *group) {
    if (fl_k16_type(type)) {
        const k16_layout *l = k16_layout_of(type);
        for (int64_t b = 0; b < K / l->qk; b++)
            for (int i = 0; i < FL_K16_ROWS; i++)
                k16_move(l, (unsigned char *)rows + (size_t)i * ldw + (size_t)b * l->bs, (unsigned char *)group + (size_t)b * FL_K16_ROWS * l->bs, i, true);
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
    if (fl_k16_type(type)) {
        const k16_layout *l = k16_layout_of(type);
        for (int64_t b = 0; b < K / l->qk; b++)
            k16_move(l, (unsigned char *)row + (size_t)b * l->bs, (unsigned char *)group + (size_t)b * FL_K16_ROWS * l->bs, i, false);
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
        const k16_layout *l = k16_layout_of(type);
        for (int64_t b = 0; b < K / l->qk; b++) {
            unsigned char blk[256]; /* (the largest base block, Q6_K, is 210 bytes) */
            k16_move(l, blk, (unsigned char *)g + (size_t)b * FL_K16_ROWS * l->bs, (int)(r % FL_K16_ROWS), false);
            fl_dequant_row(fl_k16_base(type), blk, dst + b * l->qk, l->qk);
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
