/*
 * ops_train.h - f32 forward/backward pairs of every op of the llama forward, for training.
 *
 * One *_backward beside each *_forward with the same argument order (llm.c): the backward takes
 * the gradient buffers first (d<name> for each differentiable input), then the gradient of the
 * output, then what the forward read.  Unless noted, backward ACCUMULATES (+=) into dinp/dweight
 * buffers, so callers zero them once per step (gradient accumulation falls out for free).
 *
 * Shapes use llm.c's vocabulary: N tokens (a flat batch of several sequences), C channels,
 * V vocab, F ffn width, H / Hkv heads of hd dims.  Weights use the GGUF/ggml layout: a matrix
 * W (O, I) has O rows of I contiguous inputs, and a linear layer computes out = inp . W^T.
 *
 * Sequences: a flat batch carries n_seq sequences given by cu_seqlens (n_seq + 1 offsets,
 * cu_seqlens[0] = 0, cu_seqlens[n_seq] = N); attention is causal inside each sequence and never
 * crosses one (block-diagonal), and positions (for RoPE) are given per token.
 *
 * Threading: every op splits its work with fl_parallel (rows, or (sequence, kv head) pairs for
 * attention); results do not depend on the thread count except through f32 summation order,
 * which is fixed per output element (each element is summed by one thread in a fixed order), so
 * two runs are bit-identical.  No op allocates except attention, which takes per-thread scratch
 * from FL_MEM_SCRATCH for the duration of the call.
 */
#ifndef FL_OPS_TRAIN_H
#define FL_OPS_TRAIN_H

#include "fitllm.h"
#include <stdint.h>

/* out (N, C) = wte[tokens[i]] ; wte (V, C) */
void fl_train_embed_forward(float *out, const int32_t *tokens, const float *wte, int64_t N, int64_t C);
void fl_train_embed_backward(float *dwte, const float *dout, const int32_t *tokens, int64_t N, int64_t C);

/* out (N, C) = inp * rstd * w, rstd (N) = 1 / sqrt(mean(inp^2) + eps) (saved for backward).
 * backward: dw may be NULL (frozen weight). */
void fl_train_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int64_t N, int64_t C,
                              float eps);
void fl_train_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                               const float *rstd, int64_t N, int64_t C);

/* out (N, O) = inp (N, I) . w (O, I)^T   (overwrites out)
 * backward: dinp (N, I) += dout . w, dw (O, I) += dout^T . inp ; dinp or dw may be NULL.
 * Through fl_sgemm (kernels/sgemm.h): each call allocates its packing scratch (FL_MEM_SCRATCH,
 * fl_sgemm_scratch_bytes) for its length. */
void fl_train_matmul_forward(float *out, const float *inp, const float *w, int64_t N, int64_t I, int64_t O);
void fl_train_matmul_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                              int64_t N, int64_t I, int64_t O);

/* RoPE, llama.cpp "normal" mode (adjacent pairs): for each head and pair i < rope_dim/2,
 *   theta = pos * base^(-2i/rope_dim),  (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos).
 * x (N, n_head, head_dim); out may equal inp.  Backward rotates by -theta (overwrites dinp;
 * dinp may equal dout). */
void fl_train_rope_forward(float *out, const float *inp, const int32_t *pos, int64_t N, int n_head, int head_dim,
                           int rope_dim, float base);
void fl_train_rope_backward(float *dinp, const float *dout, const int32_t *pos, int64_t N, int n_head,
                            int head_dim, int rope_dim, float base);

/* out = silu(g) * u  (n elements).  backward: dg, du OVERWRITTEN (dg may alias dout). */
void fl_train_swiglu_forward(float *out, const float *g, const float *u, int64_t n);
void fl_train_swiglu_backward(float *dg, float *du, const float *dout, const float *g, const float *u, int64_t n);

/* out = a + b.  backward: da += dout, db += dout (either may be NULL). */
void fl_train_residual_forward(float *out, const float *a, const float *b, int64_t n);
void fl_train_residual_backward(float *da, float *db, const float *dout, int64_t n);

/* Causal varlen attention (GQA: q head h reads kv head h / (n_head / n_head_kv)).
 *   q, out (N, n_head, hd); k, v (N, n_head_kv, hd); lse (N, n_head) = log-sum-exp of the
 *   scaled scores of each query row (natural log), saved for backward (flash-attention style:
 *   the probabilities are recomputed, never stored).
 * backward: dq, dk, dv are OVERWRITTEN.  Returns FL_ERR_NOMEM if the scratch can't be had. */
fl_status fl_train_attn_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                const int32_t *cu_seqlens, int n_seq, int n_head, int n_head_kv, int hd,
                                float scale);
fl_status fl_train_attn_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                 const float *k, const float *v, const float *out, const float *lse,
                                 const int32_t *cu_seqlens, int n_seq, int n_head, int n_head_kv, int hd,
                                 float scale);

/* Cross-entropy over logits (N, V) with targets (N; < 0 = ignored, loss 0):
 *   losses[i] = logsumexp(logits[i]) - logits[i][targets[i]], lse[i] saved.
 * backward: dlogits[i] = (softmax(logits[i]) - onehot(targets[i])) * dloss[i] (OVERWRITES;
 * dlogits may equal logits; ignored rows get 0).  dloss is per token (N). */
void fl_train_crossentropy_forward(float *losses, float *lse, const float *logits, const int32_t *targets,
                                   int64_t N, int64_t V);
void fl_train_crossentropy_backward(float *dlogits, const float *dloss, const float *logits, const float *lse,
                                    const int32_t *targets, int64_t N, int64_t V);

/* Round every element to the nearest bf16 / fp16 value (kept in f32 storage): the "compute
 * precision" of mixed-precision training.  fp16 overflow gives +-inf. */
void fl_train_round_bf16(float *x, int64_t n);
void fl_train_round_fp16(float *x, int64_t n);

#endif
