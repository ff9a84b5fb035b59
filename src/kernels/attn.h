/*
 * attn.h - scaled dot-product attention on the CPU: naive reference, flash attention (online
 * softmax, O(tile) memory), merge of partial results, and the FlashAttention-2 backward.
 *
 * Maths.  For a query row q (one token, one head) and the keys/values it may see:
 *     s_j = scale * q . k_j,   lse = log(sum_j exp(s_j)),   out = sum_j exp(s_j - lse) v_j
 * scale defaults to 1/sqrt(head_dim).  lse is the natural log-sum-exp; a row that sees no key
 * at all gets out = 0 and lse = -INFINITY (merging with it is exact).
 *
 * Layout (all strides in ELEMENTS between consecutive tokens, i.e. rows):
 *     q    [n_q][n_head][head_dim]      f32, token stride q_stride  (>= n_head * head_dim)
 *     k, v [n_kv][n_head_kv][head_dim]  kv_type (F32, F16 or BF16), strides k_stride, v_stride
 *     out  [n_q][n_head][head_dim]      f32, stride out_stride (may not alias q/k/v)
 *     lse  [n_q][n_head]                f32 (optional, NULL to skip)
 * GQA/MQA: query head h reads K/V head h / (n_head / n_head_kv); K/V are never duplicated.
 *
 * Variable-length packed batches: n_seq sequences concatenated along the token axis, described
 * by cumulative lengths cu_seqlens_q[n_seq + 1] and cu_seqlens_k[n_seq + 1] (start at 0,
 * non-decreasing, end at n_q / n_kv).  Attention is block-diagonal: sequence s's queries
 * [cu_q[s], cu_q[s+1]) see only its keys [cu_k[s], cu_k[s+1]).  NULL cu_seqlens means one
 * sequence covering all tokens.  Q and K lengths of a sequence may differ (chunked prefill
 * against a cache, decode).
 *
 * Positions and masks (fl_attn_row_range is the one definition every path uses).  Within a
 * sequence with Lq queries and Lk keys, query i sits at key position p = Lk - Lq + i
 * (bottom-right alignment).  Key j (0-based in the sequence) is visible when
 *     causal:               j <= p, and with a window W > 0 also j > p - W  (the last W keys)
 *     not causal, W > 0:    |j - p| < W   (symmetric band)
 *     not causal, W == 0:   every key of the sequence
 *
 * Errors: fl_attn_forward/backward return FL_ERR_INVALID with a message for inconsistent
 * shapes/strides, cu_seqlens that decrease or do not end at the token counts, n_head not a
 * multiple of n_head_kv, head_dim <= 0; FL_ERR_UNSUPPORTED for a K/V type other than
 * F32/F16/BF16 (the backward needs F32); FL_ERR_BUDGET/NOMEM if the scratch cannot be
 * allocated.  impl = FL_ATTN_AUTO picks flash, and falls back to the naive path for what the
 * flash kernels do not support (head_dim not a multiple of 8); FL_ATTN_NAIVE forces the
 * reference; FL_ATTN_FLASH returns FL_ERR_UNSUPPORTED instead of falling back.
 * Fast paths: head_dim 64 and 128 (compile-time specialised micro-kernels).
 *
 * Memory: flash needs fl_attn_workspace_bytes(a) = nth * fl_attn_tile_scratch_bytes(head_dim)
 * plus the n_seq + 1 work offsets - independent of the sequence length.  It uses a->work when
 * given (no allocation: reserve it once, like any per-step scratch) or else allocates it from
 * FL_MEM_SCRATCH for the duration of the call.  The naive path charges one [Lq_max][Lk_max]
 * score matrix per thread to FL_MEM_SCRATCH.
 *
 * Threading: both paths split (sequence, kv head, query tile) work items over fl_parallel and
 * take them from an atomic counter.  Calls are reentrant (no global state apart from the ISA).
 * ISA: the flash micro-kernels come from a table picked by fl_isa_get() (ref, avx2, avx512).
 */
#ifndef FL_ATTN_H
#define FL_ATTN_H

#include "fitllm.h"
#include "kernels/dispatch.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum fl_attn_impl { FL_ATTN_AUTO = 0, FL_ATTN_NAIVE = 1, FL_ATTN_FLASH = 2 } fl_attn_impl;

typedef struct fl_attn_args {
    int32_t n_seq;               /* sequences in the packed batch (>= 1) */
    const int32_t *cu_seqlens_q; /* [n_seq + 1] or NULL (one sequence of n_q tokens) */
    const int32_t *cu_seqlens_k; /* [n_seq + 1] or NULL (one sequence of n_kv tokens) */
    int64_t n_q, n_kv;           /* total query / key tokens */
    int32_t n_head, n_head_kv, head_dim;
    const float *q;              /* [n_q][n_head][head_dim] */
    int64_t q_stride;            /* 0 = n_head * head_dim */
    const void *k, *v;           /* [n_kv][n_head_kv][head_dim] of kv_type */
    int64_t k_stride, v_stride;  /* 0 = n_head_kv * head_dim */
    int32_t kv_type;             /* FL_TYPE_F32, FL_TYPE_F16 or FL_TYPE_BF16 */
    float *out;                  /* [n_q][n_head][head_dim] */
    int64_t out_stride;          /* 0 = n_head * head_dim */
    float *lse;                  /* [n_q][n_head] natural log-sum-exp, or NULL */
    float scale;                 /* 0 = 1/sqrt(head_dim) */
    bool causal;
    int32_t window;              /* 0 = no window */
    fl_attn_impl impl;
    void *work;                  /* optional flash workspace (64-byte aligned), NULL = allocate */
    size_t work_size;            /* its bytes, >= fl_attn_workspace_bytes(a) */
} fl_attn_args;

/* Check a's shapes, strides, cu_seqlens and types; FL_OK or an error with a message. */
fl_status fl_attn_check(const fl_attn_args *a);
/* out (and lse) for every query; see the header comment for errors. */
fl_status fl_attn_forward(const fl_attn_args *a);
/* Bytes of workspace the flash path needs for a with fl_threads_get() threads (0 if a's n_seq
 * or head_dim are unusable); depends on n_seq, head_dim and the thread count only. */
size_t fl_attn_workspace_bytes(const fl_attn_args *a);
/* The same for n_seq sequences, head_dim and nth threads (what a planner asks before any call). */
size_t fl_attn_flash_workspace_bytes(int32_t n_seq, int32_t head_dim, int nth);
/* The two implementations behind fl_attn_forward (same contract). */
fl_status fl_attn_forward_naive(const fl_attn_args *a);
fl_status fl_attn_forward_flash(const fl_attn_args *a);

/* Exact merge of two partial results over DISJOINT key ranges of the same queries:
 *   lse = log(exp(lse_a) + exp(lse_b)),  out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b
 * out_a/out_b/out: [n_rows][head_dim] with row strides (elements); lse_*: [n_rows] contiguous.
 * out may alias out_a (or out_b), lse may alias lse_a (or lse_b).  Rows with both lse = -inf
 * give out = 0, lse = -inf.  Cannot fail. */
void fl_attn_merge(int64_t n_rows, int32_t head_dim,
                   const float *out_a, int64_t stride_a, const float *lse_a,
                   const float *out_b, int64_t stride_b, const float *lse_b,
                   float *out, int64_t stride_out, float *lse);

/* Backward of fl_attn_forward (FlashAttention-2: scores recomputed tile by tile from the saved
 * lse; no n x n storage).  Inputs: the forward's args fa (kv_type must be F32; fa->out and
 * fa->lse must hold the forward's results), dout like out.  Outputs (overwritten):
 *   dq [n_q][n_head][head_dim], dk, dv [n_kv][n_head_kv][head_dim], contiguous.
 * Scratch: D = rowsum(dout * out) [n_q][n_head] plus per-thread tiles of O(64 x head_dim),
 * FL_MEM_SCRATCH.  Threaded; uses the same qk/pv micro-kernels as the forward. */
fl_status fl_attn_backward(const fl_attn_args *fa, const float *dout, int64_t dout_stride,
                           float *dq, float *dk, float *dv);
/* The FL_MEM_SCRATCH fl_attn_backward holds during a call of n_q queries in n_seq sequences of
 * n_head heads of head_dim, on nth threads (D, the two work-offset tables, the tiles); 0 if a
 * size is unusable. */
size_t fl_attn_backward_scratch_bytes(int64_t n_q, int32_t n_seq, int32_t n_head, int32_t head_dim, int nth);
/* Reference backward: materializes P and dP per (sequence, head). Same contract. */
fl_status fl_attn_backward_naive(const fl_attn_args *fa, const float *dout, int64_t dout_stride,
                                 float *dq, float *dk, float *dv);

/* Visible key range [*lo, *hi] (inclusive, in-sequence positions) of query i of a sequence
 * with lq queries and lk keys; *lo > *hi when it sees nothing. */
static inline void fl_attn_row_range(int64_t i, int64_t lq, int64_t lk, bool causal, int32_t window,
                                     int64_t *lo, int64_t *hi) {
    int64_t p = lk - lq + i;
    int64_t l = 0, h = lk - 1;
    if (causal) {
        if (p < h) h = p;
        if (window > 0 && p - window + 1 > l) l = p - window + 1;
    } else if (window > 0) {
        if (p - window + 1 > l) l = p - window + 1;
        if (p + window - 1 < h) h = p + window - 1;
    }
    *lo = l;
    *hi = h;
}

/* ---- the inner tile (exposed so paged-KV kernels can drive it block by block) ----
 *
 * A tile holds up to FL_ATTN_TQ query "lanes" (each lane = one query row of one head) in
 * transposed form, and the running state of the online softmax for each lane:
 *     m    running max of the scores, in log2 units (scores are pre-multiplied by scale*log2 e)
 *     l    running sum of exp2(s - m)
 *     ot   unnormalised output, transposed: ot[d][lane]
 * fl_attn_tile_update() folds a contiguous run of keys into the state: for each key it applies
 * the lane's visibility range [lo, hi] (key positions are key_pos0, key_pos0 + 1, ...), then
 * rescales by exp2(m_old - m_new).  Runs may come in any order (keys are a set), so a paged
 * kernel calls it once per block.  fl_attn_tile_get_lane() writes the normalised output row and
 * the natural lse.  All buffers live in caller-provided scratch (fl_attn_tile_scratch_bytes,
 * 64-byte aligned); nothing allocates.  One tile per thread; not thread-safe.
 */
#define FL_ATTN_TQ 64 /* query lanes per tile */
#define FL_ATTN_TK 64 /* keys per inner step */

typedef struct fl_attn_tile {
    int32_t head_dim;
    int32_t n_lanes;   /* active lanes (<= FL_ATTN_TQ) */
    int32_t n_padded;  /* n_lanes rounded up to 16 (lanes beyond n_lanes mirror the last one) */
    float *qt;         /* [head_dim][FL_ATTN_TQ] scaled queries */
    float *ot;         /* [head_dim][FL_ATTN_TQ] accumulator */
    float *m, *l;      /* [FL_ATTN_TQ] */
    float *alpha;      /* [FL_ATTN_TQ] */
    int64_t *lo, *hi;  /* [FL_ATTN_TQ] visible key positions (inclusive) */
    float *s;          /* [FL_ATTN_TK][FL_ATTN_TQ] scores/probabilities of one step */
    float *kbuf, *vbuf;/* [FL_ATTN_TK][head_dim] f32 copies of f16/bf16 keys/values */
} fl_attn_tile;

/* head_dim must be a multiple of 8 for the tile (FL_ASSERTed in fl_attn_tile_bind). */
size_t fl_attn_tile_scratch_bytes(int32_t head_dim);
/* Carve the tile's buffers out of scratch (fl_attn_tile_scratch_bytes bytes, 64-aligned). */
void fl_attn_tile_bind(fl_attn_tile *t, void *scratch, int32_t head_dim);
/* Start a new set of lanes: state to empty (m = -inf, l = 0, ot = 0). */
void fl_attn_tile_reset(fl_attn_tile *t, int32_t n_lanes);
/* Lane `lane` <- query row q[head_dim] times scale, seeing key positions [lo, hi]. */
void fl_attn_tile_set_lane(fl_attn_tile *t, int32_t lane, const float *q, float scale, int64_t lo, int64_t hi);
/* Fold keys k_j, v_j (j < n_keys, rows at k + j * k_stride elements of kv_type) sitting at key
 * positions key_pos0 + j into every lane.  Keys outside a lane's [lo, hi] are ignored; a run
 * visible to no lane costs nothing. */
void fl_attn_tile_update(fl_attn_tile *t, const void *k, int64_t k_stride, const void *v, int64_t v_stride,
                         int32_t kv_type, int64_t n_keys, int64_t key_pos0);
/* out[head_dim] = normalised output of lane; *lse = its natural log-sum-exp (lse may be NULL). */
void fl_attn_tile_get_lane(const fl_attn_tile *t, int32_t lane, float *out, float *lse);

/* ---- micro-kernels (one table per ISA; exposed for parity tests) ----
 * Buffers with FL_ATTN_TQ lanes per row, all 64-byte aligned (qt, s, ot, m, l, alpha); nq is a
 * multiple of 16 (<= FL_ATTN_TQ); k and v rows need no alignment.
 *   qk:      s[j][i] = sum_d k[j][d] * qt[d][i]             j < nk, i < nq   (k rows of f32)
 *   softmax: per lane i: mt = max_j s[j][i]; m' = max(m, mt); alpha = exp2(m - m'); s = exp2(s - m');
 *            l = l * alpha + sum_j s[j][i]; m = m'  (with -inf handled: exp2(-inf) = 0, no NaN)
 *   pv:      ot[d][i] = alpha[i] * ot[d][i] + sum_j v[j][d] * s[j][i]
 */
typedef struct fl_attn_kernels {
    void (*qk)(const float *qt, int32_t nq, const float *k, int64_t k_stride, int32_t nk, int32_t hd, float *s);
    void (*softmax)(float *s, int32_t nk, int32_t nq, float *m, float *l, float *alpha);
    void (*pv)(const float *s, int32_t nk, const float *v, int64_t v_stride, int32_t hd, float *ot,
               int32_t nq, const float *alpha);
} fl_attn_kernels;

const fl_attn_kernels *fl_attn_kernels_get(void);          /* for fl_isa_get() */
const fl_attn_kernels *fl_attn_kernels_for(fl_isa isa);    /* NULL if not built/supported */

void fl_attn_qk_ref(const float *qt, int32_t nq, const float *k, int64_t k_stride, int32_t nk, int32_t hd, float *s);
void fl_attn_softmax_ref(float *s, int32_t nk, int32_t nq, float *m, float *l, float *alpha);
void fl_attn_pv_ref(const float *s, int32_t nk, const float *v, int64_t v_stride, int32_t hd, float *ot,
                    int32_t nq, const float *alpha);
void fl_attn_qk_avx2(const float *qt, int32_t nq, const float *k, int64_t k_stride, int32_t nk, int32_t hd, float *s);
void fl_attn_softmax_avx2(float *s, int32_t nk, int32_t nq, float *m, float *l, float *alpha);
void fl_attn_pv_avx2(const float *s, int32_t nk, const float *v, int64_t v_stride, int32_t hd, float *ot,
                     int32_t nq, const float *alpha);
void fl_attn_qk_avx512(const float *qt, int32_t nq, const float *k, int64_t k_stride, int32_t nk, int32_t hd, float *s);
void fl_attn_softmax_avx512(float *s, int32_t nk, int32_t nq, float *m, float *l, float *alpha);
void fl_attn_pv_avx512(const float *s, int32_t nk, const float *v, int64_t v_stride, int32_t hd, float *ot,
                       int32_t nq, const float *alpha);

/* ---- paged attention's AVX2 block update (kv/paged_attn.c; kernels/avx2/paged_avx2.c) ----
 * kt16: kt[d * 16 + j] = rows[j * hd + d] for key rows j in [ja, jz) of a block of at most 16
 *   (row-major f32 rows, hd floats each), 0 for the other j < 16.
 * block16: fold keys j in [ja, jb) of such a block (K as kt16 made it, V row-major vb[j * hd +
 *   d]) into the online-softmax states of n heads of one KV group: st + h * ss = {m, l,
 *   acc[hd]} for the query q + h * hd, scores times scale.  The heads go two at a time, each
 *   with the same arithmetic whatever n is (see the file for the summation orders). */
void fl_attn_kt16_avx2(const float *rows, int32_t hd, int32_t ja, int32_t jz, float *kt);
void fl_attn_block16_avx2(int32_t n, float *st, size_t ss, const float *q, int32_t hd, const float *kt, const float *vb,
                          int32_t ja, int32_t jb, float scale);

/* FLOPs of the two inner products over the visible (query, key) pairs of a call: 4 * pairs *
 * head_dim * n_head (what the bench divides by time to get GFLOP/s). */
double fl_attn_flops(const fl_attn_args *a);

#endif
