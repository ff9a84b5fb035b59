/*
 * lora.h - LoRA adapters applied at run time, unmerged (llama.cpp's --lora, vLLM's LoRA
 * modules): each adapted matrix computes y = W x + s B (A x), W the base weights in whatever
 * type they are (quantized included), A (r x K) and B (N x r) the adapter, s = scale x alpha / r.
 *
 * Two files are read:
 *   - fitllm's (`fitllm train --lora` writes OUT.lora.gguf): keys lora.rank (u32), lora.alpha
 *     (f32); tensors lora.<name>.a [K, r, n_layer] and lora.<name>.b [r, N, n_layer], all layers
 *     stacked, <name> attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down;
 *   - llama.cpp's (convert_lora_to_gguf.py): general.type "adapter", adapter.type "lora",
 *     adapter.lora.alpha (f32; 0 or absent: s = scale); tensors blk.<i>.<name>.weight.lora_a
 *     [K, r] and .lora_b [r, N], any subset of layers and matrices, r per pair.
 * The adapter's GGUF is mapped like a model file (FL_MEM_MAPPED; --no-mmap: read into memory)
 * and its tensors are used in place: F32, F16 or BF16 (the types the matmul takes at any row
 * length).  The slot table is FL_MEM_MISC.  The forward's two extra buffers (x A^T and its
 * product with B^T) are part of the model's workspace: fl_lora_workspace_bytes.
 *
 * Errors: FL_ERR_FORMAT for a file that is not an adapter, a shape that does not fit the base
 * model (the message names the tensor), an A without its B, or a tensor the adapter would apply
 * to nothing (an adapter of the embeddings, say, which fitllm does not apply: refused rather than
 * silently ignored); FL_ERR_UNSUPPORTED for another tensor type.  Nothing leaks on failure.
 */
#ifndef FL_LORA_H
#define FL_LORA_H

#include "core/tensor.h"
#include "formats/gguf.h"
#include "model/llama.h"

#include <stdbool.h>
#include <stddef.h>

#define FL_MAX_LORAS 16 /* adapters one model holds */

/* The adapted matrices of a layer, in fl_layer's order: wq, wk, wv, wo, w1 (gate), w3 (up), w2 (down). */
enum { FL_LORA_Q, FL_LORA_K, FL_LORA_V, FL_LORA_O, FL_LORA_GATE, FL_LORA_UP, FL_LORA_DOWN, FL_LORA_TARGETS };

typedef struct fl_lora_slot {
    fl_tensor a;  /* r rows of K (a.data NULL: this matrix has no adapter) */
    fl_tensor b;  /* N rows of r */
    float scale;  /* s: the user's scale x alpha / r */
    float unit;   /* alpha / r (1 without alpha): s at a scale of 1 (a batch's adapter mix scales this) */
} fl_lora_slot;

typedef struct fl_lora {
    fl_gguf *g;           /* the mapped adapter file */
    int32_t n_layer;
    int32_t rank_max;     /* the largest r */
    int64_t n_max;        /* the largest N of an adapted matrix */
    int32_t n_pairs;      /* adapted matrices (over all layers) */
    fl_lora_slot *slots;  /* [n_layer][FL_LORA_TARGETS], FL_MEM_MISC */
} fl_lora;

/* Open the adapter at path for a base model of hyperparameters hp, scaled by scale. */
fl_status fl_lora_open(const char *path, const fl_hparams *hp, float scale, bool no_mmap, fl_lora **out);
void fl_lora_free(fl_lora *l);
/* Layer il's slot k, or NULL when that matrix has no adapter. */
static inline const fl_lora_slot *fl_lora_get(const fl_lora *l, int32_t il, int k) {
    const fl_lora_slot *s = &l->slots[(size_t)il * FL_LORA_TARGETS + (size_t)k];
    return s->a.data ? s : NULL;
}
/* The forward's buffers for max_tokens rows: x A^T and its rows of one adapter, scaled,
 * [T][rank_max] each, and their product with B^T [T][n_max] floats, each rounded up to 64 bytes
 * (0 without an adapter). */
size_t fl_lora_workspace_bytes(int32_t rank_max, int64_t n_max, int32_t max_tokens);
/* The MISC bytes of an open adapter's slot table (the plan counts them). */
size_t fl_lora_table_bytes(int32_t n_layer);
/* The MISC bytes an open adapter holds: its slot table and its file's parsed index. */
size_t fl_lora_misc_bytes(const fl_lora *l);
/* The widest output of a matrix an adapter may adapt (the forward's buffer for a slot). */
int64_t fl_lora_n_bound(const fl_hparams *hp);

/* A slot for an adapter loaded at run time (fl_engine_lora_load) reserves what the largest
 * adapter of rank <= rank takes: its file (every matrix of every layer, f32, and a header of
 * FL_LORA_SLOT_HEADER bytes + FL_LORA_SLOT_PER_TENSOR per tensor: names, shapes, alignment)
 * mapped, file_cap; its index (FL_LORA_SLOT_KEYS keys, FL_LORA_SLOT_ITEMS array elements) and
 * table, misc_cap.  The plan counts both per slot; a larger adapter is refused. */
#define FL_LORA_SLOT_HEADER 4096
#define FL_LORA_SLOT_PER_TENSOR 256
#define FL_LORA_SLOT_KEYS 64
#define FL_LORA_SLOT_ITEMS 256
void fl_lora_slot_caps(const fl_hparams *hp, int32_t rank, size_t *file_cap, size_t *misc_cap);

#endif
