#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

fl_opt *fl_args_get(fl_opt *opts, const char *name) {
    for (fl_opt *o = opts; o->name; o++)
        if (!strcmp(o->name, name)) return o;
    return NULL;
}

int64_t fl_parse_bytes(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0 || !isfinite(v)) return -1;
    double mul = 1;
    if (*end) {
        char c = (char)(*end | 0x20);
        if (c == 'k') mul = 1024.0;
        else if (c == 'm') mul = 1048576.0;
        else if (c == 'g') mul = 1073741824.0;
        else if (c == 't') mul = 1099511627776.0;
        else if (c == 'b' && end[1] == 0) mul = 1;
        else return -1;
        end++;
        if (*end && strcasecmp(end, "b") && strcasecmp(end, "ib")) return -1;
    }
    double r = v * mul;
    if (r > 9.0e18) return -1;
    return (int64_t)r;
}

static void print_help(const fl_opt *opts, const char *usage_line, const char *about) {
    printf("usage: %s\n", usage_line);
    if (about) printf("\n%s\n", about);
    printf("\noptions:\n");
    for (const fl_opt *o = opts; o->name; o++) {
        char lhs[64];
        if (o->short_name) snprintf(lhs, sizeof lhs, "-%c, --%s", o->short_name, o->name);
        else snprintf(lhs, sizeof lhs, "    --%s", o->name);
        printf("  %-24s %s\n", lhs, o->help);
    }
    printf("  %-24s %s\n", "-h, --help", "show this help");
}

static int set_value(fl_opt *o, const char *cmd, const char *v) {
    char *end;
    o->set = true;
    o->str = v;
    switch (o->kind) {
    case FL_OPT_INT:
        errno = 0;
        o->i = strtoll(v, &end, 10);
        if (end == v || *end || errno) goto bad;
        break;
    case FL_OPT_FLOAT:
        errno = 0;
        o->f = strtod(v, &end);
        if (end == v || *end || errno || !isfinite(o->f)) goto bad;
        break;
    case FL_OPT_BYTES:
        o->i = fl_parse_bytes(v);
        if (o->i < 0) goto bad;
        break;
    default: break;
    }
    return 0;
bad:
    fprintf(stderr, "fitllm %s: invalid value '%s' for --%s\n", cmd, v, o->name);
    return 2;
}

/* The command's name for messages: the lowercase words after "fitllm" in the usage line
 * ("fitllm bench serve -m MODEL ..." -> "bench serve"), else argv[0]. */
static const char *command_name(const char *usage_line, const char *argv0, char *buf, size_t cap) {
    if (!usage_line || strncmp(usage_line, "fitllm ", 7)) return argv0;
    size_t n = 0;
    for (const char *p = usage_line + 7; *p >= 'a' && *p <= 'z';) {
        const char *q = p;
        while ((*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '-') q++;
        if (*q && *q != ' ') break;
        if (n + (size_t)(q - p) + 2 > cap) break;
        if (n) buf[n++] = ' ';
        memcpy(buf + n, p, (size_t)(q - p));
        n += (size_t)(q - p);
        p = *q ? q + 1 : q;
    }
    buf[n] = 0;
    return n ? buf : argv0;
}

int fl_args_parse(int argc, char **argv, fl_opt *opts, const char *usage_line, const char *about,
                  const char **pos, int max_pos, int *n_pos) {
    char cmd_buf[64];
    const char *cmd = command_name(usage_line, argv[0], cmd_buf, sizeof cmd_buf);
    *n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_help(opts, usage_line, about);
            return 1;
        }
        if (a[0] != '-' || !strcmp(a, "-")) {
            if (*n_pos >= max_pos) {
                fprintf(stderr, "fitllm %s: unexpected argument '%s' (see --help)\n", cmd, a);
                return 2;
            }
            pos[(*n_pos)++] = a;
            continue;
        }
        fl_opt *o = NULL;
        const char *inline_val = NULL;
        if (a[1] == '-') {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            for (fl_opt *p = opts; p->name; p++)
                if (strlen(p->name) == len && !strncmp(p->name, name, len)) o = p;
            if (eq) inline_val = eq + 1;
        } else if (a[2] == 0) {
            for (fl_opt *p = opts; p->name; p++)
                if (p->short_name == a[1]) o = p;
        }
        if (!o) {
            fprintf(stderr, "fitllm %s: unknown option '%s' (see --help)\n", cmd, a);
            return 2;
        }
        if (o->kind == FL_OPT_FLAG) {
            if (inline_val) {
                fprintf(stderr, "fitllm %s: --%s takes no value\n", cmd, o->name);
                return 2;
            }
            o->set = true;
            o->i = 1;
            continue;
        }
        const char *v = inline_val;
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "fitllm %s: option '%s' needs a value\n", cmd, a);
                return 2;
            }
            v = argv[++i];
        }
        int r = set_value(o, cmd, v);
        if (r) return r;
    }
    return 0;
}
