#include "test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

const char *fl_test_shared_path(const char *rel) {
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ & 7];
    const char *env = getenv("FL_SHARED_DIR");
    snprintf(b, 1024, "%s/%s", env && *env ? env : FL_SHARED_DIR, rel);
    return b;
}

int fl_test_have_shared(void) {
    struct stat st;
    return stat(fl_test_shared_path("models/stories260K.gguf"), &st) == 0;
}

double fl_test_nmse(const float *ref, const float *got, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)ref[i] - got[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

double fl_test_max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

char *fl_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = fl_alloc(FL_MEM_MISC, (size_t)n + 1, 16);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fl_free(FL_MEM_MISC, buf, (size_t)n + 1);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = (size_t)n;
    }
    return buf;
}

void fl_test_free_file(char *buf, size_t len) { fl_free(FL_MEM_MISC, buf, len + 1); }

int fl_test_run(const char *cmd, char *out, size_t out_cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = 0;
    if (out && out_cap) {
        n = fread(out, 1, out_cap - 1, p);
        out[n] = 0;
    }
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
