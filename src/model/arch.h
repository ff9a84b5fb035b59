/*
 * arch.h - llama-family architecture names: GGUF metadata keys and tensor-name templates.
 *
 * Keys are "<arch>.<suffix>" (llama.cpp's LLM_KV names); tensors are "blk.%d.<name>.weight".
 * Only architectures listed by fl_arch_supported() load; anything else is a clear error.
 * Pure data and string formatting: no allocation, thread-safe.
 */
#ifndef FL_ARCH_H
#define FL_ARCH_H

#include <stdbool.h>
#include <stddef.h>

/* metadata key suffixes (prefixed with "<arch>.") */
#define FL_KEY_CONTEXT_LENGTH "context_length"
#define FL_KEY_EMBEDDING_LENGTH "embedding_length"
#define FL_KEY_FEED_FORWARD_LENGTH "feed_forward_length"
#define FL_KEY_BLOCK_COUNT "block_count"
#define FL_KEY_VOCAB_SIZE "vocab_size"
#define FL_KEY_HEAD_COUNT "attention.head_count"
#define FL_KEY_HEAD_COUNT_KV "attention.head_count_kv"
#define FL_KEY_KEY_LENGTH "attention.key_length"
#define FL_KEY_VALUE_LENGTH "attention.value_length"
#define FL_KEY_RMS_EPS "attention.layer_norm_rms_epsilon"
#define FL_KEY_SLIDING_WINDOW "attention.sliding_window"
#define FL_KEY_ROPE_DIM "rope.dimension_count"
#define FL_KEY_ROPE_FREQ_BASE "rope.freq_base"
#define FL_KEY_ROPE_SCALE_LINEAR "rope.scale_linear"
#define FL_KEY_ROPE_SCALING_FACTOR "rope.scaling.factor"

/* tensor names */
#define FL_TN_TOKEN_EMBD "token_embd.weight"
#define FL_TN_OUTPUT_NORM "output_norm.weight"
#define FL_TN_OUTPUT "output.weight"
#define FL_TN_ATTN_NORM "blk.%d.attn_norm.weight"
#define FL_TN_ATTN_Q "blk.%d.attn_q.weight"
#define FL_TN_ATTN_K "blk.%d.attn_k.weight"
#define FL_TN_ATTN_V "blk.%d.attn_v.weight"
#define FL_TN_ATTN_OUT "blk.%d.attn_output.weight"
#define FL_TN_FFN_NORM "blk.%d.ffn_norm.weight"
#define FL_TN_FFN_GATE "blk.%d.ffn_gate.weight"
#define FL_TN_FFN_UP "blk.%d.ffn_up.weight"
#define FL_TN_FFN_DOWN "blk.%d.ffn_down.weight"

/* true for architectures the llama forward implements ("llama"). */
bool fl_arch_supported(const char *arch);
/* "<arch>.<suffix>" into buf (truncated to cap). Returns buf. */
const char *fl_arch_key(char *buf, size_t cap, const char *arch, const char *suffix);
/* Format a per-layer tensor-name template ("blk.%d.attn_q.weight") for layer il. Returns buf. */
const char *fl_arch_tensor_name(char *buf, size_t cap, const char *tmpl, int il);

#endif
