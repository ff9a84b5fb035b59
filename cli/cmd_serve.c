/* `fitllm serve`: the OpenAI-compatible HTTP server over one engine. */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/status.h"
#include "fitllm.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

int fl_cli_spec_params(fl_opt *opts, const char *cmd, fl_engine_params *ep) {
    const fl_opt *k = fl_args_get(opts, "spec-ngram"), *lo = fl_args_get(opts, "spec-ngram-min"), *hi = fl_args_get(opts, "spec-ngram-max");
    const fl_opt *db = fl_args_get(opts, "spec-disable-by-batch-size");
    const fl_opt *md = fl_args_get(opts, "model-draft"), *dm = fl_args_get(opts, "draft-max");
    if (md->set && (k->set || lo->set || hi->set)) {
        fprintf(stderr, "fitllm %s: --model-draft drafts with a model; --spec-ngram with n-grams: give one\n", cmd);
        return 2;
    }
    if (dm->set && (!md->set || dm->i < 1 || dm->i > FL_SPEC_MAX)) {
        fprintf(stderr, "fitllm %s: --draft-max takes 1..%d, with --model-draft FILE\n", cmd, FL_SPEC_MAX);
        return 2;
    }
    const fl_opt *pm = fl_args_get(opts, "draft-p-min");
    if (pm->set && (!md->set || !(pm->f >= 0 && pm->f <= 1))) {
        fprintf(stderr, "fitllm %s: --draft-p-min takes 0..1, with --model-draft FILE\n", cmd);
        return 2;
    }
    if (pm->set) ep->spec_draft_p_min = (float)pm->f;
    if (md->set) {
        ep->spec_draft_model = md->str;
        ep->spec_tokens = dm->set ? (int32_t)dm->i : 5;
    }
    if (db->set && (db->i < 0 || db->i > INT32_MAX || !((k->set && k->i > 0) || md->set))) {
        fprintf(stderr, "fitllm %s: --spec-disable-by-batch-size takes N >= 0, with --spec-ngram K or --model-draft FILE\n", cmd);
        return 2;
    }
    if (db->set) ep->spec_disable_batch = (int32_t)db->i;
    if (k->set && (k->i < 0 || k->i > FL_SPEC_MAX)) {
        fprintf(stderr, "fitllm %s: --spec-ngram %lld: draft tokens must be 0..%d\n", cmd, (long long)k->i, FL_SPEC_MAX);
        return 2;
    }
    if ((lo->set && (lo->i < 1 || lo->i > FL_SPEC_MAX)) || (hi->set && (hi->i < 1 || hi->i > FL_SPEC_MAX)) ||
        (lo->set && hi->set && lo->i > hi->i)) {
        fprintf(stderr, "fitllm %s: --spec-ngram-min / --spec-ngram-max must be 1..%d, the min not above the max\n", cmd, FL_SPEC_MAX);
        return 2;
    }
    if ((lo->set || hi->set) && !(k->set && k->i > 0)) {
        fprintf(stderr, "fitllm %s: --spec-ngram-min / --spec-ngram-max need --spec-ngram K\n", cmd);
        return 2;
    }
    if (k->set) ep->spec_tokens = (int32_t)k->i;
    if (lo->set) ep->spec_ngram_min = (int32_t)lo->i;
    if (hi->set) ep->spec_ngram_max = (int32_t)hi->i;
    return 0;
}

int fl_cmd_serve(int argc, char **argv) {
    fl_opt opts[] = {
        {"model", 'm', FL_OPT_STR, "MODEL  GGUF model to serve (required)"},
        {"host", 0, FL_OPT_STR, "ADDR  IPv4 address to bind (default 127.0.0.1)"},
        {"port", 0, FL_OPT_INT, "PORT  TCP port (default 8080; 0 = any free port)"},
        {"mem", 0, FL_OPT_BYTES, "BYTES  total memory budget; the KV pool is sized from the plan"},
        {"kv-mem", 0, FL_OPT_BYTES, "BYTES  KV pool size (e.g. 256M)"},
        {"ctx-size", 'c', FL_OPT_INT, "CTX  max tokens per sequence (default: the model's)"},
        {"threads", 't', FL_OPT_INT, "N  compute threads (default: all cores)"},
        {"max-seqs", 0, FL_OPT_INT, "N  concurrent sequences (default 16)"},
        {"max-batch-tokens", 0, FL_OPT_INT, "N  token budget per engine step (default 512)"},
        {"kv-type", 0, FL_OPT_STR, "T  KV cache type: f32 f16 bf16 fp8_e4m3 fp8_e5m2 q8_0 q4_0 (default f16)"},
        {"block-size", 0, FL_OPT_INT, "N  tokens per KV block (default 16)"},
        {"weights", 0, FL_OPT_STR, "T  quantize weights at load: nf4 fp8 q8_0 q4_0"},
        {"prefix-cache", 0, FL_OPT_STR, "on|off  automatic prefix caching (default on)"},
        {"api-key", 0, FL_OPT_STR, "KEY  require 'Authorization: Bearer KEY' (or Anthropic's 'x-api-key: KEY')"},
        {"ssl-key-file", 0, FL_OPT_STR, "FILE  serve HTTPS with this PEM private key (llama-server's name; vLLM's --ssl-keyfile), with --ssl-cert-file"},
        {"ssl-cert-file", 0, FL_OPT_STR, "FILE  the key's PEM certificate (chain) for HTTPS (vLLM's --ssl-certfile)"},
        {"max-queue", 0, FL_OPT_INT, "N  waiting requests before answering 503 (default 256)"},
        {"max-connections", 0, FL_OPT_INT, "N  concurrent HTTP connections (default 256)"},
        {"max-body", 0, FL_OPT_BYTES, "BYTES  largest request body (default 1M)"},
        {"max-tokens-limit", 0, FL_OPT_INT, "N  largest max_tokens accepted (default 4096)"},
        {"alias", 0, FL_OPT_STR, "NAME  model name reported by the API (default: file name)"},
        {"no-mmap", 0, FL_OPT_FLAG, "read the model file into memory (huge pages where the kernel grants them) instead of mapping it"},
        {"no-repack", 0, FL_OPT_FLAG, "keep the weights as in the file (by default Q4_0 / Q8_0 matrices are rewritten in place in groups of 8 rows for the kernels, and on AVX-512 without AMX Q4_K / Q5_K / Q6_K / Q3_K / Q2_K / Q4_1 / Q5_0 / Q5_1 / IQ4_NL in groups of 16)"},
        {"lora", 0, FL_OPT_STR, "FILE[,FILE...]  up to 16 LoRA adapters applied to every request at --lora-scale, unmerged (fitllm train --lora's OUT.lora.gguf or llama.cpp adapters; F32/F16/BF16); a request's \"lora\": [{id, scale}] mixes them its own way, POST /lora-adapters sets the scales, GET /lora-adapters lists them (llama.cpp's)"},
        {"lora-init-without-apply", 0, FL_OPT_FLAG, "with --lora: load the adapters at scale 0 (applied only where a request's \"lora\" or POST /lora-adapters asks)"},
        {"lora-modules", 0, FL_OPT_STR, "NAME=FILE[,NAME=FILE...]  up to 16 LoRA adapters over one base (vLLM's): a request whose \"model\" is NAME runs with it, others with none; listed by /v1/models"},
        {"lora-scale", 0, FL_OPT_FLOAT, "S  the adapters' scale (default 1)"},
        {"lora-slots", 0, FL_OPT_INT, "N  slots for adapters loaded at run time by POST /v1/load_lora_adapter {lora_name, lora_path} (vLLM's; /v1/unload_lora_adapter frees one): each reserves, in the plan, what an adapter of --max-lora-rank takes (default 0)"},
        {"max-lora-rank", 0, FL_OPT_INT, "R  with --lora-slots: the largest rank they take (vLLM's; default 16)"},
        {"scheduling-policy", 0, FL_OPT_STR, "fcfs|priority  order of admission and preemption (default fcfs); priority: by each request's 'priority', lower first, then arrival; a waiting request preempts running ones of lower priority"},
        {"guide-masks", 0, FL_OPT_INT, "N  token masks kept for guided_regex and grammar states, shared by requests with the same pattern or grammar (default 256; 0: every mask computed but a grammar's last, reused for the same state); each vocabulary/8 bytes, in the plan"},
        {"net-mem", 0, FL_OPT_BYTES, "BYTES  memory for the server's buffers (request bodies, replies, their JSON), in the plan and enforced: a request that does not fit gets 503 (default with --mem: --mem / 16, at most 64M; without: no budget)"},
        {"guide-mem", 0, FL_OPT_BYTES, "BYTES  memory for the output constraints of all queued and running requests (grammars, regexes, JSON schemas and their states, allowed_token_ids, bad_words), in the plan and enforced: a request that does not fit gets 503 while others hold it, 400 when it alone needs more (default 16M, or --mem / 16 when less; 0: constraints refused)"},
        {"embeddings", 0, FL_OPT_FLAG, "serve POST /v1/embeddings: each input's final hidden states (after the output norm) pooled (--pooling), L2-normalized; the plan counts their buffers"},
        {"pooling", 0, FL_OPT_STR, "mean|last  how /v1/embeddings pools a prompt's states (default mean; llama.cpp's --pooling)"},
        {"reasoning-format", 0, FL_OPT_STR, "none|deepseek  chat: deepseek (default, llama.cpp's): an output's <think>...</think> (or, where the template opens the thinking as DeepSeek-R1's does, all before </think>) goes to message.reasoning_content; none: all of it is content (a request's reasoning_format overrides)"},
        {"spm-infill", 0, FL_OPT_FLAG, "/infill lays the prompt out suffix first, then the prefix (llama.cpp's --spm-infill; default: prefix first)"},
        {"responses-mem", 0, FL_OPT_BYTES, "BYTES  /v1/responses: the most bytes of stored responses, for previous_response_id and GET /v1/responses/{id} (default 16M, 0 keeps none); the least recently used go first; counted in the server's buffers (with --net-mem, at most a quarter of it)"},
        {"regex-pcre2", 0, FL_OPT_FLAG, "guided_regex always on PCRE2's matcher (by default a pattern of the common subset runs as a grammar: masks kept by canonical state, byte tokens offered)"},
        FL_CLI_CHAT_TEMPLATE_OPTS,
        FL_CLI_SPEC_OPTS,
        {"max-logprobs", 0, FL_OPT_INT, "K  most logprob alternatives a request may ask (default 20; -1: none); the plan reserves 8 x (1 + K) + 4 bytes per context token per sequence"},
        {0},
    };
    const char *pos[1];
    int n_pos;
    int r = fl_args_parse(argc, argv, opts,
                          "fitllm serve -m MODEL [--host 127.0.0.1] [--port 8080] [--mem BYTES | --kv-mem BYTES] [options]",
                          "Serve MODEL over an OpenAI-compatible HTTP API: POST /v1/completions,\n"
                          "POST /v1/chat/completions (streaming with \"stream\": true), GET /v1/models,\n"
                          "POST /v1/responses (OpenAI's Responses API: input items, previous_response_id,\n"
                          "typed stream events; GET/DELETE /v1/responses/{id}, .../input_items),\n"
                          "POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API),\n"
                          "POST /tokenize and /detokenize (vLLM's and llama.cpp's fields), GET /health,\n"
                          "GET /metrics (Prometheus), GET/POST /lora-adapters (llama.cpp's: the adapters'\n"
                          "scales for requests that name none), POST /v1/load_lora_adapter and\n"
                          "/v1/unload_lora_adapter (vLLM's, with --lora-slots). SIGINT/SIGTERM stop it gracefully.\n"
                          "Request fields: model, prompt (text or token ids, or a list of up to 16) or messages,\n"
                          "max_tokens, temperature, top_p, top_k, min_p, n, seed,\n"
                          "presence/frequency/repetition_penalty,\n"
                          "stop, include_stop_str_in_output, stop_token_ids, min_tokens, allowed_token_ids, bad_words,\n"
                          "ignore_eos, "
                          "logit_bias, priority, cache_salt,\n"
                          "truncate_prompt_tokens, stream,\n"
                          "stream_options.include_usage;\n"
                          "response_format text, json_object (one JSON object, sampled only among the\n"
                          "tokens that keep it valid) or json_schema (one value of the schema; also\n"
                          "guided_json and json_schema fields; docs/SERVER.md lists the keywords);\n"
                          "guided_choice: the output is exactly one of these texts;\n"
                          "guided_regex: the whole output is one match of this PCRE2 pattern;\n"
                          "grammar / guided_grammar: the whole output is one sentence of this GBNF grammar\n"
                          "(grammar_lazy with grammar_triggers: from the first trigger on, llama.cpp's);\n"
                          "structured_outputs {json, regex, choice, grammar, json_object}: vLLM's form of these;\n"
                          "structural_tag {structures: [{begin, schema, end}], triggers} (vLLM's): free text,\n"
                          "a structure at each trigger;\n"
                          "tools, tool_choice (none, auto, required or a named function), parallel_tool_calls\n"
                          "on chat: the tools shown in the prompt, calls read back as message.tool_calls\n"
                          "(required and a named function constrain the output to the tools' schemas, auto a call\n"
                          "once one starts);\n"
                          "reasoning_format (none, deepseek, auto) on chat: <think>...</think> as reasoning_content;\n"
                          "logprobs: an integer 0-20 on /v1/completions (that\n"
                          "many alternatives per token), true with top_logprobs 0-20 on chat, the model's\n"
                          "raw distribution before penalties and temperature.  /v1/completions also takes\n"
                          "echo: the prompt leads the text and, with logprobs, each prompt token is scored\n"
                          "(max_tokens 0: the prompt alone), as lm-evaluation-harness asks; such prompts\n"
                          "skip the prefix cache.  prompt_logprobs: 0-20 (vLLM's, not streamed): each prompt\n"
                          "token's logprob and rank and that many alternatives.\n"
                          "POST /completion takes llama.cpp's own fields (n_predict, repeat_penalty, n_probs,\n"
                          "logit_bias pairs, return_tokens, ...) and answers in its shape (docs/SERVER.md);\n"
                          "POST /infill (code models' fill-in-the-middle: input_prefix, input_suffix,\n"
                          "input_extra, prompt) the same, its prompt laid out with the model's FIM tokens.\n"
                          "Both also take llama.cpp's lora ([{id, scale}]: this request's adapter scales;\n"
                          "the OpenAI endpoints too) and speculative.n_max / n_min / p_min (its drafts).",
                          pos, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    if (!fl_args_get(opts, "model")->set) {
        fprintf(stderr, "fitllm serve: -m MODEL is required (see --help)\n");
        return 2;
    }
    const char *pc = fl_args_get(opts, "prefix-cache")->str;
    if (pc && strcmp(pc, "on") && strcmp(pc, "off")) {
        fprintf(stderr, "fitllm serve: --prefix-cache takes on or off\n");
        return 2;
    }
    const char *policy = fl_args_get(opts, "scheduling-policy")->str;
    if (policy && strcmp(policy, "fcfs") && strcmp(policy, "priority")) {
        fprintf(stderr, "fitllm serve: --scheduling-policy takes fcfs or priority\n");
        return 2;
    }
    fl_engine_params ep;
    fl_engine_params_default(&ep);
    if (policy) ep.sched_policy = strcmp(policy, "priority") ? FL_SCHED_FCFS : FL_SCHED_PRIORITY;
    ep.model_path = fl_args_get(opts, "model")->str;
    if (fl_args_get(opts, "threads")->set) ep.n_threads = (int32_t)fl_args_get(opts, "threads")->i;
    if (fl_args_get(opts, "ctx-size")->set) ep.n_ctx = (int32_t)fl_args_get(opts, "ctx-size")->i;
    if (fl_args_get(opts, "max-seqs")->set) ep.max_seqs = (int32_t)fl_args_get(opts, "max-seqs")->i;
    if (fl_args_get(opts, "max-batch-tokens")->set) ep.max_batch_tokens = (int32_t)fl_args_get(opts, "max-batch-tokens")->i;
    if (fl_args_get(opts, "kv-mem")->set) ep.kv_mem = fl_args_get(opts, "kv-mem")->i;
    if (fl_args_get(opts, "mem")->set) ep.mem_total = fl_args_get(opts, "mem")->i;
    if (fl_args_get(opts, "guide-mem")->set) ep.guide_mem = fl_args_get(opts, "guide-mem")->i;
    if (fl_args_get(opts, "net-mem")->set) ep.net_mem = fl_args_get(opts, "net-mem")->i;
    else if (ep.mem_total > 0) ep.net_mem = ep.mem_total / 16 < ((int64_t)64 << 20) ? ep.mem_total / 16 : (int64_t)64 << 20;
    if (ep.net_mem > 0 && ep.net_mem < ((int64_t)64 << 10)) {
        fprintf(stderr, "fitllm serve: --net-mem %lld is below 64 KiB, too little for one request\n", (long long)ep.net_mem);
        return 2;
    }
    if (fl_args_get(opts, "kv-type")->set) ep.kv_type = fl_args_get(opts, "kv-type")->str;
    if (fl_args_get(opts, "block-size")->set) ep.kv_block_size = (int32_t)fl_args_get(opts, "block-size")->i;
    if (fl_args_get(opts, "weights")->set) ep.weights_type = fl_args_get(opts, "weights")->str;
    ep.no_mmap = fl_args_get(opts, "no-mmap")->set;
    ep.no_repack = fl_args_get(opts, "no-repack")->set;
    if (fl_cli_spec_params(opts, "serve", &ep)) return 2;
    /* adapters: --lora (every request, by default) or --lora-modules (by name); the names and
     * paths point into one copy of the option's text */
    char mods[4096];
    const char *lora_paths[16], *lora_names[16];
    float lora_scales[16], server_scales[16];
    const float scale = fl_args_get(opts, "lora-scale")->set ? (float)fl_args_get(opts, "lora-scale")->f : 1.0f;
    const bool no_apply = fl_args_get(opts, "lora-init-without-apply")->set;
    int32_t n_lora = 0, n_names = 0;
    const char *one = fl_args_get(opts, "lora")->str, *lm = fl_args_get(opts, "lora-modules")->str;
    if (one && lm) {
        fprintf(stderr, "fitllm serve: --lora and --lora-modules do not go together\n");
        return 2;
    }
    if (no_apply && !one) {
        fprintf(stderr, "fitllm serve: --lora-init-without-apply needs --lora\n");
        return 2;
    }
    if ((one ? one : lm) && strlen(one ? one : lm) >= sizeof mods) {
        fprintf(stderr, "fitllm serve: --%s is too long\n", one ? "lora" : "lora-modules");
        return 2;
    }
    if (one || lm) strcpy(mods, one ? one : lm);
    for (char *save = NULL, *tok = (one || lm) ? strtok_r(mods, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = lm ? strchr(tok, '=') : NULL;
        if (n_lora == 16 || (lm && (!eq || eq == tok || !eq[1]))) {
            fprintf(stderr, one ? "fitllm serve: --lora takes up to 16 files, comma-separated ('%s')\n"
                                : "fitllm serve: --lora-modules takes up to 16 NAME=FILE, comma-separated ('%s')\n", tok);
            return 2;
        }
        if (eq) {
            *eq = 0;
            lora_names[n_names++] = tok;
        }
        lora_scales[n_lora] = scale;
        server_scales[n_lora] = one && !no_apply ? scale : 0.0f; /* (modules: only where named) */
        lora_paths[n_lora++] = eq ? eq + 1 : tok;
    }
    if (fl_args_get(opts, "lora-slots")->set) {
        const int64_t ls = fl_args_get(opts, "lora-slots")->i, lr = fl_args_get(opts, "max-lora-rank")->set ? fl_args_get(opts, "max-lora-rank")->i : 16;
        if (ls < 0 || ls + n_lora > 16 || lr < 1 || lr > 4096) {
            fprintf(stderr, "fitllm serve: --lora-slots takes 0..%d (16 adapters in all), --max-lora-rank 1..4096\n", 16 - n_lora);
            return 2;
        }
        ep.lora_slots = (int32_t)ls;
        ep.max_lora_rank = (int32_t)lr;
    } else if (fl_args_get(opts, "max-lora-rank")->set) {
        fprintf(stderr, "fitllm serve: --max-lora-rank needs --lora-slots\n");
        return 2;
    }
    ep.lora_paths = n_lora ? lora_paths : NULL;
    ep.lora_scales = lora_scales;
    ep.n_loras = n_lora;
    if (fl_args_get(opts, "max-logprobs")->set) ep.max_logprobs = (int32_t)fl_args_get(opts, "max-logprobs")->i;
    if (fl_args_get(opts, "guide-masks")->set) {
        const int64_t gm = fl_args_get(opts, "guide-masks")->i;
        if (gm < 0 || gm > (1 << 20)) {
            fprintf(stderr, "fitllm serve: --guide-masks takes 0..%d\n", 1 << 20);
            return 2;
        }
        ep.guide_masks = (int32_t)gm;
    }
    ep.regex_pcre2 = fl_args_get(opts, "regex-pcre2")->set;
    ep.embeddings = fl_args_get(opts, "embeddings")->set;
    const char *pool = fl_args_get(opts, "pooling")->set ? fl_args_get(opts, "pooling")->str : "mean";
    if (strcmp(pool, "mean") && strcmp(pool, "last")) {
        fprintf(stderr, "fitllm serve: --pooling takes mean or last (got '%s')\n", pool);
        return 2;
    }
    if (fl_args_get(opts, "pooling")->set && !ep.embeddings) {
        fprintf(stderr, "fitllm serve: --pooling needs --embeddings\n");
        return 2;
    }
    if (pc) ep.prefix_cache = !strcmp(pc, "on");

    fl_server_params sp;
    fl_server_params_default(&sp);
    if (fl_args_get(opts, "host")->set) sp.host = fl_args_get(opts, "host")->str;
    if (fl_args_get(opts, "port")->set) sp.port = (int32_t)fl_args_get(opts, "port")->i;
    if (sp.port < 0 || sp.port > 65535) {
        fprintf(stderr, "fitllm serve: --port must be in 0..65535\n");
        return 2;
    }
    sp.api_key = fl_args_get(opts, "api-key")->str;
    sp.ssl_key_file = fl_args_get(opts, "ssl-key-file")->str;
    sp.ssl_cert_file = fl_args_get(opts, "ssl-cert-file")->str;
    if (!sp.ssl_key_file != !sp.ssl_cert_file) { /* (said before the model loads) */
        fprintf(stderr, "fitllm serve: HTTPS needs both --ssl-key-file and --ssl-cert-file\n");
        return 2;
    }
    for (int k = 0; k < 2; k++) {
        const char *f = k ? sp.ssl_cert_file : sp.ssl_key_file;
        FILE *fp = f ? fopen(f, "rb") : NULL;
        if (f && !fp) {
            fprintf(stderr, "fitllm serve: cannot read %s '%s': %s\n", k ? "--ssl-cert-file" : "--ssl-key-file", f, strerror(errno));
            return 2;
        }
        if (fp) fclose(fp);
    }
    if (fl_args_get(opts, "max-queue")->set) sp.max_queue = (int32_t)fl_args_get(opts, "max-queue")->i;
    if (fl_args_get(opts, "max-connections")->set) sp.max_connections = (int32_t)fl_args_get(opts, "max-connections")->i;
    if (fl_args_get(opts, "max-body")->set) sp.max_body_bytes = fl_args_get(opts, "max-body")->i;
    if (fl_args_get(opts, "max-tokens-limit")->set) sp.max_tokens_limit = (int32_t)fl_args_get(opts, "max-tokens-limit")->i;
    sp.model_name = fl_args_get(opts, "alias")->str;
    sp.lora_names = lora_names;
    sp.n_lora_names = n_names;
    sp.lora_scales = server_scales;
    sp.lora_paths = lora_paths;
    sp.pooling = !strcmp(pool, "last") ? FL_POOLING_LAST : FL_POOLING_MEAN;
    sp.spm_infill = fl_args_get(opts, "spm-infill")->set;
    if (fl_args_get(opts, "responses-mem")->set) sp.responses_mem = fl_args_get(opts, "responses-mem")->i;
    if (fl_args_get(opts, "reasoning-format")->set) {
        const char *rf = fl_args_get(opts, "reasoning-format")->str;
        if (strcmp(rf, "none") && strcmp(rf, "deepseek")) {
            fprintf(stderr, "fitllm serve: --reasoning-format takes none or deepseek (got '%s')\n", rf);
            return 2;
        }
        sp.reasoning_format = !strcmp(rf, "deepseek");
    }

    /* Block the stop signals in every thread created from here on; main waits for them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    char *tmpl_file = NULL;
    size_t tmpl_len = 0;
    if (fl_cli_chat_template(opts, "serve", &tmpl_file, &tmpl_len, &ep.chat_template)) return 2;
    fl_engine *e;
    const fl_status est = fl_engine_new(&ep, &e);
    if (tmpl_file) fl_free(FL_MEM_MISC, tmpl_file, tmpl_len + 1); /* (the engine keeps a copy) */
    if (est != FL_OK) {
        fprintf(stderr, "fitllm serve: %s\n", fl_last_error());
        return 1;
    }
    fl_server *s;
    if (fl_server_start(e, &sp, &s) != FL_OK) {
        fprintf(stderr, "fitllm serve: %s\n", fl_last_error());
        fl_engine_free(e);
        return 1;
    }
    fprintf(stderr, "fitllm serve: listening on %s://%s:%d (model %s, ctx %d)\n", sp.ssl_key_file ? "https" : "http", sp.host, fl_server_port(s),
            fl_engine_model_name(e), fl_engine_n_ctx(e));
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "fitllm serve: %s received, finishing in-flight requests\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    fl_server_stop(s, 5000);
    fl_engine_free(e);
    fprintf(stderr, "fitllm serve: stopped\n");
    return 0;
}
