/* `fitllm bench kv`: block accounting of the paged KV cache on a synthetic mix of sequence
 * lengths, forks (parallel sampling) and shared prompts, against a contiguous cache that
 * reserves max-len tokens per sequence in the same bytes.  No model is run: the cache's
 * prepare() does the real block allocation, copy-on-write and prefix-cache work. */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/dispatch.h"
#include "kv/kv_cache.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t bk_rng;
static uint32_t bk_rand(void) {
    bk_rng ^= bk_rng << 13;
    bk_rng ^= bk_rng >> 7;
    bk_rng ^= bk_rng << 17;
    return (uint32_t)(bk_rng >> 32);
}
static int32_t bk_uniform(int32_t lo, int32_t hi) { return lo + (int32_t)(bk_rand() % (uint32_t)(hi - lo + 1)); }

/* Append n tokens to sequence s (positions from its current length).  The last layer's K/V
 * (zeros) are stored so that full blocks enter the prefix cache as after a real forward. */
static fl_status bk_feed(fl_kv_cache *kv, int32_t s, const int32_t *tokens, int32_t n, int32_t *pos, int32_t *sid, const float *zeros) {
    if (n <= 0) return FL_OK;
    const int32_t base = fl_kv_seq_len(kv, s);
    for (int32_t i = 0; i < n; i++) pos[i] = base + i, sid[i] = s;
    fl_batch b = {.n_tokens = n, .tokens = tokens, .pos = pos, .seq_id = sid};
    const fl_status st = fl_kv_prepare(kv, &b);
    if (st == FL_OK) fl_kv_store(kv, fl_kv_config_get(kv)->n_layer - 1, &b, zeros, zeros);
    return st;
}

static double bk_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* --attn: time one layer of paged attention, a ctx-token prefill then decodes at ctx. */
static int bench_attn(fl_kv_config c, int32_t ctx, bool json) {
    c.n_layer = 1;
    c.mem_bytes = 0;
    c.n_blocks = (ctx + c.block_size) / c.block_size + 2;
    c.n_seq_max = 1;
    c.prefix_cache = false;
    fl_kv_cache *kv = fl_kv_new(&c);
    if (!kv) {
        fprintf(stderr, "fitllm bench kv: %s\n", fl_last_error());
        return 1;
    }
    const size_t nrow = (size_t)c.n_head_kv * (size_t)c.head_dim, qrow = (size_t)c.n_head * (size_t)c.head_dim;
    const size_t nb = sizeof(int32_t) * (size_t)ctx, kb = sizeof(float) * (size_t)ctx * nrow, qb = sizeof(float) * (size_t)ctx * qrow;
    int32_t *pos = fl_alloc(FL_MEM_MISC, nb, 0), *sid = fl_calloc(FL_MEM_MISC, (size_t)ctx, sizeof(int32_t));
    float *k = fl_alloc(FL_MEM_MISC, kb, 64), *q = fl_alloc(FL_MEM_MISC, qb, 64), *o = fl_alloc(FL_MEM_MISC, qb, 64);
    if (!pos || !sid || !k || !q || !o) {
        fprintf(stderr, "fitllm bench kv: out of memory\n");
        return 1;
    }
    bk_rng = 12345;
    for (size_t i = 0; i < (size_t)ctx * nrow; i++) k[i] = (float)(bk_rand() % 2001) / 1000.0f - 1.0f;
    for (size_t i = 0; i < (size_t)ctx * qrow; i++) q[i] = (float)(bk_rand() % 2001) / 1000.0f - 1.0f;
    for (int32_t i = 0; i < ctx; i++) pos[i] = i;
    fl_batch b = {.n_tokens = ctx, .tokens = NULL, .pos = pos, .seq_id = sid};
    fl_status st = fl_kv_prepare(kv, &b);
    if (st != FL_OK) {
        fprintf(stderr, "fitllm bench kv: %s\n", fl_last_error());
        return 1;
    }
    fl_kv_store(kv, 0, &b, k, k);
    /* the prefill attention repeated on the same cache (up to 7 times, or until 2 s have gone):
     * the first call also pays the output's page faults and cold caches; the median is reported */
    double tp[7];
    int np = 0;
    const double tstart = bk_now();
    while (np < 7 && (np == 0 || bk_now() - tstart < 2.0)) {
        const double t0 = bk_now();
        fl_kv_attend(kv, 0, &b, q, o);
        tp[np++] = bk_now() - t0;
    }
    const double t_first = tp[0];
    for (int i = 1; i < np; i++) /* (insertion sort) */
        for (int j = i; j > 0 && tp[j] < tp[j - 1]; j--) {
            const double x = tp[j];
            tp[j] = tp[j - 1];
            tp[j - 1] = x;
        }
    const double t_prefill = tp[np / 2];
    /* decode: one more token, attention repeated (same position) */
    int32_t p1 = ctx, s1 = 0;
    fl_batch d = {.n_tokens = 1, .tokens = NULL, .pos = &p1, .seq_id = &s1};
    st = fl_kv_prepare(kv, &d);
    if (st != FL_OK) {
        fprintf(stderr, "fitllm bench kv: %s\n", fl_last_error());
        return 1;
    }
    fl_kv_store(kv, 0, &d, k, k);
    const int reps = 20;
    const double t0 = bk_now();
    for (int r = 0; r < reps; r++) fl_kv_attend(kv, 0, &d, q, o);
    const double t_decode = (bk_now() - t0) / reps;
    /* flops: QK^T and PV, 2 flops per multiply-add each */
    const double f_prefill = 4.0 * (double)c.n_head * c.head_dim * ((double)ctx * (ctx + 1) / 2.0);
    const double f_decode = 4.0 * (double)c.n_head * c.head_dim * (double)(ctx + 1);
    if (json) {
        printf("{\"bench\": \"kv_attn\", \"isa\": \"%s\", \"threads\": %d, \"kv_type\": \"%s\", \"ctx\": %d, \"n_head\": %d, "
               "\"n_head_kv\": %d, \"head_dim\": %d, \"block_size\": %d, \"prefill_runs\": %d, \"prefill_first_s\": %.6f, "
               "\"prefill_s\": %.6f, \"prefill_gflops\": %.3f, "
               "\"decode_ms\": %.4f, \"decode_gflops\": %.3f}\n",
               fl_isa_name(fl_isa_get()), fl_threads_get(), fl_type_name(c.type), ctx, c.n_head, c.n_head_kv, c.head_dim, c.block_size,
               np, t_first, t_prefill, f_prefill / t_prefill / 1e9, t_decode * 1e3, f_decode / t_decode / 1e9);
    } else {
        printf("paged attention, one layer, %s KV, %d heads (%d kv) x %d, %d-token blocks, %s, %d threads:\n", fl_type_name(c.type), c.n_head,
               c.n_head_kv, c.head_dim, c.block_size, fl_isa_name(fl_isa_get()), fl_threads_get());
        printf("  prefill %d tokens: %.3f s (%.2f GFLOP/s; the median of %d runs, the first %.3f s)\n  decode at %d: %.3f ms (%.2f GFLOP/s)\n",
               ctx, t_prefill, f_prefill / t_prefill / 1e9, np, t_first, ctx, t_decode * 1e3, f_decode / t_decode / 1e9);
    }
    fl_free(FL_MEM_MISC, pos, nb);
    fl_free(FL_MEM_MISC, sid, sizeof(int32_t) * (size_t)ctx);
    fl_free(FL_MEM_MISC, k, kb);
    fl_free(FL_MEM_MISC, q, qb);
    fl_free(FL_MEM_MISC, o, qb);
    fl_kv_free(kv);
    return 0;
}

int fl_bench_kv(int argc, char **argv) {
    fl_opt opts[] = {
        {"json", 0, FL_OPT_FLAG, "print one JSON object"},
        {"block-size", 'b', FL_OPT_INT, "N  tokens per block (default 16)"},
        {"kv-mem", 0, FL_OPT_BYTES, "BYTES  KV budget (default 4G)"},
        {"mem", 0, FL_OPT_BYTES, "BYTES  total memory; the KV budget is --kv-frac of it"},
        {"kv-frac", 0, FL_OPT_FLOAT, "F  fraction of --mem for KV (default 0.5)"},
        {"kv-type", 0, FL_OPT_STR, "TYPE  f32 f16 bf16 fp8_e4m3 fp8_e5m2 q8_0 q4_0 (default f16)"},
        {"max-len", 0, FL_OPT_INT, "N  longest sequence = contiguous reservation (default 2048)"},
        {"fork-frac", 0, FL_OPT_FLOAT, "F  requests that sample n=4 branches from one prompt (default 0.25)"},
        {"shared-prefix", 0, FL_OPT_INT, "N  system prompt tokens shared by half the requests (default 256)"},
        {"n-layer", 0, FL_OPT_INT, "N  model layers (default 32)"},
        {"n-head-kv", 0, FL_OPT_INT, "N  kv heads (default 8)"},
        {"head-dim", 0, FL_OPT_INT, "N  head dimension (default 128)"},
        {"seed", 0, FL_OPT_INT, "N  workload seed (default 1)"},
        {"attn", 0, FL_OPT_FLAG, "time paged attention instead (one layer: prefill of --ctx tokens, the median of up to 7 runs; decode at --ctx)"},
        {"ctx", 0, FL_OPT_INT, "N  context for --attn (default 2048)"},
        {"n-head", 0, FL_OPT_INT, "N  query heads for --attn (default 32)"},
        {"threads", 't', FL_OPT_INT, "N  threads (default: all cores)"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm bench kv [--json] [--block-size N] [--kv-mem BYTES | --mem BYTES --kv-frac F] ...",
                          "Fill a paged KV cache with a synthetic mix of requests (lengths up to --max-len, some\n"
                          "forked n=4 for parallel sampling, some sharing a system prompt) until it is full, and\n"
                          "report utilization, waste, sharing and how many sequences a contiguous max-len\n"
                          "reservation fits in the same bytes.",
                          NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    const bool json = fl_args_get(opts, "json")->set;
    if (fl_args_get(opts, "threads")->set) fl_threads_set((int)fl_args_get(opts, "threads")->i);
    fl_kv_config c = {0};
    c.block_size = fl_args_get(opts, "block-size")->set ? (int32_t)fl_args_get(opts, "block-size")->i : 16;
    c.n_layer = fl_args_get(opts, "n-layer")->set ? (int32_t)fl_args_get(opts, "n-layer")->i : 32;
    c.n_head_kv = fl_args_get(opts, "n-head-kv")->set ? (int32_t)fl_args_get(opts, "n-head-kv")->i : 8;
    c.head_dim = fl_args_get(opts, "head-dim")->set ? (int32_t)fl_args_get(opts, "head-dim")->i : 128;
    c.n_head = c.n_head_kv;
    c.type = FL_TYPE_F16;
    if (fl_args_get(opts, "kv-type")->set) {
        c.type = fl_type_from_name(fl_args_get(opts, "kv-type")->str);
        if (c.type < 0) {
            fprintf(stderr, "fitllm bench kv: unknown --kv-type '%s'\n", fl_args_get(opts, "kv-type")->str);
            return 2;
        }
    }
    c.mem_bytes = (size_t)4 << 30;
    if (fl_args_get(opts, "mem")->set) {
        const double frac = fl_args_get(opts, "kv-frac")->set ? fl_args_get(opts, "kv-frac")->f : 0.5;
        if (frac <= 0 || frac > 1) {
            fprintf(stderr, "fitllm bench kv: --kv-frac must be in (0, 1]\n");
            return 2;
        }
        c.mem_bytes = (size_t)((double)fl_args_get(opts, "mem")->i * frac);
    }
    if (fl_args_get(opts, "kv-mem")->set) c.mem_bytes = (size_t)fl_args_get(opts, "kv-mem")->i;
    if (fl_args_get(opts, "attn")->set) {
        const int32_t ctx = fl_args_get(opts, "ctx")->set ? (int32_t)fl_args_get(opts, "ctx")->i : 2048;
        c.n_head = fl_args_get(opts, "n-head")->set ? (int32_t)fl_args_get(opts, "n-head")->i : 32;
        if (ctx < 1 || ctx > (1 << 20) || c.n_head < c.n_head_kv || c.n_head % c.n_head_kv) {
            fprintf(stderr, "fitllm bench kv: need 1 <= --ctx <= 1M and --n-head a multiple of --n-head-kv\n");
            return 2;
        }
        return bench_attn(c, ctx, json);
    }
    const int32_t max_len = fl_args_get(opts, "max-len")->set ? (int32_t)fl_args_get(opts, "max-len")->i : 2048;
    const double fork_frac = fl_args_get(opts, "fork-frac")->set ? fl_args_get(opts, "fork-frac")->f : 0.25;
    const int32_t shared = fl_args_get(opts, "shared-prefix")->set ? (int32_t)fl_args_get(opts, "shared-prefix")->i : 256;
    bk_rng = 0x9E3779B97F4A7C15ull * (uint64_t)(fl_args_get(opts, "seed")->set ? fl_args_get(opts, "seed")->i : 1) + 7;
    if (max_len < 64 || shared < 0 || shared > max_len / 2 || fork_frac < 0 || fork_frac > 1) {
        fprintf(stderr, "fitllm bench kv: need --max-len >= 64, 0 <= --shared-prefix <= max-len/2, 0 <= --fork-frac <= 1\n");
        return 2;
    }
    const size_t bpt = fl_kv_bytes_per_token(&c);
    if (!bpt) {
        fprintf(stderr, "fitllm bench kv: bad model shape or KV type\n");
        return 2;
    }
    /* upper bound on live sequences: every sequence holds >= 1 block */
    const int64_t max_seqs = (int64_t)(c.mem_bytes / fl_kv_bytes_per_block(&c)) + 8;
    c.n_seq_max = max_seqs > 1000000 ? 1000000 : (int32_t)max_seqs;
    c.prefix_cache = true;
    fl_kv_cache *kv = fl_kv_new(&c);
    if (!kv) {
        fprintf(stderr, "fitllm bench kv: %s\n", fl_last_error());
        return 1;
    }
    const size_t tb = sizeof(int32_t) * (size_t)max_len;
    int32_t *tok = fl_alloc(FL_MEM_MISC, tb, 0), *pos = fl_alloc(FL_MEM_MISC, tb, 0), *sid = fl_alloc(FL_MEM_MISC, tb, 0);
    int32_t *sys = fl_alloc(FL_MEM_MISC, tb, 0);
    const size_t zb = sizeof(float) * (size_t)max_len * (size_t)c.n_head_kv * (size_t)c.head_dim;
    float *zeros = fl_calloc(FL_MEM_MISC, zb, 1);
    if (!tok || !pos || !sid || !sys || !zeros) {
        fprintf(stderr, "fitllm bench kv: out of memory\n");
        return 1;
    }
    for (int32_t i = 0; i < max_len; i++) sys[i] = 1000 + i;
    int64_t n_req = 0, n_forked = 0, len_sum = 0;
    int32_t next = 0;
    for (;;) {
        /* a request: total length from a mix of short, medium and long */
        const uint32_t kind = bk_rand() % 100;
        const int32_t total = kind < 50 ? bk_uniform(64, 512) : kind < 85 ? bk_uniform(512, 1536) : bk_uniform(1536, max_len);
        const int32_t prompt = bk_uniform(total / 4, (3 * total) / 4);
        const int n_branch = (double)(bk_rand() % 10000) < fork_frac * 10000.0 ? 4 : 1;
        if (next + n_branch > c.n_seq_max) break;
        const bool use_sys = shared > 0 && prompt > shared && bk_rand() % 2;
        for (int32_t i = 0; i < prompt; i++) tok[i] = use_sys && i < shared ? sys[i] : (int32_t)(bk_rand() % 32000);
        const int32_t s0 = next;
        int32_t nc = 0;
        fl_status st = fl_kv_seq_add(kv, s0, tok, prompt, &nc);
        if (st == FL_OK) st = bk_feed(kv, s0, tok + nc, prompt - nc, pos, sid, zeros);
        for (int b = 1; st == FL_OK && b < n_branch; b++) st = fl_kv_seq_fork(kv, s0, s0 + b);
        for (int b = 0; st == FL_OK && b < n_branch; b++) {
            for (int32_t i = 0; i < total - prompt; i++) tok[i] = (int32_t)(bk_rand() % 32000);
            st = bk_feed(kv, s0 + b, tok, total - prompt, pos, sid, zeros);
        }
        if (st != FL_OK) { /* full: this request is not admitted */
            for (int b = 0; b < n_branch; b++) fl_kv_seq_free(kv, s0 + b);
            if (st != FL_NO_KV_SPACE) {
                fprintf(stderr, "fitllm bench kv: %s\n", fl_last_error());
                return 1;
            }
            break;
        }
        next += n_branch;
        n_req++;
        n_forked += n_branch > 1;
        len_sum += (int64_t)total * n_branch;
    }
    fl_kv_stats ks;
    fl_kv_stats_get(kv, &ks);
    fl_status chk = fl_kv_check(kv);
    /* contiguous baseline: every sequence reserves max_len tokens, nothing is shared */
    const int64_t contig_seqs = (int64_t)((size_t)ks.bytes_total / (bpt * (size_t)max_len));
    const double contig_waste = next ? 1.0 - (double)len_sum / ((double)next * max_len) : 0;
    const double ratio = contig_seqs ? (double)next / (double)contig_seqs : 0;
    const double sharing = ks.tokens_logical ? 1.0 - (double)ks.tokens_live / (double)ks.tokens_logical : 0;
    if (json) {
        fl_mem_install_cjson_hooks();
        const size_t fail0 = fl_mem_thread_failures();
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "bench", "kv");
        cJSON_AddStringToObject(o, "kv_type", fl_type_name(c.type));
        cJSON_AddNumberToObject(o, "block_size", c.block_size);
        cJSON_AddNumberToObject(o, "bytes_per_token", (double)bpt);
        cJSON_AddNumberToObject(o, "kv_bytes", (double)ks.bytes_total);
        cJSON_AddNumberToObject(o, "max_len", max_len);
        cJSON_AddNumberToObject(o, "requests", (double)n_req);
        cJSON_AddNumberToObject(o, "forked_requests", (double)n_forked);
        cJSON_AddNumberToObject(o, "sequences", next);
        cJSON_AddNumberToObject(o, "blocks_total", ks.n_blocks_total);
        cJSON_AddNumberToObject(o, "blocks_used", ks.n_blocks_used);
        cJSON_AddNumberToObject(o, "utilization", ks.utilization);
        cJSON_AddNumberToObject(o, "waste", ks.waste);
        cJSON_AddNumberToObject(o, "tokens_live", (double)ks.tokens_live);
        cJSON_AddNumberToObject(o, "tokens_logical", (double)ks.tokens_logical);
        cJSON_AddNumberToObject(o, "sharing_savings", sharing);
        cJSON_AddNumberToObject(o, "sharing_bytes_saved", (double)(ks.tokens_logical - ks.tokens_live) * (double)bpt);
        cJSON_AddNumberToObject(o, "prefix_hit_tokens", (double)ks.hit_tokens);
        cJSON_AddNumberToObject(o, "prefix_miss_tokens", (double)ks.miss_tokens);
        cJSON_AddNumberToObject(o, "evictions", (double)ks.evictions);
        cJSON_AddNumberToObject(o, "cow_copies", (double)ks.cow_copies);
        cJSON *ct = cJSON_AddObjectToObject(o, "contiguous");
        cJSON_AddNumberToObject(ct, "sequences", (double)contig_seqs);
        cJSON_AddNumberToObject(ct, "waste", contig_waste);
        cJSON_AddNumberToObject(o, "concurrency_vs_contiguous", ratio);
        cJSON_AddBoolToObject(o, "invariants_ok", chk == FL_OK);
        if (fl_cli_print_json("bench kv", o, true, fail0)) chk = FL_ERR_NOMEM;
    } else {
        printf("paged KV (%s, %d-token blocks, %zu B/token, %.1f MiB):\n", fl_type_name(c.type), c.block_size, bpt, (double)ks.bytes_total / 1048576.0);
        printf("  requests %lld (%lld forked x4), sequences %d, blocks %d/%d\n", (long long)n_req, (long long)n_forked, next, ks.n_blocks_used, ks.n_blocks_total);
        printf("  utilization %.2f%%, waste %.2f%%, sharing saves %.2f%% of logical tokens\n", 100 * ks.utilization, 100 * ks.waste, 100 * sharing);
        printf("  prefix hits %lld tokens, misses %lld, evictions %lld, copy-on-write %lld\n", (long long)ks.hit_tokens, (long long)ks.miss_tokens,
               (long long)ks.evictions, (long long)ks.cow_copies);
        printf("contiguous max-len %d reservation: %lld sequences (waste %.2f%%)\n", max_len, (long long)contig_seqs, 100 * contig_waste);
        printf("concurrency paged / contiguous: %.2fx%s\n", ratio, chk == FL_OK ? "" : "  (INVARIANTS BROKEN)");
    }
    for (int32_t s = 0; s < next; s++) fl_kv_seq_free(kv, s);
    fl_free(FL_MEM_MISC, tok, tb);
    fl_free(FL_MEM_MISC, pos, tb);
    fl_free(FL_MEM_MISC, sid, tb);
    fl_free(FL_MEM_MISC, sys, tb);
    fl_free(FL_MEM_MISC, zeros, zb);
    fl_kv_free(kv);
    return chk == FL_OK ? 0 : 1;
}
