/* UTF-8 checks shared by the tokenizer, the CLI's JSON output and the server. */
#include "core/utf8.h"

#include <string.h>

size_t fl_utf8_decode(const char *str, size_t n, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    if (!n) return 0;
    uint32_t v;
    unsigned lo, hi;
    const size_t len = fl_utf8_lead(s[0], &v, &lo, &hi);
    if (!len || len > n || (len > 1 && (s[1] < lo || s[1] > hi))) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[k] & 0x3f);
    }
    *cp = v;
    return len;
}

/* Offset of the first byte that does not start a well-formed UTF-8 sequence (overlong forms,
 * surrogates and code points above U+10FFFF are ill-formed), or -1 if the text is valid. */
int64_t fl_utf8_invalid_at(const char *str, size_t n) {
    size_t i = 0;
    uint32_t cp;
    while (i < n) {
        const size_t len = fl_utf8_decode(str + i, n - i, &cp);
        if (!len) return (int64_t)i;
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
