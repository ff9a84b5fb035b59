/*
 * tp.h - tensor parallelism for llama inference (Megatron-style, one allreduce per block half).
 *
 * Split.  With N ranks, rank r keeps
 *     attention: query heads [r*H/N, (r+1)*H/N)  -> rows of wq, and the matching columns of wo
 *                kv heads: [r*Hkv/N, (r+1)*Hkv/N) when N divides Hkv; when Hkv divides N
 *                (more ranks than kv heads) the one kv head its query heads read, replicated
 *                on N/Hkv ranks (as vLLM does)   -> rows of wk, wv
 *     ffn:       an ffn slice [f0, f1)           -> rows of w1 (gate), w3 (up), columns of w2
 * and runs the model's own forward on its slice (hparams n_head_local / n_head_kv_local /
 * n_ff_local); the model calls the allreduce hook (fl_model_params.allreduce) after the wo and
 * w2 matmuls, which sums the partial outputs over the ranks: 2 allreduces of n_tokens x n_embd
 * floats per layer.  Norms are replicated.  token_embd and output are split by vocabulary rows
 * ([r*ceil(V/N), ...)): the embedding goes through the model's embed hook (rows this rank holds,
 * zeros elsewhere, one allreduce of n_tokens x n_embd), the output matmul gives this rank's
 * slice of the logits, which fl_tp_forward all-gathers (every rank gets the full logits).
 * H must be a multiple of N; other head counts are refused (FL_ERR_UNSUPPORTED).
 * Communication per forward of T tokens: (2 n_layer + 1) allreduces of T x n_embd floats plus
 * an allgather of R x ceil(V/N) floats per rank (R logit rows).
 *
 * Quantized weights.  Row slices (wq, wk, wv, w1, w3) are whole rows of any type, copied byte
 * for byte.  Column slices (wo, w2: a split along K of a row-major matrix) are copied byte for
 * byte when the slice starts and ends on the type's block boundary; otherwise that slice is
 * dequantized to f32 at load (exact values; more bytes).  The ffn split is chosen on w2's block
 * boundaries (uneven by at most one block, e.g. n_ff 172 f32 -> 43 per rank of 4, n_ff 768
 * q8_0 -> 192 each) and falls back to an even element split with f32 w2 slices only when w2
 * has fewer blocks per row than ranks (q4_K n_ff 768 over 4 ranks).  wo columns follow the
 * heads: stories260K (head_dim 8) with 32-element blocks dequantizes wo slices.  Note that the
 * Q8_0/Q4_0 integer matmul path quantizes activations per 32 elements: a block-aligned K split
 * sees the same activation blocks as one process, so results differ only by summation order.
 *
 * Ownership.  Every slice (and the replicated tensors) is copied into memory owned by the
 * fl_tp_model, charged to FL_MEM_WEIGHTS, so each rank's allocator shows exactly the weights it
 * holds (the file mapping, FL_MEM_MAPPED, is shared page cache and is only read at load).  The
 * model's layer descriptors are pointed at the copies (this file includes model/llama_impl.h:
 * it edits the loaded model's descriptors and local hparams, nothing else).  Logit buffers of
 * the gather: [R][ceil(V/N)] FL_MEM_ACT and N times that FL_MEM_COMM, grown on demand.
 *
 * Errors: load errors as fl_model_load; FL_ERR_UNSUPPORTED for head counts that do not split;
 * a failed allreduce during a forward is returned by fl_tp_forward (FL_ERR_IO).
 * Thread safety: as fl_model (one forward at a time); collective: every rank must call
 * fl_tp_load / fl_tp_forward with the same shapes in the same order.
 */
#ifndef FL_TP_H
#define FL_TP_H

#include "dist/dist.h"
#include "model/llama.h"

typedef struct fl_tp_shard {
    int32_t rank, size;
    int32_t head0, n_head;  /* query heads held */
    int32_t kv0, n_head_kv; /* kv heads held */
    int32_t ff0, n_ff;      /* ffn columns held */
} fl_tp_shard;

typedef struct fl_tp_model fl_tp_model;

/* The split of hp over `size` ranks for `rank`, with the ffn split on ff_block-element units
 * (1 = any).  FL_ERR_UNSUPPORTED when the heads do not split. */
fl_status fl_tp_shard_compute(const fl_hparams *hp, int32_t ff_block, int32_t rank, int32_t size, fl_tp_shard *out);

/* Load path and keep this rank's slice (comm: the tensor-parallel group; a single-process
 * comm gives an ordinary model with owned weights).  Collective. */
fl_status fl_tp_load(const char *path, fl_comm *comm, fl_tp_model **out);
void fl_tp_free(fl_tp_model *t);

fl_model *fl_tp_model_get(fl_tp_model *t);          /* the local (sharded) model */
const fl_tp_shard *fl_tp_shard_get(const fl_tp_model *t);
size_t fl_tp_weight_bytes(const fl_tp_model *t);    /* FL_MEM_WEIGHTS held by this rank */
int32_t fl_tp_n_dequantized(const fl_tp_model *t);  /* column slices that fell back to f32 */

/* fl_model_forward on the local slice with the allreduces; every rank gets the full logits.
 * kv must be sized with the local head counts (fl_model_hparams of fl_tp_model_get). */
fl_status fl_tp_forward(fl_tp_model *t, const fl_batch *b, const fl_kv_iface *kv, void *kv_ctx, float *logits);

#endif
