/*
 * triggers.h - the triggers of a lazy grammar (llama.cpp's grammar_lazy and grammar_triggers):
 * the output is free until one of them fires, and from the point it names on it follows the
 * grammar (engine.c feeds the grammar that text, then masks every token after it).
 *   - FL_TRIGGER_TOKEN: the token `token` is generated; the grammar takes over at its first byte;
 *   - FL_TRIGGER_WORD: the text `value` appears in the output; from its first byte;
 *   - FL_TRIGGER_PATTERN: the PCRE2 pattern `value` matches somewhere in the output; from the
 *     start of its first capturing group where that matched, else of the match;
 *   - FL_TRIGGER_PATTERN_FULL: the pattern matches the whole output; likewise.
 * The first trigger (in the order given) that fires, at its first match, wins.  A word is looked
 * for only where the last token's bytes can complete it; patterns rescan the output, as
 * llama.cpp's do.  Memory: FL_MEM_GUIDE (the copies, PCRE2's code and match data).
 */
#ifndef FL_TRIGGERS_H
#define FL_TRIGGERS_H

#include "fitllm.h"

#include <stddef.h>
#include <stdint.h>

#define FL_MAX_TRIGGERS 16        /* triggers of one request */
#define FL_TRIGGER_MAX_BYTES 1024 /* the longest word or pattern */

typedef struct fl_triggers fl_triggers;

/* Copy and compile t[0, n) (FL_ERR_INVALID naming the trigger and, for a pattern, PCRE2's message
 * and offset; FL_ERR_NOMEM).  after_think (fl_request_params.lazy_after_think): 0 the triggers
 * look at the whole output; 1 at what follows the first </think> of an output that starts (after
 * spaces) with <think>, else at all of it; 2 at what follows the first </think>.  Where they look
 * past the reasoning, a pattern's text starts at the answer (^ and a full pattern anchor there). */
fl_status fl_triggers_new(const fl_grammar_trigger *t, int32_t n, int32_t n_vocab, int32_t after_think, fl_triggers **out);
void fl_triggers_free(fl_triggers *x);
/* The output so far is text[0, n), its last token tok (the last `last` bytes); called once per
 * token as the output grows (the reasoning's end is looked for in the new bytes only): the offset
 * from which the grammar takes over, -1 while no trigger fires, -2 on an error (set). */
int64_t fl_triggers_find(fl_triggers *x, const char *text, size_t n, size_t last, int32_t tok);
/* The output's text starts again (a lazy grammar's sentence ended, the output is free again; its
 * reasoning is over): fl_triggers_find's next text is what follows. */
void fl_triggers_rearm(fl_triggers *x);

#endif
