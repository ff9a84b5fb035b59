/*
 * plan.h - the memory planner: bytes by category (fl_mem_cat) per device for inference and
 * training, from a model's shape alone (no weights loaded).
 *
 * What it owns: nothing at run time.  Every function here is pure arithmetic over plain structs
 * (fl_model_shape, fl_plan_input, fl_plan_result); they are thread-safe and allocate nothing
 * except the loaders (GGUF header, config.json), which free what they use before returning.
 * docs/PLANNER.md writes down every formula; this header writes down the buffers the engine
 * must allocate so that the plan is what the engine uses.
 *
 * Categories (fl_mem_cat):
 *   WEIGHTS  model weights on the device (training: the working copy in the train dtype)
 *   KV       KV cache blocks: whole blocks of kv_block tokens per sequence per layer
 *   ACT      per-step activations (inference: fl_plan_buffers; training: saved activations)
 *   SCRATCH  workspaces: flash-attention tiles, quantized activations, backward temporaries
 *   GRAD     gradients
 *   OPTIM    optimizer states, and fp32 master weights under mixed precision
 *   COMM     ZeRO-3 gather buffer (one layer's full weights)
 *   MISC     allocator slack measured from the engine (in.slack_bytes + in.slack_frac x total)
 *
 * Inference step buffers: what the engine (src/engine, model/llama.h) allocates.  One step
 * processes up to n_tokens tokens (fl_plan_compute: the prefill budget n_prefill plus one row per
 * sequence, / sp) and produces n_logit_rows rows of logits (n_seq, last pipeline stage).  f32,
 * every model-workspace buffer rounded up to 64 bytes (tp = tensor-parallel ranks):
 *   ACT (fl_model_workspace_bytes + the engine's logits):
 *     x, xb, out [n_tokens][n_embd]             residual stream, normed input, wo / w2 output
 *     q, att  [n_tokens][n_head/tp][head_dim]   queries, attention output
 *     k, v    [n_tokens][n_head_kv'][head_dim]  n_head_kv' = ceil(n_head_kv / tp)
 *     hb, hb2 [n_tokens][n_ff_act/tp]           ffn gate and up (n_ff_act = n_ff x n_expert_used)
 *     xl      [n_logit_rows][n_embd]            final-normed rows that get logits
 *     router  [n_tokens][n_expert]              MoE router logits (0 for dense models)
 *     scores  [n_head/tp][n_tokens][n_ctx]      naive attention only (0 with flash attention)
 *     logits  [n_logit_rows][n_vocab/tp]        not rounded
 *   SCRATCH:
 *     tiles   the paged-attention workspace: per thread 2 x 16 x head_dim + 16 + 2 x 16 x
 *             (n_head / n_head_kv) x (head_dim + 2) floats (rounded to 16), the total rounded up
 *             to a power of two >= 64 KiB, as the cache grows it; with f16 KV + the step's
 *             queries rounded to f16, [n_tokens][n_head/tp][head_dim] f32 (split-K partials of
 *             long decodes come on top: see plan_engine.h)
 *     qact    the largest single matmul workspace (fl_plan_matmul_scratch): Q8_0 / Q4_0 weights
 *             quantize the activations (about 3.4 bytes per element of [n_tokens][widest input]);
 *             other non-f32 weights dequantize n_threads x 8 rows of the widest input to f32
 *     batch   the engine's batch arrays: 17 bytes per token + 8 per logits row
 *   MISC: slack = in.slack_bytes + in.slack_frac x (the rest).  For a GGUF served by the engine,
 *   plan/plan_engine.h gives the engine-exact plan (MISC constants measured from the engine).
 *
 * KV bytes per element: f32 4, f16/bf16 2, q8_0 34/32, q4_0 18/32 (head_dim a multiple of 32),
 * fp8 (e4m3/e5m2) 1 + one f32 scale per 16 tokens x head.  A sequence of n_ctx tokens holds
 * ceil(n_ctx / kv_block) blocks per layer; a sliding-window layer holds at most
 * ceil(window / kv_block) + 1 blocks (the window can straddle a block boundary).
 *
 * Errors: functions returning fl_status give FL_ERR_INVALID with a message naming the bad
 * field (tp not dividing n_head, q8_0 KV with head_dim 8, ...).  Byte counts saturate at
 * UINT64_MAX rather than wrap.
 */
#ifndef FL_PLAN_H
#define FL_PLAN_H

#include "fitllm.h"
#include <stdbool.h>
#include <stdint.h>

#define FL_PLAN_MAX_LAYERS 256
#define FL_PLAN_MAX_STAGES 64  /* pipeline stages reported one by one */
#define FL_PLAN_FLASH_BQ 32    /* flash attention: query rows per tile */
#define FL_PLAN_FLASH_BK 64    /* flash attention: keys per tile */
#define FL_PLAN_FP8_GROUP 16   /* fp8 KV: tokens per f32 scale (per head) */
#define FL_PLAN_MAX_DIM ((int64_t)1 << 24)   /* n_embd, n_ff, n_head, n_head_kv, head_dim */
#define FL_PLAN_MAX_VOCAB ((int64_t)1 << 31)
#define FL_PLAN_MAX_EXPERTS 65536

typedef enum fl_plan_attn { FL_PLAN_ATTN_FLASH = 0, FL_PLAN_ATTN_NAIVE = 1 } fl_plan_attn;
typedef enum fl_plan_optim { FL_PLAN_OPTIM_ADAMW = 0, FL_PLAN_OPTIM_ADAMW8BIT = 1 } fl_plan_optim;

/* Weight roles: one per kind of tensor in a llama-family block. */
typedef enum fl_plan_role {
    FL_ROLE_TOKEN_EMBD = 0, FL_ROLE_OUTPUT, FL_ROLE_OUTPUT_NORM,
    FL_ROLE_ATTN_NORM, FL_ROLE_ATTN_Q, FL_ROLE_ATTN_K, FL_ROLE_ATTN_V, FL_ROLE_ATTN_O, FL_ROLE_QKV_BIAS,
    FL_ROLE_FFN_NORM, FL_ROLE_FFN_ROUTER, FL_ROLE_FFN_GATE, FL_ROLE_FFN_UP, FL_ROLE_FFN_DOWN,
    FL_ROLE_COUNT
} fl_plan_role;

/*
 * A model's shape: everything the planner needs, from a preset, a config.json or a GGUF header.
 * When has_weight_bytes is set (GGUF), the exact tensor bytes of the file replace the computed
 * ones: w_layer_split[l] are the 2-D+ tensors of layer l (split by tensor parallelism),
 * w_layer_repl[l] the 1-D ones (norms, biases: replicated); w_embd / w_output the token
 * embedding and output matrices; w_other every other global tensor (output norm, rope factors).
 */
typedef struct fl_model_shape {
    char name[64];
    int64_t n_vocab, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim;
    int64_t n_expert, n_expert_used; /* 0, 0 for dense models */
    int64_t sliding_window;          /* tokens; 0 = full attention everywhere */
    int64_t n_swa_layers;            /* how many layers use the window (all when 0 and window > 0) */
    int64_t n_ctx_train;
    bool tied_output;                /* output matrix shares token_embd */
    bool qkv_bias;                   /* q, k, v have f32 biases (Qwen2) */
    bool has_weight_bytes;
    uint64_t w_embd, w_output, w_other;
    uint64_t w_layer_split[FL_PLAN_MAX_LAYERS], w_layer_repl[FL_PLAN_MAX_LAYERS];
    /* of w_layer_split: attn_k + attn_v bytes (tensor parallelism keeps whole kv heads, so with
     * more ranks than kv heads each rank holds one replicated head, not 1/tp of them) */
    uint64_t w_layer_kv[FL_PLAN_MAX_LAYERS];
    int64_t n_params_file;           /* elements in the file (has_weight_bytes) */
    int32_t file_type;               /* most common 2-D tensor type in the file, -1 if unknown */
    uint64_t file_types;             /* bit t: some 2-D tensor of the file has ggml type t */
} fl_model_shape;

/* Weight types: one type for every matrix, or a llama.cpp-style mix (Q4_K_M, Q5_K_M): the
 * base type, with `more` (Q6_K) for the output matrix and for attn_v / ffn_down in the layers
 * where use_more_bits(l) = l < L/8 || l >= 7L/8 || (l - L/8) % 3 == 2.  Norms and biases stay
 * f32; the router stays f32. */
typedef struct fl_plan_wtype {
    int32_t base;  /* fl_type */
    int32_t more;  /* fl_type, or -1 for a uniform type */
    char name[16]; /* as given: "q4_K_M", "f16" */
} fl_plan_wtype;

typedef struct fl_plan_input {
    fl_plan_wtype weights;  /* ignored when weights_from_file */
    bool weights_from_file; /* use the shape's exact bytes (default when it has them) */
    int32_t kv_type;        /* fl_type: F32, F16, BF16, Q8_0, Q4_0, FP8_E4M3, FP8_E5M2 */
    int64_t n_ctx;          /* tokens per sequence */
    int64_t n_seq;          /* concurrent sequences (inference) / batch B (training) */
    int64_t n_prefill;      /* prefill chunk T, tokens per step (inference) */
    int64_t spec_tokens;    /* speculative decoding's draft tokens per sequence: n_seq x (1 + it) logits rows */
    int64_t kv_block;       /* tokens per KV block, a multiple of 16 */
    fl_plan_attn attn;
    int32_t n_threads;      /* flash-attention tiles are per thread */
    /* training */
    bool train;             /* weights f32, or f16/bf16 = mixed precision: 16-bit weights, grads
                               and activations + fp32 master weights */
    int64_t ckpt_every;     /* keep layer inputs every k layers and recompute; 0 = keep all */
    fl_plan_optim optim;
    int32_t zero_stage;     /* 0..3 over dp ranks */
    int32_t lora_rank;      /* LoRA: adapters A (r x in), B (out x r), f32, on the 7 matrices of every
                             * layer, trained with their grads and optimizer states; the base frozen
                             * (f32 weights, no grads); 0 = full training */
    bool lora_nf4;          /* with lora_rank: the frozen matrices in NF4 (QLoRA; rows not a multiple
                             * of 64 stay f32) and one f32 matrix of scratch to dequantize into */
    int64_t train_seqs;     /* sequences in a micro-batch (the attention kernels keep offsets per
                             * sequence); 0: the bound, one per token (packing puts a row's
                             * documents side by side: a row holds one or many) */
    /* parallelism and offload */
    int32_t tp, pp, sp, dp;
    int64_t offload_layers; /* the last n layers run on the host (weights + KV there) */
    bool offload_kv;        /* all KV blocks on the host */
    /* allocator slack, measured from the engine */
    uint64_t slack_bytes;
    double slack_frac;
} fl_plan_input;

/* Exact step buffers (bytes), as described at the top of this file. */
typedef struct fl_plan_buffers {
    uint64_t x, xb, out, q, k, v, att, hb, hb2, xl, router, scores, logits; /* ACT */
    uint64_t tiles, qact, batch;                                            /* SCRATCH */
    uint64_t act_total, scratch_total;
} fl_plan_buffers;

typedef struct fl_plan_device {
    uint64_t bytes[FL_MEM_COUNT];
    uint64_t total;
    int64_t layer_begin, layer_end; /* layers held by this pipeline stage */
} fl_plan_device;

typedef struct fl_plan_result {
    int32_t n_dev;                  /* pipeline stages; each stands for tp x sp x dp ranks */
    fl_plan_device dev[FL_PLAN_MAX_STAGES];
    uint64_t max_total;             /* the fullest device: what must fit */
    int32_t max_dev;
    uint64_t host[FL_MEM_COUNT];    /* offloaded layers / KV, on the host */
    uint64_t host_total;
    uint64_t weights_total;         /* whole model, unsharded */
    int64_t n_params;
    uint64_t kv_bytes_per_token;    /* whole model, one sequence, unsharded, before block rounding */
    fl_plan_buffers buf;            /* the inference step buffers of one rank */
} fl_plan_result;

/* ---- inputs ---- */

/* Defaults: weights f16 (from file when the shape has bytes), kv f16, n_ctx = n_ctx_train or
 * 4096, n_seq 1, n_prefill 512, kv_block 16, flash, 1 thread, adamw, tp = pp = sp = dp = 1. */
void fl_plan_input_default(fl_plan_input *in, const fl_model_shape *s);
/* "f16", "q8_0", "nf4", "fp8", "q4_K_M", "q5_K_M" ...; FL_ERR_INVALID for unknown names. */
fl_status fl_plan_parse_wtype(const char *name, fl_plan_wtype *out);

/* Built-in shapes with public numbers: "llama3-8b", "llama3-70b", "llama3.2-1b", "llama3.2-3b",
 * "mistral-7b", "mixtral-8x7b", "qwen2.5-7b", "tinyllama-1.1b" (case-insensitive). */
fl_status fl_plan_preset(const char *name, fl_model_shape *out);
int32_t fl_plan_n_presets(void);
const char *fl_plan_preset_name(int32_t i);
/* A Hugging Face config.json (llama / mistral / mixtral / qwen2 keys). */
fl_status fl_plan_shape_from_config(const char *path, fl_model_shape *out);
fl_status fl_plan_shape_from_config_str(const char *json, fl_model_shape *out);
/* A GGUF header: hyperparameters and exact tensor bytes (the weights are not read). */
fl_status fl_plan_shape_from_gguf(const char *path, fl_model_shape *out);

/* ---- formulas (each used by fl_plan_compute; exposed for the engine and tests) ---- */

/* Bytes of one tensor of n_rows rows of ne0 elements in type t (fp8 adds one f32 scale per
 * row, nf4 one f32 per 256 blocks); 0 for unknown types. */
uint64_t fl_plan_tensor_bytes(int32_t type, int64_t ne0, int64_t n_rows);
/* Weight type a role gets under a weight scheme in layer l (-1 for global tensors). */
int32_t fl_plan_role_type(const fl_plan_wtype *w, fl_plan_role role, int64_t layer, int64_t n_layer);
/* Whole-model weight bytes (exact bytes when from_file and the shape has them). */
uint64_t fl_plan_weights_bytes(const fl_model_shape *s, const fl_plan_wtype *w, bool from_file);
int64_t fl_plan_n_params(const fl_model_shape *s);
/* KV bytes per token (all layers, one sequence, unsharded, no block rounding). */
fl_status fl_plan_kv_bytes_per_token(const fl_model_shape *s, int32_t kv_type, uint64_t *out);
/* KV bytes of layers [l0, l1) for n_seq sequences of n_ctx tokens, block-rounded, with
 * n_head_kv split over tp and tokens over sp. */
fl_status fl_plan_kv_bytes(const fl_model_shape *s, int32_t kv_type, int64_t n_ctx, int64_t n_seq,
                           int64_t kv_block, int32_t tp, int32_t sp, int64_t l0, int64_t l1, uint64_t *out);
/* The inference step buffers (see the top of this file). weight_type decides qact (the
 * matmul workspace of that type, fl_plan_matmul_scratch). */
void fl_plan_inference_buffers(const fl_model_shape *s, int64_t n_tokens, int64_t n_ctx, int64_t n_logit_rows,
                               fl_plan_attn attn, int32_t n_threads, int32_t tp, int32_t weight_type,
                               int32_t kv_type, fl_plan_buffers *out);
/* The same for a model whose matrices have any of n_types types (a mix such as Q4_K_M): qact
 * is the largest of their workspaces. */
void fl_plan_inference_buffers_types(const fl_model_shape *s, int64_t n_tokens, int64_t n_ctx, int64_t n_logit_rows,
                                     fl_plan_attn attn, int32_t n_threads, int32_t tp, const int32_t *types,
                                     int n_types, int32_t kv_type, fl_plan_buffers *out);
/* FL_MEM_SCRATCH fl_matmul allocates for one call of M rows on [N][K] weights of `type`. */
uint64_t fl_plan_matmul_scratch(int32_t type, int64_t M, int64_t K, int32_t n_threads);
/* ACT bytes of one step with every token's logits, one thread, f16 KV and weights (convenience). */
uint64_t fl_plan_inference_act_bytes(const fl_model_shape *s, int64_t n_tokens_per_step, int64_t n_ctx,
                                     fl_plan_attn attn);
/* Training activations saved for the backward pass (ACT) and backward temporaries (SCRATCH)
 * for n_seq x n_ctx tokens over layers [l0, l1) on one rank. */
void fl_plan_train_act_bytes(const fl_model_shape *s, const fl_plan_input *in, int64_t l0, int64_t l1,
                             bool last_stage, uint64_t *act, uint64_t *scratch);

/* ---- the plan ---- */

fl_status fl_plan_compute(const fl_model_shape *s, const fl_plan_input *in, fl_plan_result *out);

/* KV pool for an engine given mem_bytes on its device: mem - everything else the plan puts on
 * the fullest device (from the shape alone; fl_engine_new sizes its pool for a GGUF with the
 * engine-exact fl_plan_engine_kv_mem, plan_engine.h).  FL_ERR_BUDGET with the plan's explanation when the weights alone (or
 * weights + step buffers) exceed mem. */
fl_status fl_plan_kv_pool_bytes(const fl_model_shape *s, const fl_plan_input *in, uint64_t mem_bytes,
                                uint64_t *kv_bytes);

/* ---- fitting ---- */
/* Largest n_ctx (a multiple of kv_block) whose plan fits in budget on every device. */
fl_status fl_plan_fit_ctx(const fl_model_shape *s, const fl_plan_input *in, uint64_t budget, int64_t *n_ctx);
/* Largest n_seq at in->n_ctx. */
fl_status fl_plan_fit_seq(const fl_model_shape *s, const fl_plan_input *in, uint64_t budget, int64_t *n_seq);
/* Least-lossy weights, then KV type, that fit (weights f16 > q8_0 > q6_K > q5_K_M > q4_K_M >
 * q4_0 > q3_K > q2_K; KV f16 > q8_0 > fp8 > q4_0).  The chosen ones are written to *out. */
fl_status fl_plan_fit_types(const fl_model_shape *s, const fl_plan_input *in, uint64_t budget, fl_plan_input *out);
/* When fitting fails (FL_ERR_BUDGET), the message says what the smallest plan needs and by
 * how much it misses. */

/* "16.00 GiB"-style text for a byte count. */
void fl_plan_fmt_bytes(uint64_t bytes, char *buf, size_t cap);

#endif
