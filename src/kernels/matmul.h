/*
 * matmul.h - weight x activation products, dispatched on the weight's block type.
 *
 * Layout (GGUF/ggml): a weight W has ne[0] = K (input features, the contiguous row) and
 * ne[1] = N (output features); row n is fl_type_row_size(type, K) bytes at data + n * nb[1].
 * Activations are f32, row-major: x [M][K] (M tokens), y [M][N].
 *
 *   fl_matmul(W, x, y, M)    y[m][n] = sum_k W[n][k] * x[m][k]     (threaded with fl_parallel)
 *
 * M == 1 (decode) and M > 1 (prefill) may take different paths (GEMV vs tiled GEMM); both must
 * agree with fl_matmul_ref, the plain scalar specification (dequantize a row, dot in double-free
 * f32).  fl_dequant_row(type, src, dst, K) expands one row of any supported type to f32.
 * Unsupported types return FL_ERR_UNSUPPORTED from fl_matmul_supported().
 *
 * Fast paths (kernels/matmul.c): Q8_0 and Q4_0 weights take an integer path: the activations
 * are quantized to 8 bits per block of 32 (f32 scale per block) and dotted with int8 (AVX2
 * maddubs / AVX-512 VNNI dpbusd); M == 1 is a row-parallel GEMV (chunks of ~256 KiB of rows
 * taken dynamically; Q4_0 on AVX-512 VBMI reads activations pre-ordered for its nibbles, qs4),
 * M > 1 a cache-tiled, threaded GEMM (AVX-512: 16-row repacked panels x 8 tokens; AVX2: the
 * same panels, 8 rows x 4 tokens (Q4_0 16 x 4, Q4_K 16 x 2), except that steps of up to 3 Q4_0 / 4 Q8_0
 * tokens take the GEMV, each row's codes shared by the tokens (FL_GEMV_MAX_TOKENS below);
 * otherwise 4 rows x 4 tokens register tiles over L2-sized row chunks).  On AVX-512 Q4_K takes the same
 * two paths (its own GEMV; panels with scales d sc_j and mins), and Q2_K, Q3_K, Q5_K, Q6_K, Q4_1,
 * Q5_0, Q5_1 and IQ4_NL their own GEMVs for M == 1; on AVX2 every one of these but Q8_0 / Q4_0 takes
 * maddubs row dots for M == 1 and small steps (fl_gemm_q8_avx2 and fl_gemm_rows_avx2; up to
 * fl_matmul_gemv_max_tokens: Q4_K / Q5_K 3, Q6_K 2, Q3_K / Q2_K 4, Q4_1 / Q5_0 / Q5_1 / IQ4_NL 1)
 * and the same 16-row panels as AVX-512 (all but Q8_0 / Q4_0 / Q4_K: AVX2 code only, which AVX-512
 * CPUs run too for those types' steps of M > 1) for larger steps
 * (fl_panel_gemm_avx2: Q8_0 8 rows x 4 tokens, Q4_0 / Q5_K / Q5_0 / Q5_1 16 x 4, the others 16 x 2).  Where the CPU has
 * AMX-INT8 and the OS grants the tile state, steps of 13 tokens or more of Q8_0 / Q4_0 / Q4_1 /
 * Q5_0 / Q5_1 / IQ4_NL / Q4_K / Q5_K / Q6_K / Q3_K take the AMX GEMM instead (see below; FL_AMX=0 or
 * fl_matmul_set_amx(false) turns it off; Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K steps of up to 16 tokens feed the weight rows
 * to the tiles without a panel, fl_amx_gemm_rows); the integer sums are the same, only the f32 order of
 * the per-block folds differs.  fl_matmul_set_llama_order(true)
 * instead computes Q8_0 / Q4_0 / Q5_0 exactly as llama.cpp's CPU build does (see below).  Every other type
 * dequantizes rows and uses an f32 dot; F16 weights round the activations to f16 first
 * (llama.cpp's f16 x f16 products; the rounded copy is M x K floats of scratch).
 * fl_matmul_set_f32_act(true) (or the environment
 * variable FL_MATMUL_F32ACT=1) keeps activations in f32 for every type (reference accuracy).
 * The kernels are chosen from fl_isa_get() (FL_KERNELS=ref|avx2|avx512).
 * fl_matmul allocates its activation scratch (FL_MEM_SCRATCH) per call and frees it; if that
 * allocation fails it falls back to the f32 path (no error).  fl_matmul_scratch_bytes(W, M, nth)
 * is the exact FL_MEM_SCRATCH high-water mark of one call on nth threads with the current ISA
 * and activation mode (for memory planners): the 8-bit activations (fl_act_q8_bytes) plus, for
 * M > 1 on AVX-512 (AVX2: Q8_0 / Q4_0 / Q4_0_R8 / Q4_K / Q5_K / Q6_K past fl_matmul_gemv_max_tokens, and
 * Q4_1 / Q5_0 / Q5_1 / IQ4_NL / Q3_K / Q2_K at any M), nth repacked row
 * panels (fl_panel_bytes_for each; none for Q8_0_R8, whose tile reads its groups; Q4_0_R8 keeps them
 * at every M: up to 32 tokens only a partial panel of 8 rows is packed), or on the AMX path the
 * activation tiles (fl_amx_act_bytes) plus nth x G AMX panels (G = max(1, 512 KiB /
 * fl_amx_panel_bytes), whatever N is); or
 * nth x 8 dequantized f32 rows on the f32 path (plus the M x K rounded activations for F16).
 */
#ifndef FL_MATMUL_H
#define FL_MATMUL_H

#include "core/tensor.h"
#include "fitllm.h"
#include "kernels/quant.h"

#include <stdbool.h>
#include <stddef.h>

/* FL_OK if W's type can be used by fl_matmul, else FL_ERR_UNSUPPORTED with a message. */
fl_status fl_matmul_supported(int32_t type);
/* Expand one row of K elements of `type` to f32 (K a multiple of the block size). */
void fl_dequant_row(int32_t type, const void *src, float *dst, int64_t K);

/* ---- Q4_0 / Q8_0 repacked in groups of 8 rows (FL_TYPE_Q4_0_R8 / Q8_0_R8; AVX2 and AVX-512) ----
 * A matrix of N rows (N % 8 == 0) keeps its size and row stride ldw; the 8 rows of group g
 * occupy the bytes of rows 8g..8g+7, now as K / 32 blocks of fl_r8_block_bytes (Q4_0 144, Q8_0
 * 272): block b is the 8 rows' f16 scales d (row i's at byte 2i), then vectors of 32 bytes (Q4_0
 * 4, Q8_0 8), vector v holding row i's qs[4v..4v+3] at bytes 4i..4i+3.  So one 32-byte load
 * gives 8 rows x 4 code bytes, each row a 32-bit lane (Q4_0: low nibbles codes 4v..4v+3, high
 * ones 16+4v..; Q8_0: codes 4v..4v+3), and one convert of 8 scales serves the 8 rows
 * (kernels/avx2/matmul_avx2.c).  fl_r8_base: Q4_0 / Q8_0 of an R8 type (else -1), fl_r8_of the
 * reverse.  fl_r8_pack packs 8 rows (row i at rows + i * ldw) into a group (distinct memory);
 * fl_r8_repack does it in place (tmp: fl_r8_group_rows(type) * ldw bytes); fl_r8_unpack_row gives back row i of a
 * group in the base type; fl_r8_dequant_row expands row r of a matrix starting at data. */
#define FL_R8_ROWS 8
#define FL_R8_Q4_0_BLOCK (16 + FL_R8_ROWS * 16) /* fl_r8_block_bytes: 144 */
#define FL_R8_Q8_0_BLOCK (16 + FL_R8_ROWS * 32) /* 272 */
/* The type a matrix of `rows` rows of `type` computes as after loading: its R8 type where the
 * model loader repacks it (repack asked, the AVX2 ISA, or AVX-512 without usable AMX tiles or
 * with AMX-BF16, whose prefill tiles read the groups (fl_amx_bf16_panel_r8) while steps of 2-63
 * tokens take the VNNI tiles on them; the AMX-INT8 tiles read the file's rows; neither
 * llama.cpp's order nor f32 activations, whole groups of 8 rows), else type itself.  The loader and the planners both ask
 * this, so the plan follows what is loaded. */
int32_t fl_r8_load_type(int32_t type, int64_t rows, bool repack);
int32_t fl_r8_base(int32_t type);
int32_t fl_r8_of(int32_t type);
size_t fl_r8_block_bytes(int32_t type);
void fl_r8_pack(int32_t type, const void *rows, size_t ldw, int64_t K, void *group);
void fl_r8_repack(int32_t type, void *rows, size_t ldw, int64_t K, void *tmp);
void fl_r8_unpack_row(int32_t type, const void *group, int i, int64_t K, void *row);
void fl_r8_dequant_row(int32_t type, const void *data, size_t ldw, int64_t r, float *dst, int64_t K);
/* ---- Q4_K / Q5_K / Q6_K / Q3_K / Q2_K repacked in groups of 16 rows (FL_TYPE_Q4_K_R16 / Q5_K_R16 / Q6_K_R16 /
 * Q3_K_R16 / Q2_K_R16; AVX-512 without AMX) ----
 * As the R8 types: the size and row stride stay, the 16 rows of group g occupy the bytes of
 * rows 16g..16g+15, now as K / 256 super-blocks of 16 x the base type's block (144, 176, 210,
 * 110, 84).
 * Q4_K_R16: the 16 rows' f16 d, then their f16 dmin (32 bytes each), then the 12 bytes of 6-bit
 * scales and mins as 12 planes of 16 (plane k: byte k of row 0..15), then 32 vectors of 64
 * bytes, vector 8c + v holding row i's qs[32c + 4v .. 32c + 4v + 3] at bytes 4i..4i+3.  So one
 * 64-byte load is 16 rows x 4 code bytes, each row a 32-bit lane: low nibbles codes 64c + 4v..
 * of sub-block 2c, high nibbles 64c + 32 + 4v.. of sub-block 2c + 1; three 64-byte loads of the
 * planes give all 16 rows' 8 scales and 8 mins (fl_k4_scale_min_bytes' bit layout, a row per
 * byte lane).  Q6_K_R16: the 16 rows' f16 d (32 bytes), their 16 int8 scales as 16 planes of 16,
 * then ql as 32 vectors (vector u: row i's ql[4u..4u+3] at 4i), then qh as 16 (the same), so
 * ql vectors 16n + v and 16n + 8 + v with qh vector 8n + v give the 6-bit codes
 * 128n + 4v.., + 32, + 64, + 96 of 16 rows (Q6_K's order).  Q5_K_R16: Q4_K_R16's layout with
 * qh as 8 vectors between the scale planes and the codes (vector v: row i's qh[4v..4v+3] at 4i,
 * bit j the fifth bit of sub-block j's codes 4v..4v+3).  Q3_K_R16: the 16 rows' f16 d (32 bytes),
 * their 12 scale bytes as 6 planes of 16 pairs (plane p: row i's bytes 2p, 2p + 1 at 2i), hmask
 * as 8 vectors (vector v: row i's hmask[4v..4v+3] at 4i, bit kb the third bit of 32-block kb's
 * codes 4v..4v+3), then qs as 16 (vector 8n + v: row i's qs[32n + 4v ..] at 4i, bits 2s, 2s + 1
 * the codes of 32-block 4n + s).  Q2_K_R16: the 16 rows' f16 d, their f16 dmin, their 16 scale
 * bytes as 8 planes of 16 pairs (plane kb: the scales and mins of 32-block kb's two halves), then
 * qs as Q3_K_R16's.  So every R16 type is its base block's fields, each as 16 rows side by side:
 * a field of f16 scalars as 16 of them, bytes as planes of 16 (or of 16 pairs), codes as vectors
 * of 16 rows x 4 bytes.
 * Q4_1_R16 / Q5_0_R16 / Q5_1_R16 / IQ4_NL_R16 do the same per block of 32 (16 x 20 / 22 / 24 / 18
 * bytes): the 16 rows' f16 d (32 bytes); Q4_1 / Q5_1 their f16 m (32); Q5_0 / Q5_1 their fifth
 * bits as one vector (row i's 32 bits at 4i, rearranged: bits v and 4 + v of byte k are the
 * fifth bits of codes 4v + k and 16 + 4v + k, so the bit a code vector needs is one shift away,
 * fl_b16_qh_word); then qs as 4 vectors (vector v: row i's qs[4v..4v+3] at 4i: low nibbles codes
 * 4v.., high 16 + 4v..).  fl_b16_qh / fl_b16_qs: the byte offsets of the fifth bits and codes.
 * fl_r8_group_rows(type): rows per group of a repacked type (8, 16), 0 for any other;
 * fl_r8_pack / fl_r8_repack / fl_r8_unpack_row / fl_r8_dequant_row take these types too. */
#define FL_K16_ROWS 16
#define FL_K16_BLOCK (FL_K16_ROWS * 144)
#define FL_K16_Q6_BLOCK (FL_K16_ROWS * 210)
#define FL_K16_Q5_BLOCK (FL_K16_ROWS * 176)
/* byte offsets in a super-block: Q4_K_R16's scale planes and codes, Q6_K_R16's scale planes, ql, qh */
#define FL_K16_SCALES 64
#define FL_K16_QS (FL_K16_SCALES + 12 * FL_K16_ROWS)
#define FL_K16_Q6_SCALES 32
#define FL_K16_Q6_QL (FL_K16_Q6_SCALES + 16 * FL_K16_ROWS)
#define FL_K16_Q6_QH (FL_K16_Q6_QL + 32 * 64)
#define FL_K16_Q5_QH FL_K16_QS                /* Q5_K_R16: qh, then the codes */
#define FL_K16_Q5_QS (FL_K16_Q5_QH + 8 * 64)
#define FL_K16_Q3_BLOCK (FL_K16_ROWS * 110)
#define FL_K16_Q3_SCALES 32
#define FL_K16_Q3_HM (FL_K16_Q3_SCALES + 12 * FL_K16_ROWS)
#define FL_K16_Q3_QS (FL_K16_Q3_HM + 8 * 64)
#define FL_K16_Q2_BLOCK (FL_K16_ROWS * 84)
#define FL_K16_Q2_SCALES 64
#define FL_K16_Q2_QS (FL_K16_Q2_SCALES + 16 * FL_K16_ROWS)
/* The file type a group of 16 rows is made from (Q4_K_R16: Q4_K, ...), -1 for any other type. */
static inline int32_t fl_k16_base(int32_t type) {
    switch (type) {
    case FL_TYPE_Q4_K_R16: return FL_TYPE_Q4_K;
    case FL_TYPE_Q5_K_R16: return FL_TYPE_Q5_K;
    case FL_TYPE_Q6_K_R16: return FL_TYPE_Q6_K;
    case FL_TYPE_Q3_K_R16: return FL_TYPE_Q3_K;
    case FL_TYPE_Q2_K_R16: return FL_TYPE_Q2_K;
    case FL_TYPE_Q4_1_R16: return FL_TYPE_Q4_1;
    case FL_TYPE_Q5_0_R16: return FL_TYPE_Q5_0;
    case FL_TYPE_Q5_1_R16: return FL_TYPE_Q5_1;
    case FL_TYPE_IQ4_NL_R16: return FL_TYPE_IQ4_NL;
    default: return -1;
    }
}
static inline bool fl_k16_type(int32_t type) { return fl_k16_base(type) >= 0; }
/* the R16 types whose blocks are 32 weights (Q4_1_R16, Q5_0_R16, Q5_1_R16, IQ4_NL_R16) */
static inline bool fl_b16_type(int32_t type) {
    return type == FL_TYPE_Q4_1_R16 || type == FL_TYPE_Q5_0_R16 || type == FL_TYPE_Q5_1_R16 || type == FL_TYPE_IQ4_NL_R16;
}
static inline size_t fl_b16_qh(int32_t type) { return type == FL_TYPE_Q5_0_R16 ? 32 : 64; }
static inline size_t fl_b16_qs(int32_t type) {
    return type == FL_TYPE_IQ4_NL_R16 ? 32 : type == FL_TYPE_Q4_1_R16 ? 64 : type == FL_TYPE_Q5_0_R16 ? 96 : 128;
}
/* A row's 32 fifth bits (qh) as the R16 group holds them, and back: byte k gathers the bits
 * k, k + 4, ..., k + 28 (bits 4 apart folded together in three steps) */
static inline uint32_t fl_b16_qh_word(uint32_t qh) {
    uint32_t h = 0;
    for (int k = 0; k < 4; k++) {
        uint32_t t = (qh >> k) & 0x11111111u;
        t = (t | (t >> 3)) & 0x03030303u;
        t = (t | (t >> 6)) & 0x000F000Fu;
        h |= ((t | (t >> 12)) & 0xFFu) << (8 * k);
    }
    return h;
}
static inline uint32_t fl_b16_qh_unword(uint32_t h) {
    uint32_t qh = 0;
    for (int k = 0; k < 4; k++) {
        uint32_t t = (h >> (8 * k)) & 0xFFu;
        t = (t | (t << 12)) & 0x000F000Fu;
        t = (t | (t << 6)) & 0x03030303u;
        qh |= ((t | (t << 3)) & 0x11111111u) << k;
    }
    return qh;
}
int fl_r8_group_rows(int32_t type);
/* The same with AVX-512 (bit-identical; Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K
 * vectorized, other types forwarded to fl_dequant_row). */
void fl_dequant_row_avx512(int32_t type, const void *src, float *dst, int64_t K);
/* The same with AVX2, 8 codes at a time (bit-identical; the same types vectorized). */
void fl_dequant_row_avx2(int32_t type, const void *src, float *dst, int64_t K);
/* y [M][N] = x [M][K] . W^T, threaded. */
void fl_matmul(const fl_tensor *W, const float *x, float *y, int64_t M);
/* y[i] = x . W[i]^T for n (<= FL_MATMUL_N_MAX) matrices that read the same x (q, k, v; gate, up):
 * the same bits as n fl_matmul calls.  Matrices of one type and K on a path that takes its work
 * from one counter (the GEMV, the row panels, the AMX rows at 13-16 tokens, the AMX-BF16 tiles)
 * run as one call:
 * x is quantized or packed once, and the threads meet once; otherwise one call each.  Its scratch
 * is what one of the calls would take. */
#define FL_MATMUL_N_MAX 3
void fl_matmul_n(int n, const fl_tensor *const *W, float *const *y, const float *x, int64_t M);
/* The most tokens an integer-path step of `type` sends through the GEMV on the current ISA (1,
 * or on AVX2 3 for Q4_0, 4 for Q8_0, 3 for Q4_K and Q5_K and 2 for Q6_K, the last three through
 * their row dots): such a step gives each token the bits it gets alone,
 * and larger steps (the panels) give each token the bits it gets in any other step of that
 * kind.  fl_matmul_set_few_token_gemv(false) (default true) keeps the GEMV to one token, so that
 * every step of 2 tokens or more has the same bits per token (for tests of that property). */
int64_t fl_matmul_gemv_max_tokens(int32_t type);
void fl_matmul_set_few_token_gemv(bool on);
/* The kernel family a step of M tokens of `type` takes now (with the current switches):
 * "amx-bf16", "amx-int8", "amx-int8-rows", "r8-vnni" (the AVX-512 tiles on the R8 groups),
 * "r8-avx2", "r8-ref", "r16-vnni" (Q4_K_R16's AVX-512 kernels), "gemv", "panels", "tiles", "llama-order", "f32"; for benchmark labels. */
const char *fl_matmul_kernel_name(int32_t type, int64_t M);
/* FL_MEM_SCRATCH bytes one fl_matmul(W, ., ., M) call on nth threads allocates (see above). */
size_t fl_matmul_scratch_bytes(const fl_tensor *W, int64_t M, int nth);
/* Scalar reference (single thread, dequantize row + f32 dot). */
void fl_matmul_ref(const fl_tensor *W, const float *x, float *y, int64_t M);

/* Keep activations in f32 (true) or allow 8-bit activation quantization (false, default unless
 * FL_MATMUL_F32ACT=1).  Process-wide; set before running kernels. */
void fl_matmul_set_f32_act(bool on);
bool fl_matmul_f32_act(void);
/* llama.cpp's arithmetic for Q8_0, Q4_0 and Q5_0 weights (false by default; true with
 * FL_MATMUL_LLAMA=1): 8-bit activations (Q5_0 too), and each dot summed in ggml's x86 order
 * (fl_dot_q8_llama), so results are those of llama.cpp's CPU build bit for bit where the rest
 * of the forward follows it as well.  A scalar, threaded path: for checking against
 * llama.cpp, not for speed.  Ignored when f32 activations are on. */
void fl_matmul_set_llama_order(bool on);
bool fl_matmul_llama_order(void);

/* The AVX-512 GEMVs' software prefetch: each group of weight blocks is prefetched fl_gemv_pf_near
 * bytes ahead into L1 and, where fl_gemv_pf_far > 0, that far ahead into L2 as well.  Set when the
 * kernels are chosen (fl_isa_set): on Intel 1024 + 8192 (one core's stream needs requests in
 * flight to L2 as well as to L1 to reach its bandwidth while the GEMV computes), elsewhere 4096
 * alone (Zen 4); FL_GEMV_PF=NEAR,FAR overrides both.  The bandwidth calibration's third loop reads
 * with the same distances.  Speed only: no result depends on them. */
extern int fl_gemv_pf_near, fl_gemv_pf_far;
void fl_gemv_prefetch_defaults(void);

/* ---- internals shared by the kernel variants (exposed for parity tests and benches) ---- */

/* Activations quantized per block of 32: x[m][k] ~= d[m][k/32] * qs[m][k].  The SIMD kernels
 * read dv / sv: per block, its scale and minus its code sum repeated in 8 lanes (the integer
 * sums of unsigned weight codes start from the offset times sv, so they come out exact). */
typedef struct fl_act_q8 {
    int64_t M, K, nb;  /* nb = K / 32 */
    int8_t *qs;        /* [M][K] */
    float *d;          /* [M][nb] */
    int32_t *s;        /* [M][nb] sum of the block's codes */
    float *dv;         /* [M][nb][8] */
    int32_t *sv;       /* [M][nb][8]: -s */
    float *ms;         /* [M][nb]: -s * d (the mins term of affine weight blocks, Q4_K panels) */
    int8_t *qs4;       /* M == 1 only, else NULL: the codes of each 4 blocks reordered as the 4
                        * first halves (k % 32 < 16) then the 4 second halves, the order of a
                        * Q4_0 group's low / high nibbles (the AVX-512 GEMV); a tail of nb % 4
                        * blocks is left unset, and the AVX2 quantizer, whose kernels do not
                        * read it, leaves all of it (and sv4) unset */
    int32_t *sv4;      /* with qs4: [M][nb][4] -2 * s (4 lanes of a block start at -8 s in all) */
    int32_t *o4;       /* [M][nb]: two int16, -8 x (the sum of the codes k % 4 < 2) low and -8 x
                        * (k % 4 >= 2) high: where the AVX2 Q4_0 panel tile's int16 lanes start,
                        * so that they end at sum (w - 8) x with no offset step (|.| <= 16256);
                        * filled for every row (the panels) */
    int32_t *o6;       /* [M][nb][2]: per half (k % 32 < 16, then >= 16) two int16, -32 x the
                        * sum of its codes k % 4 < 2 low and k % 4 >= 2 high: where the AVX2
                        * Q6_K panel tile's int16 lanes start for each 16-code scale, so that
                        * they end at sum (q - 32) x (|.| <= 8 x 32 x 127); filled for every row */
    size_t bytes;      /* one allocation (FL_MEM_SCRATCH) */
    void *mem;
} fl_act_q8;

fl_status fl_act_q8_alloc(fl_act_q8 *a, int64_t M, int64_t K); /* K % 32 == 0 */
size_t fl_act_q8_bytes(int64_t M, int64_t K);                      /* a->bytes of that allocation */
void fl_act_q8_free(fl_act_q8 *a);
void fl_act_q8_quantize_row(fl_act_q8 *a, int64_t m, const float *x); /* scalar reference */
/* Block i's scale d and code sum s with what derives from them (ms, dv, sv): every quantizer
 * stores them through this. */
static inline void fl_act_q8_set_block(fl_act_q8 *a, int64_t i, float d, int32_t s) {
    a->d[i] = d;
    a->s[i] = s;
    a->ms[i] = -(float)s * d;
    for (int l = 0; l < 8; l++) {
        a->dv[i * 8 + l] = d;
        a->sv[i * 8 + l] = -s;
    }
}
/* Fill row m of o4 and o6, and of qs4 (none without it), from qs; the reference and AVX-512
 * quantizers call it (the AVX2 one makes o4 / o6 in its own loop). */
void fl_act_q8_order_q4(fl_act_q8 *a, int64_t m);
/* Same result bit for bit (round to nearest even, f16-rounded scale), 16 lanes at a time. */
void fl_act_q8_quantize_row_avx512(fl_act_q8 *a, int64_t m, const float *x);
/* Blocks [b0, b1) of row m only (not qs4, which needs the whole row).  all false leaves dv, sv,
 * o4 and o6 unset (qs, d, s and ms are what the AVX-512 R8 tiles read); act16 non-NULL also
 * writes the blocks into their 16-token records (the bytes fl_act16_pack_blocks writes), and
 * rows false (act16 non-NULL) writes only the records: a token the 16-token tiles take needs
 * nothing else. */
void fl_act_q8_quantize_blocks_avx512(fl_act_q8 *a, int64_t m, const float *x, int64_t b0, int64_t b1, bool all, bool rows,
                                      void *act16);
void fl_act_q8_quantize_row_avx2(fl_act_q8 *a, int64_t m, const float *x);

/* Integer tile: y[t * ldy + r] = dot(W row r, token m0 + t) for r < nr, t < nt, where W row r
 * starts at w + r * ldw and wtype is Q8_0 or Q4_0. */
typedef void (*fl_gemm_q8_fn)(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a,
                              int64_t m0, int nt, float *y, int64_t ldy);
void fl_gemm_q8_ref(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt,
                    float *y, int64_t ldy);
void fl_gemm_q8_avx2(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt,
                     float *y, int64_t ldy);
void fl_gemm_q8_avx512(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt,
                       float *y, int64_t ldy);
/* The AVX2 row dots of Q4_1, Q5_0, Q5_1, IQ4_NL, Q3_K and Q2_K (kernels/avx2/rowdot_avx2.c): the
 * same contract as fl_gemm_q8_fn for any nt, each row read once and from L1 for the further
 * tokens; false (nothing written) for another type.  fl_gemm_q8_avx2 takes them for these types. */
bool fl_gemm_rows_avx2(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt,
                       float *y, int64_t ldy);
/* fl_gemm_q8_avx2 takes Q8_0 / Q4_0 steps of up to FL_GEMV_MAX_TOKENS tokens through its GEMV:
 * each row's codes are unpacked once for all the tokens, and every token's lanes, folds and sum
 * are those of the token alone, so a token's result has the same bits in any such step.
 * fl_matmul routes AVX2 steps of up to 3 Q4_0 / 4 Q8_0 tokens there instead of the panels. */
#define FL_GEMV_MAX_TOKENS 4
/* One dot of a Q8_0 / Q4_0 / Q5_0 row with token m in llama.cpp's order (see above). */
float fl_dot_q8_llama(int32_t wtype, const void *w, const fl_act_q8 *a, int64_t m);
/* Row panels (the AVX-512 GEMM path, M > 1): FL_PANEL_ROWS weight rows repacked per call into
 * per-thread scratch, per block of 32: 16 f32 scales (64 bytes), then the 32 x 16 codes as
 * unsigned bytes ordered [k / 4][row][k % 4] (Q8_0: code + 128, Q4_0: the nibble 0..15), so one
 * 64-byte load feeds vpdpbusd for 16 rows against 4 broadcast activation codes.  Rows >= nr are
 * zero-scaled.  fl_panel_bytes(K) = (K / 32) * 576 is the scratch for one panel.
 * fl_panel_gemm: y[t * ldy + r] = dot(panel row r, token m0 + t) for r < nr, t < nt (any nt,
 * the kernel tiles 8 tokens); the per-block integer sums are exact (offset 128 / 8 times the
 * activation code sum is subtracted in int32), so it matches fl_gemm_q8_ref up to f32 order. */
#define FL_PANEL_ROWS 16
size_t fl_panel_bytes(int64_t K);
/* Q4_K panels (M > 1 on AVX-512): the same blocks with codes 0..15 and scales d sc_j, no
 * offset, followed by [K / 32][16] f32 mins dmin m_j (subtracted times the activation block's
 * d_x * code sum, fl_act_q8.ms).  Q5_K (AVX2): codes 0..31 summed as (q - 16) x, so its mins
 * words are dmin m_j - 16 d sc_j.  Q6_K (AVX2): codes 0..63 summed as (q - 32) x, the scale d,
 * and after the blocks [K / 32][2][16] int32 words (sc, sc) (two int16) of each block's two
 * 16-code halves' scales.  Q3_K (AVX2): as Q6_K with codes 0..7 = value + 4, summed as
 * (q - 4) x.  Q2_K (AVX2): codes 0..3, the scale d, after the blocks [K / 32][4][16] words
 * (sc, sc) of the two halves then (m, m) of them, then [K / 32][16] f32 dmin.
 * fl_panel_bytes_for(type, K) is the panel scratch of a type (576, with mins words 640, Q6_K /
 * Q3_K 704, Q2_K 896 bytes per 32 columns). */
size_t fl_panel_bytes_for(int32_t wtype, int64_t K);
/* Panels with f32 mins words after the blocks: Q4_K, Q5_K (above), and on AVX2 Q4_1 (codes
 * 0..15, scale d, mins word -m), Q5_0 (codes 0..31 summed as (q - 16) x, scale d, mins word 0)
 * and Q5_1 (the same, mins word -(16 d + m)).  IQ4_NL (AVX2) panels hold its table values + 128,
 * as Q8_0's hold code + 128. */
static inline bool fl_panel_has_mins(int32_t wtype) {
    return wtype == FL_TYPE_Q4_K || wtype == FL_TYPE_Q5_K || wtype == FL_TYPE_Q4_1 || wtype == FL_TYPE_Q5_0 ||
           wtype == FL_TYPE_Q5_1;
}
/* The offset the panel's unsigned codes carry (subtracted x the activation code sums). */
static inline int32_t fl_panel_offset(int32_t wtype) {
    return wtype == FL_TYPE_Q8_0 || wtype == FL_TYPE_IQ4_NL                               ? 128
           : wtype == FL_TYPE_Q5_K || wtype == FL_TYPE_Q5_0 || wtype == FL_TYPE_Q5_1     ? 16
           : wtype == FL_TYPE_Q4_K || wtype == FL_TYPE_Q4_1 || wtype == FL_TYPE_Q6_K ||
                     wtype == FL_TYPE_Q3_K || wtype == FL_TYPE_Q2_K                       ? 0
                                                                                        : 8;
}
void fl_panel_pack_ref(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, void *panel);
void fl_panel_pack_avx512(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, void *panel);
void fl_panel_gemm_ref(int32_t wtype, const void *panel, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                       int64_t ldy);
void fl_panel_gemm_avx512(int32_t wtype, const void *panel, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                          int64_t ldy);
/* 9..16 tokens per pass on an AVX-512 panel (Q8_0, Q4_0, Q4_K), act: the fl_act16 record of block
 * 0 of the tokens' group of 16, nb = K / 32: the same bits as fl_panel_gemm_avx512. */
void fl_panel_gemm16_avx512(int32_t wtype, const void *panel, int nr, const void *act, int64_t nb, int nt, float *y, int64_t ldy);
/* AVX-512 on the AVX2 panels (fl_panel_pack_avx2) of Q6_K, Q3_K, Q2_K, Q5_K, Q5_0, Q5_1 and Q4_1
 * (fl_panel_halves_avx512):
 * 16 rows x up to 4 tokens per pass, the AVX2 tile's arithmetic lane for lane (the same bits);
 * pf / pf_bytes as fl_panel_gemm_avx2_pf. */
bool fl_panel_halves_avx512(int32_t wtype);
void fl_panel_gemm_halves_avx512(int32_t wtype, const void *panel, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                                 int64_t ldy, const void *pf, size_t pf_bytes);
/* The AVX2 panels (M > 1 without AVX-512; Q4_0, Q8_0, Q4_K, Q5_K and Q6_K): the same layout and
 * bytes (fl_panel_pack_avx2 packs full panels by in-register transposes, partial ones through
 * the reference), and kernels of 8 rows (half a panel) x 4 tokens (Q8_0), 16 rows x 4 tokens
 * (Q4_0, Q5_K, Q5_0, Q5_1) or 16 rows x 2 tokens (the others) whose int32 lanes are rows
 * (kernels/avx2/panel_avx2.c). */
void fl_panel_pack_avx2(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, void *panel);
void fl_panel_gemm_avx2(int32_t wtype, const void *panel, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                        int64_t ldy);
/* The same, prefetching pf_bytes at pf into L2 (the next panel's weight rows) spread over its
 * block steps, so that the next pack finds them there (NULL: none). */
void fl_panel_gemm_avx2_pf(int32_t wtype, const void *panel, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                           int64_t ldy, const void *pf, size_t pf_bytes);
/* The panel tiles straight on R8 rows (w at a group's first row), no pack: Q8_0_R8 (nr a
 * multiple of 8), and Q4_0_R8 for whole panels of 16 rows (nr 16), whose tile unpacks each
 * vector's nibbles per use; the same bits as the packed panels. */
void fl_r8_gemm_avx2_pf(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                        int64_t ldy, const void *pf, size_t pf_bytes);
/* AVX-512 VNNI on R8 rows, every step size (kernels/avx512/r8_avx512.c): 32 rows (four groups)
 * x up to 8 tokens per pass, the last 8 or 16 rows (nr a multiple of 8) as 16 (two groups), one
 * group at a time for 1-2 tokens, straight on the groups; the same bits as fl_panel_gemm_avx512
 * on the packed panel of those rows.  (fl_matmul passes steps of more than 8 tokens 16 at a time
 * through fl_r8_gemm16_avx512.) */
void fl_r8_gemm_avx512(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y,
                       int64_t ldy);
/* The activations of a step laid out as records of 16 tokens per block, for the AVX-512 tiles that
 * take 9-16 tokens per pass (fl_r8_gemm16_avx512, and the Q4_K panels' fl_panel_gemm16_avx512):
 * group g (tokens 16g..16g+15) holds K / 32 records of FL_ACT16_REC bytes, per block [token][32
 * codes], then per token int32 -8 s and -128 s (where a Q4_0 / Q8_0 token's int32 sums start),
 * f32 d and f32 ms (-s d, the mins term).  fl_act16_pack_row copies row m of a into its place
 * (plain C: a copy), fl_act16_pack_blocks only blocks [b0, b1) of it: the reference for the
 * records fl_act_q8_quantize_blocks_avx512 writes as it quantizes (what fl_matmul uses);
 * fl_act16_bytes(M, K) is the buffer of M tokens. */
#define FL_ACT16_TOKENS 16
#define FL_ACT16_CODES (FL_ACT16_TOKENS * 32)
#define FL_ACT16_REC (FL_ACT16_CODES + 4 * FL_ACT16_TOKENS * 4)
size_t fl_act16_bytes(int64_t M, int64_t K);
void fl_act16_pack_row(const fl_act_q8 *a, int64_t m, void *act);
void fl_act16_pack_blocks(const fl_act_q8 *a, int64_t m, void *act, int64_t b0, int64_t b1);
/* AVX-512 VNNI on Q4_K_R16 / Q5_K_R16 / Q6_K_R16 rows (kernels/avx512/k16_avx512.c), every step size: w at
 * a group's first row, nr a multiple of 16, y[t * ldy + r] for t < nt; 16 rows x up to 8 tokens
 * per pass, a token's result the same bits in any step (one token or many); Q6_K_R16 reads the
 * activations' o6 (the quantizer's `all`).  Reference: fl_gemm_q8_ref. */
void fl_k16_gemm_avx512(int32_t wtype, const void *w, size_t ldw, int nr, const fl_act_q8 *a, int64_t m0, int nt, float *y, int64_t ldy);
/* The panel of the group at w, the bytes of the base type's panel of its 16 rows: Q4_K_R16 the
 * AVX-512 Q4_K panel (fl_panel_pack_avx512 takes this type), Q5_K_R16 / Q6_K_R16 the AVX2 Q5_K /
 * Q6_K panel (fl_panel_pack_avx2 takes them, on AVX-512 CPUs only); the panels compute as the
 * base type's. */
void fl_k16_panel_pack_avx512(int32_t wtype, const void *w, int64_t K, void *panel);
/* 9..16 tokens per pass on the R8 groups, act: the fl_act16 record of block 0 of the tokens'
 * group of 16, nb = K / 32: the same bits as fl_r8_gemm_avx512.  Rows 32 at a time (four groups,
 * each activation broadcast feeding two of them, the tokens in two passes of up to 8), the last
 * 8 or 16 rows as a pair of groups; fl_matmul passes it two 16-row panels at a time.  pf: the
 * 32-row tiles prefetch the rows (false where an earlier pass left them in L2). */
void fl_r8_gemm16_avx512(int32_t wtype, const void *w, size_t ldw, int nr, const void *act, int64_t nb, int nt, float *y, int64_t ldy,
                         bool pf);
/* The same on AMX-INT8 (kernels/amx/r8_amx.c), the same bits; between fl_amx_r8_begin and
 * fl_amx_end, only where fl_amx_usable() and the CPU has AVX512_VBMI. */
void fl_amx_r8_begin(void);
void fl_amx_r8_gemm16(int32_t wtype, const void *w, size_t ldw, int nr, const void *act, int64_t nb, int nt, float *y, int64_t ldy);
/* f32 dot product of n elements. */
float fl_dot_f32_ref(const float *a, const float *b, int64_t n);
float fl_dot_f32_avx512(const float *a, const float *b, int64_t n);
/* matmul's own f32 dots (the f32 path); fl_mm_dot_f32 dispatches on fl_isa_get().  The AVX-512
 * and AVX2 ones sum in llama.cpp's order (see matmul_avx512.c); the reference in plain order. */
float fl_mm_dot_f32(const float *a, const float *b, int64_t n);
/* The same for vectors holding f16 values (AVX-512: the tail of a length that is not a multiple
 * of 16 is summed in double, as llama.cpp's f16 dot does). */
float fl_mm_dot_f16vals(const float *a, const float *b, int64_t n);
float fl_mm_dot_f16vals_avx512(const float *a, const float *b, int64_t n);
/* The end of those dots in llama.cpp's order: elements [i, n) after the SIMD head, each product
 * rounded and then added one at a time, to an f32 sum (f32 rows) or a double one (rows of f16
 * values, as its f16 dot). */
static inline float fl_dot_tail_ggml(const float *a, const float *b, int64_t i, int64_t n, float head, bool f16_rows) {
    if (f16_rows) {
        double sum = head;
        for (; i < n; i++) sum += (double)(a[i] * b[i]);
        return (float)sum;
    }
    float sum = head;
    for (; i < n; i++) {
        const float p = a[i] * b[i]; /* no fused multiply-add here */
        sum += p;
    }
    return sum;
}
/* The same order in scalar code (the reference ISA's f32 dots; fl_mm_dot_f32_ref stays plain). */
float fl_mm_dot_ggml_ref(const float *a, const float *b, int64_t n, bool f16_rows);
/* The AVX2 ones: the same bits as the AVX-512 ones (matmul_avx2.c). */
float fl_mm_dot_f32_avx2(const float *a, const float *b, int64_t n);
float fl_mm_dot_f16vals_avx2(const float *a, const float *b, int64_t n);
float fl_mm_dot_f32_ref(const float *a, const float *b, int64_t n);
float fl_mm_dot_f32_avx512(const float *a, const float *b, int64_t n);
/* y[m][r] = w[r] . x[m] for r < nr, m < M (y[m] at y + m ldy), in fl_mm_dot_f32_avx512's order;
 * f16_rows: the rows hold f16 values (llama.cpp sums their dot's tail in double). */
void fl_mm_rows_f32_avx512(const float *const *w, int nr, const float *x, int64_t M, int64_t K, float *y, int64_t ldy,
                           bool f16_rows);
/* The same for nr rows of an F32, F16, BF16, NF4 or FP8_E4M3 matrix read as they are (row i at w +
 * i ldw), K % 16 == 0: the bits of fl_mm_rows_f32_avx512 on the rows as fl_dequant_row makes
 * them, with no copy; rows 4 x tokens 6 at a time, the tokens in chunks whose activations stay in
 * L2; one token two rows at a time, one from each half of the range (two sequential streams),
 * four (one from each quarter) where x is more than FL_WROWS_X_L1 bytes. */
void fl_mm_wrows_avx512(int32_t wtype, const void *w, size_t ldw, int64_t nr, const float *x, int64_t M, int64_t K, float *y,
                        int64_t ldy);
/* The same bits on AVX2 (2 rows x 3 tokens a tile). */
void fl_mm_wrows_avx2(int32_t wtype, const void *w, size_t ldw, int64_t nr, const float *x, int64_t M, int64_t K, float *y,
                      int64_t ldy);
/* Their chunks of tokens: the activations of at most this many bytes stay in L2 while every row
 * block of a call passes over them (pp 256 of a TinyLlama-shaped F16 model, 2 Zen 4 threads,
 * alternated: 128 KiB 78-83 tok/s, 256 KiB 90-92, 512 KiB 92-94, 768 KiB 89-93). */
#define FL_WROWS_CHUNK_BYTES (512 * 1024)
/* One token's f32 activations of more than this many bytes (K > 2048) come back from L2 as the
 * weight streams pass through L1: the one-token form then shares each x load among four rows,
 * not two (docs/QUANT.md). */
#define FL_WROWS_X_L1 (8 * 1024)

/* ---- AMX-INT8 GEMM (M > 1 on CPUs whose OS grants AMX tile state; kernels/amx) ----
 * C = A . B with int8 tiles: A = 16 weight rows x 32 codes (one block of 32) straight from a
 * panel, B = the same block of 16 tokens' activation codes in the AMX "VNNI" layout, C = 16 x 16
 * exact int32 sums.  Each block's C tile is stored and folded into 16 f32 accumulators with
 * d_w (per row) x d_x (per token) in AVX-512, plus for Q4_K dmin m_j x ms (the mins term).
 * Panel (fl_amx_panel_bytes(type, K)): codes as signed bytes [K/32][16][32] (block-major; Q8_0 the code, Q4_0 the
 * nibble - 8, Q4_K the nibble 0..15, Q6_K the code - 32, Q3_K -4..3, ... see fl_amx_pack_row), then f32
 * scales [K/32][16] (d, d sc_j for K-quants; for Q6_K / Q3_K d sc_j of each block's first 16 codes),
 * then [K/32][16] f32 more: the mins of Q4_1 / Q5_1 / Q4_K / Q5_K (fl_amx_has_mins), or Q6_K's / Q3_K's
 * scales of each block's second 16 codes (they run half-block tiles, fl_amx_half); Q2_K (half
 * blocks with mins, codes 0..3) has four arrays: scales of first / second halves, then mins of
 * first / second halves (fl_amx_arrays).
 * Rows >= nr are zero.
 * Activation tiles (fl_amx_act_bytes(M, K)): per 16 tokens and block of 32, FL_AMX_ACT_BLOCK
 * bytes: the codes [k/4][token][k%4] (512), d_x [16] (64), ms = -s d_x [16] (64), and the same
 * -s d_x of each half block, codes 0-15 [16] (64) and 16-31 [16] (64) (Q2_K's mins); tokens
 * past M are zero.  fl_amx_gemm_ref is the scalar definition of the tile product on packed data (it
 * runs anywhere); fl_amx_gemm runs the tiles (only where fl_amx_usable()). */
#define FL_AMX_ROWS 16
#define FL_AMX_TOK 16
#define FL_AMX_ACT_BLOCK 768
/* AMX-INT8 present, tile state granted by the OS (arch_prctl), and not turned off with
 * fl_matmul_set_amx(false) or FL_AMX=0.  Requires the AVX-512 ISA to be selected. */
bool fl_amx_usable(void);
void fl_matmul_set_amx(bool on);
bool fl_amx_type(int32_t wtype); /* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K */
bool fl_amx_has_mins(int32_t wtype); /* Q4_1, Q5_1, Q4_K, Q5_K, Q2_K: the panel has mins after the scales */
/* The panel's f32 arrays of [K/32][16] after the codes: scales (two with half blocks), then mins (two with half blocks). */
int fl_amx_arrays(int32_t wtype);
bool fl_amx_half(int32_t wtype);     /* Q6_K, Q3_K, Q2_K: half-block tiles, scales (and Q2_K's mins) per half */
size_t fl_amx_panel_bytes(int32_t wtype, int64_t K);
size_t fl_amx_act_bytes(int64_t M, int64_t K);
/* Write token m's activation codes / scales into its tile (m >= a->M: zeros). */
void fl_amx_act_pack_row(const fl_act_q8 *a, int64_t m, void *act);
void fl_amx_act_pack_row_avx512(const fl_act_q8 *a, int64_t m, void *act); /* byte-identical */
/* Tokens m0 .. m0 + 7 (m0 % 8 == 0, m0 + 8 <= a->M) at once, byte-identical. */
void fl_amx_act_pack8_avx512(const fl_act_q8 *a, int64_t m0, void *act);
/* Panel row r as a row past nr: zero codes, scales (and mins). Both packers use it. */
void fl_amx_panel_zero_row(int32_t wtype, int64_t K, void *panel, int r);
void fl_amx_panel_pack_ref(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, void *panel);
/* One Q6_K row into panel row r (codes q = panel + 32 r, scales sc) - both packers use it. */
void fl_amx_pack_q6_K_row(const fl_block_q6_K *blk, int64_t K, int8_t *q, float *sc, int r);
/* One row of Q4_1 / Q5_0 / Q5_1 / IQ4_NL / Q5_K / Q6_K into panel row r, scalar (both packers
 * use it): codes (Q5_0 code - 16, IQ4_NL its table value, the others unsigned), scales d (d sc_j),
 * mins (if mn): -m for Q4_1 / Q5_1 (added as + m d_x s), dmin m_j for Q5_K and Q2_K (half-block layout). */
void fl_amx_pack_row(int32_t wtype, const void *row, int64_t K, int8_t *q, float *sc, float *mn, int r);
void fl_amx_panel_pack_avx512(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, void *panel);
/* y[t * ldy + r] = dot(panel row r, token 16 mt + t) for r < nr, t < nt (nt <= 16). */
void fl_amx_gemm_ref(int32_t wtype, const void *panel, int64_t K, const void *act, int64_t mt, int nt, float *y,
                     int64_t ldy, int nr);
/* The tiles, 2 panels x 2 token tiles at a time: y[t * ldy + 16 p + r] = dot(panel p row r,
 * token 16 mt + t) for panels p < np (1 or 2, panel p at panel + p * pstride), tokens t < ntok
 * (1 .. 32), rows r < 16 (r < nr in the last panel).  Between fl_amx_begin / fl_amx_end.
 * pf / pf_bytes (may be NULL / 0): memory to prefetch into L2 meanwhile (the next weights). */
void fl_amx_gemm(int32_t wtype, const void *panel, size_t pstride, int np, int64_t K, const void *act, int64_t mt,
                 int ntok, float *y, int64_t ldy, int nr, const void *pf, size_t pf_bytes);
/* Steps of up to 16 tokens (the activation tiles of one token tile), Q4_0, Q8_0, Q4_K, Q5_K and Q6_K: the same
 * products for nr (1 .. 32) weight rows at w (row stride ldw), 16 at a time, with no panel -
 * each block of rows is unpacked into L1 right before its tiles (Q8_0 with 16 real rows is
 * loaded straight from them).  y[t * ldy + r] for t < ntok, r < nr.  Between fl_amx_begin /
 * fl_amx_end; pf / pf_bytes as above. */
void fl_amx_gemm_rows(int32_t wtype, const void *w, size_t ldw, int nr, int64_t K, const void *act, int ntok, float *y,
                      int64_t ldy, const void *pf, size_t pf_bytes);
/* Load / release the tile configuration on the calling thread (around fl_amx_gemm calls on
 * weights of type wtype). */
void fl_amx_begin(int32_t wtype);
void fl_amx_end(void);

/* ---- AMX-BF16 GEMM (prefill of many tokens on CPUs with AMX-BF16; kernels/amx) ----
 * C = A . B with bf16 tiles and f32 sums: A = 16 weight rows x 32 values, B = 16 tokens x the
 * same 32 values in pairs, C = 16 x 16 f32 accumulated over all of K in the tile (no per-block
 * fold: the block scales are in the bf16 weights).  Weights are dequantized to f32 and rounded
 * to bf16, activations rounded to bf16 (round to nearest even, denormals to zero,
 * fl_amx_bf16_round).
 * Panel (fl_amx_bf16_panel_bytes(K)): [K/32][16 rows][32] bf16.
 * Activation tiles (fl_amx_bf16_act_bytes(M, K)): per 16 tokens [K/32][16 pairs][16 tokens][2]
 * bf16 (tokens past M zero).  fl_amx_bf16_gemm_ref is the scalar definition: per output, one
 * f32 fused multiply-add per value in K order. */
bool fl_amx_bf16_usable(void); /* AMX-BF16 + AVX512-BF16, fl_amx_usable(), not off (FL_AMX_BF16=0) */
void fl_matmul_set_amx_bf16(bool on);
size_t fl_amx_bf16_panel_bytes(int64_t K);
size_t fl_amx_bf16_act_bytes(int64_t M, int64_t K);
uint16_t fl_amx_bf16_round(float f);
/* Token tile mt (tokens 16 mt .. 16 mt + 15 of x, M x K row-major) into act. */
void fl_amx_bf16_act_pack_ref(const float *x, int64_t M, int64_t K, int64_t mt, uint16_t *act);
void fl_amx_bf16_act_pack_avx512(const float *x, int64_t M, int64_t K, int64_t mt, uint16_t *act); /* identical */
/* K f32 values (row NULL: zeros) as panel row r. */
void fl_amx_bf16_panel_row_ref(const float *row, int64_t K, uint16_t *panel, int r);
void fl_amx_bf16_panel_row_avx512(const float *row, int64_t K, uint16_t *panel, int r); /* identical, row != NULL */
/* Q4_0 / Q8_0: K values of the row at w (blocks) dequantized and rounded straight into panel row
 * r, the bytes of fl_dequant_row + fl_amx_bf16_panel_row_ref; false (nothing written) for other types. */
bool fl_amx_bf16_panel_row_q(int32_t wtype, const void *w, int64_t K, uint16_t *panel, int r);
/* Q4_0_R8 / Q8_0_R8: the 8 rows of the group at g (its block 0 of the K values) as panel rows
 * r0 .. r0 + 7, the bytes fl_amx_bf16_panel_row_q writes for the unpacked rows; false (nothing
 * written) for other types. */
bool fl_amx_bf16_panel_r8(int32_t wtype, const void *g, int64_t K, uint16_t *panel, int r0);
/* y[t * ldy + r] (+)= dot(panel row r, token t of the tile at act) for r < nr, t < nt (<= 16). */
void fl_amx_bf16_gemm_ref(const uint16_t *panel, int64_t K, const uint16_t *act, int nt, float *y, int64_t ldy, int nr,
                          bool acc);
/* The tiles, 2 panels x 2 token tiles: panel p at panel + p pstride, token tile t at act + t
 * astride (elements); y[t * ldy + 16 p + r] = (acc ? y : 0) + dot for t < ntok (1 .. 32), rows
 * r < 16 (r < nr in the last panel).  Between fl_amx_bf16_begin / fl_amx_end. */
void fl_amx_bf16_gemm(const uint16_t *panel, size_t pstride, int np, int64_t K, const uint16_t *act, size_t astride,
                      int ntok, float *y, int64_t ldy, int nr, bool acc);
void fl_amx_bf16_begin(void);

#endif
