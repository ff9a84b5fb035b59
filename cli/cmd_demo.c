/* `fitllm demo [-m MODEL]`: a few dozen concurrent requests through the continuous-batching
 * engine, then throughput, the memory report (weights / KV / activations / peak) and KV waste.
 * Without -m it synthesizes a small llama-shaped model with random weights (and says so). */
#include "cli/cli.h"
#include "core/clock.h"

#include "core/alloc.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/synth_tiny.h"
#include "plan/plan_engine.h"
#include "fitllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const prompts[] = {
    "Once upon a time", "Lily and Tom went to the park", "The little dog was sad because",
    "One day, a big red ball", "Sam wanted to fly like a bird", "In a small house near the sea",
    "The sun was hot and the children", "Mom said it was time for bed, but", "A tiny frog lived in a pond",
    "Ben found a shiny key under the tree", "The cat and the mouse were friends", "It was a rainy day and Anna",
    "Grandpa told a story about a dragon", "The boy had a new blue bike", "Under the bed there was a box",
    "Max the bear loved honey", "The princess lost her crown", "Two birds sat on a branch",
    "Tim did not want to share his toys", "At the zoo, the lion", "A girl named Sue liked to paint",
    "The train went fast through the hills", "Jack planted a seed in the garden", "The old owl said",
    "Every morning the farmer", "Mia baked a cake for her friend", "The robot could not find its way home",
    "On the beach, Lucy built", "The moon was big and bright", "Spot the puppy dug a hole",
    "A little fish swam to the bottom of the sea", "The snowman smiled when",
};
#define N_PROMPTS ((int)(sizeof prompts / sizeof prompts[0]))

static const char *find_tokenizer_source(void) {
    static char buf[1024];
    struct stat st;
    const char *env = getenv("FL_SHARED_DIR");
    const char *cands[] = {env, "../shared"};
    for (int i = 0; i < 2; i++) {
        if (!cands[i]) continue;
        snprintf(buf, sizeof buf, "%s/models/stories260K.gguf", cands[i]);
        if (stat(buf, &st) == 0) return buf;
    }
    return NULL;
}

/* Make generated text safe for one terminal line: invalid UTF-8 and control bytes become '?'
 * (random weights produce byte-fallback tokens that are not valid text). */
static void printable(char *t) {
    unsigned char *s = (unsigned char *)t;
    while (*s) {
        int len = *s < 0x80 ? 1 : (*s & 0xE0) == 0xC0 ? 2 : (*s & 0xF0) == 0xE0 ? 3 : (*s & 0xF8) == 0xF0 ? 4 : 0;
        int ok = len > 0;
        for (int k = 1; ok && k < len; k++) ok = (s[k] & 0xC0) == 0x80;
        if (!ok) { *s++ = '?'; continue; }
        if (len == 1 && (*s < 0x20 || *s == 0x7F)) *s = *s == '\n' ? ' ' : '?';
        s += len;
    }
}

int fl_cmd_demo(int argc, char **argv) {
    fl_opt opts[] = {
        {"model", 'm', FL_OPT_STR, "MODEL  GGUF model (default: synthesize a small random llama)"},
        {"requests", 'n', FL_OPT_INT, "N  concurrent requests (default 32)"},
        {"max-tokens", 0, FL_OPT_INT, "N  tokens generated per request (default 48)"},
        {"max-seqs", 0, FL_OPT_INT, "N  sequences running at once (default 16)"},
        {"kv-mem", 0, FL_OPT_BYTES, "BYTES  KV cache memory (default 32 MiB)"},
        {"mem", 0, FL_OPT_BYTES, "BYTES  total memory limit: the plan sizes the KV cache (instead of --kv-mem)"},
        {"weights", 0, FL_OPT_STR, "T  convert weights at load: q8_0 q4_0 nf4 fp8_e4m3 f16 ..."},
        {"kv-type", 0, FL_OPT_STR, "T  KV cache type: f16 (default) f32 bf16 q8_0 q4_0 fp8_e4m3 fp8_e5m2"},
        {"threads", 't', FL_OPT_INT, "N  threads (default: all cores)"},
        {"temp", 0, FL_OPT_FLOAT, "T  sampling temperature (default 0.8; 0 = greedy)"},
        {"json", 0, FL_OPT_FLAG, "print one JSON object instead of text"},
        {"no-mmap", 0, FL_OPT_FLAG, "read the model file into memory (huge pages where the kernel grants them) instead of mapping it"},
        FL_CLI_SPEC_OPTS,
        {"no-repack", 0, FL_OPT_FLAG, "keep the weights as in the file (by default Q4_0 / Q8_0 matrices are rewritten in place in groups of 8 rows for the kernels, and on AVX-512 without AMX Q4_K / Q5_K / Q6_K / Q3_K / Q2_K / Q4_1 / Q5_0 / Q5_1 / IQ4_NL in groups of 16)"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm demo [-m MODEL] [-n REQUESTS] [--max-tokens N] [--mem BYTES] [--weights T]",
                          "Run a few dozen concurrent requests through the continuous-batching engine and\n"
                          "print throughput, the memory report and KV waste.  Without -m, a small\n"
                          "llama-shaped model with RANDOM weights is synthesized (its text is noise).",
                          NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    fl_opt *o;
    int32_t n_req = (o = fl_args_get(opts, "requests"))->set ? (int32_t)o->i : 32;
    int32_t max_tokens = (o = fl_args_get(opts, "max-tokens"))->set ? (int32_t)o->i : 48;
    if (n_req < 1 || n_req > 10000 || max_tokens < 1) {
        fprintf(stderr, "fitllm demo: --requests must be in [1, 10000] and --max-tokens >= 1\n");
        return 2;
    }
    const char *model = fl_args_get(opts, "model")->set ? fl_args_get(opts, "model")->str : NULL;
    char tmp[256] = "";
    int json = fl_args_get(opts, "json")->set;
    if (!model) {
        const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(tmp, sizeof tmp, "%s/fitllm-demo-%d.gguf", dir, (int)getpid());
        fl_synth_tiny_params sp;
        fl_synth_tiny_default(&sp);
        sp.tokenizer_from = find_tokenizer_source();
        if (fl_synth_write_tiny(tmp, &sp) != FL_OK) {
            fprintf(stderr, "fitllm demo: cannot write the synthetic model: %s\n", fl_last_error());
            return 1;
        }
        model = tmp;
        if (!json)
            printf("No model given: synthesized a small llama-shaped model with RANDOM weights\n"
                   "(n_embd %d, %d layers, %d heads / %d kv heads, ffn %d, tokenizer: %s).\n"
                   "Its text is noise; the point is the engine, the throughput and the memory report.\n\n",
                   sp.n_embd, sp.n_layer, sp.n_head, sp.n_head_kv, sp.n_ff,
                   sp.tokenizer_from ? "stories260K's" : "byte fallback");
    }
    fl_engine_params ep;
    fl_engine_params_default(&ep);
    ep.max_logprobs = -1; /* the demo's requests ask for none: no records in its plan */
    ep.guide_mem = 0;     /* nor output constraints */
    ep.model_path = model;
    ep.n_threads = (o = fl_args_get(opts, "threads"))->set ? (int32_t)o->i : 0;
    if ((o = fl_args_get(opts, "max-seqs"))->set) ep.max_seqs = (int32_t)o->i;
    ep.kv_mem = (o = fl_args_get(opts, "kv-mem"))->set ? o->i : 32ll << 20;
    if ((o = fl_args_get(opts, "mem"))->set) {
        ep.mem_total = o->i;
        ep.kv_mem = 0;
    }
    if ((o = fl_args_get(opts, "weights"))->set) ep.weights_type = o->str;
    ep.no_mmap = fl_args_get(opts, "no-mmap")->set;
    if (fl_cli_spec_params(opts, "demo", &ep)) return 2;
    ep.no_repack = fl_args_get(opts, "no-repack")->set;
    if ((o = fl_args_get(opts, "kv-type"))->set) ep.kv_type = o->str;
    ep.n_ctx = 512;
    /* what the plan says the engine will use (compared with the measured peak at the end) */
    fl_plan_engine_out plan;
    memset(&plan, 0, sizeof plan);
    {
        fl_plan_engine_in pi;
        uint64_t kvm = 0;
        if (fl_engine_plan_input(&ep, &pi) == FL_OK &&
            (!ep.mem_total || fl_plan_engine_kv_mem(&pi, (uint64_t)ep.mem_total, &kvm) == FL_OK)) {
            if (ep.mem_total) pi.kv_mem = kvm;
            if (fl_plan_engine(&pi, &plan) != FL_OK) plan.total = 0;
        }
        fl_clear_error();
    }
    float temp = (o = fl_args_get(opts, "temp"))->set ? (float)o->f : 0.8f;
    fl_mem_reset_peaks();
    fl_engine *e;
    double t_load = fl_clock_s();
    fl_status st = fl_engine_new(&ep, &e);
    if (tmp[0]) unlink(tmp); /* mapped: the file can go */
    if (st != FL_OK) {
        fprintf(stderr, "fitllm demo: %s\n", fl_last_error());
        return 1;
    }
    t_load = fl_clock_s() - t_load;
    int rc = 0;
    int64_t first_id = -1;
    char *first_text = fl_calloc(FL_MEM_MISC, 1, 65536);
    if (!first_text) {
        fprintf(stderr, "fitllm demo: %s\n", fl_last_error());
        fl_engine_free(e);
        return 1;
    }
    size_t first_len = 0;
    const double t0 = fl_clock_s();
    for (int32_t i = 0; i < n_req && !rc; i++) {
        int32_t toks[256];
        int64_t nt = 0;
        const char *text = prompts[i % N_PROMPTS];
        if (fl_engine_tokenize(e, text, strlen(text), 1, toks, 256, &nt) != FL_OK || nt < 1 || nt > 256) {
            fprintf(stderr, "fitllm demo: tokenize: %s\n", fl_last_error());
            rc = 1;
            break;
        }
        fl_request_params p = {0};
        fl_sampling_params_default(&p.sampling);
        p.sampling.temperature = temp;
        p.sampling.top_p = 0.95f;
        p.sampling.seed = (uint64_t)i + 1;
        p.prompt = toks;
        p.n_prompt = (int32_t)nt;
        p.max_tokens = max_tokens;
        int64_t id;
        if (fl_engine_add(e, &p, &id) != FL_OK) {
            fprintf(stderr, "fitllm demo: add: %s\n", fl_last_error());
            rc = 1;
        }
        if (i == 0) first_id = id;
    }
    int64_t out_tokens = 0, max_running = 0;
    double waste_sum = 0;
    int64_t n_waste = 0;
    fl_request_output ev[64];
    int32_t active = 1;
    while (!rc && active) {
        if (fl_engine_step(e, &active) != FL_OK) {
            fprintf(stderr, "fitllm demo: step: %s\n", fl_last_error());
            rc = 1;
            break;
        }
        int32_t k;
        while ((k = fl_engine_poll(e, ev, 64)) > 0)
            for (int32_t j = 0; j < k; j++) {
                out_tokens += ev[j].n_new;
                if (ev[j].request_id == first_id) {
                    size_t l = strlen(ev[j].new_text);
                    if (first_len + l < 65535) {
                        memcpy(first_text + first_len, ev[j].new_text, l);
                        first_len += l;
                    }
                }
            }
        fl_engine_stats s;
        fl_engine_stats_get(e, &s);
        if (s.n_running > max_running) max_running = s.n_running;
        if (s.kv_blocks_used) {
            waste_sum += s.kv_waste;
            n_waste++;
        }
    }
    const double dur = fl_clock_s() - t0;
    if (!rc) {
        fl_engine_stats s;
        fl_engine_stats_get(e, &s);
        double tps = (double)out_tokens / dur, waste = n_waste ? waste_sum / (double)n_waste : 0;
        if (json) {
            char mem[1024];
            fl_mem_report_json(mem, sizeof mem);
            printf("{\"model\":\"%s\",\"random_weights\":%s,\"requests\":%d,\"output_tokens\":%lld,\"seconds\":%.3f,"
                   "\"output_tokens_per_s\":%.2f,\"max_concurrent_seqs\":%lld,\"steps\":%lld,\"preemptions\":%lld,"
                   "\"kv_waste_avg\":%.4f,\"spec_draft_tokens\":%lld,\"spec_accepted_tokens\":%lld,\"memory\":%s}\n",
                   fl_engine_model_name(e), tmp[0] ? "true" : "false", n_req, (long long)out_tokens, dur, tps,
                   (long long)max_running, (long long)s.steps, (long long)s.preemptions, waste, (long long)s.spec_draft_tokens,
                   (long long)s.spec_accepted_tokens, mem);
        } else {
            printf("model %s loaded in %.2f s; %d requests, %d tokens each, up to %d at once\n",
                   fl_engine_model_name(e), t_load, n_req, max_tokens, ep.max_seqs);
            printable(first_text);
            printf("request 0: \"%s\" ->%s%s\n\n", prompts[0], first_text, tmp[0] ? "   (random weights: noise)" : "");
            printf("throughput: %lld tokens in %.2f s = %.1f tokens/s (%lld steps, max %lld sequences per step, "
                   "%lld preemptions)\n",
                   (long long)out_tokens, dur, tps, (long long)s.steps, (long long)max_running, (long long)s.preemptions);
            printf("KV cache: %lld blocks of %d tokens; average waste %.1f%% of allocated slots\n\n",
                   (long long)s.kv_blocks_total, ep.kv_block_size, 100.0 * waste);
            if (ep.spec_tokens > 0)
                printf("speculative decoding (n-gram, up to %d drafts): %lld of %lld draft tokens kept\n\n", ep.spec_tokens,
                       (long long)s.spec_accepted_tokens, (long long)s.spec_draft_tokens);
            const double mib = 1048576.0;
            printf("memory: weights %.2f MiB (%.2f MiB mapped from the file + %.2f MiB converted), KV %.2f MiB, "
                   "activations %.2f MiB, scratch %.2f MiB; peak total %.2f MiB\n\n",
                   (double)(fl_mem_peak(FL_MEM_MAPPED) + fl_mem_peak(FL_MEM_WEIGHTS)) / mib,
                   (double)fl_mem_peak(FL_MEM_MAPPED) / mib, (double)fl_mem_peak(FL_MEM_WEIGHTS) / mib,
                   (double)fl_mem_peak(FL_MEM_KV) / mib, (double)fl_mem_peak(FL_MEM_ACT) / mib,
                   (double)fl_mem_peak(FL_MEM_SCRATCH) / mib, (double)fl_mem_peak_total() / mib);
            if (plan.total)
                printf("plan: predicted %.2f MiB, measured peak %.2f MiB (%+.2f%%)%s\n\n", (double)plan.total / mib,
                       (double)fl_mem_peak_total() / mib,
                       100.0 * ((double)plan.total - (double)fl_mem_peak_total()) / (double)fl_mem_peak_total(),
                       ep.mem_total ? "; the limit is enforced by the allocator" : "");
            fl_mem_report(stdout);
        }
    }
    fl_free(FL_MEM_MISC, first_text, 65536);
    fl_engine_free(e);
    return rc;
}
