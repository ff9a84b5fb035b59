/* `fitllm bench matmul`: GEMV (decode) GB/s against the measured read bandwidth and GEMM
 * (prefill) GOP/s against the measured int8 peak, on TinyLlama-1.1B-shaped matrices.
 *
 * GEMV streams R copies of the weight in turn (R copies >= --stream-mib, so the weights come
 * from memory, not from the last-level cache); GB/s counts weight bytes read per second.
 * GEMM multiplies -p tokens (default 512) by one copy: GOP/s = 2 M N K / time.  Where the GEMM
 * takes the AMX-BF16 tiles (64 tokens or more), the same GEMM with them off is timed too (the
 * int8 tiles: AMX-INT8 for the file's layout and, where the CPU has AVX512_VBMI, for Q4_0_R8 /
 * Q8_0_R8 (otherwise the AVX-512 VNNI tiles there)),
 * the two alternating call by call so that both see the same machine; the JSON's "all" rows
 * name the kernel of each (fl_matmul_kernel_name).
 *
 * With -p of at most STREAM_GEMM_TOKENS (a batched decode step, whose weights come from memory
 * once per step) the GEMM is timed over the copies too, as the GEMV is ("gemm_stream_gops").
 *
 * Per type also the attention projections of one layer, q (2048 x 2048), k and v (256 x 2048)
 * on the same input: fl_matmul_n (one call) against three fl_matmul calls, alternated, for one
 * token and for -p tokens (the weights stay in cache: this measures the per-call work that
 * fusing saves, not memory). */
#include "cli/cli.h"
#include "core/clock.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/calib_int8.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STREAM_GEMM_TOKENS 16

typedef struct { const float *src; float *dst; int64_t n; uint64_t seed; } fill_ctx;
static void fill_task(void *p, int ith, int nth) {
    fill_ctx *c = p;
    int64_t lo, hi;
    fl_split_range(c->n, ith, nth, &lo, &hi);
    uint64_t s = c->seed * 0x9E3779B97F4A7C15ULL + (uint64_t)ith * 0xD1B54A32D192ED03ULL + 1;
    for (int64_t i = lo; i < hi; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        c->dst[i] = (float)((double)(s >> 11) * 0x1.0p-53 - 0.5) * 0.1f;
    }
}

static float *rand_f32(int64_t n, uint64_t seed) {
    float *x = fl_alloc(FL_MEM_SCRATCH, (size_t)n * 4, 64);
    if (!x) return NULL;
    fill_ctx c = {NULL, x, n, seed};
    fl_parallel(fill_task, &c);
    return x;
}

/* The weights of a type: quantized (q4_0_r8 / q8_0_r8 / q4_K_r16 / q6_K_r16: as the base type, then
 * repacked in place a group of rows at a time, as the model loader does: fl_r8_load_type); false
 * if out of memory. */
/* the file type a repacked type is made from (q4_0_r8, q8_0_r8, the R16 types), else -1 */
static int32_t repack_base(int32_t type) {
    return fl_k16_type(type) ? fl_k16_base(type) : fl_r8_base(type);
}

static bool quantize_w(int32_t type, const float *f, int64_t N, int64_t K, char *w) {
    const int32_t base = repack_base(type);
    if (base < 0) return fl_quantize_tensor(type, f, N, K, w) == FL_OK;
    if (fl_quantize_tensor(base, f, N, K, w) != FL_OK) return false;
    const size_t ldw = fl_quantize_size(base, 1, K), gr = (size_t)fl_r8_group_rows(type);
    void *tmp = fl_alloc(FL_MEM_SCRATCH, gr * ldw, 64);
    if (!tmp) return false;
    for (int64_t r = 0; r < N; r += (int64_t)gr) fl_r8_repack(type, w + (size_t)r * ldw, ldw, K, tmp);
    fl_free(FL_MEM_SCRATCH, tmp, gr * ldw);
    return true;
}

static size_t wsize(int32_t type, int64_t N, int64_t K) { return fl_quantize_size(repack_base(type) >= 0 ? repack_base(type) : type, N, K); }

/* Microseconds per q, k, v projection of M tokens: [0] three fl_matmul calls, [1] one
 * fl_matmul_n, alternated for at least secs; false if out of memory. */
static bool time_qkv(int32_t type, int64_t M, double secs, double us[2]) {
    const int64_t K = 2048, rows[3] = {2048, 256, 256}, N = 2560;
    const size_t rb = wsize(type, 1, K);
    float *f = rand_f32(N * K, 99), *x = rand_f32(M * K, 98);
    char *w = fl_alloc(FL_MEM_WEIGHTS, rb * (size_t)N, 4096);
    float *y = fl_alloc(FL_MEM_ACT, (size_t)(M * N) * 4, 64);
    bool ok = f && x && w && y;
    if (ok) ok = quantize_w(type, f, N, K, w);
    if (ok) {
        fl_tensor W[3];
        const fl_tensor *Wp[3];
        float *yp[3];
        for (int i = 0, r0 = 0; i < 3; r0 += (int)rows[i], i++) {
            const int64_t ne[2] = {K, rows[i]};
            fl_tensor_init(&W[i], type, 2, ne, w + (size_t)r0 * rb);
            Wp[i] = &W[i];
            yp[i] = y + M * r0;
        }
        fl_matmul_n(3, Wp, yp, x, M); /* warm-up */
        double t[2] = {0, 0};
        size_t runs = 0;
        do {
            double t0 = fl_clock_s();
            for (int i = 0; i < 3; i++) fl_matmul(Wp[i], x, yp[i], M);
            t[0] += fl_clock_s() - t0;
            t0 = fl_clock_s();
            fl_matmul_n(3, Wp, yp, x, M);
            t[1] += fl_clock_s() - t0;
            runs++;
        } while (t[0] + t[1] < 2 * secs);
        for (int i = 0; i < 2; i++) us[i] = 1e6 * t[i] / (double)runs;
    }
    if (f) fl_free(FL_MEM_SCRATCH, f, (size_t)(N * K) * 4);
    if (x) fl_free(FL_MEM_SCRATCH, x, (size_t)(M * K) * 4);
    if (w) fl_free(FL_MEM_WEIGHTS, w, rb * (size_t)N);
    if (y) fl_free(FL_MEM_ACT, y, (size_t)(M * N) * 4);
    return ok;
}

int fl_bench_matmul(int argc, char **argv) {
    fl_opt opts[] = {
        {"threads", 't', FL_OPT_INT, "N  threads (default 2)"},
        {"json", 0, FL_OPT_FLAG, "print JSON"},
        {"n-prompt", 'p', FL_OPT_INT, "M  tokens for the GEMM (default 512)"},
        {"types", 0, FL_OPT_STR, "LIST  weight types, comma separated (default Q4_0,Q8_0; Q4_0_R8 / Q8_0_R8: repacked in groups of 8 rows, as the model loader does on AVX2 and AVX-512 unless AMX-INT8 comes without AMX-BF16; Q4_K_R16 / Q5_K_R16 / Q6_K_R16 / Q3_K_R16 / Q2_K_R16 / Q4_1_R16 / Q5_0_R16 / Q5_1_R16 / IQ4_NL_R16: in groups of 16, as it does on AVX-512 without AMX)"},
        {"stream-mib", 0, FL_OPT_INT, "MIB  weight bytes cycled through in GEMV, streamed GEMM and bandwidth calibration (default 1024)"},
        {"seconds", 0, FL_OPT_FLOAT, "S  minimum time per measurement (default 0.5)"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm bench matmul [-t N] [-p M] [--types Q4_0,Q8_0] [--json]",
                          "GEMV GB/s vs measured memory bandwidth, GEMM GOP/s vs measured int8 peak,\n"
                          "on TinyLlama-1.1B matrices (N x K): 2048x2048, 256x2048 (K, V), 5632x2048, 2048x5632, 32000x2048.\n"
                          "With -p 16 or fewer (a batched decode step) the GEMM is also timed with its weights from memory\n"
                          "(\"streamed\", over the copies as the GEMV).",
                          NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    const int nth = opts[0].set ? (int)opts[0].i : 2;
    const int64_t M = opts[2].set ? opts[2].i : 512;
    const int64_t stream_mib = opts[4].set ? opts[4].i : 1024;
    const double secs = opts[5].set ? opts[5].f : 0.5;
    if (nth < 1 || M < 1 || M > 1 << 20 || stream_mib < 1 || stream_mib > 1 << 20) {
        fprintf(stderr, "fitllm bench matmul: bad -t, -p or --stream-mib (-t >= 1, -p 1 to 1048576, --stream-mib 1 to 1048576)\n");
        return 2;
    }
    const size_t stream = (size_t)stream_mib << 20;
    /* What a shape's pass holds at once, at most (f32 source, its copies, activations, outputs; the
     * weights counted at 4 bytes each, the most any type takes), against the machine's memory:
     * the system overcommits, so too large a -p would otherwise be killed part way. */
    static const int64_t shapes[5][2] = {{2048, 2048}, {256, 2048}, {5632, 2048}, {2048, 5632}, {32000, 2048}};
    double need = 0;
    for (int s = 0; s < 5; s++) {
        const double nk = (double)shapes[s][0] * (double)shapes[s][1];
        const double b = nk * 4 + ((double)stream + nk * 4) + (double)M * (double)(shapes[s][0] + shapes[s][1]) * 4;
        if (b > need) need = b;
    }
    const uint64_t sys_bytes = fl_mem_system_bytes();
    if (sys_bytes > 0 && need > (double)sys_bytes) {
        fprintf(stderr, "fitllm bench matmul: -p %lld with --stream-mib %lld needs up to %.1f GiB of buffers, more than this machine's %.1f GiB\n",
                (long long)M, (long long)stream_mib, need / (1 << 30), (double)sys_bytes / (1 << 30));
        return 2;
    }
    char types_s[256];
    snprintf(types_s, sizeof types_s, "%s", opts[3].set ? opts[3].str : "Q4_0,Q8_0");
    fl_threads_set(nth);
    const bool json = opts[1].set;
    fl_mem_install_cjson_hooks();

    const double peak = fl_calib_int8_peak_gops(nth, 0.3);
    const double amx_peak = fl_calib_amx_int8_peak_gops(nth, 0.3);
    const double bw = fl_calib_mem_bandwidth_gbs(nth, stream);
    const bool compare = M >= 64 && fl_amx_bf16_usable(); /* the bf16 tiles against the int8 ones */
    const bool stream_gemm = M <= STREAM_GEMM_TOKENS;
    if (!json) {
        printf("isa %s, %d threads\n", fl_isa_name(fl_isa_get()), nth);
        printf("calibration: int8 peak %.1f GOP/s (AVX-512 VNNI), memory read bandwidth %.1f GB/s\n", peak, bw);
        if (amx_peak > 0) printf("AMX-INT8 tiles: %.1f GOP/s peak (FL_AMX=0 turns the AMX tiles off)\n", amx_peak);
        if (compare)
            printf("GEMM on the AMX-BF16 tiles; 'int8 tiles' is the same GEMM with them off, alternated call by call (the AMX-INT8\n"
                   "tiles: on the file's layout, and on the R8 groups with VBMI, else the AVX-512 VNNI tiles there)\n");
        if (stream_gemm)
            printf("GEMM of %lld tokens (a batched decode step) also over the copies, its weights from memory ('streamed')\n", (long long)M);
        printf("%-6s %-11s %10s %8s %10s %8s%s%s\n", "type", "N x K", "gemv GB/s", "%bw", "gemm GOP/s", "%peak", compare ? "  int8 tiles GOP/s" : "",
               stream_gemm ? "    streamed    %peak" : "");
    }
    const size_t fail0 = fl_mem_thread_failures();
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "isa", fl_isa_name(fl_isa_get()));
    cJSON_AddNumberToObject(root, "threads", nth);
    cJSON_AddNumberToObject(root, "int8_peak_gops", peak);
    cJSON_AddBoolToObject(root, "amx", fl_amx_usable());
    cJSON_AddNumberToObject(root, "amx_int8_peak_gops", amx_peak);
    cJSON_AddBoolToObject(root, "amx_bf16_gemm", compare);
    cJSON_AddNumberToObject(root, "mem_bandwidth_gbs", bw);
    cJSON_AddNumberToObject(root, "gemm_tokens", (double)M);
    fl_cli_json_add(root, "results", arr);

    int rc = 0;
    for (char *save = NULL, *tn = strtok_r(types_s, ",", &save); tn; tn = strtok_r(NULL, ",", &save)) {
        const int32_t type = fl_type_from_name(tn);
        if (type < 0 || fl_matmul_supported(type) != FL_OK || (!fl_quantize_supported(type) && repack_base(type) < 0)) {
            fprintf(stderr, "fitllm bench matmul: unsupported type '%s'\n", tn);
            rc = 2;
            break;
        }
        double sum_bytes = 0, sum_t_gemv = 0, sum_ops = 0, sum_t_gemm = 0, sum_t_int8 = 0, sum_sops = 0, sum_t_stream = 0;
        for (int s = 0; s < 5; s++) {
            const int64_t N = shapes[s][0], K = shapes[s][1];
            const size_t wbytes = wsize(type, N, K);
            size_t R = (stream + wbytes - 1) / wbytes;
            if (R < 1) R = 1;
            float *f = rand_f32(N * K, (uint64_t)s + 1);
            char *w = fl_alloc(FL_MEM_WEIGHTS, wbytes * R, 4096);
            float *x = rand_f32(M * K, 77), *y = fl_alloc(FL_MEM_ACT, (size_t)(M * N) * 4, 64);
            if (!f || !w || !x || !y) {
                fprintf(stderr, "fitllm bench matmul: %s\n", fl_last_error());
                rc = 1;
                if (f) fl_free(FL_MEM_SCRATCH, f, (size_t)(N * K) * 4);
                if (w) fl_free(FL_MEM_WEIGHTS, w, wbytes * R);
                if (x) fl_free(FL_MEM_SCRATCH, x, (size_t)(M * K) * 4);
                if (y) fl_free(FL_MEM_ACT, y, (size_t)(M * N) * 4);
                break;
            }
            if (!quantize_w(type, f, N, K, w)) {
                fprintf(stderr, "fitllm bench matmul: %s\n", fl_last_error());
                rc = 1;
                fl_free(FL_MEM_SCRATCH, f, (size_t)(N * K) * 4);
                fl_free(FL_MEM_WEIGHTS, w, wbytes * R);
                fl_free(FL_MEM_SCRATCH, x, (size_t)(M * K) * 4);
                fl_free(FL_MEM_ACT, y, (size_t)(M * N) * 4);
                break;
            }
            fl_free(FL_MEM_SCRATCH, f, (size_t)(N * K) * 4);
            for (size_t i = 1; i < R; i++) memcpy(w + i * wbytes, w, wbytes);
            fl_tensor W[1];
            const int64_t ne[2] = {K, N};
            /* GEMV over the copies in turn */
            size_t calls = 0;
            for (size_t i = 0; i < R; i++) { /* warm-up pass (page tables, frequency) */
                fl_tensor_init(W, type, 2, ne, w + i * wbytes);
                fl_matmul(W, x, y, 1);
            }
            double t0 = fl_clock_s(), t;
            do {
                fl_tensor_init(W, type, 2, ne, w + (calls % R) * wbytes);
                fl_matmul(W, x, y, 1);
                calls++;
                t = fl_clock_s() - t0;
            } while (t < secs || calls < R);
            const double gbs = (double)wbytes * (double)calls / t / 1e9;
            sum_bytes += (double)wbytes * (double)calls;
            sum_t_gemv += t;
            /* GEMM on one copy */
            fl_tensor_init(W, type, 2, ne, w);
            fl_matmul(W, x, y, M < 16 ? M : 16); /* warm-up */
            size_t runs = 0;
            double t_int8 = 0;
            t = 0;
            do {
                t0 = fl_clock_s();
                fl_matmul(W, x, y, M);
                t += fl_clock_s() - t0;
                if (compare) {
                    fl_matmul_set_amx_bf16(false);
                    t0 = fl_clock_s();
                    fl_matmul(W, x, y, M);
                    t_int8 += fl_clock_s() - t0;
                    fl_matmul_set_amx_bf16(true);
                }
                runs++;
            } while (t + t_int8 < secs * (compare ? 2 : 1));
            const double ops = 2.0 * (double)M * (double)N * (double)K * (double)runs;
            const double gops = ops / t / 1e9, gops_int8 = compare ? ops / t_int8 / 1e9 : 0;
            /* a batched decode step's GEMM reads its weights from memory: the same over the copies */
            double gops_stream = 0;
            if (stream_gemm) {
                size_t scalls = 0;
                t0 = fl_clock_s();
                do {
                    fl_tensor_init(W, type, 2, ne, w + (scalls % R) * wbytes);
                    fl_matmul(W, x, y, M);
                    scalls++;
                    t = fl_clock_s() - t0;
                } while (t < secs || scalls < R);
                const double sops = 2.0 * (double)M * (double)N * (double)K * (double)scalls;
                gops_stream = sops / t / 1e9;
                sum_sops += sops;
                sum_t_stream += t;
            }
            sum_ops += ops;
            sum_t_gemm += t;
            sum_t_int8 += t_int8;
            char shape[32];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)N, (long long)K);
            if (!json) {
                printf("%-6s %-11s %10.1f %7.1f%% %10.1f %7.1f%%", fl_type_name(type), shape, gbs, bw > 0 ? 100 * gbs / bw : 0, gops,
                       peak > 0 ? 100 * gops / peak : 0);
                if (compare) printf("  %16.1f", gops_int8);
                if (stream_gemm) printf(" %11.1f %7.1f%%", gops_stream, peak > 0 ? 100 * gops_stream / peak : 0);
                printf("\n");
            }
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "type", fl_type_name(type));
            cJSON_AddNumberToObject(o, "N", (double)N);
            cJSON_AddNumberToObject(o, "K", (double)K);
            cJSON_AddNumberToObject(o, "gemv_gbs", gbs);
            cJSON_AddNumberToObject(o, "gemv_pct_bandwidth", bw > 0 ? 100 * gbs / bw : 0);
            cJSON_AddNumberToObject(o, "gemm_gops", gops);
            cJSON_AddNumberToObject(o, "gemm_pct_int8_peak", peak > 0 ? 100 * gops / peak : 0);
            if (compare) cJSON_AddNumberToObject(o, "gemm_int8_tiles_gops", gops_int8);
            if (stream_gemm) {
                cJSON_AddNumberToObject(o, "gemm_stream_gops", gops_stream);
                cJSON_AddNumberToObject(o, "gemm_stream_pct_int8_peak", peak > 0 ? 100 * gops_stream / peak : 0);
            }
            fl_cli_json_add(arr, NULL, o);
            fl_free(FL_MEM_WEIGHTS, w, wbytes * R);
            fl_free(FL_MEM_SCRATCH, x, (size_t)(M * K) * 4);
            fl_free(FL_MEM_ACT, y, (size_t)(M * N) * 4);
        }
        if (rc) break;
        const double gbs = sum_bytes / sum_t_gemv / 1e9, gops = sum_ops / sum_t_gemm / 1e9;
        const double gops_int8 = compare ? sum_ops / sum_t_int8 / 1e9 : 0;
        const double gops_stream = stream_gemm ? sum_sops / sum_t_stream / 1e9 : 0;
        if (!json) {
            printf("%-6s %-11s %10.1f %7.1f%% %10.1f %7.1f%%", fl_type_name(type), "all", gbs, bw > 0 ? 100 * gbs / bw : 0, gops,
                   peak > 0 ? 100 * gops / peak : 0);
            if (compare) printf("  %16.1f", gops_int8);
            if (stream_gemm) printf(" %11.1f %7.1f%%", gops_stream, peak > 0 ? 100 * gops_stream / peak : 0);
            printf("\n");
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", fl_type_name(type));
        cJSON_AddStringToObject(o, "shape", "all");
        cJSON_AddStringToObject(o, "gemm_kernel", fl_matmul_kernel_name(type, M));
        if (compare) {
            fl_matmul_set_amx_bf16(false);
            cJSON_AddStringToObject(o, "gemm_int8_tiles_kernel", fl_matmul_kernel_name(type, M));
            fl_matmul_set_amx_bf16(true);
        }
        cJSON_AddNumberToObject(o, "gemv_gbs", gbs);
        cJSON_AddNumberToObject(o, "gemv_pct_bandwidth", bw > 0 ? 100 * gbs / bw : 0);
        cJSON_AddNumberToObject(o, "gemm_gops", gops);
        cJSON_AddNumberToObject(o, "gemm_pct_int8_peak", peak > 0 ? 100 * gops / peak : 0);
        if (compare) cJSON_AddNumberToObject(o, "gemm_int8_tiles_gops", gops_int8);
        if (stream_gemm) {
            cJSON_AddNumberToObject(o, "gemm_stream_gops", gops_stream);
            cJSON_AddNumberToObject(o, "gemm_stream_pct_int8_peak", peak > 0 ? 100 * gops_stream / peak : 0);
        }
        fl_cli_json_add(arr, NULL, o);
        /* q, k, v in one call against three */
        double us1[2], usm[2];
        if (!time_qkv(type, 1, secs, us1) || !time_qkv(type, M, secs, usm)) {
            fprintf(stderr, "fitllm bench matmul: %s\n", fl_last_error());
            rc = 1;
            break;
        }
        if (!json)
            printf("%-6s q,k,v: 1 token %.1f us as 3 calls, %.1f us as one; %lld tokens %.1f / %.1f us\n", fl_type_name(type), us1[0],
                   us1[1], (long long)M, usm[0], usm[1]);
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", fl_type_name(type));
        cJSON_AddStringToObject(o, "shape", "qkv");
        cJSON_AddNumberToObject(o, "gemv_us_3_calls", us1[0]);
        cJSON_AddNumberToObject(o, "gemv_us_fused", us1[1]);
        cJSON_AddNumberToObject(o, "gemm_us_3_calls", usm[0]);
        cJSON_AddNumberToObject(o, "gemm_us_fused", usm[1]);
        fl_cli_json_add(arr, NULL, o);
    }
    if (json && !rc) {
        rc = fl_cli_print_json("bench matmul", root, false, fail0);
        root = NULL;
    }
    cJSON_Delete(root);
    return rc;
}
