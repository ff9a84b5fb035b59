/* `fitllm bench context`: long-context sweep of one model.  For n_ctx = min-ctx, 2 min-ctx, ...
 * up to max-ctx (or the largest whose KV fits --kv-mem): prefill time, decode time per token
 * and peak memory by category (tracked allocator) for
 *   paged f16 / paged fp8   the paged KV cache (kv/kv_cache.h) sized to the context, chunked prefill
 *   flash f16 / naive f16   contiguous KV through kernels/attn.h (one-shot prefill; smaller sizes)
 *   sp flash f16            with --sp: ring attention over the ranks of mpirun (dist/sp.h), each
 *                           rank holding 1/N of the KV; per-rank KV peaks are all-gathered.
 * The planner's KV bytes (fl_plan_kv_bytes with sp = ranks) are printed next to the measured
 * ones.  --plot writes memory vs context length through gnuplot (SVG, or PNG for *.png). */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "dist/dist.h"
#include "dist/pp.h"
#include "dist/sp.h"
#include "dist/tp.h"
#include "kv/kv_cache.h"
#include "model/llama.h"
#include "plan/plan.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { BC_PAGED, BC_SP } bc_kind;

typedef struct bc_config {
    const char *name;
    bc_kind kind;
    int32_t kv_type;
    int32_t impl; /* sp: 0 flash, 1 naive */
    int64_t max_ctx;
} bc_config;

typedef struct bc_row {
    double prefill_s, decode_s;
    int32_t n_decode;
    size_t peak[FL_MEM_COUNT], peak_total, kv_bytes;
    uint64_t comm_prefill, comm_decode;
} bc_row;

static double bc_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int32_t bc_token(int64_t i, int32_t V) { return i == 0 ? 1 : (int32_t)(3 + (i * 7919) % (V - 3)); }

static void bc_peaks(bc_row *r) {
    for (int c = 0; c < FL_MEM_COUNT; c++) r->peak[c] = fl_mem_peak((fl_mem_cat)c);
    r->peak_total = fl_mem_peak_total();
}

/* Paged cache: prefill ctx - n_decode tokens in chunks, then n_decode single-token steps.
 * With tp (a tensor-parallel model over the comm's ranks) the forward is fl_tp_forward. */
static fl_pp_model *g_pp;    /* --pp: the stage model */
static int32_t g_pp_micro;   /* micro-batches per prefill chunk */

static fl_status bc_fwd(fl_model *m, fl_tp_model *tp, const fl_batch *b, const fl_kv_iface *kif, void *kv, float *logits) {
    if (g_pp) return fl_pp_forward(g_pp, b, b->n_tokens > 1 ? g_pp_micro : 1, kif, kv, logits);
    return tp ? fl_tp_forward(tp, b, kif, kv, logits) : fl_model_forward(m, b, kif, kv, logits);
}

static fl_status bc_run_paged(fl_model *m, fl_tp_model *tp, fl_comm *comm, const bc_config *c, int64_t ctx, int32_t chunk,
                              int32_t n_decode, bc_row *r) {
    const fl_hparams *hp = fl_model_hparams(m);
    fl_kv_config kc = {.n_layer = hp->n_layer, .n_head = hp->n_head_local, .n_head_kv = hp->n_head_kv_local, .head_dim = hp->head_dim,
                       .type = c->kv_type, .block_size = 16, .n_blocks = (int32_t)((ctx + 15) / 16 + 1), .n_seq_max = 1};
    fl_model_workspace_free(m);
    fl_mem_reset_peaks();
    fl_kv_cache *kv = fl_kv_new(&kc);
    if (!kv) return FL_ERR_BUDGET;
    r->kv_bytes = fl_mem_current(FL_MEM_KV);
    const size_t lb = (size_t)hp->n_vocab * sizeof(float), ib = (size_t)chunk * 3 * sizeof(int32_t);
    float *logits = fl_alloc(FL_MEM_ACT, lb, 64);
    int32_t *ib_ = fl_alloc(FL_MEM_ACT, ib, 64);
    const int32_t ws_tokens = g_pp ? (chunk + g_pp_micro - 1) / g_pp_micro : chunk;
    fl_status st = logits && ib_ ? fl_model_workspace_new(m, ws_tokens, 1) : FL_ERR_NOMEM;
    const fl_kv_iface kif = fl_kv_iface_get();
    const int64_t n_pre = ctx - n_decode;
    if (!st) {
        int32_t *tok = ib_, *pos = ib_ + chunk, *seq0 = ib_ + 2 * chunk;
        int32_t zero[1] = {0};
        fl_comm_barrier(comm);
        uint64_t c0 = fl_comm_bytes_sent(comm);
        double t0 = bc_now();
        for (int64_t p0 = 0; p0 < n_pre && !st; p0 += chunk) {
            const int32_t n = (int32_t)(n_pre - p0 < chunk ? n_pre - p0 : chunk);
            for (int32_t i = 0; i < n; i++) {
                tok[i] = bc_token(p0 + i, hp->n_vocab);
                pos[i] = (int32_t)(p0 + i);
                seq0[i] = 0;
            }
            fl_batch b = {n, tok, pos, seq0, NULL};
            st = bc_fwd(m, tp, &b, &kif, kv, logits);
        }
        fl_comm_barrier(comm);
        r->prefill_s = bc_now() - t0;
        r->comm_prefill = fl_comm_bytes_sent(comm) - c0;
        c0 = fl_comm_bytes_sent(comm);
        t0 = bc_now();
        for (int32_t g = 0; g < n_decode && !st; g++) {
            int32_t t = bc_token(n_pre + g, hp->n_vocab), p = (int32_t)(n_pre + g);
            fl_batch b = {1, &t, &p, zero, NULL};
            st = bc_fwd(m, tp, &b, &kif, kv, logits);
        }
        r->comm_decode = fl_comm_bytes_sent(comm) - c0;
        r->decode_s = (bc_now() - t0) / (n_decode > 0 ? n_decode : 1);
        r->n_decode = n_decode;
    }
    bc_peaks(r);
    fl_model_workspace_free(m);
    fl_free(FL_MEM_ACT, logits, lb);
    fl_free(FL_MEM_ACT, ib_, ib);
    fl_kv_free(kv);
    return st;
}

/* Sequence-parallel backend (one rank: contiguous KV + kernels/attn.h): one-shot prefill. */
static fl_status bc_run_sp(fl_model *m, fl_comm *comm, const bc_config *c, int64_t ctx, int32_t n_decode, bc_row *r) {
    const fl_hparams *hp = fl_model_hparams(m);
    const int32_t N = fl_comm_size(comm), rank = fl_comm_rank(comm);
    fl_sp_params sp = {hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, (int32_t)ctx, c->kv_type, c->impl};
    fl_model_workspace_free(m);
    fl_mem_reset_peaks();
    fl_sp *s;
    fl_status st = fl_sp_new(comm, &sp, &s);
    if (st) return st;
    r->kv_bytes = fl_mem_current(FL_MEM_KV);
    const int64_t n_pre = ctx - n_decode;
    const size_t lb = (size_t)hp->n_vocab * sizeof(float), tb = (size_t)n_pre * sizeof(int32_t);
    float *logits = fl_alloc(FL_MEM_ACT, lb, 64);
    int32_t *tok = fl_alloc(FL_MEM_ACT, tb, 64);
    st = logits && tok ? fl_model_workspace_new(m, (int32_t)fl_sp_local_tokens(n_pre, N, rank), 1) : FL_ERR_NOMEM;
    if (!st) {
        for (int64_t i = 0; i < n_pre; i++) tok[i] = bc_token(i, hp->n_vocab);
        fl_comm_barrier(comm);
        uint64_t b0 = fl_comm_bytes_sent(comm);
        double t0 = bc_now();
        st = fl_sp_prefill(s, m, tok, (int32_t)n_pre, logits);
        fl_comm_barrier(comm);
        r->prefill_s = bc_now() - t0;
        r->comm_prefill = fl_comm_bytes_sent(comm) - b0;
        b0 = fl_comm_bytes_sent(comm);
        t0 = bc_now();
        for (int32_t g = 0; g < n_decode && !st; g++) st = fl_sp_decode(s, m, bc_token(n_pre + g, hp->n_vocab), logits);
        r->decode_s = (bc_now() - t0) / (n_decode > 0 ? n_decode : 1);
        r->comm_decode = fl_comm_bytes_sent(comm) - b0;
        r->n_decode = n_decode;
    }
    bc_peaks(r);
    fl_model_workspace_free(m);
    fl_free(FL_MEM_ACT, logits, lb);
    fl_free(FL_MEM_ACT, tok, tb);
    fl_sp_free(s);
    return st;
}

static int bc_plot(const char *svg, cJSON *rows, int n_ranks) {
    char dat[1024], gp[1024];
    snprintf(dat, sizeof dat, "%s.dat", svg);
    snprintf(gp, sizeof gp, "%s.gp", svg);
    FILE *f = fopen(dat, "w");
    if (!f) {
        fprintf(stderr, "fitllm bench context: cannot write %s\n", dat);
        return 1;
    }
    /* one block per config: ctx kv_MiB total_peak_MiB */
    const char *cur = NULL;
    char names[8][32];
    int nb = 0;
    cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        const char *name = cJSON_GetObjectItem(row, "config")->valuestring;
        if (!cur || strcmp(cur, name)) {
            if (cur) fprintf(f, "\n\n");
            cur = name;
            if (nb < 8) snprintf(names[nb], sizeof names[0], "%s", name);
            nb++;
            fprintf(f, "# ctx kv_MiB peak_total_MiB (%s)\n", name);
        }
        fprintf(f, "%d %.6f %.6f\n", cJSON_GetObjectItem(row, "ctx")->valueint,
                cJSON_GetObjectItem(row, "kv_bytes")->valuedouble / 1048576.0,
                cJSON_GetObjectItem(row, "peak_total_bytes")->valuedouble / 1048576.0);
    }
    fclose(f);
    if (!(f = fopen(gp, "w"))) return 1;
    const size_t len = strlen(svg);
    if (len > 4 && !strcmp(svg + len - 4, ".png")) fprintf(f, "set terminal pngcairo size 900,560\n");
    else fprintf(f, "set terminal svg size 900,560 dynamic background rgb 'white'\n");
    fprintf(f, "set output '%s'\n", svg);
    fprintf(f, "set title 'memory vs context length (per rank, %d rank%s; allocator peaks)'\n", n_ranks, n_ranks > 1 ? "s" : "");
    fprintf(f, "set xlabel 'context length (tokens)'\nset ylabel 'MiB'\nset logscale xy 2\nset key left top\nset grid\nplot ");
    for (int b = 0; b < nb && b < 8; b++)
        fprintf(f, "%s'%s' index %d using 1:2 with linespoints pt 7 ps 0.7 title 'KV %s', '%s' index %d using 1:3 with lines dashtype 2 title 'peak total %s'",
                b ? ", \\\n     " : "", dat, b, names[b], dat, b, names[b]);
    fprintf(f, "\n");
    fclose(f);
    if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
        char cmd[2200];
        snprintf(cmd, sizeof cmd, "gnuplot '%s'", gp);
        if (system(cmd) != 0) fprintf(stderr, "fitllm bench context: gnuplot failed on %s\n", gp);
    } else {
        fprintf(stderr, "fitllm bench context: gnuplot not found; wrote %s and %s\n", dat, gp);
    }
    return 0;
}

int fl_bench_context(int argc, char **argv) {
    fl_opt opts[] = {
        {"model", 'm', FL_OPT_STR, "MODEL  GGUF model"},
        {"json", 0, FL_OPT_FLAG, "print one JSON object instead of a table"},
        {"min-ctx", 0, FL_OPT_INT, "N  first context length (default 1024)"},
        {"max-ctx", 0, FL_OPT_INT, "N  last context length, doubling (default 131072)"},
        {"kv-mem", 0, FL_OPT_BYTES, "BYTES  per-rank KV budget: stop at the largest context that fits"},
        {"flash-max", 0, FL_OPT_INT, "N  run the contiguous flash config up to N (default 16384)"},
        {"naive-max", 0, FL_OPT_INT, "N  run the naive-attention config up to N (default 2048)"},
        {"chunk", 0, FL_OPT_INT, "N  prefill chunk of the paged configs (default 512)"},
        {"decode", 0, FL_OPT_INT, "N  decode steps timed at each length (default 8)"},
        {"sp", 0, FL_OPT_FLAG, "sequence parallel over the mpirun ranks (ring attention); only that config"},
        {"tp", 0, FL_OPT_FLAG, "tensor parallel over the mpirun ranks (paged f16 KV, 1/N of the heads); only that config"},
        {"pp", 0, FL_OPT_INT, "M  pipeline parallel over the mpirun ranks, M micro-batches per prefill chunk; only that config"},
        {"threads", 't', FL_OPT_INT, "N  threads per rank (default: all cores; 1 under mpirun)"},
        {"no-repack", 0, FL_OPT_FLAG, "keep the weights in the file's layout (by default they are repacked in groups of rows, as run and serve do; --tp / --pp slice rows and keep the file's)"},
        {"plot", 0, FL_OPT_STR, "FILE.svg  write FILE.svg.dat + .gp (memory vs context) and run gnuplot (.png: PNG)"},
        {0},
    };
    fl_comm *comm = NULL;
    if (fl_comm_new(&argc, &argv, &comm) != FL_OK) {
        fprintf(stderr, "fitllm bench context: %s\n", fl_last_error());
        return 1;
    }
    int n_pos, ret = 0;
    int rc = fl_args_parse(argc, argv, opts, "fitllm bench context -m MODEL [--max-ctx N] [--json] [--sp] [--plot FILE.svg]",
                           "Prefill time, decode time per token and peak memory by category for context lengths\n"
                           "min-ctx, 2 min-ctx, ... max-ctx: paged KV f16 vs fp8, flash vs naive attention (smaller\n"
                           "sizes), and with --sp under mpirun the ring-attention sweep with 1/N of the KV per rank.",
                           NULL, 0, &n_pos);
    if (rc || !fl_args_get(opts, "model")->set) {
        if (!rc) fprintf(stderr, "fitllm bench context: -m MODEL is required\n");
        fl_comm_free(comm);
        return rc == 1 ? 0 : 2;
    }
#define OPTI(name, d) (fl_args_get(opts, name)->set ? fl_args_get(opts, name)->i : (d))
    const int json = fl_args_get(opts, "json")->set, use_sp = fl_args_get(opts, "sp")->set, use_tp = fl_args_get(opts, "tp")->set,
              use_pp = fl_args_get(opts, "pp")->set;
    const int64_t min_ctx = OPTI("min-ctx", 1024), max_ctx = OPTI("max-ctx", 131072);
    const int64_t kv_mem = OPTI("kv-mem", 0), flash_max = OPTI("flash-max", 16384), naive_max = OPTI("naive-max", 2048);
    const int32_t chunk = (int32_t)OPTI("chunk", 512), n_decode = (int32_t)OPTI("decode", 8);
    const int N = fl_comm_size(comm), rank = fl_comm_rank(comm);
    if (min_ctx < 64 || max_ctx < min_ctx || max_ctx > (1 << 24) || chunk < 1 || chunk > 4096 || n_decode < 0 ||
        n_decode >= min_ctx / 2) {
        fprintf(stderr, "fitllm bench context: need 64 <= min-ctx <= max-ctx <= 16M, 1 <= chunk <= 4096, 0 <= decode < min-ctx/2\n");
        fl_comm_free(comm);
        return 2;
    }
    fl_threads_set(fl_args_get(opts, "threads")->set ? (int)fl_args_get(opts, "threads")->i : (N > 1 ? 1 : 0));
    const char *path = fl_args_get(opts, "model")->str;
    fl_model *m = NULL;
    fl_tp_model *tp = NULL;
    fl_model_shape shape;
    if (use_sp + use_tp + use_pp > 1 || (use_pp && fl_args_get(opts, "pp")->i < 1)) {
        fprintf(stderr, "fitllm bench context: one of --sp, --tp, --pp M (M >= 1)\n");
        fl_comm_free(comm);
        return 2;
    }
    g_pp_micro = use_pp ? (int32_t)fl_args_get(opts, "pp")->i : 1;
    fl_model_params mp = fl_model_default_params();
    mp.repack = !fl_args_get(opts, "no-repack")->set;
    if ((use_tp ? fl_tp_load(path, comm, &tp) : use_pp ? fl_pp_load(path, comm, &g_pp) : fl_model_load(path, &mp, &m)) ||
        fl_plan_shape_from_gguf(path, &shape)) {
        fprintf(stderr, "fitllm bench context: %s\n", fl_last_error());
        fl_comm_free(comm);
        return 1;
    }
    if (tp) m = fl_tp_model_get(tp);
    if (g_pp) m = fl_pp_model_get(g_pp);
    bc_config cfgs[5];
    int n_cfg = 0;
    if (use_pp) {
        cfgs[n_cfg++] = (bc_config){"pp paged f16", BC_PAGED, FL_TYPE_F16, 0, max_ctx};
    } else if (use_tp) {
        cfgs[n_cfg++] = (bc_config){"tp paged f16", BC_PAGED, FL_TYPE_F16, 0, max_ctx};
    } else if (use_sp) {
        cfgs[n_cfg++] = (bc_config){"sp flash f16", BC_SP, FL_TYPE_F16, 0, max_ctx};
    } else {
        cfgs[n_cfg++] = (bc_config){"paged f16", BC_PAGED, FL_TYPE_F16, 0, max_ctx};
        cfgs[n_cfg++] = (bc_config){"paged fp8", BC_PAGED, FL_TYPE_FP8_E4M3, 0, max_ctx};
        cfgs[n_cfg++] = (bc_config){"flash f16", BC_SP, FL_TYPE_F16, 0, flash_max};
        cfgs[n_cfg++] = (bc_config){"naive f16", BC_SP, FL_TYPE_F16, 1, naive_max};
    }
    fl_mem_install_cjson_hooks();
    size_t fail0 = fl_mem_thread_failures(); /* (plus each run's own failures: a budget ends a sweep) */
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "benchmark", "context");
    cJSON_AddStringToObject(root, "model", path);
    cJSON_AddNumberToObject(root, "ranks", N);
    cJSON_AddNumberToObject(root, "threads_per_rank", fl_threads_get());
    cJSON_AddNumberToObject(root, "kv_mem_budget", (double)kv_mem);
    cJSON *rows = cJSON_AddArrayToObject(root, "results");
    cJSON *maxr = cJSON_AddObjectToObject(root, "max_ctx_reached");
    if (!json && rank == 0)
        printf("%-13s %8s | %10s %9s | %10s | %10s %10s %10s %10s %10s | %11s\n", "config", "ctx", "prefill s", "tok/s",
               "decode ms", "KV MiB", "plan KV", "ACT MiB", "SCR MiB", "peak MiB", "comm B/tok");
    for (int ci = 0; ci < n_cfg && !ret; ci++) {
        const bc_config *c = &cfgs[ci];
        int64_t reached = 0;
        for (int64_t ctx = min_ctx; ctx <= c->max_ctx; ctx *= 2) {
            if (kv_mem > 0) {
                fl_mem_set_budget(FL_MEM_KV, (size_t)kv_mem);
            }
            bc_row r;
            memset(&r, 0, sizeof r);
            const size_t f_run = fl_mem_thread_failures();
            fl_status st = c->kind == BC_PAGED ? bc_run_paged(m, tp, comm, c, ctx, chunk, n_decode, &r)
                                               : bc_run_sp(m, comm, c, ctx, n_decode, &r);
            fail0 += fl_mem_thread_failures() - f_run;
            fl_mem_set_budget(FL_MEM_KV, 0);
            /* every rank must agree to stop (a budget failure may hit one rank only) */
            int32_t fail = st != FL_OK, any = 0;
            int32_t all_fail[64] = {0};
            if (N > 1 && N <= 64) {
                fl_comm_allgather(comm, &fail, all_fail, sizeof fail);
                for (int k = 0; k < N; k++) any |= all_fail[k];
            } else {
                any = fail;
            }
            if (any) {
                if (st == FL_ERR_BUDGET || kv_mem > 0) break; /* the largest that fits was the previous one */
                fprintf(stderr, "fitllm bench context: %s at %lld: %s\n", c->name, (long long)ctx, fl_last_error());
                ret = 1;
                break;
            }
            uint64_t plan_kv = 0;
            int32_t pl0 = 0, pl1 = (int32_t)shape.n_layer;
            if (use_pp) fl_pp_stage_layers((int32_t)shape.n_layer, rank, N, &pl0, &pl1);
            if (fl_plan_kv_bytes(&shape, c->kv_type, ctx, 1, 16, use_tp ? N : 1, use_sp ? N : 1, pl0, pl1, &plan_kv))
                plan_kv = 0;
            uint64_t kv_peaks[64] = {0}, mine = r.peak[FL_MEM_KV];
            if (N > 1 && N <= 64) fl_comm_allgather(comm, &mine, kv_peaks, sizeof mine);
            else kv_peaks[0] = mine;
            reached = ctx;
            const double n_pre = (double)(ctx - n_decode);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "config", c->name);
            cJSON_AddStringToObject(o, "kv_type", fl_type_name(c->kv_type));
            cJSON_AddNumberToObject(o, "ctx", (double)ctx);
            cJSON_AddNumberToObject(o, "prefill_tokens", n_pre);
            cJSON_AddNumberToObject(o, "prefill_s", r.prefill_s);
            cJSON_AddNumberToObject(o, "prefill_tok_per_s", n_pre / r.prefill_s);
            cJSON_AddNumberToObject(o, "decode_ms_per_token", 1e3 * r.decode_s);
            cJSON_AddNumberToObject(o, "kv_bytes", (double)r.kv_bytes);
            cJSON_AddNumberToObject(o, "plan_kv_bytes", (double)plan_kv);
            cJSON_AddNumberToObject(o, "peak_total_bytes", (double)r.peak_total);
            cJSON *pk = cJSON_AddObjectToObject(o, "peak_bytes");
            for (int k = 0; k < FL_MEM_COUNT; k++) cJSON_AddNumberToObject(pk, fl_mem_cat_name((fl_mem_cat)k), (double)r.peak[k]);
            if (N > 1) {
                cJSON *a = cJSON_AddArrayToObject(o, "kv_peak_per_rank");
                for (int k = 0; k < N && k < 64; k++) fl_cli_json_add(a, NULL, cJSON_CreateNumber((double)kv_peaks[k]));
                cJSON_AddNumberToObject(o, "comm_bytes_per_prefill_token", (double)r.comm_prefill / n_pre);
                cJSON_AddNumberToObject(o, "comm_bytes_per_decode_token", n_decode ? (double)r.comm_decode / n_decode : 0);
            }
            fl_cli_json_add(rows, NULL, o);
            if (!json && rank == 0) {
                printf("%-13s %8lld | %10.3f %9.0f | %10.3f | %10.3f %10.3f %10.3f %10.3f %10.3f | %11.0f\n", c->name,
                       (long long)ctx, r.prefill_s, n_pre / r.prefill_s, 1e3 * r.decode_s, r.kv_bytes / 1048576.0,
                       plan_kv / 1048576.0, r.peak[FL_MEM_ACT] / 1048576.0, r.peak[FL_MEM_SCRATCH] / 1048576.0,
                       r.peak_total / 1048576.0, N > 1 ? (double)r.comm_prefill / n_pre : 0.0);
                fflush(stdout);
            }
        }
        cJSON_AddNumberToObject(maxr, c->name, (double)reached);
    }
    if (rank == 0) {
        if (fl_args_get(opts, "plot")->set) bc_plot(fl_args_get(opts, "plot")->str, rows, N);
        if (json) {
            if (fl_cli_print_json("bench context", root, true, fail0)) ret = 1;
            root = NULL;
        }
    }
    cJSON_Delete(root);
    if (tp) fl_tp_free(tp);
    else if (g_pp) fl_pp_free(g_pp);
    else fl_model_free(m);
    fl_comm_free(comm);
    return ret;
}
