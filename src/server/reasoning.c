/* Reasoning models' thinking, apart from the answer (llama.cpp's --reasoning-format deepseek,
 * vLLM's deepseek_r1 / qwen3 reasoning parsers): an output that starts with <think> (after
 * spaces), or any output where the prompt opened the thinking itself (DeepSeek-R1's template
 * ends with "<think>\n"), holds its reasoning up to </think>, and the answer after it; where
 * </think> never comes, all of it is reasoning.  Any other output is all answer. */
#include "server/server_int.h"

#include <string.h>

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
    return i;
}

srv_think srv_think_scan(const char *t, size_t n, bool open, bool final, size_t from, size_t *r0, size_t *r1, size_t *c) {
    const size_t i = skip_ws(t, 0, n), lo = sizeof OPEN - 1, lc = sizeof CLOSE - 1;
    *r0 = *r1 = *c = 0;
    if (n - i >= lo && !memcmp(t + i, OPEN, lo)) *r0 = i + lo;
    else if (!final && !strncmp(t + i, OPEN, n - i)) return SRV_THINK_UNDECIDED; /* spaces, or a part of <think> */
    else if (!open) return SRV_THINK_NONE;
    const size_t s0 = from > *r0 && from <= n ? from : *r0;
    const char *k = memmem(t + s0, n - s0, CLOSE, lc);
    if (k) {
        *r1 = (size_t)(k - t);
        *c = *r1 + lc;
        return SRV_THINK_DONE;
    }
    if (final) {
        *r1 = *c = n;
        return SRV_THINK_DONE;
    }
    *r1 = n; /* a part of </think> at the end waits */
    for (size_t m = lc - 1; m >= 1; m--)
        if (n - *r0 >= m && !memcmp(t + n - m, CLOSE, m)) {
            *r1 = n - m;
            break;
        }
    return SRV_THINK_IN;
}
