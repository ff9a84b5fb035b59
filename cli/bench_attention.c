/* `fitllm bench attention`: naive vs flash attention for growing sequence lengths - time,
 * GFLOP/s against the measured fp32 FMA peak, and peak memory through the allocator's
 * accounting (scratch = the kernels' own workspace; Q/K/V/O are reported separately).
 * Optionally writes a gnuplot data file + script of memory vs n and runs gnuplot. */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/attn.h"
#include "kernels/calib_fp32.h"
#include "kernels/dispatch.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double bench_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* seconds: best wall time; cpu_seconds: the process CPU time of that run (all threads) */
typedef struct attn_run {
    double seconds, cpu_seconds, gflops, gflops_cpu;
    size_t scratch_peak, total_peak;
    int ok;
} attn_run;

/* Best of up to 5 runs (stops after ~0.5 s of total time); peaks from the accounting. */
static attn_run run_attn_once(fl_attn_args *a) {
    attn_run r = {0};
    double best = INFINITY, total = 0;
    for (int rep = 0; rep < 5 && total < 0.5; rep++) {
        fl_mem_reset_peaks();
        const double c0 = bench_cpu(), t0 = bench_now();
        if (fl_attn_forward(a) != FL_OK) return r;
        const double dt = bench_now() - t0, dc = bench_cpu() - c0;
        total += dt;
        if (dt < best) best = dt, r.cpu_seconds = dc;
        r.scratch_peak = fl_mem_peak(FL_MEM_SCRATCH);
        r.total_peak = fl_mem_peak_total();
    }
    r.ok = 1;
    r.seconds = best;
    r.gflops = fl_attn_flops(a) / best * 1e-9;
    r.gflops_cpu = r.cpu_seconds > 0 ? fl_attn_flops(a) / r.cpu_seconds * 1e-9 : 0.0;
    return r;
}

static size_t g_run_failures; /* allocations refused inside the runs (not the report's) */

static attn_run run_attn(fl_attn_args *a) {
    const size_t f = fl_mem_thread_failures();
    const attn_run r = run_attn_once(a);
    g_run_failures += fl_mem_thread_failures() - f;
    return r;
}

static void fill_rand(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
}

static int write_plot(const char *svg, cJSON *rows) {
    char dat[1024], gp[1024];
    snprintf(dat, sizeof dat, "%s.dat", svg);
    snprintf(gp, sizeof gp, "%s.gp", svg);
    FILE *f = fopen(dat, "w");
    if (!f) {
        fprintf(stderr, "fitllm bench attention: cannot write %s\n", dat);
        return 1;
    }
    /* one block per config (gnuplot "index"): n naive_scratch_MiB flash_scratch_MiB qkvo_MiB */
    int block = -1, n_blocks = 0;
    char labels[8][64];
    cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        const int cfg = cJSON_GetObjectItem(row, "config")->valueint;
        if (cfg != block) {
            if (block >= 0) fprintf(f, "\n\n");
            block = cfg;
            if (n_blocks < 8)
                snprintf(labels[n_blocks], sizeof labels[0], "hd%d h%d/%d", cJSON_GetObjectItem(row, "head_dim")->valueint,
                         cJSON_GetObjectItem(row, "n_head")->valueint, cJSON_GetObjectItem(row, "n_head_kv")->valueint);
            n_blocks++;
            fprintf(f, "# n naive_scratch_MiB flash_scratch_MiB qkvo_MiB\n");
        }
        const cJSON *nv = cJSON_GetObjectItem(row, "naive_scratch_peak_bytes");
        fprintf(f, "%d ", cJSON_GetObjectItem(row, "n")->valueint);
        if (nv) fprintf(f, "%.6f ", nv->valuedouble / 1048576.0);
        else fprintf(f, "NaN ");
        fprintf(f, "%.6f %.6f\n", cJSON_GetObjectItem(row, "flash_scratch_peak_bytes")->valuedouble / 1048576.0,
                cJSON_GetObjectItem(row, "qkvo_bytes")->valuedouble / 1048576.0);
    }
    fclose(f);
    f = fopen(gp, "w");
    if (!f) return 1;
    const size_t len = strlen(svg);
    if (len > 4 && !strcmp(svg + len - 4, ".png")) fprintf(f, "set terminal pngcairo size 900,560\n");
    else fprintf(f, "set terminal svg size 900,560 dynamic background rgb 'white'\n");
    fprintf(f, "set output '%s'\n", svg);
    fprintf(f, "set title 'attention peak scratch memory vs sequence length (allocator accounting)'\n");
    fprintf(f, "set xlabel 'sequence length n'\nset ylabel 'MiB'\nset logscale xy 2\nset key left top\nset grid\n");
    fprintf(f, "plot ");
    for (int b = 0; b < n_blocks && b < 8; b++) {
        fprintf(f, "%s'%s' index %d using 1:2 with linespoints pt 7 ps 0.7 title 'naive scores %s', ", b ? ", \\\n     " : "", dat, b, labels[b]);
        fprintf(f, "'%s' index %d using 1:3 with linespoints pt 5 ps 0.7 title 'flash scratch %s', ", dat, b, labels[b]);
        fprintf(f, "'%s' index %d using 1:4 with lines dashtype 2 title 'Q/K/V/O %s'", dat, b, labels[b]);
    }
    fprintf(f, "\n");
    fclose(f);
    if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
        char cmd[2200];
        snprintf(cmd, sizeof cmd, "gnuplot '%s'", gp);
        if (system(cmd) != 0) fprintf(stderr, "fitllm bench attention: gnuplot failed on %s\n", gp);
    } else {
        fprintf(stderr, "fitllm bench attention: gnuplot not found; wrote %s and %s\n", dat, gp);
    }
    return 0;
}

int fl_bench_attention(int argc, char **argv) {
    fl_opt opts[] = {
        {"json", 0, FL_OPT_FLAG, "print one JSON object instead of a table"},
        {"min-n", 0, FL_OPT_INT, "N  shortest sequence (default 512)"},
        {"max-n", 0, FL_OPT_INT, "N  longest sequence, doubling from min-n (default 32768)"},
        {"naive-max-n", 0, FL_OPT_INT, "N  run the naive reference up to this n (default 8192; it needs n*n*4 bytes per thread)"},
        {"naive-max-gflop", 0, FL_OPT_FLOAT, "G  ... and only while its work is at most G GFLOP (default 20; it is scalar)"},
        {"head-dim", 0, FL_OPT_INT, "D  only this head_dim (64: 8 heads / 2 kv heads, 128: 32 heads / 8 kv heads)"},
        {"no-causal", 0, FL_OPT_FLAG, "full (bidirectional) attention instead of causal"},
        {"kv-type", 0, FL_OPT_STR, "TYPE  f32 (default), f16 or bf16 for K/V"},
        {"threads", 't', FL_OPT_INT, "N  threads (default: all cores)"},
        {"plot", 0, FL_OPT_STR, "FILE.svg  write FILE.svg.dat + FILE.svg.gp (memory vs n) and run gnuplot (.png: PNG)"},
        {0},
    };
    int n_pos;
    int rc = fl_args_parse(argc, argv, opts, "fitllm bench attention [--json] [--max-n N] [--plot FILE.svg]",
                           "Naive (materialized scores) vs flash attention for n = min-n, 2 min-n, ... max-n\n"
                           "with head_dim 64 (8 heads, GQA 4) and 128 (32 heads, GQA 4): time, GFLOP/s, % of\n"
                           "the measured fp32 FMA peak, and peak memory from the tracked allocator.",
                           NULL, 0, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    const int json = fl_args_get(opts, "json")->set;
    const int64_t min_n = fl_args_get(opts, "min-n")->set ? fl_args_get(opts, "min-n")->i : 512;
    const int64_t max_n = fl_args_get(opts, "max-n")->set ? fl_args_get(opts, "max-n")->i : 32768;
    const int64_t naive_max = fl_args_get(opts, "naive-max-n")->set ? fl_args_get(opts, "naive-max-n")->i : 8192;
    const int64_t only_hd = fl_args_get(opts, "head-dim")->set ? fl_args_get(opts, "head-dim")->i : 0;
    const bool causal = !fl_args_get(opts, "no-causal")->set;
    const double naive_max_gflop = fl_args_get(opts, "naive-max-gflop")->set ? fl_args_get(opts, "naive-max-gflop")->f : 20.0;
    int32_t kv_type = FL_TYPE_F32;
    if (fl_args_get(opts, "kv-type")->set) {
        kv_type = fl_type_from_name(fl_args_get(opts, "kv-type")->str);
        if (kv_type != FL_TYPE_F32 && kv_type != FL_TYPE_F16 && kv_type != FL_TYPE_BF16) {
            fprintf(stderr, "fitllm bench attention: --kv-type must be f32, f16 or bf16\n");
            return 2;
        }
    }
    if (min_n < 1 || max_n < min_n || max_n > (1 << 20)) {
        fprintf(stderr, "fitllm bench attention: need 1 <= min-n <= max-n <= 1048576\n");
        return 2;
    }
    if (only_hd && only_hd != 64 && only_hd != 128) {
        fprintf(stderr, "fitllm bench attention: --head-dim must be 64 or 128\n");
        return 2;
    }
    if (fl_args_get(opts, "threads")->set) fl_threads_set((int)fl_args_get(opts, "threads")->i);
    const int nth = fl_threads_get();
    /* noise (other processes) only lowers a calibration, so keep the better of the two estimates */
    double peak = fl_calib_fp32_peak_gflops(nth);
    double peak1 = fl_calib_fp32_peak_gflops(1);
    if (peak / nth > peak1) peak1 = peak / nth;
    if (peak1 * nth > peak) peak = peak1 * nth;

    static const struct { int hd, n_head, n_head_kv; } cfgs[] = {{64, 8, 2}, {128, 32, 8}};
    fl_mem_install_cjson_hooks();
    const size_t fail0 = fl_mem_thread_failures();
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "benchmark", "attention");
    cJSON_AddStringToObject(root, "isa", fl_isa_name(fl_isa_get()));
    cJSON_AddNumberToObject(root, "threads", nth);
    cJSON_AddNumberToObject(root, "fp32_fma_peak_gflops", peak);
    cJSON_AddNumberToObject(root, "fp32_fma_peak_gflops_1thread", peak1);
    cJSON_AddStringToObject(root, "pct_of_peak_definition",
                            "flash_pct_of_peak = FLOP / process CPU seconds / 1-thread peak (per-CPU-second, both);"
                            " flash_pct_of_peak_wall = FLOP / wall seconds / n-thread peak");
    cJSON_AddBoolToObject(root, "causal", causal);
    cJSON_AddStringToObject(root, "kv_type", fl_type_name(kv_type));
    cJSON *rows = cJSON_AddArrayToObject(root, "results");
    if (!json) {
        printf("fp32 FMA peak (%s, %d threads): %.1f GFLOP/s (1 thread: %.1f); %%peak = GFLOP per CPU second / 1-thread peak\n",
               fl_isa_name(fl_isa_get()), nth, peak, peak1);
        printf("%-3s %-10s %6s | %10s %9s %10s | %10s %9s %7s %10s | %7s\n", "hd", "heads", "n", "naive s", "GFLOP/s",
               "scratch", "flash s", "GFLOP/s", "%peak", "scratch", "speedup");
    }
    int status = 0;
    for (int ci = 0; ci < 2 && !status; ci++) {
        if (only_hd && cfgs[ci].hd != only_hd) continue;
        const int hd = cfgs[ci].hd, nh = cfgs[ci].n_head, nkv = cfgs[ci].n_head_kv;
        for (int64_t n = min_n; n <= max_n; n *= 2) {
            const size_t nq = (size_t)(n * nh * hd), nk = (size_t)(n * nkv * hd), esz = kv_type == FL_TYPE_F32 ? 4 : 2;
            const size_t qkvo = nq * 4 * 2 + nk * esz * 2 + (size_t)(n * nh) * 4;
            float *q = fl_alloc(FL_MEM_ACT, nq * 4, 64), *o = fl_alloc(FL_MEM_ACT, nq * 4, 64);
            float *lse = fl_alloc(FL_MEM_ACT, (size_t)(n * nh) * 4, 64);
            void *k = fl_alloc(FL_MEM_ACT, nk * esz, 64), *v = fl_alloc(FL_MEM_ACT, nk * esz, 64);
            if (!q || !o || !lse || !k || !v) {
                fprintf(stderr, "fitllm bench attention: n = %lld: %s\n", (long long)n, fl_last_error());
                status = 1;
            } else {
                fill_rand(q, nq, 1);
                float *tmp = kv_type == FL_TYPE_F32 ? NULL : fl_alloc(FL_MEM_ACT, nk * 4, 64);
                for (int w = 0; w < 2; w++) {
                    float *dst = tmp ? tmp : (float *)(w ? v : k);
                    fill_rand(dst, nk, 2 + (uint32_t)w);
                    for (size_t i = 0; tmp && i < nk; i++)
                        ((uint16_t *)(w ? v : k))[i] = kv_type == FL_TYPE_F16 ? fl_f32_to_f16(tmp[i]) : fl_f32_to_bf16(tmp[i]);
                }
                if (tmp) fl_free(FL_MEM_ACT, tmp, nk * 4);
                fl_attn_args a = {.n_seq = 1, .n_q = n, .n_kv = n, .n_head = nh, .n_head_kv = nkv, .head_dim = hd,
                                  .q = q, .k = k, .v = v, .kv_type = kv_type, .out = o, .lse = lse, .causal = causal};
                attn_run nv = {0}, fl;
                const bool do_naive = n <= naive_max && fl_attn_flops(&a) * 1e-9 <= naive_max_gflop;
                if (do_naive) {
                    a.impl = FL_ATTN_NAIVE;
                    nv = run_attn(&a);
                }
                a.impl = FL_ATTN_FLASH;
                fl = run_attn(&a);
                if (!fl.ok || (do_naive && !nv.ok)) {
                    fprintf(stderr, "fitllm bench attention: n = %lld: %s\n", (long long)n, fl_last_error());
                    status = 1;
                } else {
                    cJSON *r = cJSON_CreateObject();
                    cJSON_AddNumberToObject(r, "config", ci);
                    cJSON_AddNumberToObject(r, "head_dim", hd);
                    cJSON_AddNumberToObject(r, "n_head", nh);
                    cJSON_AddNumberToObject(r, "n_head_kv", nkv);
                    cJSON_AddNumberToObject(r, "n", (double)n);
                    cJSON_AddNumberToObject(r, "gflop", fl_attn_flops(&a) * 1e-9);
                    cJSON_AddNumberToObject(r, "qkvo_bytes", (double)qkvo);
                    if (nv.ok) {
                        cJSON_AddNumberToObject(r, "naive_seconds", nv.seconds);
                        cJSON_AddNumberToObject(r, "naive_gflops", nv.gflops);
                        cJSON_AddNumberToObject(r, "naive_scratch_peak_bytes", (double)nv.scratch_peak);
                        cJSON_AddNumberToObject(r, "naive_total_peak_bytes", (double)nv.total_peak);
                        cJSON_AddNumberToObject(r, "speedup", nv.seconds / fl.seconds);
                    }
                    cJSON_AddNumberToObject(r, "flash_seconds", fl.seconds);
                    cJSON_AddNumberToObject(r, "flash_gflops", fl.gflops);
                    cJSON_AddNumberToObject(r, "flash_cpu_seconds", fl.cpu_seconds);
                    cJSON_AddNumberToObject(r, "flash_gflops_per_cpu_second", fl.gflops_cpu);
                    /* FLOP per CPU second over one core's peak: immune to other processes' load */
                    cJSON_AddNumberToObject(r, "flash_pct_of_peak", 100.0 * fl.gflops_cpu / peak1);
                    cJSON_AddNumberToObject(r, "flash_pct_of_peak_wall", 100.0 * fl.gflops / peak);
                    cJSON_AddNumberToObject(r, "flash_scratch_peak_bytes", (double)fl.scratch_peak);
                    cJSON_AddNumberToObject(r, "flash_total_peak_bytes", (double)fl.total_peak);
                    fl_cli_json_add(rows, NULL, r);
                    if (!json) {
                        char nbuf[3][32] = {"-", "-", "-"};
                        if (nv.ok) {
                            snprintf(nbuf[0], 32, "%.4f", nv.seconds);
                            snprintf(nbuf[1], 32, "%.2f", nv.gflops);
                            snprintf(nbuf[2], 32, "%.1f MiB", (double)nv.scratch_peak / 1048576.0);
                        }
                        char sp[32] = "-";
                        if (nv.ok) snprintf(sp, sizeof sp, "%.1fx", nv.seconds / fl.seconds);
                        printf("%-3d %-10s %6lld | %10s %9s %10s | %10.4f %9.2f %6.1f%% %6.1f KiB | %7s\n", hd,
                               nh == 8 ? "8/2" : "32/8", (long long)n, nbuf[0], nbuf[1], nbuf[2], fl.seconds, fl.gflops,
                               100.0 * fl.gflops_cpu / peak1, (double)fl.scratch_peak / 1024.0, sp);
                        fflush(stdout);
                    }
                }
            }
            fl_free(FL_MEM_ACT, q, nq * 4);
            fl_free(FL_MEM_ACT, o, nq * 4);
            fl_free(FL_MEM_ACT, lse, (size_t)(n * nh) * 4);
            fl_free(FL_MEM_ACT, k, nk * esz);
            fl_free(FL_MEM_ACT, v, nk * esz);
        }
    }
    const fl_opt *plot = fl_args_get(opts, "plot");
    if (!status && plot->set) status = write_plot(plot->str, rows);
    if (json && fl_cli_print_json("bench attention", root, true, fail0 + g_run_failures)) status = 1;
    else if (!json) cJSON_Delete(root);
    return status;
}
