/*
 * llama.h - llama-architecture models: hyperparameters, weights, and the batched forward.
 *
 * Ownership.  fl_model_load() maps the GGUF file (charged FL_MEM_MAPPED by core/mmap) and
 * builds weight descriptors (fl_tensor) that are zero-copy views into the mapping for every
 * type fl_matmul supports.  Weights converted at load time (fl_model_params.weights_type, the
 * place where the quant module's fl_quantize_tensor() plugs in) would be owned by the model and
 * charged to FL_MEM_WEIGHTS (one block; see fl_model_converted_bytes;
 * a temporary f32 buffer of 64 rows is FL_MEM_SCRATCH during load).  The model struct itself and its layer table are FL_MEM_MISC.
 * fl_model_free() releases everything, the workspace included.
 *
 * Errors.  Load fails with FL_ERR_UNSUPPORTED for an architecture other than "llama" or a
 * weight type fl_matmul_supported() refuses (the message names the tensor and the type),
 * FL_ERR_FORMAT for missing tensors or shapes that disagree with the metadata, a layer's tensor
 * past block_count, a NaN / infinite / negative rms epsilon or rope base, or a rope dimension of
 * 0, FL_ERR_UNSUPPORTED for a tensor the model would not use (a bias, say: as in llama.cpp, every
 * tensor of the file must be bound; rope_freqs.weight only gets a warning that it is not
 * applied), and whatever gguf/mmap report for unreadable files.  Nothing is leaked on failure.
 *
 * Forward.  fl_model_forward() runs one step over a flat batch (model/batch.h): any mix of
 * prefills and single-token decodes of several sequences.  Every weight matrix is applied once
 * per step with M = n_tokens rows.  K/V go through the kv interface (kv/kv_iface.h), which also
 * does the attention, so the contiguous and the paged caches are interchangeable.  Logits are
 * written only for tokens with batch->logits[i] != 0 (or the last token when logits == NULL),
 * in batch order: logits_out[r][n_vocab] for the r-th such token.
 *
 * Workspace.  Activations live in one block allocated by fl_model_workspace_new() (FL_MEM_ACT)
 * and reused every step: the forward itself never allocates.  Its size is exactly
 * fl_model_workspace_bytes(hp, max_tokens, max_logit_rows), the sum of these buffers, each
 * rounded up to a multiple of 64 bytes (T = max_tokens, R = max_logit_rows, floats):
 *     x     [T][n_embd]                     residual stream
 *     xn    [T][n_embd]                     normed input of the current sub-layer
 *     q     [T][n_head_local * head_dim]    queries (roped in place)
 *     k     [T][n_head_kv_local * head_dim] keys (roped in place)
 *     v     [T][n_head_kv_local * head_dim] values
 *     att   [T][n_head_local * head_dim]    attention output (input of wo)
 *     gate  [T][n_ff_local]                 ffn gate projection, then swiglu(gate, up)
 *     up    [T][n_ff_local]                 ffn up projection
 *     out   [T][n_embd]                     wo / w2 output before the residual add
 *     xl    [R][n_embd]                     final-normed rows that get logits
 * and, with LoRA adapters (fl_model_params.lora_paths), fl_lora_workspace_bytes(rank_max,
 * n_max, T) more, the largest rank and output over the adapters: x A^T and its rows of one
 * adapter [T][rank_max] each, and their product with B^T [T][n_max].
 * A batch with more than T tokens or more than R logit rows is refused (FL_ERR_INVALID).
 *
 * Tensor parallelism.  The forward reads the local head counts / ffn width (n_head_local,
 * n_head_kv_local, n_ff_local), which a sharded load reduces; after the wo and w2 matmuls it
 * calls params.allreduce (if not NULL) on out [n_tokens][n_embd] before the residual add.
 *
 * Thread safety: a model may be shared read-only, but fl_model_forward uses the model's single
 * workspace: one forward at a time per model.  Kernels thread internally (core/threads.h).
 */
#ifndef FL_LLAMA_H
#define FL_LLAMA_H

#include "core/tensor.h"
#include "formats/gguf.h"
#include "kv/kv_iface.h"
#include "model/batch.h"

#include <stdbool.h>

typedef struct fl_hparams {
    char arch[32];
    int32_t n_vocab;
    int32_t n_ctx_train;  /* <arch>.context_length */
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;    /* attention.head_count_kv (default n_head): GQA / MQA */
    int32_t head_dim;     /* attention.key_length (default n_embd / n_head) */
    int32_t n_ff;
    int32_t rope_dim;     /* rope.dimension_count (default head_dim) */
    float rope_freq_base; /* rope.freq_base (default 10000) */
    float rope_freq_scale; /* 1 / rope.scaling.factor (default 1) */
    float rms_eps;        /* attention.layer_norm_rms_epsilon (default 1e-5) */
    int32_t n_swa;        /* attention.sliding_window, 0 = none */
    bool tied_output;     /* no output.weight: logits use token_embd */
    /* what this process computes (== the full counts unless a sharded load reduced them) */
    int32_t n_head_local;
    int32_t n_head_kv_local;
    int32_t n_ff_local;
} fl_hparams;

/* In-place sum across tensor-parallel ranks of x [n] (NULL for a single process). */
typedef void (*fl_allreduce_fn)(void *ud, float *x, int64_t n);

/* [dist/tp] Fill x [n][n_embd] with the embeddings of tokens[0..n) (vocab-parallel lookup). */
typedef void (*fl_embed_fn)(void *ud, const int32_t *tokens, int64_t n, float *x);

typedef struct fl_model_params {
    int32_t weights_type;      /* -1: keep file types; else convert matrices at load (fl_quantize_tensor) */
    fl_allreduce_fn allreduce; /* called after attn_output and ffn_down matmuls; NULL = none */
    void *allreduce_ud;
    fl_embed_fn embed;         /* [dist/tp] replaces the token_embd lookup when not NULL */
    void *embed_ud;
    bool no_mmap;              /* read the file into anonymous (huge-page) memory, not mmap it */
    const char *const *lora_paths; /* n_loras LoRA adapters applied at run time (model/lora.h): each token
                                * of a batch picks one (fl_batch.lora) or none */
    const float *lora_scales;  /* their scales (NULL: 1 each; llama.cpp's --lora-scaled) */
    int32_t n_loras;
    int32_t lora_default;      /* the adapter of a batch without fl_batch.lora (0: none; run and
                                * perplexity --lora: 1) */
    int32_t lora_slots;        /* more adapter slots after the n_loras files, empty at load, for
                                * fl_model_lora_put (the engine's run-time loading); n_loras +
                                * lora_slots <= FL_MAX_LORAS.  After load, params.n_loras counts them */
    int32_t lora_slot_rank;    /* with lora_slots: the largest rank put in a slot (the workspace's) */
    bool repack;               /* rewrite the matrices in place in groups of rows where fl_r8_load_type says (Q4_0 / Q8_0
                                * as Q4_0_R8 / Q8_0_R8 on AVX2 and AVX-512, the K-quants, Q4_1, Q5_0, Q5_1 and IQ4_NL as
                                * their R16 types on AVX-512 without AMX; kernels/matmul.h); off by default (the engine turns it on unless asked not to;
                                * tp / pp slice rows, so they keep it off) */
} fl_model_params;

typedef struct fl_layer {
    fl_tensor attn_norm, wq, wk, wv, wo;
    fl_tensor ffn_norm, w1 /* gate */, w3 /* up */, w2 /* down */;
} fl_layer;

typedef struct fl_model fl_model;

fl_model_params fl_model_default_params(void);

/* Load a llama GGUF. On failure *out is NULL and the error says why (see header comment). */
fl_status fl_model_load(const char *path, const fl_model_params *params, fl_model **out);
void fl_model_free(fl_model *m);

const fl_hparams *fl_model_hparams(const fl_model *m);
/* The parsed GGUF (for the tokenizer). Borrowed: valid until fl_model_free. */
const fl_gguf *fl_model_gguf(const fl_model *m);
/* Weight views (borrowed). */
const fl_tensor *fl_model_tok_embd(const fl_model *m);
const fl_tensor *fl_model_output(const fl_model *m); /* token_embd when tied */
const fl_layer *fl_model_layer(const fl_model *m, int32_t il);

/* FL_MEM_WEIGHTS bytes that load-time conversion to wt (params.weights_type) allocates for one
 * [ne1][ne0] matrix of src_type: 0 when it is kept (wt < 0, same type, or ne0 not a multiple of
 * wt's block), else fl_quantize_size rounded up to 64.  Matrices are token_embd, output (when
 * not tied) and the seven per-layer projections; norms stay f32. */
size_t fl_model_converted_bytes(int32_t wt, int32_t src_type, int64_t ne0, int64_t ne1);

/* Bytes converted at load (FL_MEM_WEIGHTS, 0 when none); *src_bytes: the same matrices' bytes
 * in the file, *n_elems: their elements (bits per weight = 8 x bytes / n_elems). */
size_t fl_model_converted(const fl_model *m, size_t *src_bytes, int64_t *n_elems);

/* Read and check hyperparameters from a GGUF (used by load; the planner may call it too). */
fl_status fl_hparams_from_gguf(const fl_gguf *g, fl_hparams *hp);
/* Every tensor of g is one an n_layer model of arch binds (rope_freqs.weight: a warning that
 * it is not applied); else FL_ERR_FORMAT (a layer past n_layer) or FL_ERR_UNSUPPORTED naming the
 * tensor.  Used by load and by the trainer's loader. */
fl_status fl_model_check_tensor_names(const fl_gguf *g, const char *arch, int32_t n_layer);

/* Exact FL_MEM_ACT bytes of a workspace for max_tokens tokens and max_logit_rows logit rows. */
size_t fl_model_workspace_bytes(const fl_hparams *hp, int32_t max_tokens, int32_t max_logit_rows);
/* MISC bytes of the model's own structs (fl_model and its layer table; the parsed GGUF and the
 * LoRA adapters apart): the engine-exact plan counts them. */
size_t fl_model_misc_bytes(const fl_hparams *hp);
/* (Re)allocate the model's workspace. FL_ERR_INVALID for sizes < 1, FL_ERR_BUDGET / NOMEM. */
fl_status fl_model_workspace_new(fl_model *m, int32_t max_tokens, int32_t max_logit_rows);
void fl_model_workspace_free(fl_model *m);

/* One forward step (see header comment).  Returns FL_OK; FL_ERR_INVALID for a malformed batch
 * (token id out of range, negative position, unordered sequence, too many tokens / logit rows,
 * no workspace); the kv prepare's status (FL_NO_KV_SPACE is soft: nothing was changed). */
fl_status fl_model_forward(fl_model *m, const fl_batch *batch, const fl_kv_iface *kv, void *kv_ctx,
                           float *logits_out);

/* Put adapter l (fl_lora_open'ed for this model; NULL: none) in adapter slot k (1..params.n_loras)
 * and give back what was there in *old (the caller's to free).  The caller makes sure that no
 * batch in flight applies slot k.  FL_ERR_INVALID when l's rank or outputs exceed the
 * workspace's (lora_slot_rank). */
struct fl_lora;
fl_status fl_model_lora_put(fl_model *m, int32_t k, struct fl_lora *l, struct fl_lora **old);

#endif
