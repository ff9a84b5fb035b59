/* `fitllm plan`: memory plan per device from a GGUF header, a config.json or a preset; --fit
 * finds the best settings under a budget; --table prints a models x weight types fit table. */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "plan/plan.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    O_MODEL, O_CONFIG, O_PRESET, O_WEIGHTS, O_KV, O_CTX, O_BATCH, O_PREFILL, O_BLOCK, O_ATTN, O_THREADS,
    O_TRAIN, O_CKPT, O_OPTIM, O_ZERO, O_TP, O_PP, O_SP, O_DP, O_OFF_LAYERS, O_OFF_KV, O_SLACK, O_FIT,
    O_MAXIMIZE, O_TABLE, O_LIST, O_JSON, O_VERIFY, O_MEM, O_MAX_LP, O_LORA, O_LORA_RANK, O_GUIDE_MEM, O_EMBD, O_SPEC, O_DRAFT, O_LORA_SLOTS, O_LORA_MAXR
};

/* Columns of the breakdown: category, label. */
static const struct { fl_mem_cat cat; const char *label, *key; } cols[] = {
    {FL_MEM_WEIGHTS, "weights", "weights"}, {FL_MEM_KV, "KV", "kv"}, {FL_MEM_ACT, "activations", "activations"},
    {FL_MEM_SCRATCH, "workspace", "workspace"}, {FL_MEM_GRAD, "grads", "grads"}, {FL_MEM_OPTIM, "optimizer", "optimizer"},
    {FL_MEM_COMM, "comm", "comm"}, {FL_MEM_MISC, "misc", "misc"},
};
#define N_COLS (sizeof cols / sizeof cols[0])

static const char *kv_name(int32_t t) { return fl_type_name(t); }

/* A training plan fitllm's trainer cannot run as given: tp, pp or sp ranks, or ZeRO-3 (it runs
 * one process, or data parallel with ZeRO 1 or 2); such a plan is the textbook split. */
static bool train_textbook(const fl_plan_input *in) {
    return in->train && (in->tp > 1 || in->pp > 1 || in->sp > 1 || in->zero_stage > 2);
}

static void print_plan(const fl_model_shape *s, const fl_plan_input *in, const fl_plan_result *r) {
    char a[32], b[32], c[32];
    fl_plan_fmt_bytes(r->weights_total, a, sizeof a);
    fl_plan_fmt_bytes(r->kv_bytes_per_token, b, sizeof b);
    printf("model:    %s (%lld layers, n_embd %lld, %lld heads / %lld KV heads x %lld, n_ff %lld, vocab %lld%s)\n", s->name,
           (long long)s->n_layer, (long long)s->n_embd, (long long)s->n_head, (long long)s->n_head_kv, (long long)s->head_dim,
           (long long)s->n_ff, (long long)s->n_vocab, s->n_expert ? ", MoE" : "");
    printf("params:   %.3f %s, weights %s (%s), KV %s per token (%s)\n", r->n_params >= 1000000000 ? (double)r->n_params / 1e9 : (double)r->n_params / 1e6, r->n_params >= 1000000000 ? "B" : "M", a,
           in->weights_from_file && s->has_weight_bytes && !in->train ? "exact, from the file" : in->weights.name, b, kv_name(in->kv_type));
    if (in->train)
        printf("training: batch %lld x %lld tokens, %s, %s, checkpoint every %lld, ZeRO-%d over %d%s%.0d%s\n", (long long)in->n_seq,
               (long long)in->n_ctx, in->weights.base == FL_TYPE_F32 ? "fp32" : "mixed precision", in->optim == FL_PLAN_OPTIM_ADAMW ? "AdamW" : "8-bit AdamW",
               (long long)in->ckpt_every, in->zero_stage, in->dp, in->lora_rank ? ", LoRA rank " : "", in->lora_rank,
               in->lora_nf4 ? " on an NF4 base (QLoRA)" : in->lora_rank ? " on a frozen f32 base" : "");
    else
        printf("serving:  ctx %lld x %lld sequences, prefill chunk %lld, %s attention, KV blocks of %lld\n", (long long)in->n_ctx,
               (long long)in->n_seq, (long long)in->n_prefill, in->attn == FL_PLAN_ATTN_FLASH ? "flash" : "naive", (long long)in->kv_block);
    printf("ranks:    tp %d x pp %d x sp %d x dp %d = %d devices\n\n", in->tp, in->pp, in->sp, in->dp, in->tp * in->pp * in->sp * in->dp);
    printf("%-12s", "device");
    for (size_t k = 0; k < N_COLS; k++) printf(" %11s", cols[k].label);
    printf(" %11s\n", "total");
    for (int32_t d = 0; d < r->n_dev; d++) {
        const fl_plan_device *dev = &r->dev[d];
        char lab[32];
        snprintf(lab, sizeof lab, r->n_dev > 1 ? "stage %d" : "each", d);
        printf("%-12s", lab);
        for (size_t k = 0; k < N_COLS; k++) {
            fl_plan_fmt_bytes(dev->bytes[cols[k].cat], c, sizeof c);
            printf(" %11s", dev->bytes[cols[k].cat] ? c : "-");
        }
        fl_plan_fmt_bytes(dev->total, c, sizeof c);
        printf(" %11s\n", c);
    }
    if (r->host_total) {
        printf("%-12s", "host");
        for (size_t k = 0; k < N_COLS; k++) {
            fl_plan_fmt_bytes(r->host[cols[k].cat], c, sizeof c);
            printf(" %11s", r->host[cols[k].cat] ? c : "-");
        }
        fl_plan_fmt_bytes(r->host_total, c, sizeof c);
        printf(" %11s\n", c);
    }
    if (train_textbook(in))
        printf("\nnote: fitllm train runs one process or data parallel with ZeRO 1 or 2; this plan's tp / pp / sp\n"
               "      ranks or ZeRO-3 are the textbook split (docs/PLANNER.md), not checked against a run\n");
}

static cJSON *plan_json(const fl_model_shape *s, const fl_plan_input *in, const fl_plan_result *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", s->name);
    cJSON *sh = cJSON_AddObjectToObject(o, "shape");
    cJSON_AddNumberToObject(sh, "n_vocab", (double)s->n_vocab);
    cJSON_AddNumberToObject(sh, "n_embd", (double)s->n_embd);
    cJSON_AddNumberToObject(sh, "n_ff", (double)s->n_ff);
    cJSON_AddNumberToObject(sh, "n_layer", (double)s->n_layer);
    cJSON_AddNumberToObject(sh, "n_head", (double)s->n_head);
    cJSON_AddNumberToObject(sh, "n_head_kv", (double)s->n_head_kv);
    cJSON_AddNumberToObject(sh, "head_dim", (double)s->head_dim);
    cJSON_AddNumberToObject(sh, "n_expert", (double)s->n_expert);
    cJSON_AddNumberToObject(sh, "n_expert_used", (double)s->n_expert_used);
    cJSON_AddNumberToObject(sh, "sliding_window", (double)s->sliding_window);
    cJSON_AddBoolToObject(sh, "tied_output", s->tied_output);
    cJSON *ij = cJSON_AddObjectToObject(o, "input");
    cJSON_AddStringToObject(ij, "weights", in->weights_from_file && s->has_weight_bytes && !in->train ? "file" : in->weights.name);
    cJSON_AddStringToObject(ij, "kv_type", kv_name(in->kv_type));
    cJSON_AddNumberToObject(ij, "ctx", (double)in->n_ctx);
    cJSON_AddNumberToObject(ij, "batch", (double)in->n_seq);
    cJSON_AddNumberToObject(ij, "prefill", (double)in->n_prefill);
    cJSON_AddNumberToObject(ij, "kv_block", (double)in->kv_block);
    cJSON_AddStringToObject(ij, "attn", in->attn == FL_PLAN_ATTN_FLASH ? "flash" : "naive");
    cJSON_AddBoolToObject(ij, "train", in->train);
    if (in->lora_rank) {
        cJSON_AddNumberToObject(ij, "lora_rank", in->lora_rank);
        cJSON_AddBoolToObject(ij, "lora_nf4", in->lora_nf4);
    }
    cJSON_AddNumberToObject(ij, "tp", in->tp);
    cJSON_AddNumberToObject(ij, "pp", in->pp);
    cJSON_AddNumberToObject(ij, "sp", in->sp);
    cJSON_AddNumberToObject(ij, "dp", in->dp);
    cJSON_AddNumberToObject(ij, "zero", in->zero_stage);
    if (in->train) cJSON_AddBoolToObject(o, "train_textbook", train_textbook(in)); /* (fitllm's trainer cannot run it) */
    cJSON_AddNumberToObject(o, "n_params", (double)r->n_params);
    cJSON_AddNumberToObject(o, "weights_total", (double)r->weights_total);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)r->kv_bytes_per_token);
    cJSON *devs = cJSON_AddArrayToObject(o, "devices");
    for (int32_t d = 0; d < r->n_dev; d++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "stage", d);
        cJSON_AddNumberToObject(e, "layer_begin", (double)r->dev[d].layer_begin);
        cJSON_AddNumberToObject(e, "layer_end", (double)r->dev[d].layer_end);
        cJSON *b = cJSON_AddObjectToObject(e, "bytes");
        for (size_t k = 0; k < N_COLS; k++) cJSON_AddNumberToObject(b, cols[k].key, (double)r->dev[d].bytes[cols[k].cat]);
        cJSON_AddNumberToObject(e, "total", (double)r->dev[d].total);
        fl_cli_json_add(devs, NULL, e);
    }
    cJSON_AddNumberToObject(o, "max_total", (double)r->max_total);
    cJSON *h = cJSON_AddObjectToObject(o, "host");
    for (size_t k = 0; k < N_COLS; k++) cJSON_AddNumberToObject(h, cols[k].key, (double)r->host[cols[k].cat]);
    cJSON_AddNumberToObject(h, "total", (double)r->host_total);
    if (!in->train) {
        const fl_plan_buffers *bf = &r->buf;
        cJSON *b = cJSON_AddObjectToObject(o, "step_buffers");
        const char *names[] = {"x", "xb", "q", "k", "v", "att", "hb", "hb2", "router", "scores", "logits", "tiles", "qact"};
        uint64_t vals[] = {bf->x, bf->xb, bf->q, bf->k, bf->v, bf->att, bf->hb, bf->hb2, bf->router, bf->scores, bf->logits, bf->tiles, bf->qact};
        for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) cJSON_AddNumberToObject(b, names[k], (double)vals[k]);
    }
    return o;
}

static size_t g_fail0; /* this thread's allocation failures when the command began */

/* Print o (indented) and delete it; 1 with a message where it could not be built whole. */
static int emit_json(cJSON *o) { return fl_cli_print_json("plan", o, true, g_fail0); }

/* --table: presets x weight types, columns 24/48/80 GiB and 8 x 80 GiB. */
static int fit_table(const fl_plan_input *base, bool json) {
    static const char *const wts[] = {"f16", "q8_0", "q4_K_M"};
    static const double caps[] = {24, 48, 80, 80};
    static const char *const cap_names[] = {"24 GB", "48 GB", "80 GB", "8 x 80 GB"};
    cJSON *rows = json ? cJSON_CreateArray() : NULL;
    if (!json) {
        printf("fit table: ctx %lld, batch %lld, KV %s (GB = GiB; fits: <= 90%% of the memory, tight: <= 100%%)\n\n",
               (long long)base->n_ctx, (long long)base->n_seq, kv_name(base->kv_type));
        printf("%-16s %-8s", "model", "weights");
        for (int c = 0; c < 4; c++) printf(" %18s", cap_names[c]);
        printf("\n");
    }
    for (int32_t p = 0; p < fl_plan_n_presets(); p++) {
        fl_model_shape s;
        if (fl_plan_preset(fl_plan_preset_name(p), &s)) return 1;
        for (size_t w = 0; w < sizeof wts / sizeof wts[0]; w++) {
            if (!json) printf("%-16s %-8s", s.name, wts[w]);
            cJSON *row = NULL;
            if (json) {
                row = cJSON_CreateObject();
                cJSON_AddStringToObject(row, "model", s.name);
                cJSON_AddStringToObject(row, "weights", wts[w]);
                fl_cli_json_add(rows, NULL, row);
            }
            for (int c = 0; c < 4; c++) {
                fl_plan_input in = *base;
                fl_plan_parse_wtype(wts[w], &in.weights);
                in.weights_from_file = false;
                if (c == 3) { /* 8 devices: tensor parallel as far as the heads allow, the rest pipeline */
                    in.tp = 8;
                    while (s.n_head % in.tp) in.tp /= 2;
                    in.pp = 8 / in.tp;
                }
                fl_plan_result r;
                const char *verdict;
                char cell[48], tot[32];
                if (fl_plan_compute(&s, &in, &r) != FL_OK) {
                    verdict = "n/a";
                    snprintf(cell, sizeof cell, "n/a");
                } else {
                    double cap = caps[c] * 1073741824.0;
                    verdict = (double)r.max_total <= 0.9 * cap ? "fits" : (double)r.max_total <= cap ? "tight" : "no";
                    fl_plan_fmt_bytes(r.max_total, tot, sizeof tot);
                    snprintf(cell, sizeof cell, "%s %s", verdict, tot);
                }
                if (json) {
                    cJSON *e = cJSON_CreateObject();
                    cJSON_AddStringToObject(e, "verdict", verdict);
                    cJSON_AddNumberToObject(e, "bytes_per_device", (double)r.max_total);
                    fl_cli_json_add(row, cap_names[c], e);
                } else {
                    printf(" %18s", cell);
                }
            }
            if (!json) printf("\n");
        }
    }
    if (json) return emit_json(rows);
    return 0;
}

int fl_cmd_plan(int argc, char **argv) {
    fl_opt opts[] = {
        [O_MODEL] = {"model", 'm', FL_OPT_STR, "MODEL  GGUF file (only the header is read)"},
        [O_CONFIG] = {"config", 0, FL_OPT_STR, "FILE  Hugging Face config.json"},
        [O_PRESET] = {"preset", 0, FL_OPT_STR, "NAME  built-in shape (--list-presets)"},
        [O_WEIGHTS] = {"weights", 0, FL_OPT_STR, "T  weight type: f32 f16 bf16 q8_0 q6_K q5_K_M q4_K_M q4_0 nf4 fp8 ... (default: the file's, else f16)"},
        [O_KV] = {"kv-type", 0, FL_OPT_STR, "T  KV cache type: f32 f16 bf16 q8_0 q4_0 fp8 (default f16)"},
        [O_CTX] = {"ctx-size", 'c', FL_OPT_INT, "CTX  tokens per sequence (default: the model's training context)"},
        [O_BATCH] = {"batch", 0, FL_OPT_INT, "B  concurrent sequences (training: batch size; default 1)"},
        [O_PREFILL] = {"prefill", 0, FL_OPT_INT, "T  prefill chunk, tokens per step (default 512)"},
        [O_BLOCK] = {"kv-block", 0, FL_OPT_INT, "N  tokens per KV block, a multiple of 16 (default 16)"},
        [O_ATTN] = {"attn", 0, FL_OPT_STR, "IMPL  flash or naive (default flash)"},
        [O_THREADS] = {"threads", 't', FL_OPT_INT, "N  threads (flash-attention tiles are per thread; default 1)"},
        [O_TRAIN] = {"train", 0, FL_OPT_FLAG, "plan training (weights f32, or bf16/f16 = mixed precision: 16-bit numerics on an extra f32 copy)"},
        [O_CKPT] = {"checkpoint-every", 0, FL_OPT_INT, "K  gradient checkpointing: keep every K-th layer input (default off)"},
        [O_OPTIM] = {"optim", 0, FL_OPT_STR, "NAME  adamw (8 B/param) or adamw8bit (2 B/param)"},
        [O_LORA_RANK] = {"lora-rank", 0, FL_OPT_INT, "R  with --train: LoRA adapters of rank R on a frozen base (train --lora R); --weights nf4 = QLoRA"},
        [O_ZERO] = {"zero", 0, FL_OPT_INT, "S  ZeRO stage 0..3 over --dp ranks"},
        [O_TP] = {"tp", 0, FL_OPT_INT, "N  tensor-parallel ranks"},
        [O_PP] = {"pp", 0, FL_OPT_INT, "N  pipeline stages"},
        [O_SP] = {"sp", 0, FL_OPT_INT, "N  sequence-parallel ranks"},
        [O_DP] = {"dp", 0, FL_OPT_INT, "N  data-parallel ranks"},
        [O_OFF_LAYERS] = {"offload-layers", 0, FL_OPT_INT, "N  run the last N layers on the host"},
        [O_OFF_KV] = {"offload-kv", 0, FL_OPT_FLAG, "keep the KV cache on the host"},
        [O_SLACK] = {"slack", 0, FL_OPT_BYTES, "BYTES  allocator slack per device (measured from the engine)"},
        [O_FIT] = {"fit", 0, FL_OPT_BYTES, "BYTES  find the best settings that fit in BYTES per device"},
        [O_MAXIMIZE] = {"maximize", 0, FL_OPT_STR, "WHAT  with --fit: ctx, batch or types (default: ctx without -c, batch without --batch, else types)"},
        [O_TABLE] = {"table", 0, FL_OPT_FLAG, "fit table: presets x weight types on 24/48/80 GB and 8 x 80 GB"},
        [O_LIST] = {"list-presets", 0, FL_OPT_FLAG, "list the built-in presets"},
        [O_JSON] = {"json", 0, FL_OPT_FLAG, "print JSON"},
        [O_VERIFY] = {"verify", 0, FL_OPT_FLAG, "with -m: run the engine (--batch seqs, --prefill step tokens, -c) and compare the plan with its measured peaks"},
        [O_MEM] = {"mem", 0, FL_OPT_BYTES, "BYTES  with --verify: size the KV cache from a total memory limit"},
        [O_GUIDE_MEM] = {"guide-mem", 0, FL_OPT_BYTES, "BYTES  with --verify: the output constraints' budget (default 16M, or --mem / 16 when less), counted as a bound"},
        [O_MAX_LP] = {"max-logprobs", 0, FL_OPT_INT, "K  with --verify: the engine's logprob alternatives (default 20; -1 none), checked by a second run"},
        [O_LORA] = {"lora", 0, FL_OPT_STR, "FILE  with --verify: the engine applies this LoRA adapter at run time (planned: its file, tables and buffers)"},
        [O_EMBD] = {"embeddings", 0, FL_OPT_FLAG, "with --verify: an engine that takes embedding requests (serve --embeddings), max_seqs of them run after the generations"},
        [O_SPEC] = {"spec-ngram", 0, FL_OPT_INT, "K  speculative decoding's draft tokens per sequence (serve --spec-ngram): a logits row each"},
        [O_DRAFT] = {"model-draft", 0, FL_OPT_STR, "FILE  serving with speculative decoding's draft model (serve --model-draft): its weights (its file's types), KV cache for the same sequences and step buffers are added to each device (one device; with --verify: the engine-exact plan and a run, --spec-ngram K drafts, default 5)"},
        [O_LORA_SLOTS] = {"lora-slots", 0, FL_OPT_INT, "N  with --verify: slots for adapters loaded at run time (serve --lora-slots), each reserving what an adapter of --max-lora-rank takes (MAPPED and MISC then bounds); with --lora, the run loads it into each"},
        [O_LORA_MAXR] = {"max-lora-rank", 0, FL_OPT_INT, "R  with --lora-slots: the largest rank they take (default 16)"},
        [O_LORA_MAXR + 1] = {0},
    };
    const char *pos[1];
    int n_pos;
    int r = fl_args_parse(argc, argv, opts,
                          "fitllm plan (-m MODEL | --config FILE | --preset NAME) [--weights T] [--kv-type T] [-c CTX] [--batch B]\n"
                          "                   [--train [--checkpoint-every K] [--optim adamw|adamw8bit] [--zero S] [--lora-rank R]] [--tp N] [--pp N] [--sp N]\n"
                          "                   [--dp N] [--fit BYTES [--maximize ctx|batch|types]] [--table] [--json]",
                          "Plan memory per device, by category (weights, KV, activations, workspace, grads, optimizer),\n"
                          "without loading any weights.  Formulas: docs/PLANNER.md.",
                          pos, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    bool json = opts[O_JSON].set;
    fl_mem_install_cjson_hooks();
    g_fail0 = fl_mem_thread_failures();
    if (opts[O_LIST].set) {
        for (int32_t i = 0; i < fl_plan_n_presets(); i++) printf("%s\n", fl_plan_preset_name(i));
        return 0;
    }
    int n_src = opts[O_MODEL].set + opts[O_CONFIG].set + opts[O_PRESET].set;
    if (n_src > 1 || (n_src == 0 && !opts[O_TABLE].set)) {
        fprintf(stderr, "fitllm plan: give exactly one of -m MODEL, --config FILE, --preset NAME (see --help)\n");
        return 2;
    }
    fl_model_shape s;
    memset(&s, 0, sizeof s);
    fl_status st = FL_OK;
    if (opts[O_MODEL].set) st = fl_plan_shape_from_gguf(opts[O_MODEL].str, &s);
    else if (opts[O_CONFIG].set) st = fl_plan_shape_from_config(opts[O_CONFIG].str, &s);
    else if (opts[O_PRESET].set) st = fl_plan_preset(opts[O_PRESET].str, &s);
    if (st) {
        fprintf(stderr, "fitllm plan: %s\n", fl_last_error());
        return 1;
    }
    fl_plan_input in;
    fl_plan_input_default(&in, n_src ? &s : NULL);
    if (!n_src) in.n_ctx = 8192;
    /* option values */
    const char *bad = NULL;
    if (opts[O_WEIGHTS].set) {
        if (fl_plan_parse_wtype(opts[O_WEIGHTS].str, &in.weights)) bad = fl_last_error();
        in.weights_from_file = false;
    }
    if (opts[O_KV].set && !bad) {
        in.kv_type = fl_type_from_name(opts[O_KV].str);
        if (in.kv_type < 0) bad = "unknown --kv-type (f32, f16, bf16, q8_0, q4_0, fp8)";
    }
    if (opts[O_ATTN].set && !bad) {
        if (!strcmp(opts[O_ATTN].str, "flash")) in.attn = FL_PLAN_ATTN_FLASH;
        else if (!strcmp(opts[O_ATTN].str, "naive")) in.attn = FL_PLAN_ATTN_NAIVE;
        else bad = "--attn must be flash or naive";
    }
    if (opts[O_OPTIM].set && !bad) {
        if (!strcmp(opts[O_OPTIM].str, "adamw")) in.optim = FL_PLAN_OPTIM_ADAMW;
        else if (!strcmp(opts[O_OPTIM].str, "adamw8bit")) in.optim = FL_PLAN_OPTIM_ADAMW8BIT;
        else bad = "--optim must be adamw or adamw8bit";
    }
    struct { int o; int64_t lo, hi; } ranges[] = {{O_CTX, 1, 1ll << 30}, {O_BATCH, 1, 1 << 20}, {O_PREFILL, 1, 1 << 24},
                                                  {O_BLOCK, 16, 1 << 16}, {O_THREADS, 1, 4096}, {O_CKPT, 0, 1 << 16},
                                                  {O_ZERO, 0, 3}, {O_TP, 1, 4096}, {O_PP, 1, 4096}, {O_SP, 1, 4096},
                                                  {O_DP, 1, 1 << 20}, {O_OFF_LAYERS, 0, 1 << 16}, {O_SPEC, 0, FL_SPEC_MAX}};
    static char msg[128];
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0] && !bad; k++)
        if (opts[ranges[k].o].set && (opts[ranges[k].o].i < ranges[k].lo || opts[ranges[k].o].i > ranges[k].hi)) {
            snprintf(msg, sizeof msg, "--%s must be in [%lld, %lld]", opts[ranges[k].o].name, (long long)ranges[k].lo, (long long)ranges[k].hi);
            bad = msg;
        }
    if (bad) {
        fprintf(stderr, "fitllm plan: %s\n", bad);
        return 2;
    }
    if (opts[O_CTX].set) in.n_ctx = opts[O_CTX].i;
    if (opts[O_BATCH].set) in.n_seq = opts[O_BATCH].i;
    if (opts[O_PREFILL].set) in.n_prefill = opts[O_PREFILL].i;
    if (opts[O_SPEC].set) in.spec_tokens = opts[O_SPEC].i;
    if (opts[O_BLOCK].set) in.kv_block = opts[O_BLOCK].i;
    if (opts[O_THREADS].set) in.n_threads = (int32_t)opts[O_THREADS].i;
    if (opts[O_CKPT].set) in.ckpt_every = opts[O_CKPT].i;
    if (opts[O_ZERO].set) in.zero_stage = (int32_t)opts[O_ZERO].i;
    if (opts[O_TP].set) in.tp = (int32_t)opts[O_TP].i;
    if (opts[O_PP].set) in.pp = (int32_t)opts[O_PP].i;
    if (opts[O_SP].set) in.sp = (int32_t)opts[O_SP].i;
    if (opts[O_DP].set) in.dp = (int32_t)opts[O_DP].i;
    if (opts[O_OFF_LAYERS].set) in.offload_layers = opts[O_OFF_LAYERS].i;
    in.offload_kv = opts[O_OFF_KV].set;
    if (opts[O_SLACK].set) in.slack_bytes = (uint64_t)opts[O_SLACK].i;
    if (opts[O_TRAIN].set) {
        in.train = true;
        if (!opts[O_WEIGHTS].set) fl_plan_parse_wtype("f32", &in.weights);
        if (!opts[O_CTX].set && in.n_ctx > 2048) in.n_ctx = 2048;
        if (opts[O_LORA_RANK].set) {
            in.lora_rank = (int32_t)opts[O_LORA_RANK].i;
            if (in.weights.base == FL_TYPE_NF4) { /* QLoRA: an NF4 base, fp32 training */
                in.lora_nf4 = true;
                fl_plan_parse_wtype("f32", &in.weights);
            }
        }
    } else if (opts[O_LORA_RANK].set) {
        fprintf(stderr, "fitllm plan: --lora-rank plans training (with --train)\n");
        return 2;
    }
    if (opts[O_TABLE].set) return fit_table(&in, json);
    if (opts[O_VERIFY].set) {
        if (!opts[O_MODEL].set) {
            fprintf(stderr, "fitllm plan: --verify needs -m MODEL\n");
            return 2;
        }
        fl_plan_verify_opts vo = {opts[O_MODEL].str, opts[O_WEIGHTS].set ? opts[O_WEIGHTS].str : NULL,
                                  opts[O_KV].set ? opts[O_KV].str : NULL, opts[O_CTX].set ? (int32_t)opts[O_CTX].i : 0,
                                  opts[O_BATCH].set ? (int32_t)opts[O_BATCH].i : 4,
                                  opts[O_PREFILL].set ? (int32_t)opts[O_PREFILL].i : 64,
                                  opts[O_BLOCK].set ? (int32_t)opts[O_BLOCK].i : 0,
                                  opts[O_THREADS].set ? (int32_t)opts[O_THREADS].i : 0, opts[O_MEM].set ? opts[O_MEM].i : 0,
                                  opts[O_MAX_LP].set ? (int32_t)opts[O_MAX_LP].i : FL_MAX_TOP_LOGPROBS,
                                  opts[O_LORA].set ? opts[O_LORA].str : NULL, opts[O_GUIDE_MEM].set ? opts[O_GUIDE_MEM].i : -1,
                                  opts[O_EMBD].set, opts[O_SPEC].set ? (int32_t)opts[O_SPEC].i : opts[O_DRAFT].set ? 5 : 0,
                                  opts[O_DRAFT].set ? opts[O_DRAFT].str : NULL,
                                  opts[O_LORA_SLOTS].set ? (int32_t)opts[O_LORA_SLOTS].i : 0,
                                  opts[O_LORA_MAXR].set ? (int32_t)opts[O_LORA_MAXR].i : 16};
        if (vo.max_logprobs < -1 || vo.max_logprobs > FL_MAX_TOP_LOGPROBS) {
            fprintf(stderr, "fitllm plan: --max-logprobs takes -1..%d\n", FL_MAX_TOP_LOGPROBS);
            return 2;
        }
        return fl_plan_verify(&vo);
    }

    cJSON *fit = NULL;
    if (opts[O_FIT].set) {
        uint64_t budget = (uint64_t)opts[O_FIT].i;
        const char *what = opts[O_MAXIMIZE].set ? opts[O_MAXIMIZE].str
                           : !opts[O_CTX].set   ? "ctx"
                           : !opts[O_BATCH].set ? "batch"
                                                : "types";
        char bud[32], line[256];
        fl_plan_fmt_bytes(budget, bud, sizeof bud);
        if (!strcmp(what, "ctx")) {
            int64_t v;
            st = fl_plan_fit_ctx(&s, &in, budget, &v);
            if (!st) {
                in.n_ctx = v;
                snprintf(line, sizeof line, "fit: in %s, the longest context at batch %lld is %lld tokens", bud, (long long)in.n_seq, (long long)v);
            }
        } else if (!strcmp(what, "batch")) {
            int64_t v;
            st = fl_plan_fit_seq(&s, &in, budget, &v);
            if (!st) {
                in.n_seq = v;
                snprintf(line, sizeof line, "fit: in %s, at most %lld sequences of %lld tokens", bud, (long long)v, (long long)in.n_ctx);
            }
        } else if (!strcmp(what, "types")) {
            fl_plan_input best;
            st = fl_plan_fit_types(&s, &in, budget, &best);
            if (!st) {
                in = best;
                snprintf(line, sizeof line, "fit: in %s, the least lossy types are weights %s and KV %s (ctx %lld, batch %lld)", bud,
                         in.weights.name, kv_name(in.kv_type), (long long)in.n_ctx, (long long)in.n_seq);
            }
        } else {
            fprintf(stderr, "fitllm plan: --maximize must be ctx, batch or types\n");
            return 2;
        }
        if (st) {
            char why[512];
            snprintf(why, sizeof why, "%s", fl_last_error());
            if (json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddBoolToObject(o, "fits", false);
                cJSON_AddStringToObject(o, "error", why);
                (void)emit_json(o); /* (the exit code says it failed either way) */
            }
            fprintf(stderr, "fitllm plan: %s\n", why);
            return st == FL_ERR_BUDGET ? 3 : 1;
        }
        if (json) {
            fit = cJSON_CreateObject();
            cJSON_AddBoolToObject(fit, "fits", true);
            cJSON_AddStringToObject(fit, "maximized", what);
            cJSON_AddNumberToObject(fit, "budget", (double)budget);
            cJSON_AddNumberToObject(fit, "ctx", (double)in.n_ctx);
            cJSON_AddNumberToObject(fit, "batch", (double)in.n_seq);
            cJSON_AddStringToObject(fit, "weights", in.weights_from_file && s.has_weight_bytes ? "file" : in.weights.name);
            cJSON_AddStringToObject(fit, "kv_type", kv_name(in.kv_type));
        } else {
            printf("%s\n\n", line);
        }
    }
    if (opts[O_DRAFT].set && (in.train || in.tp * in.pp * in.sp * in.dp > 1 || opts[O_FIT].set || opts[O_OFF_LAYERS].set || in.offload_kv)) {
        cJSON_Delete(fit);
        fprintf(stderr, "fitllm plan: --model-draft plans serving on one device (no --train, ranks, --fit or offload)\n");
        return 2;
    }
    fl_plan_result res, dres;
    st = fl_plan_compute(&s, &in, &res);
    if (!st && opts[O_DRAFT].set) { /* the draft model: its own weights and cache for the same sequences, its step buffers */
        fl_model_shape ds;
        fl_plan_input din = in;
        if (!(st = fl_plan_shape_from_gguf(opts[O_DRAFT].str, &ds))) {
            din.weights_from_file = ds.has_weight_bytes;
            din.spec_tokens = 0;
            st = fl_plan_compute(&ds, &din, &dres);
        }
        if (!st && ds.n_vocab != s.n_vocab) st = fl_set_error(FL_ERR_INVALID, "the draft model's vocabulary (%lld tokens) is not the model's (%lld)",
                                                             (long long)ds.n_vocab, (long long)s.n_vocab);
        if (!st) { /* the engine runs the models in turn: one matmul workspace, the larger */
            const uint64_t shared = res.buf.qact < dres.buf.qact ? res.buf.qact : dres.buf.qact;
            dres.dev[0].bytes[FL_MEM_SCRATCH] -= shared;
            dres.dev[0].total -= shared;
        }
        for (int c = 0; !st && c < FL_MEM_COUNT; c++) res.dev[0].bytes[c] += dres.dev[0].bytes[c];
        if (!st) {
            res.dev[0].total += dres.dev[0].total;
            res.max_total = res.dev[0].total;
        }
    }
    if (st) {
        cJSON_Delete(fit);
        fprintf(stderr, "fitllm plan: %s\n", fl_last_error());
        return 1;
    }
    if (json) {
        cJSON *o = plan_json(&s, &in, &res);
        if (fit) fl_cli_json_add(o, "fit", fit);
        if (opts[O_DRAFT].set) { /* (included in the devices above) */
            cJSON *d = cJSON_AddObjectToObject(o, "draft_model");
            cJSON_AddStringToObject(d, "path", opts[O_DRAFT].str);
            cJSON *b = cJSON_AddObjectToObject(d, "bytes");
            for (size_t k = 0; k < N_COLS; k++) cJSON_AddNumberToObject(b, cols[k].key, (double)dres.dev[0].bytes[cols[k].cat]);
            cJSON_AddNumberToObject(d, "total", (double)dres.dev[0].total);
        }
        if (emit_json(o)) return 1;
    } else {
        print_plan(&s, &in, &res);
        if (opts[O_DRAFT].set) {
            char b[32];
            fl_plan_fmt_bytes(dres.dev[0].total, b, sizeof b);
            printf("(the device's figures include the draft model %s: %s", opts[O_DRAFT].str, b);
            for (size_t k = 0; k < N_COLS; k++)
                if (dres.dev[0].bytes[cols[k].cat]) {
                    fl_plan_fmt_bytes(dres.dev[0].bytes[cols[k].cat], b, sizeof b);
                    printf(", %s %s", cols[k].label, b);
                }
            printf(")\n");
        }
    }
    return 0;
}
