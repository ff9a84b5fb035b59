/*
 * model.h - the llama model as a trainable f32 object: parameters, gradients, activations,
 * forward and backward over a flat varlen batch, activation checkpointing every k layers.
 *
 * Memory (llm.c style, every byte in one tracked allocation per kind):
 *   params   all parameters in ONE allocation, FL_MEM_WEIGHTS (f32 master weights)
 *   wcompute the rounded compute copy for bf16/fp16 precision, FL_MEM_WEIGHTS (absent for f32)
 *   grads    one allocation of the same layout, FL_MEM_GRAD (f32 accumulation)
 *   acts     one allocation, FL_MEM_ACT, sized by fl_train_act_bytes() for max_tokens
 *   bwd      the backward's temporaries (residual and intermediate gradients), FL_MEM_SCRATCH,
 *            sized by fl_train_bwd_bytes(); the attention kernels add their workspace per call
 * Parameter layout: FL_TP_* tensors in order, per-layer tensors stacked over layers
 * (e.g. wq is (L, H*hd, C)); matrices in GGUF row layout (O rows of I inputs).
 *
 * Checkpointing (ckpt_every = k): k == 0 keeps every layer's activations; k > 0 keeps only the
 * inputs of layers 0, k, 2k, ... and k layers' worth of activation buffers; backward recomputes
 * each segment [l0, l0+k) from its stored input before going back through it.  Kernels are
 * deterministic, so gradients with and without checkpointing are bit-identical.  No KV cache.
 *
 * Precision: FL_TRAIN_F32, or BF16/FP16 "compute" (weights, matmul inputs and matmul output
 * gradients rounded to bf16/fp16 values, f32 accumulation inside every matmul, f32 master weights
 * and gradients).  FP16 overflow shows as inf/NaN in the gradients (loss scaling is the trainer's).
 *
 * Fields are read-only outside model.c except params (the optimizer updates them; call
 * fl_train_model_sync_compute() afterwards) and grads.  Not thread-safe; each op threads itself.
 */
#ifndef FL_TRAIN_MODEL_H
#define FL_TRAIN_MODEL_H

#include "fitllm.h"
#include "formats/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fl_train_config {
    int32_t n_vocab, n_ctx, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, rope_dim;
    float rope_base, rms_eps;
} fl_train_config;

typedef enum fl_train_param {
    FL_TP_TOK_EMBD = 0, /* (V, C) */
    FL_TP_ATTN_NORM,    /* (L, C) */
    FL_TP_WQ,           /* (L, H*hd, C) */
    FL_TP_WK,           /* (L, Hkv*hd, C) */
    FL_TP_WV,           /* (L, Hkv*hd, C) */
    FL_TP_WO,           /* (L, C, H*hd) */
    FL_TP_FFN_NORM,     /* (L, C) */
    FL_TP_FFN_GATE,     /* (L, F, C) */
    FL_TP_FFN_UP,       /* (L, F, C) */
    FL_TP_FFN_DOWN,     /* (L, C, F) */
    FL_TP_OUT_NORM,     /* (C) */
    FL_TP_OUTPUT,       /* (V, C) */
    FL_TP_COUNT
} fl_train_param;

typedef enum fl_train_precision { FL_TRAIN_F32 = 0, FL_TRAIN_BF16 = 1, FL_TRAIN_FP16 = 2 } fl_train_precision;

/* A flat batch of n_seq sequences (packed documents or bucketed rows). Borrowed arrays. */
typedef struct fl_train_batch {
    const int32_t *tokens;     /* (N) */
    const int32_t *targets;    /* (N) next token, < 0 = not scored */
    const int32_t *pos;        /* (N) position inside its sequence (restarts per document) */
    const int32_t *cu_seqlens; /* (n_seq + 1) */
    int64_t n_tokens;
    int32_t n_seq;
} fl_train_batch;

typedef struct fl_train_model fl_train_model;
/* Where a bucketed backward hands each bucket's gradients (fl_train_model_set_grad_sink). */
typedef fl_status (*fl_train_grad_sink)(void *ud, const fl_train_model *m, int bucket, const float *stage);
struct fl_train_model {
    fl_train_config cfg;
    int64_t n_params;                /* elements in params (n_full unless the matrices went NF4) */
    int64_t n_full;                  /* elements of every tensor (the export layout) */
    int64_t offset[FL_TP_COUNT];     /* element offset of each tensor in params (matrices last) */
    float *params;                   /* (n_params) FL_MEM_WEIGHTS */
    float *wcompute;                 /* (n_params) rounded copy or NULL (f32) */
    float *grads;                    /* (n_params) FL_MEM_GRAD, NULL until reserve (and with a sink) */
    fl_train_grad_sink gsink;        /* bucketed gradients: the sink, its argument and */
    void *gsink_ud;
    float *gstage;                   /* (fl_train_grad_bucket_max) FL_MEM_GRAD staging, instead of grads */
    int precision;                   /* fl_train_precision */
    bool ref_attn;                   /* force the plain attention of ops_train.c (tests) */
    /* LoRA (lora_rank > 0): adapters A (r, I), B (O, r) on every matrix, base frozen */
    int32_t lora_rank;
    float lora_alpha;
    int64_t n_lora;
    int64_t lora_off[FL_TP_COUNT][2]; /* element offsets of A and B (all layers) in lora */
    float *lora;                      /* (n_lora) FL_MEM_WEIGHTS */
    /* frozen base matrices moved out of params (QLoRA): F32 or NF4 per tensor, all layers */
    void *frozen[FL_TP_COUNT];
    int32_t frozen_type[FL_TP_COUNT];
    size_t frozen_bytes[FL_TP_COUNT];
    float *wscratch;                  /* one dequantized matrix (FL_MEM_SCRATCH) */
    size_t wscratch_bytes;
    /* activations */
    int64_t max_tokens;
    int ckpt_every;
    unsigned char *acts;
    size_t acts_bytes;
    unsigned char *bwd; /* backward temporaries (FL_MEM_SCRATCH) */
    size_t bwd_bytes;
    void *priv; /* carve-up of acts (model.c) */
    /* after forward: */
    int64_t n_tokens;
    bool have_forward;
};

/* Validate a shape: FL_ERR_INVALID with a message if inconsistent. */
fl_status fl_train_config_check(const fl_train_config *cfg);
/* Elements of parameter tensor p (all layers). */
int64_t fl_train_param_numel(const fl_train_config *cfg, fl_train_param p);
/* Bytes of the activation allocation for max_tokens tokens (exact, what reserve allocates). */
size_t fl_train_act_bytes(const fl_train_config *cfg, int64_t max_tokens, int ckpt_every, int lora_rank);
/* Bytes of the backward temporaries' allocation (exact, what reserve allocates). */
size_t fl_train_bwd_bytes(const fl_train_config *cfg, int64_t max_tokens, int lora_rank);
/* The largest FL_MEM_SCRATCH one of a step's f32 products allocates (fl_sgemm_scratch_bytes over
 * every linear layer's forward, input gradient, weight gradient (none under LoRA) and LoRA
 * products, and the output layer's), for max_tokens tokens on nth threads: live only within a
 * product, never with the attention kernels' workspace. */
size_t fl_train_gemm_scratch_bytes(const fl_train_config *cfg, int64_t max_tokens, int lora_rank, int nth);

/* New model with zeroed parameters (FL_ERR_NOMEM / FL_ERR_BUDGET / FL_ERR_INVALID). */
fl_status fl_train_model_new(const fl_train_config *cfg, fl_train_model **out);
void fl_train_model_free(fl_train_model *m);
/* GPT-2 style init: N(0, 0.02), residual projections (wo, ffn_down) N(0, 0.02/sqrt(2L)), norms 1. */
void fl_train_model_init_random(fl_train_model *m, uint64_t seed);
/* Read hparams from the llama.* keys and dequantize every tensor to f32 (any type fl_dequant_row
 * knows).  A missing output.weight is tied to token_embd (copied).  Errors name the tensor. */
fl_status fl_train_model_load_gguf(const fl_gguf *g, fl_train_model **out);
/* The same with the base matrices frozen as NF4 as they are read (QLoRA; rows not a multiple of
 * 64 stay F32): each goes through one f32 matrix of scratch, so the f32 base is never held
 * whole.  The same bytes as loading in f32 and fl_train_model_quantize_base_nf4.  Enable LoRA
 * before training (the base gets no gradients). */
fl_status fl_train_model_load_gguf_nf4(const fl_gguf *g, fl_train_model **out);
fl_status fl_train_config_from_gguf(const fl_gguf *g, fl_train_config *cfg);
/* Read every parameter of m (shapes must match m's config) from g's tensors. */
fl_status fl_train_model_read_params(fl_train_model *m, const fl_gguf *g);

/* Bucketed gradients (ZeRO-2's way to never hold the whole gradient).  With a sink set before
 * fl_train_model_reserve (full training only: not with LoRA), reserve allocates one staging
 * buffer of fl_train_grad_bucket_max floats instead of the n_params of grads (which stays
 * NULL), and every backward writes its gradients a bucket at a time into it, from zero, and
 * calls sink(ud, m, bucket, stage) when the bucket is complete, before it goes on (an error
 * from the sink ends the backward): first FL_TRAIN_BUCKET_HEAD (output_norm, output), then the
 * layers n_layer - 1 .. 0 (each layer's nine tensors), then n_layer (token_embd).  So the sink
 * sees each micro-batch's gradients, not their sum over a step.  fl_train_grad_bucket_tensor
 * gives tensor i of a bucket: its offset in the flat parameters, its offset in the staging
 * buffer and its length (false past the last). */
#define FL_TRAIN_BUCKET_HEAD (-1)
void fl_train_model_set_grad_sink(fl_train_model *m, fl_train_grad_sink sink, void *ud);
bool fl_train_grad_bucket_tensor(const fl_train_model *m, int bucket, int i, int64_t *off, int64_t *soff, int64_t *n);
int64_t fl_train_grad_bucket_max(const fl_train_config *cfg);

/* Pointer to layer `layer` of tensor p inside buf (params or grads); layer ignored for the
 * global tensors. */
float *fl_train_model_tensor(const fl_train_model *m, float *buf, fl_train_param p, int layer);
/* GGUF name and shape (ne[0] = row length) of tensor p of one layer. */
void fl_train_param_name(fl_train_param p, int layer, char *buf, size_t cap);
int fl_train_param_shape(const fl_train_config *cfg, fl_train_param p, int64_t ne[2]); /* returns n_dims */
bool fl_train_param_per_layer(fl_train_param p);
bool fl_train_param_is_matrix(fl_train_param p); /* wq wk wv wo ffn_gate ffn_up ffn_down */

/* Allocate gradients and activations for batches of up to max_tokens tokens; frees earlier ones. */
fl_status fl_train_model_reserve(fl_train_model *m, int64_t max_tokens, int ckpt_every, int precision);
/* Refresh the rounded compute copy after the parameters changed (no-op for f32). */
void fl_train_model_sync_compute(fl_train_model *m);
void fl_train_model_zero_grad(fl_train_model *m);

/* Forward: *loss_sum = sum of the per-token losses of scored targets, *n_scored their count
 * (both may be NULL).  Bad tokens/targets/positions/cu_seqlens return FL_ERR_INVALID. */
fl_status fl_train_model_forward(fl_train_model *m, const fl_train_batch *b, double *loss_sum, int64_t *n_scored);
/* Logits (N, V) of the last forward (valid until backward, which overwrites them). */
const float *fl_train_model_logits(const fl_train_model *m);
/* Backward of the last forward on the same batch: grads += d(dloss * sum of token losses).
 * So dloss = 1 / (scored tokens of the whole step) makes grads the mean-loss gradient. */
fl_status fl_train_model_backward(fl_train_model *m, const fl_train_batch *b, float dloss);

/* The buffers the optimizer updates: params/grads (full training) or the LoRA adapters. */
void fl_train_model_trainable(fl_train_model *m, float **params, float **grads, int64_t *n);
/* Ranges [r[2i], r[2i+1]) of the trainable buffer that get weight decay (matrices, not norms);
 * returns the count (<= max). */
int fl_train_model_decay_ranges(const fl_train_model *m, int64_t *ranges, int max);
/* After an optimizer update: refresh the rounded compute copy. */
void fl_train_model_after_update(fl_train_model *m);

/* LoRA: adapters of rank r (scale alpha / r) on wq wk wv wo ffn_gate ffn_up ffn_down of every
 * layer; A ~ U(-1/sqrt(I), 1/sqrt(I)) from seed, B = 0 (the model starts unchanged).  Call
 * before reserve.  The base (params) is frozen: no gradients are kept for it. */
fl_status fl_train_model_enable_lora(fl_train_model *m, int32_t rank, float alpha, uint64_t seed);
/* QLoRA: quantize the base matrices to NF4 (rows not a multiple of 64 stay F32) and free their
 * f32 copy; needs LoRA enabled first.  Matmuls dequantize one matrix at a time.  (A GGUF base is
 * better read with fl_train_model_load_gguf_nf4, which never holds the f32 matrices.) */
fl_status fl_train_model_quantize_base_nf4(fl_train_model *m);
/* Adapter tensors "lora.<tensor>.{a,b}" (F32, all layers stacked) and lora.* keys. */
fl_status fl_train_model_add_lora_to_writer(const fl_train_model *m, fl_gguf_writer *w);
fl_status fl_train_model_read_lora(fl_train_model *m, const fl_gguf *g);
fl_status fl_train_model_save_lora(const fl_train_model *m, const char *path);
/* Every parameter in the full f32 layout (n_full, FL_MEM_MISC, caller frees *bytes) with the
 * adapters merged: W + (alpha/r) B A (NF4 base matrices dequantized): what the export writes,
 * as one copy (the export makes it a matrix at a time; tests compare the two). */
fl_status fl_train_model_merged(const fl_train_model *m, float **out, size_t *bytes);

/* Write the parameters as a llama GGUF (F32 tensors, standard keys); tokenizer.* keys copied
 * from tok_src when given.  Atomic (temp + fsync + rename). */
fl_status fl_train_model_save_gguf(const fl_train_model *m, const char *path, const fl_gguf *tok_src);
/* Add the llama.* hparam keys and the parameter tensors (borrowing buf, full layout; NULL =
 * keys only) to a writer. */
fl_status fl_train_model_add_to_writer(const fl_train_model *m, fl_gguf_writer *w, const float *buf);

#endif
