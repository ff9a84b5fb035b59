/* Architecture names and key formatting (see arch.h). */
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

static const char *const supported[] = {"llama"};

bool fl_arch_supported(const char *arch) {
    for (size_t i = 0; i < sizeof supported / sizeof supported[0]; i++)
        if (!strcmp(arch, supported[i])) return true;
    return false;
}

const char *fl_arch_key(char *buf, size_t cap, const char *arch, const char *suffix) {
    snprintf(buf, cap, "%s.%s", arch, suffix);
    return buf;
}

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#endif
const char *fl_arch_tensor_name(char *buf, size_t cap, const char *tmpl, int il) {
    snprintf(buf, cap, tmpl, il);
    return buf;
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
