/*
 * utf8.h - UTF-8 well-formedness (RFC 3629: no overlong forms, surrogates or code points past
 * U+10FFFF) and repair.  JSON output must be UTF-8, and a model's byte-fallback tokens can
 * produce any byte string, so the CLI's and the server's JSON go through fl_utf8_sanitize.
 */
#ifndef FL_CORE_UTF8_H
#define FL_CORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Offset of the first byte that does not start a well-formed sequence, or -1 if s is valid. */
int64_t fl_utf8_invalid_at(const char *s, size_t n);
bool fl_utf8_is_valid(const char *s, size_t n);
/* A character's first byte c: its length (1-4; 0 where c begins no well-formed character), its
 * value bits (*v) and the range allowed for its second byte ([*lo, *hi]: narrower after E0, ED,
 * F0 and F4, which would otherwise begin overlong forms, surrogates or code points past U+10FFFF). */
static inline size_t fl_utf8_lead(unsigned c, uint32_t *v, unsigned *lo, unsigned *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (c < 0x80) return *v = c, 1;
    if (c >= 0xC2 && c <= 0xDF) return *v = c & 0x1F, 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return *v = c & 0x0F, 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return *v = c & 0x07, 4;
    }
    return 0;
}
/* The well-formed character that s[0..n) starts with into *cp; its length (1-4), or 0 where s
 * starts with an ill-formed or incomplete sequence (or n is 0). */
size_t fl_utf8_decode(const char *s, size_t n, uint32_t *cp);
/* s[0..n) into out (room for 3 n bytes), every ill-formed byte replaced by U+FFFD; returns the
 * length written. */
size_t fl_utf8_sanitize(const char *s, size_t n, char *out);

#endif
