/* UTF-8 checks shared by the tokenizer, the CLI's JSON output and the server. */
#include "core/utf8.h"

#include <string.h>

/* Offset of the first byte that does not start a well-formed UTF-8 sequence (overlong forms,
 * surrogates and code points above U+10FFFF are ill-formed), or -1 if the text is valid. */
int64_t fl_utf8_invalid_at(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
        if (c >= 0xc2 && c <= 0xdf) len = 2;
        else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        } else return (int64_t)i;
        if (i + len > n) return (int64_t)i;
        if (s[i + 1] < lo || s[i + 1] > hi) return (int64_t)i;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80) return (int64_t)i;
        i += len;
    }
    return -1;
}

bool fl_utf8_is_valid(const char *s, size_t n) { return fl_utf8_invalid_at(s, n) < 0; }

size_t fl_utf8_sanitize(const char *s, size_t n, char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        const int64_t bad = fl_utf8_invalid_at(s + i, n - i);
        const size_t good = bad < 0 ? n - i : (size_t)bad;
        memcpy(out + o, s + i, good);
        o += good;
        i += good;
        if (i < n) { /* one ill-formed byte -> U+FFFD */
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    return o;
}
