/*
 * regex_gbnf.h - a regular expression of the common subset rewritten as a GBNF grammar, so that
 * guided_regex runs on the grammar's recognizer (grammar.h): canonical states (masks kept for
 * counted repeats too), byte tokens offered, no rescans.
 *
 * The subset (PCRE2 syntax as regex_guide.c compiles it: UTF mode, no other option): literals
 * and escaped punctuation; \n \r \t \f \e \a \xHH \x{H..}; . (any character but \n); \d \D \w
 * \W \s \S (ASCII, as PCRE2 without UCP); classes [...] / [^...] of characters, ranges and \d
 * \w \s (\b a backspace); groups ( ), (?: ), (?<name> ), (?P<name> ); alternation; quantifiers
 * ? * + {m} {m,} {m,n} up to 10000, lazy or not (the same whole matches).  A leading ^ and a
 * trailing $ are dropped first (fl_regex_strip_anchors).  Anything else (anchors elsewhere, \b,
 * lookaround, atomic groups, possessive quantifiers, backreferences, \p, \Q..\E, \h \v \R \N,
 * POSIX classes, inline options, comments, a { that is no quantifier) is FL_ERR_UNSUPPORTED, and
 * the pattern stays on PCRE2 (regex_guide.h).
 */
#ifndef FL_REGEX_GBNF_H
#define FL_REGEX_GBNF_H

#include "fitllm.h"

#include <stddef.h>

/* *gbnf := the grammar (root ::= ...), NUL-terminated, *len bytes (GUIDE, freed with
 * fl_free(FL_MEM_GUIDE, *gbnf, *len + 1)); FL_ERR_UNSUPPORTED (no error set) outside the subset
 * or for a pattern PCRE2 would refuse; FL_ERR_NOMEM. */
fl_status fl_regex_to_gbnf(const char *pattern, char **gbnf, size_t *len);

#endif
