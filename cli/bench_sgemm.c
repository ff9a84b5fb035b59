/* `fitllm bench sgemm`: the trainer's f32 products (kernels/sgemm.h) on TinyLlama-1.1B's
 * matrices, GFLOP/s against the calibrated fp32 peak.
 *
 * For each W (O x I) and -p tokens: the forward y = x W^T, the input gradient dx += dy W and the
 * weight gradient dW += dy^T x, each called until --seconds have passed (2 M I O FLOP a call,
 * per wall second; the peak is per CPU second of each thread, so on a shared machine the
 * percentages read low, never high).  The JSON's "all" row sums every shape's FLOP and time. */
#include "cli/cli.h"
#include "core/clock.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/calib_fp32.h"
#include "kernels/dispatch.h"
#include "kernels/sgemm.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <time.h>

static float *filled(int64_t n, uint32_t seed) {
    float *x = fl_alloc(FL_MEM_SCRATCH, (size_t)n * sizeof(float), 64);
    if (!x) return NULL;
    uint32_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(s >> 9) * 0x1.0p-23f * 0.1f - 0.05f;
    }
    return x;
}

enum { FWD, DINP, DW, FORMS };
static const char *const form_name[FORMS] = {"forward", "dinp", "dw"};

static void call_form(int form, int64_t M, int64_t I, int64_t O, const float *x, const float *w, float *y, float *dx,
                      float *dw) {
    if (form == FWD) fl_sgemm(FL_SGEMM_TB, M, O, I, x, I, w, I, y, O);                 /* y = x W^T */
    else if (form == DINP) fl_sgemm(FL_SGEMM_ACC, M, I, O, y, O, w, I, dx, I);          /* dx += dy W */
    else fl_sgemm(FL_SGEMM_TA | FL_SGEMM_ACC, O, I, M, y, O, x, I, dw, I);             /* dW += dy^T x */
}

/* seconds per call of one form: one call untimed, then calls until secs have passed */
static double time_form(int form, int64_t M, int64_t I, int64_t O, const float *x, const float *w, float *y, float *dx,
                        float *dw, double secs) {
    call_form(form, M, I, O, x, w, y, dx, dw);
    int calls = 0;
    const double t0 = fl_clock_s();
    double t;
    do {
        call_form(form, M, I, O, x, w, y, dx, dw);
        calls++;
        t = fl_clock_s() - t0;
    } while (t < secs);
    return t / calls;
}

int fl_bench_sgemm(int argc, char **argv) {
    fl_opt opts[] = {
        {"threads", 't', FL_OPT_INT, "N  threads (default 2)"},
        {"json", 0, FL_OPT_FLAG, "print JSON"},
        {"n-prompt", 'p', FL_OPT_INT, "M  tokens (default 256)"},
        {"seconds", 0, FL_OPT_FLOAT, "S  minimum time per measurement (default 0.3)"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm bench sgemm [-t N] [-p M] [--json]",
                          "The trainer's f32 products (y = x W^T, dx += dy W, dW += dy^T x) on TinyLlama-1.1B's matrices\n"
                          "(O x I: 2048x2048, 5632x2048, 2048x5632, 32000x2048), GFLOP/s against the measured fp32 peak.",
                          NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    const int nth = opts[0].set ? (int)opts[0].i : 2;
    const int64_t M = opts[2].set ? opts[2].i : 256;
    const double secs = opts[3].set ? opts[3].f : 0.3;
    if (nth < 1 || M < 1 || M > 65536 || !(secs > 0 && secs <= 60)) {
        fprintf(stderr, "fitllm bench sgemm: bad -t, -p or --seconds (-t >= 1, -p 1 to 65536, --seconds up to 60)\n");
        return 2;
    }
    fl_threads_set(nth);
    const bool json = opts[1].set;
    fl_mem_install_cjson_hooks();
    const double peak = fl_calib_fp32_peak_gflops(nth);
    static const int64_t shapes[4][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}, {32000, 2048}}; /* O, I */
    const size_t fail0 = fl_mem_thread_failures();
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "bench", "sgemm");
    cJSON_AddStringToObject(root, "isa", fl_isa_name(fl_isa_get()));
    cJSON_AddNumberToObject(root, "threads", nth);
    cJSON_AddNumberToObject(root, "tokens", (double)M);
    cJSON_AddNumberToObject(root, "fp32_peak_gflops", peak);
    fl_cli_json_add(root, "results", arr);
    if (!json) {
        printf("isa %s, %d threads, %lld tokens; calibration: fp32 peak %.1f GFLOP/s\n", fl_isa_name(fl_isa_get()), nth,
               (long long)M, peak);
        printf("%-12s %12s %6s %12s %6s %12s %6s\n", "O x I", "y=xW^T", "%peak", "dx+=dyW", "%peak", "dW+=dy^Tx", "%peak");
    }
    double flop_all = 0, t_all[FORMS] = {0};
    int rc = 0;
    for (int s = 0; s < 4 && !rc; s++) {
        const int64_t O = shapes[s][0], I = shapes[s][1];
        float *w = filled(O * I, 1), *dw = filled(O * I, 2), *x = filled(M * I, 3), *dx = filled(M * I, 4),
              *y = filled(M * O, 5);
        if (w && dw && x && dx && y) {
            const double flop = 2.0 * (double)M * (double)I * (double)O;
            double g[FORMS];
            for (int f = 0; f < FORMS; f++) {
                const double t = time_form(f, M, I, O, x, w, y, dx, dw, secs);
                g[f] = flop / t * 1e-9;
                t_all[f] += t;
            }
            flop_all += flop;
            if (!json)
                printf("%5lld x %-5lld %12.1f %5.1f%% %12.1f %5.1f%% %12.1f %5.1f%%\n", (long long)O, (long long)I, g[FWD],
                       100 * g[FWD] / peak, g[DINP], 100 * g[DINP] / peak, g[DW], 100 * g[DW] / peak);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "out", (double)O);
            cJSON_AddNumberToObject(o, "in", (double)I);
            for (int f = 0; f < FORMS; f++) {
                char k[32];
                snprintf(k, sizeof k, "%s_gflops", form_name[f]);
                cJSON_AddNumberToObject(o, k, g[f]);
                snprintf(k, sizeof k, "%s_pct_fp32_peak", form_name[f]);
                cJSON_AddNumberToObject(o, k, peak > 0 ? 100 * g[f] / peak : 0);
            }
            fl_cli_json_add(arr, NULL, o);
        } else {
            fprintf(stderr, "fitllm bench sgemm: %s\n", fl_last_error());
            rc = 1;
        }
        const float *bufs[5] = {w, dw, x, dx, y};
        const int64_t n[5] = {O * I, O * I, M * I, M * I, M * O};
        for (int i = 0; i < 5; i++)
            if (bufs[i]) fl_free(FL_MEM_SCRATCH, (void *)bufs[i], (size_t)n[i] * sizeof(float));
    }
    if (!rc) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "shape", "all");
        for (int f = 0; f < FORMS; f++) {
            char k[32];
            const double g = flop_all / t_all[f] * 1e-9;
            snprintf(k, sizeof k, "%s_gflops", form_name[f]);
            cJSON_AddNumberToObject(o, k, g);
            snprintf(k, sizeof k, "%s_pct_fp32_peak", form_name[f]);
            cJSON_AddNumberToObject(o, k, peak > 0 ? 100 * g / peak : 0);
            if (!json) printf("%s%s %.1f GFLOP/s (%.1f%%)%s", f == 0 ? "all shapes: " : ", ", form_name[f], g, 100 * g / peak, f == FORMS - 1 ? "\n" : "");
        }
        fl_cli_json_add(arr, NULL, o);
    }
    if (json && !rc) {
        rc = fl_cli_print_json("bench sgemm", root, false, fail0);
        root = NULL;
    }
    cJSON_Delete(root);
    return rc;
}
