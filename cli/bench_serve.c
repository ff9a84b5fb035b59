/* `fitllm bench serve -m MODEL ...`: a synthetic serving workload through the engine API
 * (Poisson or all-at-once arrivals, prompt/generation length distributions, an optional common
 * prefix).  Prints throughput, TTFT and inter-token latency percentiles, KV utilization and
 * waste, preemptions, prefix-cache hits and peak memory by category; with --baseline static the
 * same workload also runs as padded static batches over a contiguous max-length KV reservation
 * with the same KV bytes, side by side. */
#include "cli/cli.h"
#include "core/clock.h"
#include "core/alloc.h"
#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/regex_guide.h"
#include "core/status.h"
#include "core/threads.h"
#include "formats/gguf.h"
#include "kernels/calib_int8.h"
#include "plan/plan_engine.h"

#include "fitllm.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct dist {
    int32_t lo, hi; /* uniform in [lo, hi] (lo == hi: fixed) */
} dist;

/* "N" or "A:B" / "A-B" (uniform). */
static int parse_dist(const char *s, dist *d) {
    char *end;
    long a = strtol(s, &end, 10);
    if (end == s || a < 1) return -1;
    long b = a;
    if (*end == ':' || *end == '-') {
        const char *t = end + 1;
        b = strtol(t, &end, 10);
        if (end == t || b < a) return -1;
    }
    if (*end || b > 1000000) return -1;
    d->lo = (int32_t)a;
    d->hi = (int32_t)b;
    return 0;
}

static uint64_t rnd(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rnd01(uint64_t *s) { return (double)(rnd(s) >> 11) * (1.0 / 9007199254740992.0); }
static int32_t draw(const dist *d, uint64_t *s) { return d->lo + (int32_t)(rnd(s) % (uint64_t)(d->hi - d->lo + 1)); }

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double pct(double *v, int64_t n, double p) {
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    int64_t i = (int64_t)ceil(p / 100.0 * (double)n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

typedef struct workload {
    int32_t n;
    int32_t **prompt, *n_prompt, *gen;
    int32_t *prio;   /* -1: the high-priority class (--high-priority), else 0 */
    int32_t n_high;
    double *arrival;
    int32_t max_len;
} workload;

/* The workload's arrays, tracked (MISC) like every allocation. */
static void workload_free(workload *w) {
    if (w->prompt)
        for (int32_t i = 0; i < w->n; i++)
            if (w->prompt[i]) fl_free(FL_MEM_MISC, w->prompt[i], (size_t)w->n_prompt[i] * sizeof(int32_t));
    fl_free(FL_MEM_MISC, w->prompt, (size_t)w->n * sizeof *w->prompt);
    fl_free(FL_MEM_MISC, w->n_prompt, (size_t)w->n * sizeof *w->n_prompt);
    fl_free(FL_MEM_MISC, w->gen, (size_t)w->n * sizeof *w->gen);
    fl_free(FL_MEM_MISC, w->prio, (size_t)w->n * sizeof *w->prio);
    fl_free(FL_MEM_MISC, w->arrival, (size_t)w->n * sizeof *w->arrival);
}

typedef struct run_cfg {
    fl_engine_params ep;
    int json;
    float temp, top_p; /* the requests' sampling: greedy by default */
    int32_t top_k;
    int32_t logprobs;        /* -1: off; else alternatives per token */
    int32_t prompt_logprobs; /* score every prompt token too */
    int32_t json_object;     /* constrain every output to a JSON object */
    const char *json_schema; /* or to a value of this JSON Schema (text) */
    const char *regex;       /* or to a match of this regex */
    const char *grammar;     /* or to a sentence of this GBNF grammar (text) */
    int32_t paired_peak;     /* calibrate the int8 peak around every step (decode_pct_int8_peak_paired) */
    double params;           /* matrix elements one token multiplies (2 ops each) */
} run_cfg;

/* --paired-peak: the int8 peak measured for this long around each step (the probe and two
 * passes take about three times this) */
#define PAIRED_PEAK_S 0.015

/* Elements of the matrices one token's forward multiplies (the layers' and the output head, or
 * the tied embedding), read from the GGUF header: 2 ops each per token.  0 if unreadable. */
static double matmul_params(const char *path) {
    fl_gguf *g;
    if (!path || fl_gguf_open(path, &g) != FL_OK) {
        fl_clear_error();
        return 0;
    }
    double n = 0;
    bool head = false;
    for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
        const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
        const bool blk = t->name.len > 4 && memcmp(t->name.data, "blk.", 4) == 0;
        if (fl_gguf_str_eq(t->name, "output.weight")) head = true;
        if ((blk && t->n_dims == 2) || fl_gguf_str_eq(t->name, "output.weight")) n += (double)t->ne[0] * (double)t->ne[1];
    }
    const fl_gguf_tensor *emb = fl_gguf_find_tensor(g, "token_embd.weight");
    if (!head && emb) n += (double)emb->ne[0] * (double)emb->ne[1];
    fl_gguf_free(g);
    return n;
}

/* Run the workload on a fresh engine; returns a cJSON object with the results (or NULL). */
static cJSON *run_one(const run_cfg *rc, const workload *w, const char *label) {
    fl_mem_reset_peaks();
    fl_engine *e;
    double t_load = fl_clock_s();
    if (fl_engine_new(&rc->ep, &e) != FL_OK) {
        fprintf(stderr, "fitllm bench serve: %s\n", fl_last_error());
        return NULL;
    }
    t_load = fl_clock_s() - t_load;
    const int32_t n = w->n;
    /* the benchmark's own bookkeeping is tracked too (MISC), like every allocation */
    int64_t *ids = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *ids);
    double *t_add = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *t_add), *t_first = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *t_first);
    double *t_last = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *t_last), *t_done = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *t_done);
    int64_t itl_cap = 1024, n_itl = 0;
    double *itl = fl_calloc(FL_MEM_MISC, (size_t)itl_cap, sizeof *itl);
    int32_t *got = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *got);
    fl_request_output *ev = fl_calloc(FL_MEM_MISC, 256, sizeof *ev);
    double util_sum = 0, waste_sum = 0;
    int64_t n_samples = 0, max_running = 0, out_tokens = 0, done = 0, added = 0, in_tokens = 0;
    int64_t lp_records = 0, plp_records = 0; /* logprob records received (a check that they came) */
    /* decode-only steps (no prompt token prefilled): their time and tokens */
    double dec_time = 0;
    int64_t dec_tokens = 0, dec_steps = 0;
    /* --paired-peak: each decode step's rate over the peak measured just before and after it */
    double *pair = rc->paired_peak ? fl_calloc(FL_MEM_MISC, 4096, sizeof *pair) : NULL, pk_before = 0;
    int64_t n_pair = 0;
    fl_engine_stats prev;
    fl_engine_stats_get(e, &prev);
    int err = 0;
    if (!ids || !t_add || !t_first || !t_last || !t_done || !itl || !got || !ev || (rc->paired_peak && !pair)) {
        fprintf(stderr, "fitllm bench serve: %s\n", fl_last_error());
        err = 1;
    }
    const double t0 = fl_clock_s();
    while (done < n && !err) {
        double t = fl_clock_s() - t0;
        while (added < n && w->arrival[added] <= t) {
            fl_request_params p = {0};
            fl_sampling_params_default(&p.sampling);
            p.sampling.temperature = rc->temp;
            p.sampling.top_k = rc->top_k;
            p.sampling.top_p = rc->top_p;
            p.prompt = w->prompt[added];
            p.n_prompt = w->n_prompt[added];
            p.max_tokens = w->gen[added];
            p.ignore_eos = 1;
            p.sampling.seed = (uint64_t)added + 1;
            p.logprobs = rc->logprobs >= 0;
            p.top_logprobs = rc->logprobs > 0 ? rc->logprobs : 0;
            p.prompt_logprobs = rc->prompt_logprobs;
            p.json_object = rc->json_object;
            p.json_schema = rc->json_schema;
            p.regex = rc->regex;
            p.grammar = rc->grammar;
            p.priority = rc->ep.sched_policy == FL_SCHED_PRIORITY ? w->prio[added] : 0; /* (FCFS: the classes are only reported) */
            p.lora = rc->ep.n_loras > 0 ? 1 + (int32_t)(added % rc->ep.n_loras) : 0;
            in_tokens += p.n_prompt;
            if (fl_engine_add(e, &p, &ids[added]) != FL_OK) {
                fprintf(stderr, "fitllm bench serve: request %lld: %s\n", (long long)added, fl_last_error());
                err = 1;
                break;
            }
            t_add[added] = fl_clock_s();
            added++;
        }
        int32_t active = 0;
        if (pair && pk_before == 0) pk_before = fl_calib_int8_peak_gops(fl_threads_get(), PAIRED_PEAK_S);
        const double t_step = fl_clock_s();
        if (fl_engine_step(e, &active) != FL_OK) {
            fprintf(stderr, "fitllm bench serve: step: %s\n", fl_last_error());
            err = 1;
            break;
        }
        double tp = fl_clock_s();
        {
            fl_engine_stats now;
            fl_engine_stats_get(e, &now);
            if (now.tokens_prefilled == prev.tokens_prefilled && now.tokens_generated > prev.tokens_generated) {
                dec_time += tp - t_step;
                dec_tokens += now.tokens_generated - prev.tokens_generated;
                dec_steps++;
            }
            if (pair) { /* (after the step's timing: the pause is not in it) */
                const double pk_after = fl_calib_int8_peak_gops(fl_threads_get(), PAIRED_PEAK_S);
                if (now.tokens_prefilled == prev.tokens_prefilled && now.tokens_generated > prev.tokens_generated && n_pair < 4096 &&
                    tp > t_step && pk_before + pk_after > 0)
                    pair[n_pair++] = 100.0 * (double)(now.tokens_generated - prev.tokens_generated) * 2.0 * rc->params / 1e9 /
                                     (tp - t_step) / (0.5 * (pk_before + pk_after));
                pk_before = pk_after;
            }
            prev = now;
        }
        int32_t k;
        while ((k = fl_engine_poll(e, ev, 256)) > 0)
            for (int32_t j = 0; j < k; j++) {
                int64_t i = ev[j].request_id; /* ids are handed out 0, 1, 2, ... in add order */
                if (i < 0 || i >= n) continue;
                if (ev[j].new_logprobs) lp_records += ev[j].n_new;
                if (ev[j].prompt_logprobs) plp_records += ev[j].n_prompt_logprobs;
                if (ev[j].n_new > 0) {
                    if (got[i] == 0) t_first[i] = tp;
                    else {
                        /* tokens of one step arrive together: spread the gap over them */
                        double gap = (tp - t_last[i]) / ev[j].n_new;
                        for (int32_t q = 0; q < ev[j].n_new; q++) {
                            if (n_itl == itl_cap) {
                                double *g = fl_realloc(FL_MEM_MISC, itl, (size_t)itl_cap * sizeof *itl, (size_t)itl_cap * 2 * sizeof *itl, 64);
                                if (!g) break; /* keep the samples so far */
                                itl = g;
                                itl_cap *= 2;
                            }
                            itl[n_itl++] = gap;
                        }
                    }
                    got[i] += ev[j].n_new;
                    out_tokens += ev[j].n_new;
                    t_last[i] = tp;
                }
                if (ev[j].finish != FL_FINISH_NONE) {
                    t_done[i] = tp;
                    done++;
                }
            }
        fl_engine_stats st;
        fl_engine_stats_get(e, &st);
        if (st.n_running > max_running) max_running = st.n_running;
        if (st.kv_blocks_used > 0) {
            util_sum += st.kv_utilization;
            waste_sum += st.kv_waste;
            n_samples++;
        }
        if (active == 0 && added < n) { /* idle until the next arrival */
            double wait = w->arrival[added] - (fl_clock_s() - t0);
            if (wait > 0) {
                struct timespec ts = {(time_t)wait, (long)((wait - floor(wait)) * 1e9)};
                nanosleep(&ts, NULL);
            }
        }
    }
    const double dur = fl_clock_s() - t0;
    cJSON *o = NULL;
    const size_t f_report = fl_mem_thread_failures();
    double *ttft = err ? NULL : fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *ttft);
    if (ttft) o = cJSON_CreateObject();
    if (!err && !o) fprintf(stderr, "fitllm bench serve: out of memory for the %s run's report\n", label);
    if (o) {
        for (int32_t i = 0; i < n; i++) ttft[i] = t_first[i] - t_add[i];
        fl_engine_stats st;
        fl_engine_stats_get(e, &st);
        cJSON_AddStringToObject(o, "engine", label);
        cJSON_AddStringToObject(o, "model", fl_engine_model_name(e));
        cJSON_AddNumberToObject(o, "requests", n);
        cJSON_AddNumberToObject(o, "load_s", t_load);
        cJSON_AddNumberToObject(o, "duration_s", dur);
        cJSON_AddNumberToObject(o, "output_tokens", (double)out_tokens);
        cJSON_AddNumberToObject(o, "output_tokens_per_s", (double)out_tokens / dur);
        cJSON_AddNumberToObject(o, "input_tokens_per_s", (double)in_tokens / dur);
        cJSON_AddNumberToObject(o, "logprobs", rc->logprobs);
        cJSON_AddBoolToObject(o, "json_object", rc->json_object);
        cJSON_AddBoolToObject(o, "json_schema", rc->json_schema != NULL);
        cJSON_AddBoolToObject(o, "regex", rc->regex != NULL);
        cJSON_AddBoolToObject(o, "grammar", rc->grammar != NULL);
        if (rc->regex || rc->grammar) {
            cJSON_AddNumberToObject(o, "guide_mask_hits", (double)st.guide_mask_hits);
            cJSON_AddNumberToObject(o, "guide_mask_misses", (double)st.guide_mask_misses);
        }
        cJSON_AddNumberToObject(o, "logprob_records", (double)lp_records);
        cJSON_AddNumberToObject(o, "prompt_logprob_records", (double)plp_records);
        cJSON_AddNumberToObject(o, "requests_per_s", n / dur);
        cJSON_AddNumberToObject(o, "ttft_p50_ms", 1e3 * pct(ttft, n, 50));
        cJSON_AddNumberToObject(o, "ttft_p99_ms", 1e3 * pct(ttft, n, 99));
        cJSON_AddNumberToObject(o, "itl_p50_ms", 1e3 * pct(itl, n_itl, 50));
        cJSON_AddNumberToObject(o, "itl_p99_ms", 1e3 * pct(itl, n_itl, 99));
        cJSON_AddNumberToObject(o, "max_concurrent_seqs", (double)max_running);
        cJSON_AddNumberToObject(o, "decode_steps", (double)dec_steps);
        cJSON_AddNumberToObject(o, "decode_tokens_per_step", dec_steps ? (double)dec_tokens / (double)dec_steps : 0);
        cJSON_AddNumberToObject(o, "decode_tok_s", dec_time > 0 ? (double)dec_tokens / dec_time : 0);
        if (pair) {
            cJSON_AddNumberToObject(o, "decode_pct_int8_peak_paired", n_pair ? pct(pair, n_pair, 50) : 0);
            cJSON_AddNumberToObject(o, "decode_pct_int8_peak_paired_p10", n_pair ? pct(pair, n_pair, 10) : 0);
            cJSON_AddNumberToObject(o, "decode_pct_int8_peak_paired_p90", n_pair ? pct(pair, n_pair, 90) : 0);
            cJSON_AddNumberToObject(o, "paired_steps", (double)n_pair);
        }
        cJSON_AddNumberToObject(o, "steps", (double)st.steps);
        if (rc->ep.spec_tokens > 0) { /* speculative decoding: its drafts (the GOP/s above count generated tokens) */
            cJSON_AddNumberToObject(o, "spec_tokens", rc->ep.spec_tokens);
            cJSON_AddNumberToObject(o, "spec_draft_tokens", (double)st.spec_draft_tokens);
            cJSON_AddNumberToObject(o, "spec_accepted_tokens", (double)st.spec_accepted_tokens);
            cJSON_AddNumberToObject(o, "spec_acceptance_rate",
                                    st.spec_draft_tokens ? (double)st.spec_accepted_tokens / (double)st.spec_draft_tokens : 0);
        }
        cJSON_AddNumberToObject(o, "preemptions", (double)st.preemptions);
        cJSON_AddNumberToObject(o, "swaps_out", (double)st.swaps_out);
        cJSON_AddNumberToObject(o, "kv_blocks_total", (double)st.kv_blocks_total);
        cJSON_AddNumberToObject(o, "kv_utilization_avg", n_samples ? util_sum / (double)n_samples : 0);
        cJSON_AddNumberToObject(o, "kv_waste_avg", n_samples ? waste_sum / (double)n_samples : 0);
        int64_t pre = st.prefix_hit_tokens + st.prefix_miss_tokens;
        cJSON_AddNumberToObject(o, "prefix_hit_tokens", (double)st.prefix_hit_tokens);
        cJSON_AddNumberToObject(o, "prefix_hit_rate", pre ? (double)st.prefix_hit_tokens / (double)pre : 0);
        if (w->n_high > 0) /* --high-priority: the two classes' latencies */
            for (int c = 0; c < 2; c++) {
                cJSON *co = cJSON_AddObjectToObject(o, c ? "normal_priority" : "high_priority");
                int32_t m = 0;
                for (int32_t i = 0; i < n; i++)
                    if ((w->prio[i] < 0) == (c == 0)) ttft[m++] = t_first[i] - t_add[i];
                cJSON_AddNumberToObject(co, "requests", m);
                cJSON_AddNumberToObject(co, "ttft_p50_ms", 1e3 * pct(ttft, m, 50));
                cJSON_AddNumberToObject(co, "ttft_p99_ms", 1e3 * pct(ttft, m, 99));
                m = 0;
                for (int32_t i = 0; i < n; i++)
                    if ((w->prio[i] < 0) == (c == 0)) ttft[m++] = t_done[i] - t_add[i];
                cJSON_AddNumberToObject(co, "e2e_p50_ms", 1e3 * pct(ttft, m, 50));
                cJSON_AddNumberToObject(co, "e2e_p99_ms", 1e3 * pct(ttft, m, 99));
            }
        cJSON *pk = cJSON_AddObjectToObject(o, "peak_bytes");
        for (int c = 0; c < FL_MEM_COUNT; c++)
            if (fl_mem_peak((fl_mem_cat)c)) cJSON_AddNumberToObject(pk, fl_mem_cat_name((fl_mem_cat)c), (double)fl_mem_peak((fl_mem_cat)c));
        cJSON_AddNumberToObject(pk, "total", (double)fl_mem_peak_total());
        if (fl_mem_thread_failures() != f_report) { /* (cJSON left out what it could not allocate) */
            fprintf(stderr, "fitllm bench serve: out of memory for the %s run's report\n", label);
            cJSON_Delete(o);
            o = NULL;
        }
    }
    if (ttft) fl_free(FL_MEM_MISC, ttft, (size_t)n * sizeof *ttft);
    fl_engine_free(e);
    fl_free(FL_MEM_MISC, ids, (size_t)n * sizeof *ids);
    fl_free(FL_MEM_MISC, t_add, (size_t)n * sizeof *t_add);
    fl_free(FL_MEM_MISC, t_first, (size_t)n * sizeof *t_first);
    fl_free(FL_MEM_MISC, t_last, (size_t)n * sizeof *t_last);
    fl_free(FL_MEM_MISC, t_done, (size_t)n * sizeof *t_done);
    fl_free(FL_MEM_MISC, itl, (size_t)itl_cap * sizeof *itl);
    fl_free(FL_MEM_MISC, pair, pair ? 4096 * sizeof *pair : 0);
    fl_free(FL_MEM_MISC, got, (size_t)n * sizeof *got);
    fl_free(FL_MEM_MISC, ev, 256 * sizeof *ev);
    return o;
}

static void print_text(const cJSON *o) {
    for (int c = 0; c < 2; c++) {
        const cJSON *co = cJSON_GetObjectItem(o, c ? "normal_priority" : "high_priority");
        if (co)
            printf("%-8s %-6s priority: %d requests, TTFT p50 %7.1f ms p99 %7.1f ms, end to end p50 %7.1f ms p99 %7.1f ms\n",
                   cJSON_GetObjectItem(o, "engine")->valuestring, c ? "normal" : "high", cJSON_GetObjectItem(co, "requests")->valueint,
                   cJSON_GetObjectItem(co, "ttft_p50_ms")->valuedouble, cJSON_GetObjectItem(co, "ttft_p99_ms")->valuedouble,
                   cJSON_GetObjectItem(co, "e2e_p50_ms")->valuedouble, cJSON_GetObjectItem(co, "e2e_p99_ms")->valuedouble);
    }
    printf("%-8s %6.1f tok/s  %5.2f req/s  TTFT p50 %7.1f ms p99 %7.1f ms  ITL p50 %6.1f ms p99 %6.1f ms\n"
           "         max concurrent %d, preemptions %d, KV util %.1f%% waste %.1f%%, prefix hits %.1f%%, peak %.1f MiB\n"
           "         decode steps: %.1f tok/s, %.1f tokens per step, %.1f GOP/s = %.1f%% of the int8 peak\n",
           cJSON_GetObjectItem(o, "engine")->valuestring, cJSON_GetObjectItem(o, "output_tokens_per_s")->valuedouble,
           cJSON_GetObjectItem(o, "requests_per_s")->valuedouble, cJSON_GetObjectItem(o, "ttft_p50_ms")->valuedouble,
           cJSON_GetObjectItem(o, "ttft_p99_ms")->valuedouble, cJSON_GetObjectItem(o, "itl_p50_ms")->valuedouble,
           cJSON_GetObjectItem(o, "itl_p99_ms")->valuedouble, cJSON_GetObjectItem(o, "max_concurrent_seqs")->valueint,
           cJSON_GetObjectItem(o, "preemptions")->valueint, 100 * cJSON_GetObjectItem(o, "kv_utilization_avg")->valuedouble,
           100 * cJSON_GetObjectItem(o, "kv_waste_avg")->valuedouble, 100 * cJSON_GetObjectItem(o, "prefix_hit_rate")->valuedouble,
           cJSON_GetObjectItem(cJSON_GetObjectItem(o, "peak_bytes"), "total")->valuedouble / 1048576.0,
           cJSON_GetObjectItem(o, "decode_tok_s")->valuedouble, cJSON_GetObjectItem(o, "decode_tokens_per_step")->valuedouble,
           cJSON_GetObjectItem(o, "decode_gops")->valuedouble, cJSON_GetObjectItem(o, "decode_pct_int8_peak")->valuedouble);
    if (cJSON_GetObjectItem(o, "spec_tokens"))
        printf("         speculative decoding (n-gram, up to %d drafts): %.0f drafted, %.0f kept (%.1f%%)\n",
               cJSON_GetObjectItem(o, "spec_tokens")->valueint, cJSON_GetObjectItem(o, "spec_draft_tokens")->valuedouble,
               cJSON_GetObjectItem(o, "spec_accepted_tokens")->valuedouble, 100 * cJSON_GetObjectItem(o, "spec_acceptance_rate")->valuedouble);
}

int fl_bench_serve(int argc, char **argv) {
    fl_opt opts[] = {
        {"model", 'm', FL_OPT_STR, "MODEL  GGUF model (required)"},
        {"requests", 'n', FL_OPT_INT, "N  number of requests (default 32)"},
        {"rate", 0, FL_OPT_FLOAT, "R  Poisson arrival rate in requests/s (default: all at once)"},
        {"prompt-len", 0, FL_OPT_STR, "DIST  prompt tokens: N or A:B uniform (default 32:256)"},
        {"gen-len", 0, FL_OPT_STR, "DIST  generated tokens: N or A:B uniform (default 32:128)"},
        {"shared-prefix", 0, FL_OPT_INT, "L  the first L prompt tokens are common to all requests (default 0)"},
        {"max-seqs", 0, FL_OPT_INT, "N  concurrent sequences (default 16)"},
        {"max-batch-tokens", 0, FL_OPT_INT, "N  token budget per step (default 512)"},
        {"kv-mem", 0, FL_OPT_BYTES, "BYTES  KV cache memory (default: 64 MiB)"},
        {"mem", 0, FL_OPT_BYTES, "BYTES  total memory limit: the plan sizes the KV cache (instead of --kv-mem)"},
        {"weights", 0, FL_OPT_STR, "T  convert weights at load: q8_0 q4_0 nf4 fp8_e4m3 f16 ..."},
        {"kv-type", 0, FL_OPT_STR, "TYPE  KV element type (paged engine; default f16)"},
        {"kv-block-size", 0, FL_OPT_INT, "N  tokens per KV block (default 16)"},
        {"preempt", 0, FL_OPT_STR, "MODE  recompute (default) or swap"},
        {"scheduling-policy", 0, FL_OPT_STR, "P  fcfs (default) or priority"},
        {"lora", 0, FL_OPT_STR, "FILE[,FILE...]  up to 16 LoRA adapters over the base; request i runs with adapter i mod n (all of them adapted)"},
        {"high-priority", 0, FL_OPT_FLOAT, "F  a fraction F of the requests (drawn at random) form a high-priority class (priority -1, the rest 0; sent only under --scheduling-policy priority); both classes' TTFT and end-to-end latency are reported"},
        {"no-prefix-cache", 0, FL_OPT_FLAG, "disable prefix caching"},
        {"baseline", 0, FL_OPT_STR, "KIND  'static': also run padded static batches on a contiguous max-length KV"},
        {"threads", 't', FL_OPT_INT, "N  threads (default: all cores)"},
        {"seed", 0, FL_OPT_INT, "N  workload seed (default 1)"},
        {"temp", 0, FL_OPT_FLOAT, "T  sampling temperature of every request (default 0: greedy)"},
        {"top-k", 0, FL_OPT_INT, "K  top-k of every request (default 0: off)"},
        {"top-p", 0, FL_OPT_FLOAT, "P  top-p of every request (default 1: off)"},
        {"logprobs", 0, FL_OPT_INT, "K  every request asks for logprobs with K alternatives per token (default: none)"},
        {"prompt-logprobs", 0, FL_OPT_FLAG, "every request also scores its prompt tokens (echo with logprobs)"},
        {"json-object", 0, FL_OPT_FLAG, "every output is constrained to one JSON object (ends when it closes)"},
        {"json-schema", 0, FL_OPT_STR, "every output is constrained to a value of the JSON Schema in FILE (ends when complete)"},
        {"regex", 0, FL_OPT_STR, "PATTERN  every output is constrained to a whole match of this regex (vLLM's guided_regex; ends when nothing extends it)"},
        {"grammar", 0, FL_OPT_STR, "FILE  every output is constrained to a sentence of the GBNF grammar in FILE (llama.cpp's grammar; ends when nothing extends it)"},
        {"guide-mem", 0, FL_OPT_BYTES, "BYTES  memory for the requests' output constraints, in the plan and enforced (default: 16M, or --mem / 16 when less, for a workload with constraints; 0 without)"},
        {"guide-masks", 0, FL_OPT_INT, "N  token masks the engine keeps for regex and grammar states (default 256; 0: every mask computed but a grammar's last, reused for the same state)"},
        {"regex-pcre2", 0, FL_OPT_FLAG, "--regex always on PCRE2's matcher (by default a pattern of the common subset runs as a grammar)"},
        {"json", 0, FL_OPT_FLAG, "print one JSON object"},
        {"no-mmap", 0, FL_OPT_FLAG, "read the model file into memory (huge pages where the kernel grants them) instead of mapping it"},
        FL_CLI_SPEC_OPTS,
        {"no-repack", 0, FL_OPT_FLAG, "keep the weights as in the file (by default Q4_0 / Q8_0 matrices are rewritten in place in groups of 8 rows for the kernels, and on AVX-512 without AMX Q4_K / Q5_K / Q6_K / Q3_K / Q2_K / Q4_1 / Q5_0 / Q5_1 / IQ4_NL in groups of 16)"},
        {"paired-peak", 0, FL_OPT_FLAG, "also measure the int8 peak for a moment before and after every engine step: decode_pct_int8_peak_paired is the median over the decode steps of each step's rate against the peak around it (the machine's speed drifts; the pauses are outside the steps' times, not outside the latencies)"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm bench serve -m MODEL [--requests N] [--rate R] [--prompt-len DIST] "
                                            "[--gen-len DIST] [--shared-prefix L] [--scheduling-policy P] [--high-priority F] [--lora FILE,...] [--spec-ngram K] [--temp T] [--top-k K] [--top-p P] [--logprobs K] [--prompt-logprobs] [--json-object | --json-schema FILE | --regex PATTERN | --grammar FILE] [--guide-masks N] [--guide-mem BYTES] [--regex-pcre2] [--baseline static] [--json]",
                          "Serve a synthetic workload through the continuous-batching engine and report\n"
                          "throughput, latency percentiles, KV utilization/waste, preemptions, prefix hits and\n"
                          "peak memory, and the decode-only steps' tokens/s and weight GOP/s against the measured int8 peak.  --baseline static adds the same workload as static padded batches.",
                          NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    fl_opt *o_model = fl_args_get(opts, "model");
    if (!o_model->set) {
        fprintf(stderr, "fitllm bench serve: -m MODEL is required\n");
        return 2;
    }
    dist dp = {32, 256}, dg = {32, 128};
    fl_opt *o;
    if ((o = fl_args_get(opts, "prompt-len"))->set && parse_dist(o->str, &dp)) {
        fprintf(stderr, "fitllm bench serve: bad --prompt-len '%s' (N or A:B)\n", o->str);
        return 2;
    }
    if ((o = fl_args_get(opts, "gen-len"))->set && parse_dist(o->str, &dg)) {
        fprintf(stderr, "fitllm bench serve: bad --gen-len '%s' (N or A:B)\n", o->str);
        return 2;
    }
    const char *baseline = fl_args_get(opts, "baseline")->set ? fl_args_get(opts, "baseline")->str : NULL;
    if (baseline && strcmp(baseline, "static")) {
        fprintf(stderr, "fitllm bench serve: --baseline must be 'static'\n");
        return 2;
    }
    const char *pm = fl_args_get(opts, "preempt")->set ? fl_args_get(opts, "preempt")->str : "recompute";
    if (strcmp(pm, "recompute") && strcmp(pm, "swap")) {
        fprintf(stderr, "fitllm bench serve: --preempt must be recompute or swap\n");
        return 2;
    }
    const char *policy = fl_args_get(opts, "scheduling-policy")->set ? fl_args_get(opts, "scheduling-policy")->str : "fcfs";
    const double high = fl_args_get(opts, "high-priority")->set ? fl_args_get(opts, "high-priority")->f : 0;
    if ((strcmp(policy, "fcfs") && strcmp(policy, "priority")) || !(high >= 0 && high <= 1)) {
        fprintf(stderr, "fitllm bench serve: --scheduling-policy must be fcfs or priority, --high-priority in [0, 1]\n");
        return 2;
    }
    int32_t n = fl_args_get(opts, "requests")->set ? (int32_t)fl_args_get(opts, "requests")->i : 32;
    int32_t shared = fl_args_get(opts, "shared-prefix")->set ? (int32_t)fl_args_get(opts, "shared-prefix")->i : 0;
    double rate = fl_args_get(opts, "rate")->set ? fl_args_get(opts, "rate")->f : 0;
    if (n < 1 || n > 100000 || shared < 0 || rate < 0) {
        fprintf(stderr, "fitllm bench serve: --requests must be in [1, 100000], --shared-prefix and --rate >= 0\n");
        return 2;
    }
    uint64_t seed = fl_args_get(opts, "seed")->set ? (uint64_t)fl_args_get(opts, "seed")->i : 1;

    run_cfg rc;
    memset(&rc, 0, sizeof rc);
    fl_engine_params_default(&rc.ep);
    rc.ep.model_path = o_model->str;
    rc.ep.n_threads = fl_args_get(opts, "threads")->set ? (int32_t)fl_args_get(opts, "threads")->i : 0;
    if ((o = fl_args_get(opts, "max-seqs"))->set) rc.ep.max_seqs = (int32_t)o->i;
    if ((o = fl_args_get(opts, "max-batch-tokens"))->set) rc.ep.max_batch_tokens = (int32_t)o->i;
    rc.ep.kv_mem = fl_args_get(opts, "kv-mem")->set ? fl_args_get(opts, "kv-mem")->i : 64ll << 20;
    if ((o = fl_args_get(opts, "kv-type"))->set) rc.ep.kv_type = o->str;
    if ((o = fl_args_get(opts, "weights"))->set) rc.ep.weights_type = o->str;
    rc.ep.no_mmap = fl_args_get(opts, "no-mmap")->set;
    if (fl_cli_spec_params(opts, "bench serve", &rc.ep)) return 2;
    rc.ep.no_repack = fl_args_get(opts, "no-repack")->set;
    if ((o = fl_args_get(opts, "kv-block-size"))->set) rc.ep.kv_block_size = (int32_t)o->i;
    rc.ep.prefix_cache = !fl_args_get(opts, "no-prefix-cache")->set;
    rc.ep.preempt = strcmp(pm, "swap") ? FL_PREEMPT_RECOMPUTE : FL_PREEMPT_SWAP;
    rc.ep.sched_policy = strcmp(policy, "priority") ? FL_SCHED_FCFS : FL_SCHED_PRIORITY;
    char lora_buf[4096];
    const char *lora_paths[16];
    if ((o = fl_args_get(opts, "lora"))->set) { /* comma-separated files */
        if (strlen(o->str) >= sizeof lora_buf) {
            fprintf(stderr, "fitllm bench serve: --lora is too long\n");
            return 2;
        }
        strcpy(lora_buf, o->str);
        for (char *save = NULL, *t = strtok_r(lora_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (rc.ep.n_loras == 16) {
                fprintf(stderr, "fitllm bench serve: --lora takes at most 16 files\n");
                return 2;
            }
            lora_paths[rc.ep.n_loras++] = t;
        }
        rc.ep.lora_paths = lora_paths;
    }
    rc.json = fl_args_get(opts, "json")->set;
    rc.temp = fl_args_get(opts, "temp")->set ? (float)fl_args_get(opts, "temp")->f : 0.0f;
    rc.top_k = fl_args_get(opts, "top-k")->set ? (int32_t)fl_args_get(opts, "top-k")->i : 0;
    rc.top_p = fl_args_get(opts, "top-p")->set ? (float)fl_args_get(opts, "top-p")->f : 1.0f;
    rc.logprobs = fl_args_get(opts, "logprobs")->set ? (int32_t)fl_args_get(opts, "logprobs")->i : -1;
    rc.prompt_logprobs = fl_args_get(opts, "prompt-logprobs")->set;
    rc.json_object = fl_args_get(opts, "json-object")->set;
    /* the engine reserves (and the plan counts) logprob records only for what the workload asks */
    rc.ep.max_logprobs = rc.logprobs >= 0 ? rc.logprobs : rc.prompt_logprobs ? 0 : -1;
    if (fl_args_get(opts, "guide-masks")->set) {
        const int64_t gm = fl_args_get(opts, "guide-masks")->i;
        if (gm < 0 || gm > (1 << 20)) {
            fprintf(stderr, "fitllm bench serve: --guide-masks takes 0..%d\n", 1 << 20);
            return 2;
        }
        rc.ep.guide_masks = (int32_t)gm;
    }
    rc.ep.regex_pcre2 = fl_args_get(opts, "regex-pcre2")->set;
    /* as for logprobs: the constraints' budget only where the workload has constraints */
    if (fl_args_get(opts, "guide-mem")->set) rc.ep.guide_mem = fl_args_get(opts, "guide-mem")->i;
    else if (!rc.json_object && !fl_args_get(opts, "json-schema")->set && !fl_args_get(opts, "regex")->set && !fl_args_get(opts, "grammar")->set)
        rc.ep.guide_mem = 0;
    if (fl_args_get(opts, "logprobs")->set && (rc.logprobs < 0 || rc.logprobs > FL_MAX_TOP_LOGPROBS)) {
        fprintf(stderr, "fitllm bench serve: --logprobs takes 0..%d\n", FL_MAX_TOP_LOGPROBS);
        return 2;
    }
    if (!(rc.temp >= 0.0f && rc.temp <= 100.0f) || rc.top_k < 0 || !(rc.top_p > 0.0f && rc.top_p <= 1.0f)) {
        fprintf(stderr, "fitllm bench serve: --temp must be in [0, 100], --top-k >= 0, --top-p in (0, 1]\n");
        return 2;
    }

    /* the workload: random ids (BOS first), a common prefix, arrival times */
    workload w = {0};
    w.n = n;
    w.prompt = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *w.prompt);
    w.n_prompt = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *w.n_prompt);
    w.gen = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *w.gen);
    w.arrival = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *w.arrival);
    w.prio = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *w.prio);
    uint64_t rs = seed, rs_prio = seed ^ 0x5052494fu; /* the classes from a stream of their own: the rest of the workload stays what the seed gives */
    int32_t n_vocab_guess = 256; /* ids below every llama vocab's size; the engine checks the range */
    int32_t *prefix = fl_calloc(FL_MEM_MISC, (size_t)shared + 1, sizeof *prefix);
    if (!w.prompt || !w.n_prompt || !w.gen || !w.arrival || !w.prio || !prefix) {
        fprintf(stderr, "fitllm bench serve: %s\n", fl_last_error());
        fl_free(FL_MEM_MISC, prefix, ((size_t)shared + 1) * sizeof *prefix);
        workload_free(&w);
        return 1;
    }
    for (int32_t j = 0; j < shared; j++) prefix[j] = 3 + (int32_t)(rnd(&rs) % (uint64_t)(n_vocab_guess - 3));
    double t = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t np = draw(&dp, &rs);
        if (np < shared + 1) np = shared + 1;
        w.n_prompt[i] = np;
        w.gen[i] = draw(&dg, &rs);
        w.prompt[i] = fl_alloc(FL_MEM_MISC, (size_t)np * sizeof(int32_t), 16);
        if (!w.prompt[i]) {
            fprintf(stderr, "fitllm bench serve: %s\n", fl_last_error());
            for (int32_t k = i; k < n; k++) w.n_prompt[k] = 0;
            fl_free(FL_MEM_MISC, prefix, ((size_t)shared + 1) * sizeof *prefix);
            workload_free(&w);
            return 1;
        }
        w.prompt[i][0] = 1;
        for (int32_t j = 1; j < np; j++)
            w.prompt[i][j] = j - 1 < shared ? prefix[j - 1] : 3 + (int32_t)(rnd(&rs) % (uint64_t)(n_vocab_guess - 3));
        if (np + w.gen[i] > w.max_len) w.max_len = np + w.gen[i];
        if (rate > 0) t += -log(1.0 - rnd01(&rs)) / rate;
        w.arrival[i] = t;
        if (high > 0 && rnd01(&rs_prio) < high) {
            w.prio[i] = -1;
            w.n_high++;
        }
    }
    fl_free(FL_MEM_MISC, prefix, ((size_t)shared + 1) * sizeof *prefix);
    /* both engines get the workload's longest sequence as their context: the static baseline
     * reserves exactly that per sequence, the paged engine only what each request uses */
    rc.ep.n_ctx = w.max_len;
    if ((o = fl_args_get(opts, "mem"))->set) {
        /* the plan sizes the KV pool for the whole limit; both engines get that pool */
        fl_plan_engine_in pi;
        uint64_t kvm = 0;
        if (rc.ep.guide_mem < 0) { /* the default constraints' budget as under this limit */
            rc.ep.mem_total = o->i;
            rc.ep.guide_mem = fl_engine_guide_mem(&rc.ep);
            rc.ep.mem_total = 0;
        }
        fl_status pst = fl_engine_plan_input(&rc.ep, &pi);
        if (pst == FL_OK) pst = fl_plan_engine_kv_mem(&pi, (uint64_t)o->i, &kvm);
        if (pst != FL_OK) {
            fprintf(stderr, "fitllm bench serve: %s\n", fl_last_error());
            workload_free(&w);
            return 1;
        }
        rc.ep.kv_mem = (int64_t)kvm;
    }

    size_t fail0 = fl_mem_thread_failures(); /* (the report must come out whole, see below; a run's failures are its own) */
    cJSON *root = cJSON_CreateObject();
    cJSON *wj = cJSON_AddObjectToObject(root, "workload");
    cJSON_AddNumberToObject(wj, "requests", n);
    cJSON_AddNumberToObject(wj, "rate", rate);
    cJSON_AddNumberToObject(wj, "prompt_len_min", dp.lo);
    cJSON_AddNumberToObject(wj, "prompt_len_max", dp.hi);
    cJSON_AddNumberToObject(wj, "gen_len_min", dg.lo);
    cJSON_AddNumberToObject(wj, "gen_len_max", dg.hi);
    cJSON_AddNumberToObject(wj, "shared_prefix", shared);
    cJSON_AddNumberToObject(wj, "max_len", w.max_len);
    cJSON_AddNumberToObject(wj, "kv_mem", (double)rc.ep.kv_mem);
    if (fl_args_get(opts, "mem")->set) cJSON_AddNumberToObject(wj, "mem_total", (double)fl_args_get(opts, "mem")->i);
    cJSON_AddNumberToObject(wj, "max_seqs", rc.ep.max_seqs);
    cJSON_AddStringToObject(wj, "scheduling_policy", policy);
    cJSON_AddNumberToObject(wj, "lora_adapters", rc.ep.n_loras);
    cJSON_AddNumberToObject(wj, "high_priority_requests", w.n_high);
    /* the int8 peak beside the decode steps' weight ops (2 per matrix element and token) */
    const double params = matmul_params(rc.ep.model_path);
    rc.params = params;
    rc.paired_peak = fl_args_get(opts, "paired-peak")->set;
    if (rc.ep.n_threads > 0) fl_threads_set(rc.ep.n_threads);
    const double peak0 = fl_calib_int8_peak_gops(fl_threads_get(), 0.3);
    cJSON_AddNumberToObject(root, "matmul_params", params);
    /* the constraint (at most one), refused here, before the model loads */
    size_t schema_len = 0, gbnf_len = 0;
    char *schema = NULL, *gbnf = NULL;
    const bool want_schema = fl_args_get(opts, "json-schema")->set, want_regex = fl_args_get(opts, "regex")->set,
               want_grammar = fl_args_get(opts, "grammar")->set;
    int rcode = 0;
    if (rc.json_object + want_schema + want_regex + want_grammar > 1) {
        fprintf(stderr, "fitllm bench serve: one of --json-object, --json-schema, --regex and --grammar\n");
        rcode = 2;
    } else if (want_schema) {
        fl_json_schema *probe = NULL;
        if (!(schema = fl_cli_read_file(fl_args_get(opts, "json-schema")->str, &schema_len)) || fl_json_schema_compile(schema, &probe) != FL_OK) {
            fprintf(stderr, "fitllm bench serve: --json-schema: %s\n", fl_last_error());
            rcode = 2;
        }
        fl_json_schema_free(probe);
        rc.json_schema = schema;
    } else if (want_regex) {
        fl_regex_guide *probe = NULL;
        if (fl_regex_guide_new(fl_args_get(opts, "regex")->str, &probe) != FL_OK) {
            fprintf(stderr, "fitllm bench serve: --regex: %s\n", fl_last_error());
            rcode = 2;
        }
        fl_regex_guide_free(probe);
        rc.regex = fl_args_get(opts, "regex")->str;
    } else if (want_grammar) {
        fl_grammar_guide *probe = NULL;
        if (!(gbnf = fl_cli_read_file(fl_args_get(opts, "grammar")->str, &gbnf_len)) || fl_grammar_guide_new(gbnf, &probe) != FL_OK) {
            fprintf(stderr, "fitllm bench serve: --grammar: %s\n", fl_last_error());
            rcode = 2;
        }
        fl_grammar_guide_free(probe);
        rc.grammar = gbnf;
    }
    if (rcode) {
        if (schema) fl_free(FL_MEM_MISC, schema, schema_len + 1);
        if (gbnf) fl_free(FL_MEM_MISC, gbnf, gbnf_len + 1);
        cJSON_Delete(root);
        workload_free(&w);
        return rcode;
    }
    size_t f_run = fl_mem_thread_failures();
    cJSON *paged = run_one(&rc, &w, "paged");
    fail0 += fl_mem_thread_failures() - f_run;
    if (!paged) rcode = 1;
    else fl_cli_json_add(root, "paged", paged);
    if (!rcode && baseline) {
        run_cfg rs2 = rc;
        rs2.ep.kv_layout = FL_KV_CONTIGUOUS;
        rs2.ep.prefix_cache = 0;
        rs2.ep.spec_tokens = 0; /* (drafts need the paged cache) */
        f_run = fl_mem_thread_failures();
        cJSON *st = run_one(&rs2, &w, "static");
        fail0 += fl_mem_thread_failures() - f_run;
        if (!st) rcode = 1;
        else fl_cli_json_add(root, "static", st);
    }
    /* calibrated again after the runs, the larger kept (the machine's speed drifts over minutes) */
    const double peak1 = fl_calib_int8_peak_gops(fl_threads_get(), 0.3), peak = peak0 > peak1 ? peak0 : peak1;
    cJSON_AddNumberToObject(root, "int8_peak_gops", peak);
    cJSON_AddNumberToObject(root, "int8_peak_gops_before", peak0);
    cJSON_AddNumberToObject(root, "int8_peak_gops_after", peak1);
    for (int i = 0; i < 2 && !rcode; i++) {
        cJSON *eo = cJSON_GetObjectItem(root, i ? "static" : "paged");
        const cJSON *dt = cJSON_GetObjectItem(eo, "decode_tok_s");
        if (!dt) continue;
        const double gops = dt->valuedouble * 2.0 * params / 1e9;
        cJSON_AddNumberToObject(eo, "decode_gops", gops);
        cJSON_AddNumberToObject(eo, "decode_pct_int8_peak", peak > 0 ? 100 * gops / peak : 0);
    }
    /* cJSON leaves out what it cannot allocate: a report built through a failed allocation is
     * not printed, in either form (the text is read from it too) */
    if (!rcode && (!root || fl_mem_thread_failures() != fail0)) {
        fprintf(stderr, "fitllm bench serve: out of memory while building the report; nothing printed\n");
        rcode = 1;
    }
    if (!rcode) {
        if (rc.json) {
            rcode = fl_cli_print_json("bench serve", root, false, fail0);
            root = NULL;
        } else {
            printf("workload: %d requests, prompt %d..%d, gen %d..%d, shared prefix %d, %s, KV %.1f MiB\n", n, dp.lo,
                   dp.hi, dg.lo, dg.hi, shared, rate > 0 ? "Poisson arrivals" : "all at once",
                   (double)rc.ep.kv_mem / 1048576.0);
            print_text(cJSON_GetObjectItem(root, "paged"));
            if (baseline) print_text(cJSON_GetObjectItem(root, "static"));
        }
    }
    cJSON_Delete(root);
    workload_free(&w);
    if (schema) fl_free(FL_MEM_MISC, schema, schema_len + 1);
    if (gbnf) fl_free(FL_MEM_MISC, gbnf, gbnf_len + 1);
    return rcode;
}
