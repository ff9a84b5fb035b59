/*
 * paged_attn.h - causal attention reading K/V straight through block tables (no gather copy).
 *
 * For every query row r of sequence s (position p = pos0 + r - q0), every head h with kv head
 * kh = h / (n_head / n_head_kv):
 *     out[r][h] = sum_j softmax_j(scale * q[r][h] . K_s[j][kh]) V_s[j][kh]
 * over the cached positions j with  p - window < j <= p  (window 0 = unlimited), where
 * K_s[j] lives in block blocks[j / block_size], row j % block_size.  The queries of one
 * sequence are its last n_q positions (bottom-right causal), so the same kernel is the prefill
 * (a chunk against cached blocks + itself) and the decode (n_q = 1).
 *
 * Algorithm (flash style): positions are cut into partitions of part_blocks blocks.  Inside a
 * partition the kernel keeps an online softmax state (m, l, acc) per (query, head) and updates
 * it once per block; partition states are merged in order with the log-sum-exp rule.  Decode
 * rows of long sequences spread partitions over threads (split-K: partial states go to the
 * workspace and a second pass merges them); prefill rows take all partitions in one work item.
 * Both paths run the same per-block update and the same in-order merge, so a query's output
 * bits depend only on its position and the cached K/V, never on how the batch was cut (the
 * prefix-cache oracle relies on this).
 *
 * K/V are dequantised on load (kv_quant.h), per block and kv head, into per-thread scratch.
 * The inner dot / scale-add loops have a portable fixed-order version (the reference) and
 * AVX2 / AVX-512 versions (target attributes), chosen once per call from fl_isa_get().
 * Threads: fl_parallel inside; the caller provides the workspace (fl_paged_attn_ws_size).
 */
#ifndef FL_PAGED_ATTN_H
#define FL_PAGED_ATTN_H

#include <stddef.h>
#include <stdint.h>

/* One layer of paged K/V storage. */
typedef struct fl_paged_kv {
    int32_t type;        /* fl_type of K and V (kv_quant.h) */
    int32_t block_size, n_head_kv, head_dim;
    size_t row_bytes;    /* bytes of one token row (n_head_kv * head_dim elements) */
    size_t block_bytes;  /* block_size * row_bytes */
    const uint8_t *k, *v; /* [n_blocks - 1][block_size][row_bytes]: block id b at (b - 1) * block_bytes */
    const float *k_scale, *v_scale; /* fp8: [n_blocks - 1][n_head_kv], same indexing; else NULL */
} fl_paged_kv;

/* The queries of one sequence in the batch. */
typedef struct fl_paged_seq {
    int32_t q0, n_q;        /* batch rows [q0, q0 + n_q) */
    int32_t pos0;           /* position of row q0; rows are pos0 .. pos0 + n_q - 1 */
    const int32_t *blocks;  /* [ceil((pos0 + n_q) / block_size)] block ids; 0 only for blocks
                               entirely outside every row's window */
} fl_paged_seq;

typedef struct fl_paged_attn_params {
    int32_t n_head;      /* query heads (multiple of n_head_kv) */
    float scale;         /* usually 1/sqrt(head_dim) */
    int32_t window;      /* sliding window in tokens, 0 = none */
    int32_t part_blocks; /* blocks per partition (>= 1) */
} fl_paged_attn_params;

/* Query rows per prefill work item: each K/V block is converted and transposed once per tile of
 * this many rows, and each thread's workspace holds two tiles' softmax states per head of a KV
 * group (the planner's formula follows it). */
#define FL_PAGED_Q_TILE 32

/* Bytes of workspace fl_paged_attn needs for these sequences with nth threads. */
size_t fl_paged_attn_ws_size(const fl_paged_kv *kv, const fl_paged_seq *seqs, int32_t n_seq,
                             const fl_paged_attn_params *pp, int nth);

/* q: [n_rows][n_head][head_dim] f32, out: same shape (rows not covered by seqs untouched).
 * ws: at least fl_paged_attn_ws_size bytes, 64-aligned.  Runs on fl_threads_get() threads. */
void fl_paged_attn(const fl_paged_kv *kv, const fl_paged_seq *seqs, int32_t n_seq,
                   const fl_paged_attn_params *pp, const float *q, float *out, void *ws);

/* The plain reference: for each row, gather the visible K/V rows (dequantised) and run a
 * two-pass softmax in double.  Allocates nothing (O(1) state per row besides out). */
void fl_paged_attn_naive(const fl_paged_kv *kv, const fl_paged_seq *seqs, int32_t n_seq,
                         const fl_paged_attn_params *pp, const float *q, float *out);

#endif
