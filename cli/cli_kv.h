/*
 * cli_kv.h - the KV cache behind `fitllm run` and `fitllm perplexity`: the paged cache
 * (kv/kv_cache.h, default) or the contiguous one (kv/kv_contig.h, the static baseline and the
 * llama.cpp-faithful path), chosen by the shared options --kv-layout, --kv-type, --block-size.
 *
 * One sequence (id 0) of up to n_ctx positions.  Paged: ceil(n_ctx / block_size) blocks plus
 * the null block, no prefix cache, RoPE parameters from the model (for --context-shift).
 * Contiguous: f16 or f32 only.  Errors: FL_ERR_INVALID with a message for an unknown layout or
 * type, or a type the layout does not store; the caches' own errors otherwise.
 */
#ifndef FL_CLI_KV_H
#define FL_CLI_KV_H

#include "kv/kv_cache.h"
#include "kv/kv_contig.h"
#include "model/llama.h"

#include <stdbool.h>

typedef struct fl_cli_kv {
    bool paged;
    int32_t type, block_size;
    fl_kv_cache *pk;
    fl_kv_contig *ck;
    fl_kv_iface iface; /* pass &iface and ctx to fl_model_forward */
    void *ctx;
} fl_cli_kv;

/* The option rows (help texts); append them to a command's fl_opt table. */
#define FL_CLI_KV_OPTS                                                                                    \
    {"kv-layout", 0, FL_OPT_STR, "L  KV cache layout: paged (default) or contiguous (static, llama.cpp-like)"}, \
    {"kv-type", 0, FL_OPT_STR, "T  KV element type: f32 f16 (default) bf16 fp8_e4m3 fp8_e5m2 q8_0 q4_0"},     \
    {"block-size", 0, FL_OPT_INT, "N  tokens per KV block (paged; default 16)"}

/* layout/type may be NULL (defaults), block_size <= 0 -> 16. */
fl_status fl_cli_kv_new(const fl_hparams *hp, const char *layout, const char *type, int64_t block_size, int32_t n_ctx,
                        fl_cli_kv *out);
void fl_cli_kv_reset(fl_cli_kv *kv); /* empty sequence 0 */
void fl_cli_kv_free(fl_cli_kv *kv);  /* zeroed or half-built ok */
/* KV bytes of one token (all layers, K and V, scales included). */
double fl_cli_kv_bytes_per_token(const fl_cli_kv *kv, const fl_hparams *hp);

#endif
