/*
 * tokenizer.h - tokenizers built from a GGUF file's tokenizer.ggml.* metadata.
 *
 * Kinds: "llama" (SentencePiece-style: scores, byte fallback <0xXX>, leading-space rule) and
 * "gpt2" (byte-level BPE with merges and the pre-tokenizer regex of tokenizer.ggml.pre, run with
 * libpcre2).  Results match llama.cpp's llama_tokenize / llama_token_to_piece exactly.
 * The tokenizer owns copies of what it needs (charged to FL_MEM_MISC); the GGUF may be closed
 * after fl_tokenizer_new.  Immutable after creation: safe to share between threads.  Each call
 * allocates its working memory from FL_MEM_SCRATCH and releases it before returning.
 *
 * Pre-tokenizers (tokenizer.ggml.pre): default, llama3 / llama-bpe (and llama.cpp's aliases),
 * dbrx, smaug-bpe, deepseek-llm, deepseek-coder, falcon, mpt, olmo, starcoder, refact, gpt-2
 * (and aliases), qwen2.  Checked against llama.cpp's vectors for all but dbrx/smaug/qwen2.
 * Special tokens: control, user-defined and unknown tokens are cut out of the text before the
 * merges, longest first; with parse_special=false only user-defined ones are (as llama.cpp).
 * End of generation: eos, eot, eom and tokens with texts like <|eot_id|>, <|im_end|>, <|end|>.
 *
 * Errors of fl_tokenizer_new: FL_ERR_FORMAT for missing or malformed tokenizer.ggml.* keys
 * (model, tokens, scores, token_type, merges), FL_ERR_UNSUPPORTED for other tokenizer models
 * (bert, t5, ...) and unknown pre-tokenizers, FL_ERR_NOMEM; the message names the key.
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
/* The two files' vocabularies are one: as many tokens, each of the same text (a draft model's for
 * speculative decoding must be its target's). */
bool fl_gguf_vocab_equal(const fl_gguf *a, const fl_gguf *b);
bool fl_tokenizer_add_bos(const fl_tokenizer *t);  /* tokenizer.ggml.add_bos_token (default per kind) */
bool fl_tokenizer_is_eog(const fl_tokenizer *t, int32_t id); /* end of generation (eos, eot, ...) */

/* Tokenize text (len bytes).  add_special: prepend BOS (and append EOS) as the model asks;
 * parse_special: recognize special/control token texts such as "<s>".  Writes up to cap ids
 * and sets *n_out to the full count (call again with a larger buffer if *n_out > cap).
 * Invalid UTF-8 returns FL_ERR_INVALID with the byte offset in the message. */
fl_status fl_tokenize(const fl_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                      int32_t *out, int64_t cap, int64_t *n_out);
/* The text of one token as it appears in output (byte-fallback tokens give their byte, "▁" ->
 * space; control/unknown tokens give "" unless render_special, user-defined tokens always give
 * their text, unused ones ""; BPE tokens are mapped back through GPT-2's byte table).  Returns the byte length written
 * (NUL-terminated, truncated to cap-1), or -1 for an invalid id. */
int32_t fl_token_to_piece(const fl_tokenizer *t, int32_t id, char *buf, int32_t cap, bool render_special);
/* Detokenize a whole sequence (llama.cpp llama_detokenize semantics: strips the leading space
 * the SPM tokenizer added when remove_leading_space).  Returns length or -1 if buf too small.
 * Precisely: the pieces of fl_token_to_piece concatenated; with remove_leading_space, on vocabs
 * that add a space prefix (SPM), one leading space is dropped from the first token after an
 * optional leading BOS (which renders as usual: "" unless render_special), so
 * detokenize(tokenize(x)) == x.  BPE vocabs with
 * llama.cpp's clean_spaces (gpt-2, llama-bpe, falcon, ...) then drop the space before ? ! . ,
 * and in " 's", " 'm", " 're", " 've", " ' ".  An id out of range gives -1 (FL_ERR_INVALID). */
int64_t fl_detokenize(const fl_tokenizer *t, const int32_t *ids, int64_t n, char *buf, int64_t cap,
                      bool remove_leading_space, bool render_special);

/* ---- additions (tokenizer part of issue 3) ---- */

/* Byte-level BPE tokenizer from GPT-2 style files: encoder.json (token text in the GPT-2
 * byte-to-unicode mapping -> id, ids 0..n-1) and a merges file ("left right" per line in rank
 * order, optional "#version" first line).  pre_kind is a tokenizer.ggml.pre value such as
 * "llama-bpe" or "gpt-2".  No special tokens are defined (bos/eos = -1).  FL_ERR_IO /
 * FL_ERR_FORMAT / FL_ERR_UNSUPPORTED (unknown pre_kind) with a message on failure. */
fl_status fl_tokenizer_new_bpe_files(const char *encoder_json_path, const char *merges_path, const char *pre_kind,
                                     fl_tokenizer **out);

int32_t fl_tokenizer_eot(const fl_tokenizer *t);   /* -1 if none */
/* Fill-in-the-middle tokens (code models: /infill): prefix, suffix, middle, pad, repository name,
 * file separator.  From tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id (the older
 * prefix/suffix/middle_token_id for the first three), else from a control or user-defined token
 * whose text is one the model families use: "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
 * "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>" and the like.  -1 if none. */
typedef enum fl_fim_token { FL_FIM_PRE, FL_FIM_SUF, FL_FIM_MID, FL_FIM_PAD, FL_FIM_REP, FL_FIM_SEP, FL_FIM_COUNT } fl_fim_token;
int32_t fl_tokenizer_fim(const fl_tokenizer *t, fl_fim_token which);
int32_t fl_tokenizer_unk(const fl_tokenizer *t);   /* -1 if none */
bool fl_tokenizer_add_eos(const fl_tokenizer *t);  /* tokenizer.ggml.add_eos_token */
const char *fl_tokenizer_kind(const fl_tokenizer *t); /* "llama" or "gpt2" */
const char *fl_tokenizer_pre(const fl_tokenizer *t);  /* pre-tokenizer name ("default" for llama) */
bool fl_tokenizer_is_control(const fl_tokenizer *t, int32_t id);
/* Raw vocabulary text of a token (not NUL-terminated; borrowed): its length, or -1 for a bad id. */
int32_t fl_tokenizer_token_text(const fl_tokenizer *t, int32_t id, const char **text);
float fl_tokenizer_score(const fl_tokenizer *t, int32_t id);
/* Id of the token whose vocabulary text is exactly text[0..len), or -1. */
int32_t fl_tokenizer_find(const fl_tokenizer *t, const char *text, size_t len);
/* Upper bound of any piece length (bytes, without the NUL): size buffers with it + 1. */
int32_t fl_tokenizer_max_piece(const fl_tokenizer *t);

/* For streaming output: the length of the longest prefix of s[0..n) that does not end inside
 * an incomplete UTF-8 sequence (byte-fallback tokens can split a character across pieces).
 * Print that many bytes and keep the rest for the next piece. */
size_t fl_utf8_complete_prefix(const char *s, size_t n);

#endif
