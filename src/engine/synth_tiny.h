/*
 * synth_tiny.h - write a small llama-shaped GGUF with random F32 weights (for `fitllm demo`
 * without a model, and for engine tests that need no shared data).
 *
 * The weights are random (fixed seed: the same file every time) and the text it generates is
 * noise; it exists to exercise the engine and the memory report, never to be read.  The
 * tokenizer is copied from tokenizer_from (any llama GGUF, e.g. stories260K) when given and
 * readable, otherwise a byte-fallback SentencePiece vocabulary is generated (<unk>, <s>, </s>,
 * "▁", the 256 byte tokens <0x00>..<0xFF>).  Distinct from `fitllm synth` (quant module).
 * Temporary buffers are FL_MEM_SCRATCH and freed before return.
 */
#ifndef FL_SYNTH_TINY_H
#define FL_SYNTH_TINY_H

#include "fitllm.h"

typedef struct fl_synth_tiny_params {
    int32_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx;
    uint64_t seed;
    const char *tokenizer_from; /* GGUF to copy tokenizer.* keys from, or NULL */
} fl_synth_tiny_params;

/* n_embd 256, n_layer 4, n_head 8, n_head_kv 4, n_ff 768, n_ctx 1024, seed 42, no tokenizer file. */
void fl_synth_tiny_default(fl_synth_tiny_params *p);
/* Write the model to path.  FL_ERR_INVALID for bad shapes, I/O errors from the GGUF writer. */
fl_status fl_synth_write_tiny(const char *path, const fl_synth_tiny_params *p);

#endif
