/* `fitllm bench packing`: the same set of sequences run as a padded batch (every sequence padded
 * to the longest, the classic [B][T_max] layout) and as one packed varlen batch (concatenated,
 * cu_seqlens, block-diagonal): bytes of Q/K/V/O, kernel scratch, FLOPs and time for each, and
 * a check that the real tokens get the same outputs both ways. */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/attn.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double pk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of a few runs; scratch peak from the accounting. */
static fl_status pk_time(fl_attn_args *a, double *sec, size_t *scratch) {
    double best = INFINITY, total = 0;
    for (int rep = 0; rep < 7 && total < 0.5; rep++) {
        fl_mem_reset_peaks();
        const double t0 = pk_now();
        fl_status st = fl_attn_forward(a);
        if (st != FL_OK) return st;
        const double dt = pk_now() - t0;
        total += dt;
        if (dt < best) best = dt;
        *scratch = fl_mem_peak(FL_MEM_SCRATCH);
    }
    *sec = best;
    return FL_OK;
}

int fl_bench_packing(int argc, char **argv) {
    fl_opt opts[] = {
        {"json", 0, FL_OPT_FLAG, "print one JSON object instead of text"},
        {"n-seq", 0, FL_OPT_INT, "B  number of sequences (default 16)"},
        {"lengths", 0, FL_OPT_STR, "L1,L2,...  explicit sequence lengths (e.g. 37,120,8,200) instead of random ones"},
        {"max-len", 0, FL_OPT_INT, "T  longest sequence (default 1024); lengths are random in [1, T] with one of T"},
        {"seed", 0, FL_OPT_INT, "S  random seed for the lengths (default 1)"},
        {"head-dim", 0, FL_OPT_INT, "D  head_dim (default 64)"},
        {"heads", 0, FL_OPT_INT, "H  query heads (default 8, with H/4 kv heads)"},
        {"threads", 't', FL_OPT_INT, "N  threads (default: all cores)"},
        {0},
    };
    int n_pos;
    int rc = fl_args_parse(argc, argv, opts, "fitllm bench packing [--json] [--n-seq B] [--max-len T]",
                           "Causal attention over B sequences of random lengths: padded batch (pad to the\n"
                           "longest) vs packed varlen (cu_seqlens, block-diagonal, no padding).",
                           NULL, 0, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    const int json = fl_args_get(opts, "json")->set;
    int64_t B = fl_args_get(opts, "n-seq")->set ? fl_args_get(opts, "n-seq")->i : 16;
    int64_t T = fl_args_get(opts, "max-len")->set ? fl_args_get(opts, "max-len")->i : 1024;
    int32_t given[256];
    int n_given = 0;
    const fl_opt *lopt = fl_args_get(opts, "lengths");
    if (lopt->set) { /* "37,120,8,200" */
        const char *p = lopt->str;
        T = 0;
        while (*p) {
            char *end;
            long x = strtol(p, &end, 10);
            if (end == p || x < 1 || x > 65536 || n_given == 256 || (*end && *end != ',')) {
                fprintf(stderr, "fitllm bench packing: bad --lengths '%s' (up to 256 lengths in [1, 65536])\n", lopt->str);
                return 2;
            }
            given[n_given++] = (int32_t)x;
            if (x > T) T = x;
            p = *end ? end + 1 : end;
        }
        if (n_given == 0) {
            fprintf(stderr, "fitllm bench packing: empty --lengths\n");
            return 2;
        }
        B = n_given;
    }
    uint32_t seed = fl_args_get(opts, "seed")->set ? (uint32_t)fl_args_get(opts, "seed")->i : 1;
    const int64_t hd = fl_args_get(opts, "head-dim")->set ? fl_args_get(opts, "head-dim")->i : 64;
    const int64_t nh = fl_args_get(opts, "heads")->set ? fl_args_get(opts, "heads")->i : 8;
    if (B < 1 || B > 4096 || T < 1 || T > 65536 || hd < 8 || hd > 512 || hd % 8 || nh < 4 || nh % 4 || nh > 256) {
        fprintf(stderr, "fitllm bench packing: need 1 <= n-seq <= 4096, 1 <= max-len <= 65536, head-dim a multiple of 8\n"
                        "in [8, 512], heads a multiple of 4 in [4, 256]\n");
        return 2;
    }
    if (fl_args_get(opts, "threads")->set) fl_threads_set((int)fl_args_get(opts, "threads")->i);
    const int64_t nkv = nh / 4, qrow = nh * hd, krow = nkv * hd;

    /* lengths: one sequence of T, the others random in [1, T] */
    int32_t *len = fl_alloc(FL_MEM_MISC, sizeof(int32_t) * (size_t)B, 0);
    int32_t *cu = fl_alloc(FL_MEM_MISC, sizeof(int32_t) * (size_t)(B + 1), 0);
    int32_t *cu_pad = fl_alloc(FL_MEM_MISC, sizeof(int32_t) * (size_t)(B + 1), 0);
    if (!len || !cu || !cu_pad) {
        fprintf(stderr, "fitllm bench packing: %s\n", fl_last_error());
        return 1;
    }
    cu[0] = cu_pad[0] = 0;
    for (int64_t s = 0; s < B; s++) {
        seed = seed * 1664525u + 1013904223u;
        len[s] = n_given ? given[s] : s == 0 ? (int32_t)T : 1 + (int32_t)((seed >> 8) % (uint32_t)T);
        cu[s + 1] = cu[s] + len[s];
        cu_pad[s + 1] = cu_pad[s] + (int32_t)T;
    }
    const int64_t n_packed = cu[B], n_padded = B * T;

    /* padded tensors [B][T][...]; the packed ones hold the same real tokens back to back */
    const size_t pq = (size_t)(n_padded * qrow), pk = (size_t)(n_padded * krow);
    const size_t cq = (size_t)(n_packed * qrow), ck = (size_t)(n_packed * krow);
    float *P[4] = {fl_calloc(FL_MEM_ACT, pq, 4), fl_calloc(FL_MEM_ACT, pk, 4), fl_calloc(FL_MEM_ACT, pk, 4), fl_calloc(FL_MEM_ACT, pq, 4)};
    float *C[4] = {fl_calloc(FL_MEM_ACT, cq, 4), fl_calloc(FL_MEM_ACT, ck, 4), fl_calloc(FL_MEM_ACT, ck, 4), fl_calloc(FL_MEM_ACT, cq, 4)};
    int status = 0;
    for (int w = 0; w < 4; w++)
        if (!P[w] || !C[w]) status = 1;
    double t_pad = 0, t_pack = 0, max_diff = 0;
    size_t s_pad = 0, s_pack = 0;
    fl_attn_args ap = {0}, ac = {0};
    if (status) {
        fprintf(stderr, "fitllm bench packing: %s\n", fl_last_error());
    } else {
        uint32_t r = 7;
        for (int64_t s = 0; s < B; s++)
            for (int64_t i = 0; i < len[s]; i++) {
                for (int w = 0; w < 3; w++) {
                    const int64_t row = w ? krow : qrow;
                    float *dp = P[w] + (s * T + i) * row, *dc = C[w] + (cu[s] + i) * row;
                    for (int64_t e = 0; e < row; e++) {
                        r = r * 1664525u + 1013904223u;
                        dp[e] = dc[e] = (float)(r >> 8) / 16777216.0f * 2.0f - 1.0f;
                    }
                }
            }
        /* padded: B sequences of T tokens; right padding + causal keeps the real tokens exact */
        ap = (fl_attn_args){.n_seq = (int32_t)B, .cu_seqlens_q = cu_pad, .cu_seqlens_k = cu_pad, .n_q = n_padded,
                            .n_kv = n_padded, .n_head = (int32_t)nh, .n_head_kv = (int32_t)nkv, .head_dim = (int32_t)hd,
                            .q = P[0], .k = P[1], .v = P[2], .kv_type = 0, .out = P[3], .causal = true};
        ac = ap;
        ac.cu_seqlens_q = ac.cu_seqlens_k = cu, ac.n_q = ac.n_kv = n_packed;
        ac.q = C[0], ac.k = C[1], ac.v = C[2], ac.out = C[3];
        if (pk_time(&ap, &t_pad, &s_pad) != FL_OK || pk_time(&ac, &t_pack, &s_pack) != FL_OK) {
            fprintf(stderr, "fitllm bench packing: %s\n", fl_last_error());
            status = 1;
        }
        for (int64_t s = 0; s < B && !status; s++)
            for (int64_t i = 0; i < len[s]; i++)
                for (int64_t e = 0; e < qrow; e++)
                    max_diff = fmax(max_diff, fabs(P[3][(s * T + i) * qrow + e] - C[3][(cu[s] + i) * qrow + e]));
    }
    if (!status) {
        const double b_pad = 4.0 * (double)(2 * pq + 2 * pk), b_pack = 4.0 * (double)(2 * cq + 2 * ck);
        const double f_pad = fl_attn_flops(&ap), f_pack = fl_attn_flops(&ac);
        if (json) {
            fl_mem_install_cjson_hooks();
            const size_t fail0 = fl_mem_thread_failures();
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "benchmark", "packing");
            cJSON_AddNumberToObject(o, "threads", fl_threads_get());
            cJSON_AddNumberToObject(o, "n_seq", (double)B);
            cJSON_AddNumberToObject(o, "max_len", (double)T);
            cJSON_AddNumberToObject(o, "head_dim", (double)hd);
            cJSON_AddNumberToObject(o, "n_head", (double)nh);
            cJSON_AddNumberToObject(o, "n_head_kv", (double)nkv);
            cJSON *lens = cJSON_AddArrayToObject(o, "lengths");
            for (int64_t s = 0; s < B; s++) fl_cli_json_add(lens, NULL, cJSON_CreateNumber(len[s]));
            cJSON *p = cJSON_AddObjectToObject(o, "padded");
            cJSON_AddNumberToObject(p, "tokens", (double)n_padded);
            cJSON_AddNumberToObject(p, "qkvo_bytes", b_pad);
            cJSON_AddNumberToObject(p, "scratch_peak_bytes", (double)s_pad);
            cJSON_AddNumberToObject(p, "gflop", f_pad * 1e-9);
            cJSON_AddNumberToObject(p, "seconds", t_pad);
            cJSON *c = cJSON_AddObjectToObject(o, "packed");
            cJSON_AddNumberToObject(c, "tokens", (double)n_packed);
            cJSON_AddNumberToObject(c, "qkvo_bytes", b_pack);
            cJSON_AddNumberToObject(c, "scratch_peak_bytes", (double)s_pack);
            cJSON_AddNumberToObject(c, "gflop", f_pack * 1e-9);
            cJSON_AddNumberToObject(c, "seconds", t_pack);
            cJSON_AddNumberToObject(o, "bytes_ratio", b_pad / b_pack);
            cJSON_AddNumberToObject(o, "speedup", t_pad / t_pack);
            cJSON_AddNumberToObject(o, "max_abs_diff_real_tokens", max_diff);
            if (fl_cli_print_json("bench packing", o, true, fail0)) status = 1;
        } else {
            printf("%lld sequences, longest %lld, %lld real tokens (%.1f%% of the padded %lld)\n", (long long)B,
                   (long long)T, (long long)n_packed, 100.0 * (double)n_packed / (double)n_padded, (long long)n_padded);
            printf("%-8s %10s %12s %10s %10s\n", "layout", "Q/K/V/O", "scratch", "GFLOP", "seconds");
            printf("%-8s %7.2f MiB %8.1f KiB %10.3f %10.4f\n", "padded", b_pad / 1048576.0, (double)s_pad / 1024.0, f_pad * 1e-9, t_pad);
            printf("%-8s %7.2f MiB %8.1f KiB %10.3f %10.4f\n", "packed", b_pack / 1048576.0, (double)s_pack / 1024.0, f_pack * 1e-9, t_pack);
            printf("packed: %.2fx fewer bytes, %.2fx faster; real-token outputs differ by at most %.3g\n", b_pad / b_pack,
                   t_pad / t_pack, max_diff);
        }
        if (max_diff > 1e-4) {
            fprintf(stderr, "fitllm bench packing: padded and packed outputs disagree (%.3g)\n", max_diff);
            status = 1;
        }
    }
    for (int w = 0; w < 4; w++) {
        fl_free(FL_MEM_ACT, P[w], (w == 1 || w == 2 ? pk : pq) * 4);
        fl_free(FL_MEM_ACT, C[w], (w == 1 || w == 2 ? ck : cq) * 4);
    }
    fl_free(FL_MEM_MISC, len, sizeof(int32_t) * (size_t)B);
    fl_free(FL_MEM_MISC, cu, sizeof(int32_t) * (size_t)(B + 1));
    fl_free(FL_MEM_MISC, cu_pad, sizeof(int32_t) * (size_t)(B + 1));
    return status;
}
