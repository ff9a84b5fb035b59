/*
 * regex_guide.h - a regular expression that the whole output must match (vLLM's guided_regex).
 *
 * The pattern is PCRE2 syntax in UTF mode (a dot or a class is one character), anchored at both
 * ends: the output as a whole is one match (so a leading ^ and a trailing $ are dropped: they
 * say that already, and an anchor would keep the DFA state from being carried).  A $ elsewhere
 * is the end of the output only (PCRE2_DOLLAR_ENDONLY), never the place before a final newline:
 * with that, PCRE2's partial matching took "\n" for the start of a match of "$".  A check asks PCRE2 whether a text is a match or
 * can still become one (a hard partial match).  Where the text is scanned whole: on the pattern
 * wrapped as (?:PATTERN)\z, JIT-compiled, with bounds on its backtracking and its memory (past
 * them the check is an error, not a hang); where that wrapping does not compile (a pattern that
 * ends inside a comment or an open \Q), on PCRE2's DFA (pcre2_dfa_match), which follows every
 * alternative at once.
 * Backreferences, recursion, subroutine calls and conditions are refused when the pattern is
 * compiled, as the DFA runs none of them.
 *
 * The guide holds the text generated so far.  A candidate continuation is allowed where the
 * text plus it is a match or the prefix of one, and it ends on a whole UTF-8 character: a token
 * that ends inside a multi-byte character is not offered (whether some completion of it could
 * match is not asked), so characters that the vocabulary spells only in byte tokens cannot be
 * produced.  Where the pattern has no assertion (lookaround, \b, anchor) and nothing atomic
 * (atomic groups, possessive quantifiers), a check reads only the candidate's bytes: the DFA's
 * state after the text so far (on the wrapped pattern where it compiled) is carried from token
 * to token (PCRE2_DFA_RESTART) and copied per candidate; else,
 * and from the point where a pattern keeps more states alive than the carried workspace holds
 * (about 40), each check scans the whole text again, so a step costs about (tokens checked) x
 * (text length): see docs/SERVER.md.
 */
#ifndef FL_REGEX_GUIDE_H
#define FL_REGEX_GUIDE_H

#include "fitllm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FL_REGEX_MAX_PATTERN 4096 /* bytes of pattern accepted */
#define FL_REGEX_STATE_INTS 256   /* a carried DFA state: PCRE2's workspace (about 40 live states) */

typedef struct fl_regex_guide fl_regex_guide;

/* A leading ^ and a trailing $ (unescaped, outside \Q..\E) of p[0, n) say what a whole match
 * means already: the body between them is [*b, *e). */
void fl_regex_strip_anchors(const char *p, size_t n, size_t *b, size_t *e);

/* Compile pattern; FL_ERR_INVALID (naming the offset and PCRE2's message) for a pattern that
 * does not compile, one the DFA could not run, or one longer than FL_REGEX_MAX_PATTERN. */
fl_status fl_regex_guide_new(const char *pattern, fl_regex_guide **out);
void fl_regex_guide_free(fl_regex_guide *g);

/* 1 where the text so far followed by s[0, n) is a match or can still become one (and ends on
 * a whole character), 0 where not, -1 on an error (out of memory, the backtracking bound, a
 * DFA limit; set). */
int fl_regex_guide_allows(fl_regex_guide *g, const char *s, size_t n);

/* Append s[0, n) to the text (the caller has checked fl_regex_guide_allows). */
fl_status fl_regex_guide_feed(fl_regex_guide *g, const char *s, size_t n);

/* The text so far is a match of the whole pattern. */
bool fl_regex_guide_complete(fl_regex_guide *g);

/* Bytes of text so far. */
size_t fl_regex_guide_len(const fl_regex_guide *g);

/* The checks run on PCRE2's DFA (the wrapped form did not compile). */
bool fl_regex_guide_on_dfa(const fl_regex_guide *g);

/* The checks of allows read only the candidate's bytes, from the DFA state carried over the
 * text so far (see above); set_carry turns that off (or back on, before any text) for tests. */
bool fl_regex_guide_carries(const fl_regex_guide *g);
void fl_regex_guide_set_carry(fl_regex_guide *g, bool on);

/* A 128-bit key for every answer the guide gives from here on: the pattern and the carried DFA
 * state after the text so far (two texts with the same key allow the same continuations; the
 * engine keeps each key's token mask, so a state met again is not checked again).  false where
 * the checks do not run from the carried state (then there is no such key). */
bool fl_regex_guide_key(const fl_regex_guide *g, uint8_t key[16]);

/* ---- JSON Schema "pattern": a string value (decoded) is one match of a pattern ----
 * The pattern is taken whole, as outlines and llama.cpp do (a leading ^ and a trailing $ are
 * dropped: they say the same), not searched for as the JSON Schema text says.  It runs on
 * PCRE2's DFA a character at a time from a state the caller keeps (json_fsm.h), so a pattern
 * with other assertions, atomic groups, possessive quantifiers, backreferences, recursion or
 * conditions is refused when compiled; U+10FFFF, the end mark, is no character of such a
 * string. */
typedef struct fl_regex_str fl_regex_str;
typedef struct fl_regex_state {
    int32_t rs;                    /* 0 no character yet (fl_regex_state_init), 1 alive, 2 dead */
    int ws[FL_REGEX_STATE_INTS];   /* the DFA's workspace after the characters so far */
} fl_regex_state;
static inline void fl_regex_state_init(fl_regex_state *s) { s->rs = 0; }

/* FL_ERR_INVALID naming the offset in pattern and what is wrong or unsupported; FL_ERR_NOMEM. */
fl_status fl_regex_str_new(const char *pattern, fl_regex_str **out);
void fl_regex_str_free(fl_regex_str *x);
/* One character (its UTF-8 bytes ch[0, n)) after the state s: 1 the string can still become a
 * match (s moves on), 0 it cannot (s is dead), -1 an error (the DFA's workspace; set). */
int fl_regex_str_step(fl_regex_str *x, fl_regex_state *s, const char *ch, size_t n);
/* The characters so far are a match (s unchanged). */
bool fl_regex_str_complete(fl_regex_str *x, const fl_regex_state *s);

#endif
