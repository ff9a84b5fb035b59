/*
 * grammar.h - a GBNF grammar that the whole output must be a sentence of (llama.cpp's `grammar`,
 * vLLM's `guided_grammar` in its GBNF form).
 *
 * GBNF, as llama.cpp reads it (grammars/README.md there):
 *     root  ::= answer "."              # a rule: name ::= alternatives; root is the start
 *     answer ::= "yes" | "no" | num
 *     num   ::= [1-9] [0-9]{0,2}        # classes, ranges, [^...] negated, . any character
 *     list  ::= "(" ( item ("," item)* )? ")"
 * Literals "..." and classes [...] take the escapes \n \r \t \\ \" \[ \] \- \^ \/ \xHH \uHHHH
 * \UHHHHHHHH and raw UTF-8; postfix * + ? {m} {m,} {m,n} apply to the item before them (a
 * literal as a whole, a group, a class, a rule); # starts a comment.  A rule's alternatives end
 * at the end of their line, except inside parentheses and after |.  Names are letters, digits,
 * - and _.  Refused with the line and column: syntax errors, a rule used but never defined or
 * defined twice, no root, left recursion (a rule that can reach itself before consuming a
 * character, which no top-down recognizer can follow), repeats over 10000.
 *
 * The recognizer is a pushdown automaton run on every parse at once: its state is the set of
 * the parses' stacks (each stack a list of positions in the rules: where the innermost rule goes
 * on, then where each enclosing one resumes), each with a character class on top.  A character
 * moves each stack whose top admits it and expands rule references at the new top; the text is
 * a sentence where the empty stack is in the set, and it can still become one while the set is
 * not empty.  Stacks are kept sorted and unique, so the state is canonical: equal states answer
 * everything alike and have equal keys (fl_grammar_guide_key), by which the engine keeps masks.
 * Bounded: a stack of more than FL_GRAMMAR_MAX_DEPTH entries (nesting that deep), a state of
 * more than FL_GRAMMAR_MAX_STATE ints, or a mask walk past FL_GRAMMAR_WALK_BUDGET ints of states
 * (a very ambiguous grammar) is an error, not a hang that stalls every request of the engine.
 *
 * Text is UTF-8 and the grammar matches characters.  A text may end inside a character (a byte
 * token): it is allowed where some character those bytes begin could come next (the state keeps
 * the bytes, and they are part of its key), so characters the vocabulary spells only in byte
 * tokens can be produced (unlike guided_regex, whose PCRE2 cannot say it).  Bytes that begin no
 * UTF-8 character are never allowed.
 */
#ifndef FL_GRAMMAR_H
#define FL_GRAMMAR_H

#include "fitllm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FL_GRAMMAR_MAX_TEXT (256 * 1024) /* bytes of grammar accepted */
#define FL_GRAMMAR_MAX_REPEAT 10000      /* m, n of {m,n} */
#define FL_GRAMMAR_MAX_DEPTH 2048        /* entries of one stack */
#define FL_GRAMMAR_MAX_STATE (1 << 20)   /* ints of a state (stacks and their lengths) */
#define FL_GRAMMAR_WALK_BUDGET (1LL << 24) /* ints of states one mask walk's transitions may read and
                                          * write (tens of ms of work); past it the mask is an error */

typedef struct fl_grammar_guide fl_grammar_guide;

/* Compile the GBNF text (NUL-terminated); FL_ERR_INVALID naming the line, column and what is
 * wrong; FL_ERR_NOMEM. */
fl_status fl_grammar_guide_new(const char *gbnf, fl_grammar_guide **out);
void fl_grammar_guide_free(fl_grammar_guide *g);

/* 1 where the text so far followed by s[0, n) is a sentence or the prefix of one (and ends on a
 * whole character), 0 where not, -1 on an error (out of memory, the bounds above; set). */
int fl_grammar_guide_allows(fl_grammar_guide *g, const char *s, size_t n);

/* Back to the state before any text (a lazy grammar's next sentence; FL_ERR_NOMEM). */
fl_status fl_grammar_guide_reset(fl_grammar_guide *g);

/* Append s[0, n) to the text (FL_ERR_INVALID where it is not allowed). */
fl_status fl_grammar_guide_feed(fl_grammar_guide *g, const char *s, size_t n);

/* The text so far is a sentence; and nothing can follow it (the only parse is complete). */
bool fl_grammar_guide_complete(const fl_grammar_guide *g);
bool fl_grammar_guide_finished(const fl_grammar_guide *g);

/* A 128-bit key of the grammar and the state after the text so far: two texts with the same key
 * allow the same continuations. */
void fl_grammar_guide_key(const fl_grammar_guide *g, uint8_t key[16]);

/* Stacks in the state (tests, stats). */
int32_t fl_grammar_guide_n_stacks(const fl_grammar_guide *g);
/* The walk's bound (FL_GRAMMAR_WALK_BUDGET unless set; tests). */
void fl_grammar_guide_set_budget(fl_grammar_guide *g, int64_t ints);

/* Every token's text (as generated text shows it) and the tokens' order by text: what the
 * vocabulary walk reads.  Built once per model (the engine's, `fitllm run --grammar`'s). */
typedef struct fl_vocab_text {
    char *text;     /* token t: text[off[t] .. off[t + 1]) (NUL after the last) */
    int64_t *off;   /* [n + 1] */
    int32_t *order; /* [n] fl_grammar_vocab_order */
    int32_t n;
} fl_vocab_text;
/* piece(ctx, t, buf, cap): token t's text into buf (at most cap bytes), its length (<= 0: none) */
typedef int32_t (*fl_piece_fn)(void *ctx, int32_t t, char *buf, int32_t cap);
/* Bytes v holds for n tokens of text_bytes bytes in all (the plan counts them). */
static inline uint64_t fl_vocab_text_bytes(int32_t n, uint64_t text_bytes) { return ((uint64_t)n + 1) * 8 + 4 * (uint64_t)n + text_bytes + 1; }
fl_status fl_vocab_text_build(fl_vocab_text *v, int32_t n, fl_piece_fn piece, void *ctx); /* FL_ERR_NOMEM */
void fl_vocab_text_free(fl_vocab_text *v);

/* The order of tokens 0..n-1 by their text (token t: text[off[t] .. off[t + 1]), bytewise),
 * which fl_grammar_guide_mask walks.  FL_ERR_NOMEM. */
fl_status fl_grammar_vocab_order(const char *text, const int64_t *off, int32_t n, int32_t *order);

/* bits := the tokens (bit t of word t / 64) whose text may come next: fl_grammar_guide_allows
 * for every token at once, walking the tokens in order (fl_grammar_vocab_order) so that tokens
 * that begin alike share the states of their common beginning and a dead beginning rules out
 * every token that starts with it.  Empty texts are never allowed.  FL_ERR_INVALID / NOMEM as
 * allows (set). */
fl_status fl_grammar_guide_mask(fl_grammar_guide *g, const char *text, const int64_t *off, const int32_t *order,
                                int32_t n, uint64_t *bits);

#endif
