/*
 * tokenizer.h - tokenizers built from a GGUF file's tokenizer.ggml.* metadata.
 *
 * Kinds: "llama" (SentencePiece-style: scores, byte fallback <0xXX>, leading-space rule) and
 * "gpt2" (byte-level BPE with merges and the pre-tokenizer regex of tokenizer.ggml.pre, run with
 * libpcre2).  Results match llama.cpp's llama_tokenize / llama_token_to_piece exactly.
 * The tokenizer owns copies of what it needs (charged to FL_MEM_MISC); the GGUF may be closed
 * after fl_tokenizer_new.  Immutable after creation: safe to share between threads.
 */
#ifndef FL_TOKENIZER_H
#define FL_TOKENIZER_H

#include "formats/gguf.h"
#include <stdbool.h>

typedef struct fl_tokenizer fl_tokenizer;

fl_status fl_tokenizer_new(const fl_gguf *g, fl_tokenizer **out);
void fl_tokenizer_free(fl_tokenizer *t);

int32_t fl_tokenizer_n_vocab(const fl_tokenizer *t);
int32_t fl_tokenizer_bos(const fl_tokenizer *t);   /* -1 if none */
int32_t fl_tokenizer_eos(const fl_tokenizer *t);
bool fl_tokenizer_add_bos(const fl_tokenizer *t);  /* tokenizer.ggml.add_bos_token (default per kind) */
bool fl_tokenizer_is_eog(const fl_tokenizer *t, int32_t id); /* end of generation (eos, eot, ...) */

/* Tokenize text (len bytes).  add_special: prepend BOS (and append EOS) as the model asks;
 * parse_special: recognize special/control token texts such as "<s>".  Writes up to cap ids
 * and sets *n_out to the full count (call again with a larger buffer if *n_out > cap).
 * Invalid UTF-8 returns FL_ERR_INVALID with the byte offset in the message. */
fl_status fl_tokenize(const fl_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                      int32_t *out, int64_t cap, int64_t *n_out);
/* The text of one token as it appears in output (byte-fallback tokens give their byte, "▁" ->
 * space; special tokens give "" unless render_special).  Returns the byte length written
 * (NUL-terminated, truncated to cap-1), or -1 for an invalid id. */
int32_t fl_token_to_piece(const fl_tokenizer *t, int32_t id, char *buf, int32_t cap, bool render_special);
/* Detokenize a whole sequence (llama.cpp llama_detokenize semantics: strips the leading space
 * the SPM tokenizer added when remove_leading_space).  Returns length or -1 if buf too small. */
int64_t fl_detokenize(const fl_tokenizer *t, const int32_t *ids, int64_t n, char *buf, int64_t cap,
                      bool remove_leading_space, bool render_special);

#endif
