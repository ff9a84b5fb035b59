/* `fitllm chat`: a conversation with a model in the terminal (llama-cli's conversation mode).
 *
 * Each line read is a user turn.  The conversation is rendered with the chat template family the
 * GGUF declares (server/chat.c, the same text /v1/chat/completions builds), tokenized with its
 * special tokens, and sent through the engine as one request; the reply streams to stdout.  The
 * engine's prefix cache keeps the earlier turns' KV blocks, so a turn computes only what is new
 * (the last reply and the new line, from the last full block on).  When a conversation no longer
 * fits the context, its oldest turns are dropped (the system prompt stays).
 *
 * Ctrl-C stops a reply (what was written stays in the conversation); at the prompt it ends the
 * chat, as the end of input and /exit do.  /clear starts over. */
#include "cli/cli.h"
#include "core/clock.h"
#include "core/alloc.h"
#include "core/status.h"
#include "fitllm.h"
#include "plan/plan_engine.h"
#include "engine/engine.h"
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_interrupt;
static void on_sigint(int sig) {
    (void)sig;
    g_interrupt = 1;
}

/* One user turn from f into b: a line, and the lines after one that ends in a backslash (the
 * backslash becomes a newline).  0: a turn; 1: end of input with nothing read; -1: interrupted or
 * a read error; -2: out of memory. */
static int read_turn(FILE *f, srv_buf *b) {
    b->len = 0;
    if (srv_buf_append(b, "", 0)) return -2;
    bool any = false;
    for (;;) {
        errno = 0;
        const int c = fgetc(f);
        if (c == EOF) {
            if (g_interrupt || ferror(f)) return -1;
            return any ? 0 : 1;
        }
        any = true;
        if (c == '\n') {
            if (b->len > 0 && b->p[b->len - 1] == '\\') {
                b->p[b->len - 1] = '\n';
                continue;
            }
            return 0;
        }
        const char ch = (char)c;
        if (srv_buf_append(b, &ch, 1)) return -2;
    }
}

static bool add_message(cJSON *msgs, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", content)) {
        cJSON_Delete(m);
        return false;
    }
    fl_cli_json_add(msgs, NULL, m);
    return true;
}

/* Render msgs and tokenize them (BOS as the model asks, the template's markers as tokens) into
 * *ids (FL_MEM_MISC, *cap entries). */
static fl_status render_ids(fl_engine *e, const cJSON *msgs, int32_t **ids, int64_t *cap, int64_t *n) {
    srv_buf text = {.misc = true};
    const char *err = NULL;
    fl_status st = srv_chat_render(fl_engine_chat_template(e), msgs, NULL, &text, &err);
    if (st) {
        srv_buf_free(&text);
        return st == FL_ERR_NOMEM ? st : fl_set_error(st, "%s", err ? err : "cannot render the conversation");
    }
    const int flags = FL_TOKENIZE_ADD_SPECIAL | FL_TOKENIZE_PARSE_SPECIAL;
    for (;;) {
        st = fl_engine_tokenize(e, text.p ? text.p : "", text.len, flags, *ids, *cap, n);
        if (st || *n <= *cap) break;
        int32_t *q = fl_alloc(FL_MEM_MISC, (size_t)*n * sizeof(int32_t), 0);
        if (!q) {
            st = FL_ERR_NOMEM;
            break;
        }
        fl_free(FL_MEM_MISC, *ids, (size_t)*cap * sizeof(int32_t));
        *ids = q;
        *cap = *n;
    }
    srv_buf_free(&text);
    return st;
}

int fl_cli_chat_template(fl_opt *opts, const char *cmd, char **owned, size_t *owned_len, const char **out) {
    const fl_opt *a = fl_args_get(opts, "chat-template"), *f = fl_args_get(opts, "chat-template-file");
    *out = NULL;
    *owned = NULL;
    if (a->set && f->set) {
        fprintf(stderr, "fitllm %s: give --chat-template or --chat-template-file, not both\n", cmd);
        return 2;
    }
    if (!a->set && !f->set) return 0;
    const char *arg = a->str;
    if (f->set) {
        if (!(*owned = fl_cli_read_file(f->str, owned_len))) {
            fprintf(stderr, "fitllm %s: %s\n", cmd, fl_last_error());
            return 2;
        }
        arg = *owned;
    }
    bool known = false;
    *out = srv_chat_template_resolve(arg, &known);
    if (!*out) {
        fprintf(stderr, "fitllm %s: unknown chat template '%s' (chatml, llama2, llama3, phi3, deepseek3, deepseek-r1, plain, or template text)\n", cmd, arg);
        return 2;
    }
    if (!known) fprintf(stderr, "fitllm %s: the chat template is none of the families rendered; chats get a plain User:/Assistant: transcript\n", cmd);
    return 0;
}

int fl_cmd_chat(int argc, char **argv) {
    fl_opt opts[] = {
        {"model", 'm', FL_OPT_STR, "MODEL  GGUF model (required)"},
        {"system", 0, FL_OPT_STR, "TEXT  the system prompt (kept when old turns are dropped and by /clear)"},
        {"n-predict", 'n', FL_OPT_INT, "N  most tokens per reply (default: up to the context)"},
        {"ctx-size", 'c', FL_OPT_INT, "CTX  tokens of the conversation (default: the model's, at most 4096); older turns are dropped past it"},
        {"threads", 't', FL_OPT_INT, "N  threads (default: all cores)"},
        FL_CLI_SAMPLING_OPTS,
        {"seed", 's', FL_OPT_INT, "S  RNG seed (default 0); turn k (from 1) samples with seed S + k"},
        {"mem", 0, FL_OPT_BYTES, "BYTES  total memory budget, enforced (the KV pool gets what the plan leaves); default: a pool for one context"},
        {"kv-type", 0, FL_OPT_STR, "T  KV cache type: f32 f16 bf16 fp8_e4m3 fp8_e5m2 q8_0 q4_0 (default f16)"},
        {"weights", 0, FL_OPT_STR, "T  quantize weights at load: nf4 fp8 q8_0 q4_0"},
        {"lora", 0, FL_OPT_STR, "FILE  apply a LoRA adapter, unmerged (fitllm train --lora's OUT.lora.gguf or a llama.cpp adapter)"},
        {"lora-scale", 0, FL_OPT_FLOAT, "S  the adapter's scale (default 1)"},
        {"no-mmap", 0, FL_OPT_FLAG, "read the model file into memory instead of mapping it"},
        FL_CLI_CHAT_TEMPLATE_OPTS,
        FL_CLI_SPEC_OPTS,
        {"json", 0, FL_OPT_FLAG, "print one JSON object per turn instead of streaming: {turn, reply, finish_reason, prompt_tokens, cached_tokens, reply_tokens, dropped_messages}"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm chat -m MODEL [--system TEXT] [-n N] [-c CTX] [options]",
                          "Chat with MODEL in the terminal: each line you type is a user turn (end a line with \\\n"
                          "to go on on the next), rendered with the model's chat template (the GGUF's\n"
                          "tokenizer.chat_template, or --chat-template: Llama 2/3, ChatML, Phi-3, DeepSeek-R1; else a User:/Assistant:\n"
                          "transcript that stops at the next \"User:\"); the reply streams back.  The earlier turns\n"
                          "stay in the KV cache (prefix caching), so a turn computes only what is new.\n"
                          "/clear starts over, /exit (or the end of input) ends; Ctrl-C stops a reply.  Input that\n"
                          "is not a terminal is read the same way, a turn per line, and each reply ends in a newline.\n"
                          "The turns, tokens and speeds, and the memory report, go to stderr at the end.",
                          NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    const fl_opt *o_model = fl_args_get(opts, "model");
    if (!o_model->set) {
        fprintf(stderr, "fitllm chat: -m MODEL is required\n");
        return 2;
    }
    const int64_t n_predict = fl_args_get(opts, "n-predict")->set ? fl_args_get(opts, "n-predict")->i : -1;
    if (fl_args_get(opts, "n-predict")->set && n_predict < 1) {
        fprintf(stderr, "fitllm chat: -n must be >= 1\n");
        return 2;
    }
    fl_sampling_params sp;
    fl_sampling_params_default(&sp);
#define FOPT(name, field) if (fl_args_get(opts, name)->set) sp.field = (float)fl_args_get(opts, name)->f
#define IOPT(name, field) if (fl_args_get(opts, name)->set) sp.field = (int32_t)fl_args_get(opts, name)->i
    FOPT("temp", temperature);
    IOPT("top-k", top_k);
    FOPT("top-p", top_p);
    FOPT("min-p", min_p);
    FOPT("repeat-penalty", repeat_penalty);
    FOPT("frequency-penalty", frequency_penalty);
    FOPT("presence-penalty", presence_penalty);
    IOPT("repeat-last-n", penalty_last_n);
#undef FOPT
#undef IOPT
    const uint64_t seed = fl_args_get(opts, "seed")->set ? (uint64_t)fl_args_get(opts, "seed")->i : 0;
    char *tmpl_file = NULL;
    size_t tmpl_len = 0;
    const char *tmpl_text;
    if (fl_cli_chat_template(opts, "chat", &tmpl_file, &tmpl_len, &tmpl_text)) return 2;

    fl_engine_params ep;
    fl_engine_params_default(&ep);
    ep.model_path = o_model->str;
    ep.n_threads = fl_args_get(opts, "threads")->set ? (int32_t)fl_args_get(opts, "threads")->i : 0;
    ep.max_seqs = 1;
    ep.max_logprobs = -1;
    ep.guide_masks = 0;
    ep.guide_mem = 0; /* no output constraints */
    ep.kv_type = fl_args_get(opts, "kv-type")->str;
    ep.weights_type = fl_args_get(opts, "weights")->str;
    ep.no_mmap = fl_args_get(opts, "no-mmap")->set;
    if (fl_cli_spec_params(opts, "chat", &ep)) return 2;
    ep.chat_template = tmpl_text;
    const char *lora = fl_args_get(opts, "lora")->str;
    const float lora_scale = fl_args_get(opts, "lora-scale")->set ? (float)fl_args_get(opts, "lora-scale")->f : 1.0f;
    if (lora) {
        ep.lora_paths = &lora;
        ep.lora_scales = &lora_scale;
        ep.n_loras = 1;
    }
    int rc = 1;
    fl_engine *e = NULL;
    cJSON *msgs = NULL;
    srv_buf line = {.misc = true}, reply = {.misc = true};
    int32_t *ids = NULL;
    int64_t ids_cap = 0;
    struct sigaction old_sa;
    bool sa_set = false;
    fl_status st;
    {
        /* the context: -c, else the model's (at most 4096); the pool: one context's blocks (+ one
         * for a copy-on-write), unless --mem sizes it */
        fl_plan_engine_in pi;
        fl_plan_engine_out po;
        if ((st = fl_engine_plan_input(&ep, &pi)) || (st = fl_plan_engine(&pi, &po))) goto fail;
        ep.n_ctx = fl_args_get(opts, "ctx-size")->set ? (int32_t)fl_args_get(opts, "ctx-size")->i : (po.n_ctx < 4096 ? po.n_ctx : 4096);
        if (ep.n_ctx < 2) {
            fl_set_error(FL_ERR_INVALID, "context size %d: at least 2", ep.n_ctx);
            goto fail;
        }
        if (fl_args_get(opts, "mem")->set) {
            ep.mem_total = fl_args_get(opts, "mem")->i;
        } else {
            const int64_t bs = pi.kv_block > 0 ? pi.kv_block : 16;
            ep.kv_mem = (int64_t)po.kv_bytes_per_block * ((ep.n_ctx + bs - 1) / bs + 1);
        }
        if (ep.max_batch_tokens > ep.n_ctx) ep.max_batch_tokens = ep.n_ctx;
    }
    if ((st = fl_engine_new(&ep, &e))) goto fail;
    fl_mem_install_cjson_hooks();
    const int32_t n_ctx = fl_engine_n_ctx(e);
    const char *tmpl = fl_engine_chat_template(e);
    const bool plain = srv_chat_plain(tmpl);
    const char *sys = fl_args_get(opts, "system")->str;
    if (!(msgs = cJSON_CreateArray()) || (sys && !add_message(msgs, "system", sys))) goto nomem;
    const int first = sys ? 1 : 0; /* the first message a drop may take */
    const bool json = fl_args_get(opts, "json")->set;
    const bool tty = isatty(0) && isatty(1) && !json;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: a read at the prompt returns */
    sigemptyset(&sa.sa_mask);
    sa_set = sigaction(SIGINT, &sa, &old_sa) == 0;
    if (tty)
        fprintf(stderr, "fitllm chat: %s, %d tokens of context, template: %s. /clear starts over, /exit ends; Ctrl-C stops a reply.\n",
                fl_engine_model_name(e), n_ctx, plain ? "none (a User:/Assistant: transcript)" : "the model's");
    int64_t turns = 0, prompt_tok = 0, gen_tok = 0, dropped = 0;
    double t_prefill = 0, t_decode = 0;
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        g_interrupt = 0;
        const int rt = read_turn(stdin, &line);
        if (rt == -2) goto nomem;
        if (rt != 0) break;
        if (!strcmp(line.p, "/exit") || !strcmp(line.p, "/quit")) break;
        if (!strcmp(line.p, "/clear")) {
            while (cJSON_GetArraySize(msgs) > first) cJSON_DeleteItemFromArray(msgs, first);
            if (tty) fputs("(conversation cleared)\n", stderr);
            continue;
        }
        if (line.len == 0) continue;
        if (!add_message(msgs, "user", line.p)) goto nomem;
        int64_t n = 0, dropped0 = dropped;
        /* the oldest turns go until the conversation and a token of reply fit */
        for (;;) {
            if ((st = render_ids(e, msgs, &ids, &ids_cap, &n))) goto fail;
            if (n < n_ctx || cJSON_GetArraySize(msgs) <= first + 1) break;
            cJSON_DeleteItemFromArray(msgs, first);
            dropped++;
            if (cJSON_GetArraySize(msgs) > first + 1) { /* a reply goes with its question */
                cJSON_DeleteItemFromArray(msgs, first);
                dropped++;
            }
        }
        if (n >= n_ctx) {
            fprintf(stderr, "fitllm chat: this turn alone is %lld tokens, and the context holds %d; it is left out\n", (long long)n, n_ctx);
            cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
            continue;
        }
        fl_request_params rp;
        memset(&rp, 0, sizeof rp);
        rp.prompt = ids;
        rp.n_prompt = (int32_t)n;
        rp.max_tokens = (int32_t)(n_predict > 0 && n_predict < n_ctx - n ? n_predict : n_ctx - n);
        rp.sampling = sp;
        rp.sampling.seed = seed + (uint64_t)turns + 1; /* (0 would be the engine's own per-request seed) */
        if (plain) rp.stop[0] = "\nUser:";
        rp.lora = lora ? 1 : 0;
        fl_engine_stats s0;
        fl_engine_stats_get(e, &s0);
        int64_t id;
        if ((st = fl_engine_add(e, &rp, &id))) goto fail;
        reply.len = 0;
        if (srv_buf_append(&reply, "", 0)) goto nomem;
        const double t0 = fl_clock_s();
        double t1 = 0;
        int32_t active = 1;
        bool cancelled = false, failed = false;
        int64_t got = 0;
        fl_finish_reason finish = FL_FINISH_NONE;
        while (active) {
            if (g_interrupt && !cancelled) {
                fl_engine_cancel(e, id);
                cancelled = true;
            }
            if ((st = fl_engine_step(e, &active))) goto fail;
            fl_request_output ev[4];
            int32_t k;
            while ((k = fl_engine_poll(e, ev, 4)) > 0)
                for (int32_t i = 0; i < k; i++) {
                    if (ev[i].n_new > 0 && got == 0) t1 = fl_clock_s();
                    got += ev[i].n_new;
                    const size_t tl = strlen(ev[i].new_text);
                    if (!json) {
                        fwrite(ev[i].new_text, 1, tl, stdout);
                        fflush(stdout);
                    }
                    if (srv_buf_append(&reply, ev[i].new_text, tl)) goto nomem;
                    if (ev[i].finish != FL_FINISH_NONE) finish = ev[i].finish;
                    if (ev[i].finish == FL_FINISH_ERROR) {
                        fprintf(stderr, "\nfitllm chat: the reply failed: %s\n", ev[i].error ? ev[i].error : "error");
                        failed = true;
                    }
                }
        }
        const double t2 = fl_clock_s();
        if (t1 > 0) {
            t_prefill += t1 - t0;
            t_decode += t2 - t1;
        }
        fl_engine_stats s1;
        fl_engine_stats_get(e, &s1);
        if (json) {
            static const char *const why[] = {"", "stop", "length", "stop", "abort", "error"}; /* (EOS and a stop: "stop", as OpenAI) */
            const size_t fail0 = fl_mem_thread_failures();
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "turn", (double)turns + 1);
            cJSON_AddStringToObject(o, "reply", reply.p);
            _Static_assert(FL_FINISH_ERROR == 5, "why[] follows fl_finish_reason");
            cJSON_AddStringToObject(o, "finish_reason", (unsigned)finish < sizeof why / sizeof why[0] ? why[finish] : "");
            cJSON_AddNumberToObject(o, "prompt_tokens", (double)n);
            cJSON_AddNumberToObject(o, "cached_tokens", (double)(s1.prefix_hit_tokens - s0.prefix_hit_tokens));
            cJSON_AddNumberToObject(o, "reply_tokens", (double)got);
            cJSON_AddNumberToObject(o, "dropped_messages", (double)(dropped - dropped0));
            if (fl_cli_print_json(NULL, o, false, fail0)) goto nomem;
        } else {
            fputc('\n', stdout);
        }
        fflush(stdout);
        prompt_tok += s1.tokens_prefilled - s0.tokens_prefilled;
        gen_tok += got;
        turns++;
        if (failed) { /* the turn is not kept */
            cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
            continue;
        }
        if (!add_message(msgs, "assistant", reply.p)) goto nomem;
    }
    {
        fl_engine_stats s;
        fl_engine_stats_get(e, &s);
        fprintf(stderr, "%lld turns; prompt: %lld tokens computed, %lld taken from the prefix cache; reply: %lld tokens, %.1f tok/s",
                (long long)turns, (long long)prompt_tok, (long long)s.prefix_hit_tokens, (long long)gen_tok,
                gen_tok > turns && t_decode > 0 ? (double)(gen_tok - turns) / t_decode : 0.0);
        if (dropped) fprintf(stderr, "; %lld old messages dropped to fit the context", (long long)dropped);
        if (ep.spec_tokens > 0)
            fprintf(stderr, "; speculative decoding: %lld of %lld draft tokens kept", (long long)s.spec_accepted_tokens,
                    (long long)s.spec_draft_tokens);
        fprintf(stderr, " (first tokens after %.3f s on average)\n", turns ? t_prefill / (double)turns : 0.0);
        fl_mem_report(stderr);
    }
    rc = 0;
    goto done;
nomem:
    fl_set_error(FL_ERR_NOMEM, "out of memory");
fail:
    fprintf(stderr, "fitllm chat: %s\n", fl_last_error()[0] ? fl_last_error() : "failed");
done:
    if (sa_set) sigaction(SIGINT, &old_sa, NULL);
    cJSON_Delete(msgs);
    fl_free(FL_MEM_MISC, ids, (size_t)ids_cap * sizeof(int32_t));
    srv_buf_free(&line);
    srv_buf_free(&reply);
    fl_engine_free(e);
    if (tmpl_file) fl_free(FL_MEM_MISC, tmpl_file, tmpl_len + 1);
    return rc;
}
