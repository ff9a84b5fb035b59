/* `fitllm bench optim`: the optimizer step (train/optim.h) alone: AdamW and 8-bit AdamW on -n
 * parameters, and the gradient norm (fl_grad_clip), seconds a step, ns a parameter and GB/s of
 * the bytes a step must move (AdamW: the parameter read and written, the gradient read, m and v
 * read and written, 28 bytes; 8-bit AdamW: 16 bytes and the blocks' absmax; the norm: 4).
 *
 * Each is run --steps times after one untimed step, the gradients changing between steps (so the
 * states move as in training), and the median step is reported. */
#include "cli/cli.h"
#include "core/clock.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/dispatch.h"
#include "train/optim.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* gradients of step s: a fixed pattern over several decades, its signs flipped by step */
static void fill_grads(float *g, int64_t n, int s) {
    uint32_t r = 2463534242u + (uint32_t)s;
    for (int64_t i = 0; i < n; i++) {
        r ^= r << 13;
        r ^= r >> 17;
        r ^= r << 5;
        const float u = (float)(r >> 8) * 0x1.0p-24f - 0.5f;
        g[i] = u * (i % 7 == 0 ? 1e-2f : i % 7 == 1 ? 1e-6f : 1e-4f);
    }
}

enum { ADAMW, ADAMW8, NORM, KINDS };
static const char *const kind_name[KINDS] = {"adamw", "adamw8bit", "grad_norm"};

int fl_bench_optim(int argc, char **argv) {
    fl_opt opts[] = {
        {"threads", 't', FL_OPT_INT, "N  threads (default 2)"},
        {"json", 0, FL_OPT_FLAG, "print JSON"},
        {"params", 'n', FL_OPT_INT, "P  parameters (default 100000000)"},
        {"steps", 0, FL_OPT_INT, "S  timed steps, the median reported (default 5)"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm bench optim [-n PARAMS] [-t N] [--steps S] [--json]",
                          "The optimizer step alone: AdamW and 8-bit AdamW (blocks of 256) on P parameters, and the\n"
                          "gradient norm; seconds a step, ns a parameter and GB/s of the bytes a step moves.",
                          NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    const int nth = opts[0].set ? (int)opts[0].i : 2;
    const int64_t n = opts[2].set ? opts[2].i : 100000000;
    const int steps = opts[3].set ? (int)opts[3].i : 5;
    if (nth < 1 || n < 1 || n > ((int64_t)1 << 36) || steps < 1 || steps > 1000) {
        fprintf(stderr, "fitllm bench optim: bad -t, -n or --steps (-t >= 1, -n 1 to 2^36, --steps 1 to 1000)\n");
        return 2;
    }
    fl_threads_set(nth);
    const bool json = opts[1].set;
    fl_mem_install_cjson_hooks();
    const size_t fail0 = fl_mem_thread_failures();
    const size_t nb = (size_t)n * sizeof(float);
    float *p = fl_alloc(FL_MEM_WEIGHTS, nb, 64), *g = fl_alloc(FL_MEM_GRAD, nb, 64);
    double *ts = fl_alloc(FL_MEM_MISC, (size_t)steps * sizeof(double), 64);
    if (!p || !g || !ts) {
        fprintf(stderr, "fitllm bench optim: no memory for %lld parameters and their gradients\n", (long long)n);
        fl_free(FL_MEM_WEIGHTS, p, nb);
        fl_free(FL_MEM_GRAD, g, nb);
        fl_free(FL_MEM_MISC, ts, (size_t)steps * sizeof(double));
        return 1;
    }
    for (int64_t i = 0; i < n; i++) p[i] = (float)(i % 1000) * 1e-4f - 0.05f;
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "bench", "optim");
    cJSON_AddStringToObject(root, "isa", fl_isa_name(fl_isa_get()));
    cJSON_AddNumberToObject(root, "threads", nth);
    cJSON_AddNumberToObject(root, "params", (double)n);
    fl_cli_json_add(root, "results", arr);
    if (!json) {
        printf("isa %s, %d threads, %lld parameters, median of %d steps\n", fl_isa_name(fl_isa_get()), nth, (long long)n, steps);
        printf("%-10s %12s %10s %8s\n", "", "s/step", "ns/param", "GB/s");
    }
    int rc = 0;
    for (int k = 0; k < KINDS && !rc; k++) {
        fl_optim *o = NULL;
        if (k != NORM) {
            fl_optimizer_config cfg = fl_optim_default();
            cfg.kind = k == ADAMW ? FL_OPTIMIZER_ADAMW : FL_OPTIMIZER_ADAMW8BIT;
            if (fl_optim_new(&cfg, n, NULL, -1, &o)) {
                fprintf(stderr, "fitllm bench optim: %s\n", fl_last_error());
                rc = 1;
                break;
            }
        }
        for (int s = 0; s <= steps; s++) {
            fill_grads(g, n, s);
            const double t0 = fl_clock_s();
            if (o) fl_optim_step(o, p, g, 1e-4f);
            else (void)fl_grad_clip(g, n, 0.0);
            if (s > 0) ts[s - 1] = fl_clock_s() - t0; /* the first step untimed */
        }
        fl_optim_free(o);
        qsort(ts, (size_t)steps, sizeof(double), cmp_double);
        const double t = ts[steps / 2];
        const double bytes = k == ADAMW    ? 28.0 * (double)n
                             : k == ADAMW8 ? 16.0 * (double)n + 16.0 * (double)((n + 255) / 256)
                                           : 4.0 * (double)n;
        if (!json) printf("%-10s %12.4f %10.3f %8.1f\n", kind_name[k], t, t * 1e9 / (double)n, bytes / t * 1e-9);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "op", kind_name[k]);
        cJSON_AddNumberToObject(e, "s_per_step", t);
        cJSON_AddNumberToObject(e, "ns_per_param", t * 1e9 / (double)n);
        cJSON_AddNumberToObject(e, "gb_per_s", bytes / t * 1e-9);
        fl_cli_json_add(arr, NULL, e);
    }
    fl_free(FL_MEM_WEIGHTS, p, nb);
    fl_free(FL_MEM_GRAD, g, nb);
    fl_free(FL_MEM_MISC, ts, (size_t)steps * sizeof(double));
    if (json && !rc) {
        rc = fl_cli_print_json("bench optim", root, false, fail0);
        root = NULL;
    }
    cJSON_Delete(root);
    return rc;
}
