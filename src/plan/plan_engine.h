/*
 * plan_engine.h - the exact plan of one inference engine (fl_engine_new over a GGUF): the bytes
 * the engine will allocate, by category, computed with the engine's own size functions.
 *
 * fl_plan_compute (plan.h) plans any shape from its hyperparameters alone (presets, config.json,
 * sharding, training).  This is its engine-exact counterpart for a file that is about to be
 * served: it reads the GGUF header and tensor table (nothing is copied; the file is mapped and
 * unmapped again) and adds up exactly what fl_engine_new and the steps allocate:
 *
 *   MAPPED   the whole GGUF file (core/mmap charges the mapping), and each LoRA adapter's file
 *   (lora_paths: each adapter is opened here as the model opens it, so its parsed file and slot
 *   table count in MISC exactly, and the two forward buffers, for the largest rank and output
 *   over the adapters, in ACT: fl_lora_workspace_bytes; with adapters, the model's table of them)
 *   WEIGHTS  matrices converted at load (weights_type): fl_model_converted_bytes per matrix
 *   KV       the paged pool: floor(kv_mem / fl_kv_bytes_per_block) blocks x bytes per block
 *   ACT      fl_model_workspace_bytes(hp, max_batch_tokens + max_seqs, max_seqs)
 *            + the engine's logits [max_seqs][n_vocab] f32
 *   SCRATCH  the engine's batch arrays (17 bytes per step token + 8 per row)
 *            + the largest single matmul workspace of a step (fl_matmul allocates it per call:
 *              q8 activations for Q8_0/Q4_0 weights, else n_threads x 8 dequantized rows)
 *            + the paged-attention workspace (kept by the cache; grows by doubling from 64 KiB;
 *              with f16 KV it also holds the step's queries rounded to f16)
 *   MISC     bookkeeping, from the size functions of the modules that allocate it:
 *            static: the parsed GGUF and the tokenizer, counted exactly by building them here
 *                    (so a plan is exact only while no other thread allocates MISC)
 *                    + the chat template copy; the model's structs (fl_model_misc_bytes); the
 *                      paged cache's (fl_kv_misc_bytes: its struct, the pool's block entries
 *                      and hash buckets, the prefix cache's tokens and hashes per block, the
 *                      sequence slots (8 x max_seqs + 64), the swap directory's name); the
 *                      backend's and its sequence-id adapter's (fl_engine_model_misc_bytes);
 *                      the engine's (fl_engine_misc_bytes: its struct, the scheduler, the
 *                      request table, the poll's buffers for a step)
 *            requests: the cache's arrays for a step of max_batch_tokens (fl_kv_step_misc_bytes)
 *                    + max_seqs x (sizeof(fl_request) + the sampler's struct
 *                      + 16 x n_vocab (sampler) + 4 x n_ctx (token ids)
 *                      + the cache's token ids and block table at n_ctx (fl_kv_seq_misc_bytes)
 *                      + n_ctx x the mean piece length, rounded up to a power of two (the
 *                      streamed text)): at most max_seqs requests queued or running, each up
 *                      to a full context, n = 1
 *                    + half the largest of those growing arrays (its old copy while it doubles)
 *                    + with embeddings, max_seqs x n_embd x 4 (pooled vectors) + the poll's
 *                      copy (4 x n_embd x max_seqs rounded up to a power of two, at least 256 floats)
 *                    + with max_logprobs >= 0, max_seqs x n_ctx records of 8 x (1 + max_logprobs)
 *                      + 4 bytes (a request asking for logprobs, and for its prompt's, holds one per
 *                      token of its context, and a prompt token's record its rank) and the poll's copy of one step's records (at most
 *                      max_seqs: a step has that many logits rows), a power of two >= 256
 *                      records, and half of it again when it grew there
 *   NET      net_mem: the budget of the HTTP server's buffers, when one serves the engine
 *   GUIDE    guide_mem: the budget of the requests' output constraints (compiled grammars,
 *            regexes and JSON schemas, their states, allowed_token_ids, bad_words), an upper
 *            bound that the engine enforces (fl_engine_params.guide_mem)
 *            static also: the vocabulary's text for JSON-constrained requests (all the pieces,
 *                    their offsets, a byte flag and a float row per token)
 *                    + the mask cache of guide_masks masks (fl_mask_cache_bytes: n_vocab / 8 B
 *                    each + 32 B, one working mask, 8 B of buckets per mask, 128 B)
 *
 * Errors: FL_ERR_INVALID for bad parameters; the GGUF loader's errors; FL_ERR_BUDGET from
 * fl_plan_engine_kv_mem when the weights alone, or everything but the KV cache, exceed the
 * limit (the message says by how much).  Thread-safe; allocates only while reading the header.
 */
#ifndef FL_PLAN_ENGINE_H
#define FL_PLAN_ENGINE_H

#include "fitllm.h"
#include <stdint.h>


typedef struct fl_plan_engine_in {
    const char *model_path;
    int32_t weights_type;     /* fl_type to convert matrices to at load, -1 = keep the file's */
    int32_t kv_type;          /* fl_type of the paged KV cache */
    int32_t kv_block;         /* tokens per block (0 = 16) */
    int32_t n_ctx;            /* 0 = the model's training context, else 2048 */
    int32_t max_seqs, max_batch_tokens;
    int32_t spec_tokens;      /* speculative decoding's drafts per sequence (fl_engine_params.spec_tokens):
                               * max_seqs x (1 + spec_tokens) logits rows */
    int32_t n_threads;        /* 0 = fl_threads_get() */
    uint64_t kv_mem;          /* the KV budget handed to the cache */
    int32_t prefix_cache;     /* the cache keeps prefix-cache entries per block */
    int32_t repack;           /* the loader repacks Q4_0 / Q8_0 matrices (fl_r8_load_type) */
    int32_t max_logprobs;     /* alternatives a request may ask for (-1: no logprobs) */
    int32_t guide_masks;      /* token masks kept for regex requests' states (engine/mask_cache.h) */
    uint64_t guide_mem;       /* the output constraints' budget (fl_engine_guide_mem): GUIDE */
    uint64_t net_mem;         /* the server's buffers' budget (fl_engine_params.net_mem): NET */
    int32_t embeddings;       /* the engine takes embedding requests (fl_engine_params.embeddings) */
    const char *swap_dir;     /* the swap file's directory (fl_engine_params.swap_path; NULL: $TMPDIR) */
    const char *chat_template; /* the engine's copy in place of the file's (fl_engine_params.chat_template) */
    const char *spec_draft_model; /* speculative decoding's draft model (fl_engine_params.spec_draft_model): its file
                               * (MAPPED), its paged cache for max_seqs whole contexts (KV), its workspace and
                               * logits (ACT), its batch arrays and attention workspace (SCRATCH; the matmul
                               * workspace is the larger of the two models'), its parsed GGUF, structs and
                               * sequences (MISC); NULL: none */
    const char *const *lora_paths; /* LoRA adapters applied at run time (model/lora.h) */
    const float *lora_scales;
    int32_t n_loras;
    int32_t lora_slots;         /* run-time adapter slots (fl_engine_params.lora_slots): each reserves */
    int32_t max_lora_rank;      /* what an adapter of this rank may take (model/lora.h fl_lora_slot_caps) */
} fl_plan_engine_in;

typedef struct fl_plan_engine_out {
    uint64_t bytes[FL_MEM_COUNT];
    uint64_t total;
    int64_t kv_blocks;          /* usable blocks */
    uint64_t kv_bytes_per_block;
    uint64_t file_bytes, meta_bytes, tensor_bytes; /* file = meta + tensors (+ alignment) */
    uint64_t ws_bytes, logits_bytes, batch_bytes, matmul_scratch, attn_ws;
    uint64_t embd_bytes;        /* embeddings: the step's hidden states (ACT), their flags and owners (SCRATCH), the
                                 * pooled vectors and the poll's copy (MISC) */
    uint64_t misc_static, misc_requests;
    double avg_piece_bytes;     /* mean detokenized bytes per vocabulary token (1 without a tokenizer) */
    uint64_t vocab_text_bytes;  /* all the vocabulary's detokenized bytes (the engine's JSON table) */
    uint64_t logprob_bytes;     /* MISC of the logprob records (with max_logprobs >= 0) */
    uint64_t mask_cache_bytes;  /* MISC of the regex requests' mask cache (guide_masks) */
    uint64_t gguf_bytes, tokenizer_bytes; /* MISC of the parsed GGUF and of the tokenizer (+ chat template) */
    uint64_t lora_file_bytes, lora_misc_bytes, lora_ws_bytes; /* the adapter: MAPPED, MISC (parsed file and slot table), ACT */
    uint64_t lora_slot_file_bytes, lora_slot_misc_bytes; /* the run-time slots' reservation: MAPPED, MISC (in the above) */
    int64_t n_params;           /* elements of the matrices and norms */
    double bits_per_weight;     /* of the weights the matmuls read */
    int32_t n_vocab, n_ctx;
    uint64_t model_misc_bytes, kv_misc_bytes, kv_seq_misc_bytes, kv_step_misc_bytes; /* MISC parts: the model's structs,
                                 * the cache's, a sequence's arrays at n_ctx, a step's arrays */
    uint64_t draft_bytes[FL_MEM_COUNT]; /* speculative decoding's draft model, included in bytes[] */
} fl_plan_engine_out;

fl_status fl_plan_engine(const fl_plan_engine_in *in, fl_plan_engine_out *out);

/* The KV budget that makes the engine's plan total exactly mem_total (in->kv_mem ignored).
 * FL_ERR_BUDGET: "the weights alone (X) exceed the memory limit M by D", or the same for
 * weights + step buffers + bookkeeping + the constraints' budget. */
fl_status fl_plan_engine_kv_mem(const fl_plan_engine_in *in, uint64_t mem_total, uint64_t *kv_mem);

#endif
