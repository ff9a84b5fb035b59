/*
 * tokenizer_impl.h - internals shared by tokenizer.c (vocab, special tokens, pieces),
 * tokenizer_spm.c (SentencePiece-style merges) and tokenizer_bpe.c (byte-level BPE with
 * libpcre2 pre-tokenizers).  Not part of the public API.
 *
 * Ownership: everything hanging off fl_tokenizer is owned by it and charged to FL_MEM_MISC.
 * Per-call working memory (symbols, heaps, output growth) is charged to FL_MEM_SCRATCH and
 * freed before the call returns, so a tokenizer can be shared by threads.
 */
#ifndef FL_TOKENIZER_IMPL_H
#define FL_TOKENIZER_IMPL_H

#include "model/tokenizer.h"
#include "core/alloc.h"
#include "core/status.h"

#include <stdint.h>

/* Token attributes (bit flags; the GGUF token_type values map onto one of the first six). */
enum {
    FL_TATTR_UNDEFINED = 0,
    FL_TATTR_UNKNOWN = 1 << 0,
    FL_TATTR_UNUSED = 1 << 1,
    FL_TATTR_NORMAL = 1 << 2,
    FL_TATTR_CONTROL = 1 << 3,
    FL_TATTR_USER_DEFINED = 1 << 4,
    FL_TATTR_BYTE = 1 << 5,
    FL_TATTR_LSTRIP = 1 << 6, /* strip whitespace left of the token when matching it in text */
    FL_TATTR_RSTRIP = 1 << 7, /* ... and right of it */
};

typedef enum fl_tok_kind { FL_TOK_SPM = 0, FL_TOK_BPE = 1 } fl_tok_kind;

/* Open-addressing hash table from byte strings to uint32 values.  Slots hold
 * (hash high 32 bits << 32 | value + 1); 0 marks an empty slot.  The keys themselves live
 * elsewhere: lookups compare through a callback that reads the key of a stored value. */
typedef struct fl_strtab {
    uint64_t *slots; /* [mask + 1] */
    uint64_t mask;
} fl_strtab;

typedef struct fl_tok_entry {
    uint32_t off;   /* into fl_tokenizer.text */
    uint32_t len;
    float score;
    uint32_t attr;  /* FL_TATTR_* */
} fl_tok_entry;

/* One BPE merge (rank = index): left and right byte strings in fl_tokenizer.merge_text. */
typedef struct fl_bpe_merge {
    uint32_t l_off, l_len, r_off, r_len;
} fl_bpe_merge;

#define FL_TOK_MAX_REGEX 8

struct fl_tokenizer {
    fl_tok_kind kind;
    int32_t n_vocab;
    fl_tok_entry *tokens; /* [n_vocab] */
    char *text;           /* all token texts back to back */
    size_t text_size;
    fl_strtab vocab_map;  /* text -> id (the last id wins for duplicate texts, as llama.cpp) */

    int32_t bos, eos, unk, eot, eom, pad, sep, nl; /* -1 when absent */
    int32_t fim[FL_FIM_COUNT];  /* fill-in-the-middle tokens (fl_fim_token), -1 when absent */
    bool add_bos, add_eos, add_space_prefix, clean_spaces, ignore_merges;
    int32_t *eog;          /* end-of-generation ids */
    int32_t n_eog;
    int32_t *special;      /* control/user-defined/unknown ids, longest text first */
    int32_t n_special;
    /* Pre-filter for the partition: bit (b0 << 8 | b1) of sp_prefix2 is set when a special
     * token text starts with bytes b0 b1 (sp_prefix1: one-byte texts); sp_lens are the
     * distinct special text lengths. */
    uint64_t *sp_prefix2; /* [1024] */
    uint64_t sp_prefix1[4];
    uint32_t *sp_lens;
    int32_t n_sp_lens;
    int32_t byte_tok[256]; /* SPM: id of <0xXX> (or the 1-byte token), -1 if none */
    bool spm_split;        /* SPM: no token has a character followed by "▁", so text may be
                              merged in chunks cut before each "▁" run (same result) */

    /* BPE */
    char pre_name[64];
    fl_bpe_merge *merges;  /* [n_merges], rank order */
    int64_t n_merges;
    char *merge_text;
    size_t merge_text_size;
    fl_strtab merge_map;   /* (left, right) -> rank */
    int n_regex;
    void *regex[FL_TOK_MAX_REGEX]; /* pcre2_code_8 * */
    void *pcre_gctx;               /* pcre2_general_context_8 * (allocations charged to MISC) */
};

/* ---- string tables (tokenizer.c) ---- */
fl_status fl_strtab_init(fl_strtab *t, uint64_t n_expected);
void fl_strtab_deinit(fl_strtab *t);
uint64_t fl_strtab_hash(const void *s, size_t n);
uint64_t fl_strtab_hash2(const void *a, size_t na, const void *b, size_t nb);
/* Insert value for a key with hash h; an existing value whose key equals replaces it. */
typedef bool (*fl_strtab_eq)(const void *ctx, uint32_t value, const void *key);
void fl_strtab_put(fl_strtab *t, uint64_t h, uint32_t value, fl_strtab_eq eq, const void *ctx, const void *key);
/* Value stored for the key, or -1. */
int64_t fl_strtab_get(const fl_strtab *t, uint64_t h, fl_strtab_eq eq, const void *ctx, const void *key);

/* Token id of a text, or -1. */
int32_t fl_tok_find(const fl_tokenizer *t, const char *s, size_t n);
static inline const char *fl_tok_text(const fl_tokenizer *t, int32_t id) { return t->text + t->tokens[id].off; }

/* Growable id vector charged to FL_MEM_SCRATCH. */
typedef struct fl_idvec {
    int32_t *v;
    int64_t n, cap;
} fl_idvec;
fl_status fl_idvec_push(fl_idvec *a, int32_t id);
void fl_idvec_free(fl_idvec *a);

/* Length in bytes of the UTF-8 sequence starting with byte c (1 for stray bytes). */
static inline int fl_utf8_len(unsigned char c) {
    static const int lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

/* ---- SPM (tokenizer_spm.c): tokenize one raw text fragment (spaces not yet escaped). ---- */
/* True if no token text has a character other than "▁" followed by "▁". */
bool fl_spm_can_split(const fl_tokenizer *t);
fl_status fl_spm_tokenize(const fl_tokenizer *t, const char *text, size_t len, bool add_prefix, fl_idvec *out);

/* ---- BPE (tokenizer_bpe.c) ---- */
/* Compile the pre-tokenizer regexes of t->pre_name; FL_ERR_UNSUPPORTED for unknown kinds. */
fl_status fl_bpe_init_pre(fl_tokenizer *t);
void fl_bpe_free_pre(fl_tokenizer *t);
/* Build merge table from "left right" strings (n lines). */
fl_status fl_bpe_set_merges(fl_tokenizer *t, const fl_gguf_str *lines, int64_t n);
fl_status fl_bpe_tokenize(const fl_tokenizer *t, const char *text, size_t len, fl_idvec *out);
/* GPT-2 byte-level decoding of a token text: appends bytes to buf (cap), returns full length. */
int64_t fl_bpe_decode_text(const char *s, size_t n, char *buf, int64_t cap);

#endif
