/* /metrics in the Prometheus text exposition format. */
#include "server/server_int.h"

static const double bucket_le[SRV_NBUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

void srv_hist_add(srv_hist *h, double v) {
    h->sum += v;
    h->count++;
    for (int i = 0; i < SRV_NBUCKETS; i++)
        if (v <= bucket_le[i]) h->buckets[i]++;
}

static fl_status hist(srv_buf *o, const char *name, const char *help, const srv_hist *h) {
    fl_status st = srv_buf_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < SRV_NBUCKETS && !st; i++) st = srv_buf_printf(o, "%s_bucket{le=\"%g\"} %lld\n", name, bucket_le[i], (long long)h->buckets[i]);
    if (!st) st = srv_buf_printf(o, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n", name, (long long)h->count, name, h->sum, name, (long long)h->count);
    return st;
}

static fl_status gauge(srv_buf *o, const char *name, const char *help, const char *type, double v) {
    return srv_buf_printf(o, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* A metric under another project's name, with the model_name label its dashboards select on. */
static fl_status labeled(srv_buf *o, const char *name, const char *help, const char *type, const char *label, double v) {
    return srv_buf_printf(o, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=\"%s\"} %.17g\n", name, help, name, type, name, label, v);
}

static fl_status labeled_hist(srv_buf *o, const char *name, const char *help, const char *label, const srv_hist *h) {
    fl_status st = srv_buf_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < SRV_NBUCKETS && !st; i++)
        st = srv_buf_printf(o, "%s_bucket{model_name=\"%s\",le=\"%g\"} %lld\n", name, label, bucket_le[i], (long long)h->buckets[i]);
    if (!st)
        st = srv_buf_printf(o, "%s_bucket{model_name=\"%s\",le=\"+Inf\"} %lld\n%s_sum{model_name=\"%s\"} %.6f\n%s_count{model_name=\"%s\"} %lld\n",
                            name, label, (long long)h->count, name, label, h->sum, name, label, (long long)h->count);
    return st;
}

/* The same figures under vLLM's names (vllm:..., v1 engine) and llama-server's (llamacpp:...), so
 * that the dashboards and alerts written for them read this server. */
static fl_status compat_metrics(fl_server *s, srv_buf *o, const fl_engine_stats *es, const srv_metrics *m) {
    char label[2 * sizeof s->model_name]; /* the model name, escaped for a label value */
    size_t k = 0;
    for (const char *p = s->model_name; *p && k + 3 < sizeof label; p++) {
        if (*p == '\\' || *p == '"') label[k++] = '\\';
        if (*p == '\n') { label[k++] = '\\'; label[k++] = 'n'; continue; }
        label[k++] = *p;
    }
    label[k] = 0;
    const double usage = es->kv_blocks_total > 0 ? (double)es->kv_blocks_used / (double)es->kv_blocks_total : 0;
    fl_status st = FL_OK;
    st |= labeled(o, "vllm:num_requests_running", "requests in the engine's running batch", "gauge", label, es->n_running);
    st |= labeled(o, "vllm:num_requests_waiting", "requests waiting to run", "gauge", label, es->n_waiting + es->n_preempted);
    st |= labeled(o, "vllm:kv_cache_usage_perc", "KV cache usage (1 = full)", "gauge", label, usage);
    st |= srv_buf_printf(o, "# HELP vllm:request_success_total finished requests (choices), by finish reason\n# TYPE vllm:request_success_total counter\n");
    static const char *const REASONS[4] = {"stop", "length", "abort", "error"};
    for (int q = 0; q < 4; q++)
        st |= srv_buf_printf(o, "vllm:request_success_total{model_name=\"%s\",finished_reason=\"%s\"} %lld\n", label, REASONS[q], (long long)m->finished[q]);
    st |= labeled(o, "vllm:prompt_tokens_total", "prompt tokens of finished requests", "counter", label, (double)m->prompt_tokens);
    st |= labeled(o, "vllm:generation_tokens_total", "generated tokens", "counter", label, (double)m->completion_tokens);
    st |= labeled(o, "vllm:num_preemptions_total", "preemptions", "counter", label, (double)es->preemptions);
    st |= labeled(o, "vllm:prefix_cache_queries_total", "prompt tokens looked up in the prefix cache", "counter", label,
                  (double)(es->prefix_hit_tokens + es->prefix_miss_tokens));
    st |= labeled(o, "vllm:prefix_cache_hits_total", "prompt tokens found in the prefix cache", "counter", label, (double)es->prefix_hit_tokens);
    st |= labeled_hist(o, "vllm:time_to_first_token_seconds", "time to first token", label, &m->ttft);
    st |= labeled_hist(o, "vllm:e2e_request_latency_seconds", "end-to-end request latency", label, &m->e2e);
    st |= labeled(o, "vllm:spec_decode_num_drafts_total", "speculative decoding: drafts verified", "counter", label, (double)es->spec_drafts);
    st |= labeled(o, "vllm:spec_decode_num_draft_tokens_total", "speculative decoding: draft tokens verified", "counter", label,
                  (double)es->spec_draft_tokens);
    st |= labeled(o, "vllm:spec_decode_num_accepted_tokens_total", "speculative decoding: draft tokens kept", "counter", label,
                  (double)es->spec_accepted_tokens);
    st |= gauge(o, "llamacpp:prompt_tokens_total", "prompt tokens of finished requests", "counter", (double)m->prompt_tokens);
    st |= gauge(o, "llamacpp:tokens_predicted_total", "generated tokens", "counter", (double)m->completion_tokens);
    st |= gauge(o, "llamacpp:requests_processing", "requests running", "gauge", es->n_running);
    st |= gauge(o, "llamacpp:requests_deferred", "requests waiting", "gauge", es->n_waiting + es->n_preempted);
    st |= gauge(o, "llamacpp:kv_cache_usage_ratio", "KV cache usage (1 = full)", "gauge", usage);
    st |= gauge(o, "llamacpp:n_decode_total", "engine steps", "counter", (double)es->steps);
    return st;
}

fl_status srv_metrics_render(fl_server *s, srv_buf *o) {
    fl_engine_stats es;
    fl_engine_stats_get(s->engine, &es);
    pthread_mutex_lock(&s->mu);
    srv_metrics m = s->m;
    int32_t live = s->n_live;
    const int64_t stored = s->resp_count;
    const size_t stored_bytes = s->resp_bytes;
    pthread_mutex_unlock(&s->mu);
    fl_status st = FL_OK;
    st |= srv_buf_printf(o, "# HELP fitllm_requests_total HTTP generation requests by outcome\n# TYPE fitllm_requests_total counter\n");
    st |= srv_buf_printf(o, "fitllm_requests_total{outcome=\"ok\"} %lld\nfitllm_requests_total{outcome=\"client_error\"} %lld\n"
                            "fitllm_requests_total{outcome=\"server_error\"} %lld\nfitllm_requests_total{outcome=\"cancelled\"} %lld\n",
                         (long long)m.requests_ok, (long long)m.requests_err4xx, (long long)m.requests_err5xx, (long long)m.requests_cancelled);
    static const char *const REASONS[4] = {"stop", "length", "abort", "error"};
    st |= srv_buf_printf(o, "# HELP fitllm_choices_finished_total choices (engine requests) finished, by reason\n"
                            "# TYPE fitllm_choices_finished_total counter\n");
    for (int k = 0; k < 4; k++) st |= srv_buf_printf(o, "fitllm_choices_finished_total{reason=\"%s\"} %lld\n", REASONS[k], (long long)m.finished[k]);
    st |= gauge(o, "fitllm_prompt_tokens_total", "prompt tokens of finished requests", "counter", (double)m.prompt_tokens);
    st |= gauge(o, "fitllm_generation_tokens_total", "generated tokens", "counter", (double)m.completion_tokens);
    st |= hist(o, "fitllm_time_to_first_token_seconds", "time to first token", &m.ttft);
    st |= hist(o, "fitllm_request_latency_seconds", "end-to-end request latency", &m.e2e);
    st |= gauge(o, "fitllm_requests_running", "requests being served", "gauge", (double)live);
    st |= gauge(o, "fitllm_engine_waiting", "requests waiting in the engine", "gauge", es.n_waiting);
    st |= gauge(o, "fitllm_engine_running", "requests running in the engine", "gauge", es.n_running);
    st |= gauge(o, "fitllm_engine_steps_total", "engine steps", "counter", (double)es.steps);
    st |= gauge(o, "fitllm_kv_blocks_total", "KV blocks in the pool", "gauge", (double)es.kv_blocks_total);
    st |= gauge(o, "fitllm_kv_blocks_used", "KV blocks held by sequences", "gauge", (double)es.kv_blocks_used);
    st |= gauge(o, "fitllm_kv_blocks_free", "free KV blocks", "gauge", (double)es.kv_blocks_free);
    st |= gauge(o, "fitllm_kv_blocks_cached", "free KV blocks still holding prefix-cache entries", "gauge", (double)es.kv_blocks_cached);
    st |= gauge(o, "fitllm_kv_utilization", "live tokens / allocated token slots", "gauge", es.kv_utilization);
    st |= gauge(o, "fitllm_prefix_cache_hit_tokens_total", "prompt tokens served from the prefix cache", "counter", (double)es.prefix_hit_tokens);
    st |= gauge(o, "fitllm_prefix_cache_miss_tokens_total", "prompt tokens computed", "counter", (double)es.prefix_miss_tokens);
    st |= gauge(o, "fitllm_preemptions_total", "preemptions", "counter", (double)es.preemptions);
    st |= gauge(o, "fitllm_spec_draft_tokens_total", "speculative decoding (--spec-ngram): draft tokens verified", "counter", (double)es.spec_draft_tokens);
    st |= gauge(o, "fitllm_spec_accepted_tokens_total", "speculative decoding: draft tokens kept", "counter", (double)es.spec_accepted_tokens);
    st |= gauge(o, "fitllm_guide_mask_hits_total", "guided_regex and grammar token masks found kept for their state", "counter", (double)es.guide_mask_hits);
    st |= gauge(o, "fitllm_guide_mask_misses_total", "guided_regex and grammar token masks computed", "counter", (double)es.guide_mask_misses);
    st |= gauge(o, "fitllm_responses_stored", "/v1/responses kept for previous_response_id and GET (--responses-mem)", "gauge", (double)stored);
    st |= gauge(o, "fitllm_responses_stored_bytes", "their bytes (part of the net category)", "gauge", (double)stored_bytes);
    st |= srv_buf_printf(o, "# HELP fitllm_memory_bytes tracked memory by category\n# TYPE fitllm_memory_bytes gauge\n");
    for (int c = 0; c < FL_MEM_COUNT; c++)
        st |= srv_buf_printf(o, "fitllm_memory_bytes{category=\"%s\"} %zu\n", fl_mem_cat_name((fl_mem_cat)c), fl_mem_current((fl_mem_cat)c));
    st |= srv_buf_printf(o, "fitllm_memory_bytes{category=\"total\"} %zu\n", fl_mem_current_total());
    st |= srv_buf_printf(o, "# HELP fitllm_memory_peak_bytes peak tracked memory by category\n# TYPE fitllm_memory_peak_bytes gauge\n");
    for (int c = 0; c < FL_MEM_COUNT; c++)
        st |= srv_buf_printf(o, "fitllm_memory_peak_bytes{category=\"%s\"} %zu\n", fl_mem_cat_name((fl_mem_cat)c), fl_mem_peak((fl_mem_cat)c));
    st |= srv_buf_printf(o, "fitllm_memory_peak_bytes{category=\"total\"} %zu\n", fl_mem_peak_total());
    st |= srv_buf_printf(o, "# HELP fitllm_memory_budget_bytes enforced budget by category (guide: --guide-mem)\n# TYPE fitllm_memory_budget_bytes gauge\n");
    for (int c = 0; c < FL_MEM_COUNT; c++)
        if (fl_mem_budget((fl_mem_cat)c))
            st |= srv_buf_printf(o, "fitllm_memory_budget_bytes{category=\"%s\"} %zu\n", fl_mem_cat_name((fl_mem_cat)c), fl_mem_budget((fl_mem_cat)c));
    st |= srv_buf_printf(o, "# HELP fitllm_memory_refused_total allocations refused by their category's budget\n# TYPE fitllm_memory_refused_total counter\n");
    st |= srv_buf_printf(o, "fitllm_memory_refused_total{category=\"guide\"} %zu\n", fl_mem_refused(FL_MEM_GUIDE));
    st |= compat_metrics(s, o, &es, &m);
    return st ? FL_ERR_NOMEM : FL_OK;
}
