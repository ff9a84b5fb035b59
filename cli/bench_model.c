/* `fitllm bench model -m MODEL [-p 512] [-n 128] [-t N] [--json]`: llama-bench-style prefill
 * (pp) and decode (tg) tokens/s through the model forward, with the weight bytes streamed per
 * decoded token as GB/s and % of the measured read bandwidth, and prefill GOP/s (2 x matmul
 * weights x tokens) as % of the measured int8 peak (kernels/calib_int8.h).
 * pp: one forward over -p tokens; tg: -n single-token forwards from an empty cache; -p 0 or
 * -n 0 skips that test (as llama-bench does), and its keys are left out of the JSON.  Decode
 * runs in up to 8 rounds, each between two readings of the bandwidth on one kept buffer: the
 * median of the rounds' ratios (tg_pct_bandwidth_paired) is what this VM's drift, 33 or 55-62
 * GB/s from one second to the next, does not move.  Likewise each prefill (-r of them, the
 * first 64) runs between two short readings of the int8 peak, and pp_pct_int8_peak_paired is the
 * median of its GOP/s over the larger of its two (pp_pct_int8_peak divides the mean by the larger
 * of the long readings before and after everything).  The KV
 * cache is `fitllm run`'s (--kv-layout paged by default, --kv-type f16, --block-size 16).
 * Builds to a stub where the model module is absent. */
#include "cli/cli.h"
#include "core/clock.h"

#include <stdio.h>

#if __has_include("model/llama.h") && __has_include("kv/kv_contig.h")
#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/calib_int8.h"
#include "kernels/matmul.h"
#include "kernels/dispatch.h"
#include "cli/cli_kv.h"
#include "model/llama.h"

#include <cjson/cJSON.h>
#include <string.h>
#include <time.h>

/* decode rounds, each with a bandwidth reading either side (at most) */
#define PAIR_MAX 8
/* prefills paired with an int8 peak reading either side (the first this many repetitions) */
#define PP_PAIR_MAX 64
/* seconds per try of those readings (fl_calib_int8_peak_gops: a probe and two tries) */
#define PP_PAIR_CALIB_S 0.05

/* the median of v[0..n) (n <= PP_PAIR_MAX); 0 for none */
static double median(const double *v0, int n) {
    double v[PP_PAIR_MAX];
    memcpy(v, v0, sizeof(double) * (size_t)n);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            const double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* gops over the larger of the int8 peak read now and *pk_prev (the reading before the run),
 * which becomes the one now */
static double paired_ratio(int nth, double gops, double *pk_prev) {
    const double pk = fl_calib_int8_peak_gops(nth, PP_PAIR_CALIB_S), pk_max = pk > *pk_prev ? pk : *pk_prev;
    *pk_prev = pk;
    return pk_max > 0 ? gops / pk_max : 0;
}

int fl_bench_model(int argc, char **argv) {
    fl_opt opts[] = {
        {"model", 'm', FL_OPT_STR, "MODEL  GGUF file (required)"},
        {"n-prompt", 'p', FL_OPT_INT, "N  prompt tokens for pp (default 512; 0 skips pp)"},
        {"n-gen", 'n', FL_OPT_INT, "N  generated tokens for tg (default 128; 0 skips tg)"},
        {"threads", 't', FL_OPT_INT, "N  threads (default 2)"},
        {"json", 0, FL_OPT_FLAG, "print JSON"},
        {"stream-mib", 0, FL_OPT_INT, "MIB  buffer for the bandwidth calibration (default 1024)"},
        {"repetitions", 'r', FL_OPT_INT, "N  prefills timed, the mean reported (default 1; the first 64 also paired with the int8 peak)"},
        FL_CLI_KV_OPTS,
        {"no-mmap", 0, FL_OPT_FLAG, "read the model file into memory (huge pages where the kernel grants them) instead of mapping it"},
        {"no-repack", 0, FL_OPT_FLAG, "keep the weights as in the file (by default Q4_0 / Q8_0 matrices are rewritten in place in groups of 8 rows for the kernels, and on AVX-512 without AMX Q4_K / Q5_K / Q6_K / Q3_K / Q2_K / Q4_1 / Q5_0 / Q5_1 / IQ4_NL in groups of 16)"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm bench model -m MODEL [-p 512] [-n 128] [-t N] [--json]",
                          "Prefill (pp) and decode (tg) tokens/s, decode GB/s of weights vs measured memory\n"
                          "bandwidth, prefill GOP/s vs measured int8 peak.  Decode runs in up to 8 rounds with the\n"
                          "bandwidth read before and after each, and each prefill between two readings of the int8 peak;\n"
                          "\"paired\" is the median of those ratios.", NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    if (!opts[0].set) {
        fprintf(stderr, "fitllm bench model: -m MODEL is required\n");
        return 2;
    }
    const int32_t np = opts[1].set ? (int32_t)opts[1].i : 512, ng = opts[2].set ? (int32_t)opts[2].i : 128;
    const int nth = opts[3].set ? (int)opts[3].i : 2;
    const int64_t stream_mib = opts[5].set ? opts[5].i : 1024;
    const int reps = opts[6].set ? (int)opts[6].i : 1;
    if (np < 0 || ng < 0 || np + ng < 1 || nth < 1 || np > 1 << 16 || ng > 1 << 16 || reps < 1 || reps > 1000 || stream_mib < 1 ||
        stream_mib > 1 << 20) {
        fprintf(stderr, "fitllm bench model: bad -p, -n, -t, -r or --stream-mib (-p and -n are 0 to 65536, not both 0; -t >= 1; -r 1 to "
                        "1000; --stream-mib 1 to 1048576)\n");
        return 2;
    }
    const size_t stream = (size_t)stream_mib << 20;
    const int32_t nt = np > 16 ? np : 16; /* the token buffers: the prompt, or the warm-up and the tg tokens' source */
    fl_threads_set(nth);
    fl_model *m = NULL;
    fl_cli_kv kv = {0};
    float *logits = NULL;
    int32_t *tok = NULL, *pos = NULL, *sid = NULL;
    int rc = 1;
    fl_calib_bw *cb = NULL;
    double tg_ratio[PAIR_MAX], pp_ratio[PP_PAIR_MAX], pp8_ratio[PP_PAIR_MAX];
    int n_tg_ratio = 0, n_pp_ratio = 0;
    fl_model_params mp = fl_model_default_params();
    mp.no_mmap = fl_args_get(opts, "no-mmap")->set;
    mp.repack = !fl_args_get(opts, "no-repack")->set;
    if (fl_model_load(opts[0].str, &mp, &m) != FL_OK) goto fail;
    const fl_hparams *hp = fl_model_hparams(m);
    if (fl_cli_kv_new(hp, fl_args_get(opts, "kv-layout")->str, fl_args_get(opts, "kv-type")->str,
                      fl_args_get(opts, "block-size")->set ? fl_args_get(opts, "block-size")->i : 0, nt + ng, &kv) != FL_OK ||
        fl_model_workspace_new(m, nt, 1) != FL_OK)
        goto fail;
    logits = fl_alloc(FL_MEM_ACT, (size_t)hp->n_vocab * 4, 64);
    tok = fl_calloc(FL_MEM_MISC, (size_t)nt, 4);
    pos = fl_calloc(FL_MEM_MISC, (size_t)nt, 4);
    sid = fl_calloc(FL_MEM_MISC, (size_t)nt, 4);
    if (!logits || !tok || !pos || !sid) goto fail;
    /* weight bytes read per decoded token: every matmul weight + one embedding row */
    double wbytes = 0, wparams = 0;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const fl_layer *L = fl_model_layer(m, l);
        const fl_tensor *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w3, &L->w2};
        for (int i = 0; i < 7; i++) {
            wbytes += (double)fl_tensor_nbytes(ws[i]);
            wparams += (double)fl_tensor_nelements(ws[i]);
        }
    }
    wbytes += (double)fl_tensor_nbytes(fl_model_output(m));
    wparams += (double)fl_tensor_nelements(fl_model_output(m));
    /* calibrated before and again after the runs, the larger kept: this machine's speed drifts
     * over minutes, and a calibration caught in a slow moment must not inflate the percentages */
    cb = fl_calib_bw_new(nth, stream);
    if (!cb && fl_isa_best() != FL_ISA_REF) { /* (the reference ISA has no read loop: no bandwidth, as before) */
        fprintf(stderr, "fitllm bench model: no buffer of --stream-mib %lld MiB for the bandwidth calibration (%s)\n", (long long)stream_mib,
                fl_last_error());
        goto done;
    }
    const double bw0 = cb ? fl_calib_bw_measure(cb, 3) : -1;
    const double peak0 = fl_calib_int8_peak_gops(nth, 0.3);
    const double amx_peak = fl_calib_amx_int8_peak_gops(nth, 0.3);

    for (int32_t i = 0; i < nt; i++) { tok[i] = 3 + (int32_t)((i * 7919u) % (uint32_t)(hp->n_vocab - 3)); pos[i] = i; sid[i] = 0; }
    /* warm-up: a short prefill */
    fl_batch wb = {16, tok, pos, sid, NULL};
    if (fl_model_forward(m, &wb, &kv.iface, kv.ctx, logits) != FL_OK) goto fail;
    fl_cli_kv_reset(&kv);
    fl_batch pb = {np, tok, pos, sid, NULL};
    /* where the prefill's matmuls take the AMX-BF16 tiles, the same prefill with them off (on the
     * int8 tiles) too, the two alternating, so both see the same machine */
    const bool compare = np >= 64 && fl_amx_bf16_usable();
    /* what each pass runs on (the first layer's wq): with the R8 groups the int8 pass takes the
     * AMX-INT8 tiles on the groups (r8-amx; the AVX-512 VNNI tiles without VBMI), with the file's
     * layout the AMX-INT8 tiles on panels */
    const int32_t wq_type = fl_model_layer(m, 0)->wq.type;
    const char *pp8_kernel = NULL;
    if (compare) { /* (only then: switching back on would override FL_AMX_BF16=0) */
        fl_matmul_set_amx_bf16(false);
        pp8_kernel = fl_matmul_kernel_name(wq_type, np);
        fl_matmul_set_amx_bf16(true);
    }
    /* each prefill (of the first PP_PAIR_MAX) between two short readings of the int8 peak: the
     * ratio of its GOP/s to the larger of the two, and their median (pp_pct_int8_peak_paired),
     * as for decode below; the passes of a comparison share their middle reading */
    const double op_pp = 2.0 * wparams * np / 1e9;
    double t_pp = 0, t_pp8 = 0, t0, t_one;
    double pk_prev = np > 0 ? fl_calib_int8_peak_gops(nth, PP_PAIR_CALIB_S) : 0;
    for (int i = 0; i < (np > 0 ? reps : 0); i++) {
        const bool pair = i < PP_PAIR_MAX;
        t0 = fl_clock_s();
        if (fl_model_forward(m, &pb, &kv.iface, kv.ctx, logits) != FL_OK) goto fail;
        t_pp += t_one = fl_clock_s() - t0;
        fl_cli_kv_reset(&kv);
        if (pair) pp_ratio[n_pp_ratio] = paired_ratio(nth, op_pp / t_one, &pk_prev);
        if (compare) {
            fl_matmul_set_amx_bf16(false);
            t0 = fl_clock_s();
            const fl_status st = fl_model_forward(m, &pb, &kv.iface, kv.ctx, logits);
            t_pp8 += t_one = fl_clock_s() - t0;
            fl_matmul_set_amx_bf16(true);
            fl_cli_kv_reset(&kv);
            if (st != FL_OK) goto fail;
            if (pair) pp8_ratio[n_pp_ratio] = paired_ratio(nth, op_pp / t_one, &pk_prev);
        }
        if (pair) n_pp_ratio++;
    }
    const char *pp_kernel = fl_matmul_kernel_name(wq_type, np > 0 ? np : 1); /* (as the switches stand after the runs) */
    t_pp /= reps;
    t_pp8 /= reps;
    /* decode in rounds, each between two readings of the bandwidth (one pass of each read loop
     * over the calibration buffer): the ratio of each round's GB/s to the larger of its two, and
     * their median, which the machine's drift from second to second (here 33 or 55-62 GB/s, the
     * two alternating) does not move as it moves the ratio to a calibration seconds away */
    double t_tg = 0;
    const int n_rounds = ng < PAIR_MAX ? ng : PAIR_MAX;
    double bw_prev = ng > 0 && cb ? fl_calib_bw_measure(cb, 1) : 0;
    for (int k = 0, i = 0; k < n_rounds; k++) { /* tokens [k ng / n_rounds, (k + 1) ng / n_rounds) */
        const int32_t i1 = (int32_t)((int64_t)(k + 1) * ng / n_rounds), n_tok = i1 - i;
        t0 = fl_clock_s();
        for (; i < i1; i++) {
            fl_batch db = {1, &tok[i % nt], &i, &sid[0], NULL};
            if (fl_model_forward(m, &db, &kv.iface, kv.ctx, logits) != FL_OK) goto fail;
        }
        const double dt = fl_clock_s() - t0;
        t_tg += dt;
        const double b = cb ? fl_calib_bw_measure(cb, 1) : 0, b_max = b > bw_prev ? b : bw_prev;
        tg_ratio[n_tg_ratio++] = b_max > 0 ? wbytes * n_tok / dt / 1e9 / b_max : 0;
        bw_prev = b;
    }
    const double bw1 = cb ? fl_calib_bw_measure(cb, 3) : -1, peak1 = fl_calib_int8_peak_gops(nth, 0.3);
    const double bw = bw0 > bw1 ? bw0 : bw1, peak = peak0 > peak1 ? peak0 : peak1;
    const double pp = np ? np / t_pp : 0, tg = ng ? ng / t_tg : 0, gbs = wbytes * tg / 1e9, gops = np ? 2.0 * wparams * np / t_pp / 1e9 : 0;
    const double pp8 = compare ? np / t_pp8 : 0, gops8 = compare ? 2.0 * wparams * np / t_pp8 / 1e9 : 0;
    if (opts[4].set) {
        fl_mem_install_cjson_hooks();
        const size_t fail0 = fl_mem_thread_failures();
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", opts[0].str);
        cJSON_AddStringToObject(o, "isa", fl_isa_name(fl_isa_get()));
        cJSON_AddNumberToObject(o, "threads", nth);
        cJSON_AddStringToObject(o, "kv_layout", kv.paged ? "paged" : "contiguous");
        cJSON_AddBoolToObject(o, "mmap", !mp.no_mmap);
        /* repacked at load: the R8 groups (Q4_0 / Q8_0) or the R16 ones (the K-quants, Q4_1,
         * Q5_0, Q5_1, IQ4_NL); the first layer's q and down projections as loaded */
        const int32_t tq = fl_model_layer(m, 0)->wq.type, t2 = fl_model_layer(m, 0)->w2.type;
        cJSON_AddBoolToObject(o, "repack", fl_r8_base(tq) >= 0 || fl_r8_base(t2) >= 0 || fl_k16_type(tq) || fl_k16_type(t2));
        cJSON_AddStringToObject(o, "wq_type", fl_type_name(tq));
        cJSON_AddNumberToObject(o, "weight_bytes_per_token", wbytes);
        cJSON_AddNumberToObject(o, "mem_bandwidth_gbs", bw);
        cJSON_AddNumberToObject(o, "int8_peak_gops", peak);
        cJSON_AddNumberToObject(o, "mem_bandwidth_gbs_before", bw0);
        cJSON_AddNumberToObject(o, "mem_bandwidth_gbs_after", bw1);
        cJSON_AddNumberToObject(o, "int8_peak_gops_before", peak0);
        cJSON_AddNumberToObject(o, "int8_peak_gops_after", peak1);
        cJSON_AddBoolToObject(o, "amx", fl_amx_usable());
        cJSON_AddNumberToObject(o, "amx_int8_peak_gops", amx_peak);
        cJSON_AddNumberToObject(o, "n_prompt", np);
        if (np) {
            cJSON_AddStringToObject(o, "pp_kernel", pp_kernel);
            cJSON_AddNumberToObject(o, "pp_tok_s", pp);
            cJSON_AddNumberToObject(o, "pp_gops", gops);
            cJSON_AddNumberToObject(o, "pp_pct_int8_peak", peak > 0 ? 100 * gops / peak : 0);
            cJSON_AddNumberToObject(o, "pp_pct_int8_peak_paired", 100 * median(pp_ratio, n_pp_ratio));
            cJSON *a = cJSON_AddArrayToObject(o, "pp_pct_int8_peak_rounds");
            for (int k = 0; a && k < n_pp_ratio; k++) fl_cli_json_add(a, NULL, cJSON_CreateNumber(100 * pp_ratio[k]));
        }
        cJSON_AddNumberToObject(o, "repetitions", reps);
        cJSON_AddBoolToObject(o, "amx_bf16_prefill", compare);
        if (compare) {
            cJSON_AddStringToObject(o, "pp_int8_tiles_kernel", pp8_kernel);
            cJSON_AddNumberToObject(o, "pp_int8_tiles_tok_s", pp8);
            cJSON_AddNumberToObject(o, "pp_int8_tiles_pct_int8_peak", peak > 0 ? 100 * gops8 / peak : 0);
            cJSON_AddNumberToObject(o, "pp_int8_tiles_pct_int8_peak_paired", 100 * median(pp8_ratio, n_pp_ratio));
        }
        cJSON_AddNumberToObject(o, "n_gen", ng);
        if (ng) {
            cJSON_AddNumberToObject(o, "tg_tok_s", tg);
            cJSON_AddNumberToObject(o, "tg_gbs", gbs);
            cJSON_AddNumberToObject(o, "tg_pct_bandwidth", bw > 0 ? 100 * gbs / bw : 0);
            cJSON_AddNumberToObject(o, "tg_pct_bandwidth_paired", 100 * median(tg_ratio, n_tg_ratio));
            cJSON *a = cJSON_AddArrayToObject(o, "tg_pct_bandwidth_rounds");
            for (int k = 0; a && k < n_tg_ratio; k++) fl_cli_json_add(a, NULL, cJSON_CreateNumber(100 * tg_ratio[k]));
        }
        if (fl_cli_print_json(NULL, o, false, fail0)) goto fail;
    } else {
        printf("model %s: %.1f MiB of matmul weights per token, isa %s, %d threads%s\n", opts[0].str, wbytes / 1048576.0,
               fl_isa_name(fl_isa_get()), nth, mp.no_mmap ? ", weights read into memory (--no-mmap)" : "");
        printf("calibration (the larger of before and after): memory read bandwidth %.1f GB/s, int8 peak %.1f GOP/s (%s)", bw,
               peak, fl_isa_get() == FL_ISA_AVX512 ? "AVX-512 VNNI" : "AVX2 maddubs");
        if (amx_peak > 0) printf(", AMX-INT8 tiles %.1f GOP/s", amx_peak);
        printf("\n");
        if (np)
            printf("pp%-5d %9.2f tok/s  %8.1f GOP/s  %5.1f%% of int8 peak (%.1f%% paired: the median of %d) (%s)\n", np, pp, gops,
                   peak > 0 ? 100 * gops / peak : 0, 100 * median(pp_ratio, n_pp_ratio), n_pp_ratio, pp_kernel);
        if (compare)
            printf("pp%-5d %9.2f tok/s  %8.1f GOP/s  %5.1f%% of int8 peak (%.1f%% paired) (%s, AMX-BF16 off, alternated)\n", np, pp8,
                   gops8, peak > 0 ? 100 * gops8 / peak : 0, 100 * median(pp8_ratio, n_pp_ratio), pp8_kernel);
        if (ng)
            printf("tg%-5d %9.2f tok/s  %8.2f GB/s   %5.1f%% of memory bandwidth (%.1f%% paired: the median of %d rounds)\n", ng, tg, gbs,
                   bw > 0 ? 100 * gbs / bw : 0, 100 * median(tg_ratio, n_tg_ratio), n_tg_ratio);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "fitllm bench model: %s\n", fl_last_error());
done:
    fl_calib_bw_free(cb);
    if (sid) fl_free(FL_MEM_MISC, sid, (size_t)nt * 4);
    if (pos) fl_free(FL_MEM_MISC, pos, (size_t)nt * 4);
    if (tok) fl_free(FL_MEM_MISC, tok, (size_t)nt * 4);
    if (logits) fl_free(FL_MEM_ACT, logits, (size_t)fl_model_hparams(m)->n_vocab * 4);
    fl_cli_kv_free(&kv);
    if (m) fl_model_free(m);
    return rc;
}
#else
int fl_bench_model(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "fitllm bench model: this build has no model module (src/model)\n");
    return 1;
}
#endif
