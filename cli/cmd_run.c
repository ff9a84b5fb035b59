/* `fitllm run`: generate text from a prompt with one model, a KV cache (paged by default,
 * cli_kv.h) and a sampler.  --context-shift: when the context is full, keep the first S "sink"
 * positions and the most recent half of the rest (StreamingLLM; the paged cache re-rotates the
 * moved keys with RoPE, fl_kv_seq_stream) and go on generating. */
#include "cli/cli.h"
#include "core/clock.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "core/utf8.h"
#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/sampling.h"
#include "cli/cli_kv.h"
#include "core/dtype.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "dist/dist.h"
#include "dist/tp.h"
#include "kv/kv_cache.h"
#include "kernels/ops.h"
#include "kv/kv_contig.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* The CLI's JSON reports (cli.h): printed only where built whole. */
int fl_cli_print_json(const char *cmd, cJSON *o, bool pretty, size_t fail0) {
    char *s = o && fl_mem_thread_failures() == fail0 ? (pretty ? cJSON_Print(o) : cJSON_PrintUnformatted(o)) : NULL;
    cJSON_Delete(o);
    if (!s) {
        fl_set_error(FL_ERR_NOMEM, "out of memory while building the JSON report; nothing printed");
        if (cmd) fprintf(stderr, "fitllm %s: %s\n", cmd, fl_last_error());
        return 1;
    }
    /* generated text can hold any bytes: every ill-formed UTF-8 byte becomes U+FFFD */
    const size_t n = strlen(s);
    const bool valid = fl_utf8_is_valid(s, n);
    char *u = valid ? NULL : fl_alloc(FL_MEM_MISC, 3 * n + 1, 16);
    if (!valid && !u) {
        cJSON_free(s);
        fl_set_error(FL_ERR_NOMEM, "out of memory while printing the JSON report; nothing printed");
        if (cmd) fprintf(stderr, "fitllm %s: %s\n", cmd, fl_last_error());
        return 1;
    }
    if (u) {
        fwrite(u, 1, fl_utf8_sanitize(s, n, u), stdout);
        putchar('\n');
        fl_free(FL_MEM_MISC, u, 3 * n + 1);
    } else {
        puts(s);
    }
    cJSON_free(s);
    return 0;
}

void fl_cli_json_add(cJSON *o, const char *key, cJSON *item) {
    if (!item) return;
    if (!(o && (key ? cJSON_AddItemToObject(o, key, item) : cJSON_AddItemToArray(o, item)))) cJSON_Delete(item);
}

int fl_cli_print_json_with_memory(const char *cmd, cJSON *o, size_t fail0) {
    char mem[1024];
    fl_mem_report_json(mem, sizeof mem);
    fl_cli_json_add(o, "memory", cJSON_Parse(mem)); /* (a failed parse counts as a failure) */
    return fl_cli_print_json(cmd, o, false, fail0);
}

bool fl_cli_overwrites_input(const char *cmd, const char *out, int n, const char *const inputs[], const char *const what[]) {
    struct stat so;
    if (!out || stat(out, &so) != 0) return false; /* a new file replaces nothing */
    for (int i = 0; i < n; i++) {
        struct stat si;
        if (!inputs[i] || stat(inputs[i], &si) != 0) continue;
        if (si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
            fprintf(stderr, "fitllm %s: %s is the %s (%s); write the output elsewhere\n", cmd, out, what[i], inputs[i]);
            return true;
        }
    }
    return false;
}

/* Read a whole file into a FL_MEM_MISC buffer (NUL-terminated); *len excludes the NUL. */
char *fl_cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fl_set_error(FL_ERR_IO, "cannot open %s", path);
        return NULL;
    }
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            size_t ncap = cap ? cap * 2 : 131072;
            char *nb = fl_realloc(FL_MEM_MISC, buf, cap, ncap, 16);
            if (!nb) break;
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fl_free(FL_MEM_MISC, buf, cap);
        fl_set_error(FL_ERR_IO, "cannot read %s", path);
        return NULL;
    }
    /* shrink to exactly n + 1 so the caller frees with len + 1 */
    char *fit = fl_realloc(FL_MEM_MISC, buf, cap, n + 1, 16);
    if (!fit) {
        fl_free(FL_MEM_MISC, buf, cap);
        return NULL;
    }
    fit[n] = 0;
    *len = n;
    return fit;
}

void fl_cli_lora_params(fl_opt *opts, const char **path, float *scale, fl_model_params *mp) {
    *path = fl_args_get(opts, "lora")->str;
    *scale = fl_args_get(opts, "lora-scale")->set ? (float)fl_args_get(opts, "lora-scale")->f : 1.0f;
    if (*path) {
        mp->lora_paths = path;
        mp->lora_scales = scale;
        mp->n_loras = mp->lora_default = 1;
    }
}

/* Tokenize text with BOS; the ids are a FL_MEM_MISC array of *n (+1 spare) entries. */
fl_status fl_cli_tokenize(const struct fl_tokenizer *tok, const char *text, size_t len, int32_t **ids, int64_t *n) {
    int64_t cap = (int64_t)len + 8, need = 0;
    *ids = fl_alloc(FL_MEM_MISC, (size_t)cap * sizeof(int32_t), 16);
    if (!*ids) return FL_ERR_NOMEM;
    fl_status st = fl_tokenize(tok, text, len, true, false, *ids, cap, &need);
    if (st == FL_OK && need > cap) { /* more ids than bytes (a vocabulary without byte tokens, say): once more at its size */
        fl_free(FL_MEM_MISC, *ids, (size_t)cap * sizeof(int32_t));
        cap = need;
        if (!(*ids = fl_alloc(FL_MEM_MISC, (size_t)cap * sizeof(int32_t), 16))) return FL_ERR_NOMEM;
        st = fl_tokenize(tok, text, len, true, false, *ids, cap, &need);
        if (st == FL_OK && need > cap) st = fl_set_error(FL_ERR_INTERNAL, "the tokenizer asked for %lld ids, then for more", (long long)cap);
    }
    if (st) {
        fl_free(FL_MEM_MISC, *ids, (size_t)cap * sizeof(int32_t));
        *ids = NULL;
        return st;
    }
    /* keep the allocation size recoverable: shrink to need + 1 */
    int32_t *fit = fl_realloc(FL_MEM_MISC, *ids, (size_t)cap * sizeof(int32_t), (size_t)(need + 1) * sizeof(int32_t), 16);
    if (!fit) {
        fl_free(FL_MEM_MISC, *ids, (size_t)cap * sizeof(int32_t));
        *ids = NULL;
        return FL_ERR_NOMEM;
    }
    *ids = fit;
    *n = need;
    return FL_OK;
}

static int32_t run_piece(void *ctx, int32_t t, char *buf, int32_t cap) { return fl_token_to_piece(ctx, t, buf, cap, false); }

/* --grammar: masked := logits with every token that cannot continue the grammar at -inf
 * (end-of-generation only where the text is a sentence); FL_ERR_INVALID where none is left. */
/* --model-draft: a draft model over its own contiguous KV cache, for the one sequence. */
typedef struct run_drafter {
    fl_model *m;
    fl_kv_contig *kv;
    float *logits;         /* [n_vocab] */
    int32_t *toks;         /* [n_ctx] the token at each position its cache holds */
    int64_t n;             /* positions it holds */
    int32_t n_vocab, n_ctx, max_batch;
    float p_min;
} run_drafter;

static void drafter_free(run_drafter *d) {
    fl_free(FL_MEM_ACT, d->logits, d->logits ? (size_t)d->n_vocab * sizeof(float) : 0);
    fl_free(FL_MEM_MISC, d->toks, d->toks ? (size_t)d->n_ctx * sizeof(int32_t) : 0);
    fl_kv_contig_free(d->kv);
    fl_model_free(d->m);
    memset(d, 0, sizeof *d);
}

/* The draft model at path over the target's vocabulary (the same texts, as the engine checks). */
static fl_status drafter_new(const char *path, const fl_model_params *mp, const fl_model *target, int32_t n_ctx, int32_t max_batch,
                             float p_min, run_drafter *d) {
    memset(d, 0, sizeof *d);
    fl_model_params dp = fl_model_default_params();
    dp.no_mmap = mp->no_mmap;
    dp.repack = mp->repack;
    fl_status st = fl_model_load(path, &dp, &d->m);
    if (st) {
        fl_add_error_context("draft model %s", path);
        return st;
    }
    const fl_hparams *hp = fl_model_hparams(d->m), *thp = fl_model_hparams(target);
    if (hp->n_vocab != thp->n_vocab || !fl_gguf_vocab_equal(fl_model_gguf(target), fl_model_gguf(d->m))) {
        st = fl_set_error(FL_ERR_INVALID, "draft model %s: its vocabulary (%d tokens) is not the model's (%d tokens, the same texts)", path,
                          hp->n_vocab, thp->n_vocab);
        drafter_free(d);
        return st;
    }
    d->n_vocab = hp->n_vocab;
    d->n_ctx = n_ctx;
    d->max_batch = max_batch;
    d->p_min = p_min;
    fl_kv_contig_params kp = {hp->n_layer, hp->n_head_local, hp->n_head_kv_local, hp->head_dim, n_ctx, 1, hp->n_swa, FL_TYPE_F16};
    if ((st = fl_kv_contig_new(&kp, &d->kv)) || (st = fl_model_workspace_new(d->m, max_batch, 1))) {
        drafter_free(d);
        return st;
    }
    d->logits = fl_alloc(FL_MEM_ACT, (size_t)d->n_vocab * sizeof(float), 64);
    d->toks = fl_alloc(FL_MEM_MISC, (size_t)n_ctx * sizeof(int32_t), 0);
    if (!d->logits || !d->toks) {
        drafter_free(d);
        return fl_set_error(FL_ERR_NOMEM, "draft model: no memory for its buffers");
    }
    return FL_OK;
}

/* The draft's greedy continuation of gen[0, n), at most k tokens, ending at the first it gives less
 * than p_min (llama.cpp's --draft-p-min): its cache catches up from the first position whose token
 * differs from gen (the rest is rewound), the last token's row gives the first draft token, then
 * one token at a time.  A draft is a function of gen, so verifying it keeps the output exact. */
static fl_status drafter_run(run_drafter *d, const int32_t *gen, int64_t n, int32_t k, int32_t *out, int32_t *n_out) {
    *n_out = 0;
    int64_t keep = 0;
    while (keep < d->n && keep < n - 1 && d->toks[keep] == gen[keep]) keep++;
    int32_t pos[512], seq[512] = {0};
    for (int64_t i = keep; i < n; i += d->max_batch) { /* what it lacks, the last token's row at the end */
        const int32_t m = (int32_t)(n - i < d->max_batch ? n - i : d->max_batch);
        for (int32_t j = 0; j < m; j++) pos[j] = (int32_t)(i + j);
        fl_batch b = {m, gen + i, pos, seq, NULL};
        fl_status st = fl_model_forward(d->m, &b, fl_kv_contig_iface(), d->kv, d->logits);
        if (st) return st;
        memcpy(d->toks + i, gen + i, (size_t)m * sizeof(int32_t));
    }
    d->n = n;
    for (int32_t j = 0; j < k; j++) {
        int32_t best = (int32_t)fl_ops_kernels_get()->argmax(d->logits, d->n_vocab);
        if (d->p_min > 0) { /* its probability: 1 / sum of exp(x - max) */
            double sum = 0;
            for (int32_t v = 0; v < d->n_vocab; v++) sum += exp((double)d->logits[v] - (double)d->logits[best]);
            if (1.0 / sum < (double)d->p_min) break;
        }
        out[(*n_out)++] = best;
        if (j == k - 1 || n + j >= d->n_ctx) break;
        int32_t p1 = (int32_t)(n + j), s1 = 0;
        fl_batch b = {1, &best, &p1, &s1, NULL};
        fl_status st = fl_model_forward(d->m, &b, fl_kv_contig_iface(), d->kv, d->logits);
        if (st) return st;
        d->toks[n + j] = best;
        d->n = n + j + 1;
    }
    return FL_OK;
}

static fl_status grammar_row(fl_grammar_guide *g, const fl_vocab_text *v, const fl_tokenizer *tok, uint64_t *bits, const float *logits,
                             float *masked) {
    fl_status st = fl_grammar_guide_mask(g, v->text, v->off, v->order, v->n, bits);
    if (st != FL_OK) return st;
    const bool may_end = fl_grammar_guide_complete(g);
    int32_t left = 0;
    for (int32_t t = 0; t < v->n; t++) {
        const bool ok = fl_tokenizer_is_eog(tok, t) ? may_end : (bits[t >> 6] >> (t & 63)) & 1;
        masked[t] = ok ? logits[t] : -INFINITY;
        left += ok;
    }
    return left ? FL_OK : fl_set_error(FL_ERR_INVALID, "grammar: no token of the vocabulary continues a sentence here");
}

int fl_cmd_run(int argc, char **argv) {
    fl_opt opts[] = {
        {"model", 'm', FL_OPT_STR, "MODEL  GGUF model file (llama architecture)"},
        {"prompt", 'p', FL_OPT_STR, "TEXT  prompt text"},
        {"file", 'f', FL_OPT_STR, "FILE  read the prompt from FILE"},
        {"n-predict", 'n', FL_OPT_INT, "N  tokens to generate (default 128; stops earlier at EOS)"},
        {"ctx-size", 'c', FL_OPT_INT, "CTX  context length (default: the model's, at most 4096)"},
        {"threads", 't', FL_OPT_INT, "N  threads (default: all cores)"},
        FL_CLI_SAMPLING_OPTS,
        {"seed", 's', FL_OPT_INT, "S  RNG seed (default 0)"},
        {"json", 0, FL_OPT_FLAG, "print one JSON object (ids, text, timings, memory) instead of streaming"},
        {"logprobs", 0, FL_OPT_INT, "K  with --json: each generated token's log-probability and the K most likely tokens at its step (0..20; the raw distribution, before penalties and temperature)"},
        {"grammar", 0, FL_OPT_STR, "GBNF  the output is one sentence of this GBNF grammar (llama.cpp's syntax, rule root; docs/SERVER.md)"},
        {"grammar-file", 0, FL_OPT_STR, "FILE  as --grammar, read from FILE (e.g. docs/grammars/json.gbnf)"},
        {"context-shift", 0, FL_OPT_FLAG, "generate past CTX: keep the sink tokens + the recent half (paged KV only)"},
        {"sink", 0, FL_OPT_INT, "S  sink tokens kept by --context-shift (default 4)"},
        FL_CLI_SPEC_OPTS,
        {"tp", 0, FL_OPT_INT, "N  tensor parallel over N ranks: run as `mpirun -np N fitllm run --tp N ...`"},
        FL_CLI_KV_OPTS,
        {"weights", 0, FL_OPT_STR, "T  convert weights at load: q8_0 q4_0 nf4 fp8_e4m3 f16 ..."},
        FL_CLI_LORA_OPTS,
        {"no-mmap", 0, FL_OPT_FLAG, "read the model file into memory (huge pages where the kernel grants them) instead of mapping it"},
        {"no-repack", 0, FL_OPT_FLAG, "keep the weights as in the file (by default Q4_0 / Q8_0 matrices are rewritten in place in groups of 8 rows for the kernels, and on AVX-512 without AMX Q4_K / Q5_K / Q6_K / Q3_K / Q2_K / Q4_1 / Q5_0 / Q5_1 / IQ4_NL in groups of 16)"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm run -m MODEL (-p PROMPT | -f FILE) [-n N] [-c CTX] [options]",
                          "Generate text after a prompt.  Streams the text to stdout, then prints prefill and\n"
                          "decode speed and the memory report to stderr.",
                          NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    const fl_opt *o_model = fl_args_get(opts, "model"), *o_prompt = fl_args_get(opts, "prompt"),
                 *o_file = fl_args_get(opts, "file");
    if (!o_model->set) {
        fprintf(stderr, "fitllm run: -m MODEL is required\n");
        return 2;
    }
    if (o_prompt->set == o_file->set) {
        fprintf(stderr, "fitllm run: give exactly one of -p PROMPT or -f FILE\n");
        return 2;
    }
    const bool json = fl_args_get(opts, "json")->set;
    const int64_t n_predict = fl_args_get(opts, "n-predict")->set ? fl_args_get(opts, "n-predict")->i : 128;
    const int64_t n_lp = fl_args_get(opts, "logprobs")->set ? fl_args_get(opts, "logprobs")->i : -1;
    if (n_lp > FL_MAX_TOP_LOGPROBS || (fl_args_get(opts, "logprobs")->set && (n_lp < 0 || !json))) {
        fprintf(stderr, "fitllm run: --logprobs takes 0..%d, with --json\n", FL_MAX_TOP_LOGPROBS);
        return 2;
    }
    if (n_predict < 0) {
        fprintf(stderr, "fitllm run: -n must be >= 0\n");
        return 2;
    }
    const int64_t n_tp = fl_args_get(opts, "tp")->set ? fl_args_get(opts, "tp")->i : 1;
    if (n_tp < 1 || n_tp > 1024) {
        fprintf(stderr, "fitllm run: --tp must be in 1..1024\n");
        return 2;
    }
    fl_threads_set(fl_args_get(opts, "threads")->set ? (int)fl_args_get(opts, "threads")->i : 0);
    if (n_tp > 1 && !fl_args_get(opts, "threads")->set) { /* ranks share the cores */
        int per = fl_threads_get() / (int)n_tp;
        fl_threads_set(per > 0 ? per : 1);
    }
    fl_sampler_params sp = fl_sampler_default_params();
#define FOPT(name, field) if (fl_args_get(opts, name)->set) sp.field = (float)fl_args_get(opts, name)->f
#define IOPT(name, field) if (fl_args_get(opts, name)->set) sp.field = (int32_t)fl_args_get(opts, name)->i
    FOPT("temp", temp);
    IOPT("top-k", top_k);
    FOPT("top-p", top_p);
    FOPT("min-p", min_p);
    FOPT("repeat-penalty", repeat_penalty);
    FOPT("frequency-penalty", freq_penalty);
    FOPT("presence-penalty", presence_penalty);
    IOPT("repeat-last-n", penalty_last_n);
#undef FOPT
#undef IOPT
    if (fl_args_get(opts, "seed")->set) sp.seed = (uint64_t)fl_args_get(opts, "seed")->i;
    fl_engine_params spec; /* --spec-ngram: only its three fields */
    fl_engine_params_default(&spec);
    spec.spec_tokens = 0; /* (off unless asked) */
    if (fl_cli_spec_params(opts, "run", &spec)) return 2;
    const int32_t spec_k = spec.spec_tokens, spec_lo = spec.spec_ngram_min ? spec.spec_ngram_min : FL_SPEC_NGRAM_MIN;
    const int32_t spec_hi = spec.spec_ngram_max ? spec.spec_ngram_max : spec_lo > FL_SPEC_NGRAM_MAX ? spec_lo : FL_SPEC_NGRAM_MAX;
    if (spec_lo > spec_hi) {
        fprintf(stderr, "fitllm run: --spec-ngram-min %d is above --spec-ngram-max %d\n", spec_lo, spec_hi);
        return 2;
    }

    int rc = 1;
    char *text = NULL;
    size_t text_len = 0;
    bool text_owned = false;
    fl_model *m = NULL;
    fl_comm *comm = NULL;
    fl_tp_model *tpm = NULL;
    int rank = 0;
    fl_tokenizer *tok = NULL;
    fl_cli_kv kv = {0};
    run_drafter drafter = {0};
    fl_sampler *smp = NULL;
    int32_t *ids = NULL, *gen = NULL;
    int64_t n_ids = 0, n_gen = 0;
    float *logits = NULL;
    char *out_text = NULL;
    size_t out_cap = 0, logits_bytes = 0, gen_bytes = 0, lp_bytes = 0;
    fl_token_logprob *lp = NULL; /* --logprobs: [max_gen][1 + K] */
    char *gbnf = NULL;           /* --grammar-file's text */
    size_t gbnf_len = 0;
    fl_grammar_guide *gram = NULL;
    fl_vocab_text voc = {0};
    uint64_t *gbits = NULL;
    float *masked = NULL;
    fl_status st;

    if (o_file->set) {
        if (!(text = fl_cli_read_file(o_file->str, &text_len))) goto fail;
        text_owned = true;
    } else {
        text = (char *)o_prompt->str;
        text_len = strlen(text);
    }
    if (text_len == 0) {
        fl_set_error(FL_ERR_INVALID, "the prompt is empty");
        goto fail;
    }
    if (fl_args_get(opts, "grammar")->set || fl_args_get(opts, "grammar-file")->set) { /* refused before the model loads */
        if (fl_args_get(opts, "grammar")->set && fl_args_get(opts, "grammar-file")->set) {
            fl_set_error(FL_ERR_INVALID, "give --grammar or --grammar-file, not both");
            goto fail;
        }
        if (fl_args_get(opts, "grammar-file")->set && !(gbnf = fl_cli_read_file(fl_args_get(opts, "grammar-file")->str, &gbnf_len))) goto fail;
        if (fl_grammar_guide_new(gbnf ? gbnf : fl_args_get(opts, "grammar")->str, &gram) != FL_OK) goto fail;
    }
    fl_model_params mparams = fl_model_default_params();
    mparams.no_mmap = fl_args_get(opts, "no-mmap")->set;
    mparams.repack = !fl_args_get(opts, "no-repack")->set;
    const char *lora;
    float lora_scale;
    fl_cli_lora_params(opts, &lora, &lora_scale, &mparams);
    if (fl_args_get(opts, "weights")->set) {
        const char *wn = fl_args_get(opts, "weights")->str;
        mparams.weights_type = fl_type_from_name(wn);
        if (mparams.weights_type < 0) {
            st = fl_set_error(FL_ERR_INVALID, "unknown --weights type '%s'", wn);
            goto fail;
        }
    }
    if (n_tp > 1) { /* every rank loads its slice; logits are all-gathered, so all sample alike */
        if (lora) {
            st = fl_set_error(FL_ERR_UNSUPPORTED, "--lora with --tp is not supported (merge it first: fitllm train --merge-lora)");
            goto fail;
        }
        if (mparams.weights_type >= 0) {
            st = fl_set_error(FL_ERR_UNSUPPORTED, "--weights with --tp is not supported (quantize the file with fitllm quantize)");
            goto fail;
        }
        if ((st = fl_comm_new(NULL, NULL, &comm))) goto fail;
        rank = fl_comm_rank(comm);
        if (fl_comm_size(comm) != n_tp) {
            fl_set_error(FL_ERR_INVALID, "--tp %lld needs exactly %lld ranks (mpirun -np %lld), this run has %d",
                         (long long)n_tp, (long long)n_tp, (long long)n_tp, fl_comm_size(comm));
            goto fail;
        }
        if ((st = fl_tp_load(o_model->str, comm, &tpm))) goto fail;
        m = fl_tp_model_get(tpm);
    } else if ((st = fl_model_load(o_model->str, &mparams, &m))) {
        goto fail;
    }
    {
        size_t src = 0;
        int64_t ne = 0;
        const size_t conv = fl_model_converted(m, &src, &ne);
        if (conv)
            fprintf(stderr, "weights converted to %s at load: %.2f MiB -> %.2f MiB (%.2f bits per weight, %.2f MiB saved)\n",
                    fl_type_name(mparams.weights_type), (double)src / 1048576.0, (double)conv / 1048576.0,
                    8.0 * (double)conv / (double)ne, ((double)src - (double)conv) / 1048576.0);
        else if (mparams.weights_type >= 0)
            fprintf(stderr, "weights: no matrix converted to %s (already that type, or rows not a multiple of its block)\n",
                    fl_type_name(mparams.weights_type));
    }
    const fl_hparams *hp = fl_model_hparams(m);
    if ((st = fl_tokenizer_new(fl_model_gguf(m), &tok))) goto fail;
    if ((st = fl_cli_tokenize(tok, text, text_len, &ids, &n_ids))) goto fail;
    int64_t n_ctx = fl_args_get(opts, "ctx-size")->set ? fl_args_get(opts, "ctx-size")->i
                                                       : (hp->n_ctx_train > 0 && hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    if (n_ctx < 1 || n_ctx > (1 << 24)) {
        fl_set_error(FL_ERR_INVALID, "context size %lld out of range", (long long)n_ctx);
        goto fail;
    }
    if (n_ids >= n_ctx) {
        fl_set_error(FL_ERR_INVALID, "the prompt has %lld tokens, which does not leave room in the context of %lld",
                     (long long)n_ids, (long long)n_ctx);
        goto fail;
    }
    const bool shift = fl_args_get(opts, "context-shift")->set;
    const int64_t n_sink = fl_args_get(opts, "sink")->set ? fl_args_get(opts, "sink")->i : 4;
    if (shift && (n_sink < 0 || n_sink > n_ctx / 2)) {
        fl_set_error(FL_ERR_INVALID, "--sink %lld must be in [0, CTX/2]", (long long)n_sink);
        goto fail;
    }
    const int64_t max_gen = shift || n_predict < n_ctx - n_ids ? n_predict : n_ctx - n_ids;
    int32_t max_batch = n_ids < 512 ? (int32_t)n_ids : 512;
    if (max_batch < 1 + spec_k) max_batch = 1 + spec_k; /* a decode and its drafts */
    if ((st = fl_cli_kv_new(hp, fl_args_get(opts, "kv-layout")->str, fl_args_get(opts, "kv-type")->str,
                            fl_args_get(opts, "block-size")->set ? fl_args_get(opts, "block-size")->i : 0, (int32_t)n_ctx,
                            &kv)))
        goto fail;
    if (shift && !kv.paged) {
        fl_set_error(FL_ERR_UNSUPPORTED, "--context-shift needs the paged KV cache");
        goto fail;
    }
    if (spec_k > 0 && (!kv.paged || shift || tpm)) {
        fl_set_error(FL_ERR_UNSUPPORTED, "%s needs the paged KV cache, without --context-shift and --tp",
                     spec.spec_draft_model ? "--model-draft" : "--spec-ngram");
        goto fail;
    }
    if (spec.spec_draft_model &&
        (st = drafter_new(spec.spec_draft_model, &mparams, m, (int32_t)n_ctx, max_batch, spec.spec_draft_p_min, &drafter)))
        goto fail;
    if (shift && hp->rope_freq_scale != 1.0f) {
        fl_set_error(FL_ERR_UNSUPPORTED, "--context-shift: re-rotation with a RoPE frequency scale is not implemented");
        goto fail;
    }
    if ((st = fl_model_workspace_new(m, max_batch, 1 + spec_k))) goto fail;
    if ((st = fl_sampler_new(&sp, hp->n_vocab, &smp))) goto fail;
    if (gram && ((st = fl_vocab_text_build(&voc, hp->n_vocab, run_piece, tok)) ||
                 !(gbits = fl_alloc(FL_MEM_MISC, ((size_t)hp->n_vocab + 63) / 64 * 8, 0)) ||
                 !(masked = fl_alloc(FL_MEM_ACT, (size_t)hp->n_vocab * sizeof *masked, 64))))
        goto fail;
    logits_bytes = (size_t)(1 + spec_k) * (size_t)hp->n_vocab * sizeof(float); /* a row per draft token too */
    logits = fl_alloc(FL_MEM_ACT, logits_bytes, 64);
    gen_bytes = (size_t)(n_ids + max_gen + 1) * sizeof(int32_t);
    gen = fl_alloc(FL_MEM_MISC, gen_bytes, 16); /* history: prompt + generated */
    if (!logits || !gen) goto fail;
    memcpy(gen, ids, (size_t)n_ids * sizeof(int32_t));
    if (n_lp >= 0) {
        lp_bytes = (size_t)(max_gen + 1) * (size_t)(1 + n_lp) * sizeof *lp;
        if (!(lp = fl_alloc(FL_MEM_MISC, lp_bytes, 16))) goto fail;
    }

    /* prefill in batches of up to max_batch tokens */
    int32_t pos[512], seq[512];
    memset(seq, 0, sizeof seq);
    const double t0 = fl_clock_s();
    for (int64_t i = 0; i < n_ids; i += max_batch) {
        const int32_t n = (int32_t)(n_ids - i < max_batch ? n_ids - i : max_batch);
        for (int32_t j = 0; j < n; j++) pos[j] = (int32_t)(i + j);
        fl_batch b = {n, ids + i, pos, seq, NULL};
        if ((st = tpm ? fl_tp_forward(tpm, &b, &kv.iface, kv.ctx, logits) : fl_model_forward(m, &b, &kv.iface, kv.ctx, logits))) goto fail;
    }
    const double t1 = fl_clock_s();
    /* decode */
    int64_t n_shifted = 0, n_shifts = 0; /* positions dropped by --context-shift, and how often */
    char piece[256], pending[1024];
    size_t n_pending = 0;
    /* --spec-ngram: the rows after the last token and after each of its d drafts; a draft is kept
     * while it is the token sampled (as the engine does, engine.c sample_drafts) */
    int32_t n_rows = 1, n_draft = 0, draft[FL_SPEC_MAX], btok[1 + FL_SPEC_MAX], bpos[1 + FL_SPEC_MAX], bseq[1 + FL_SPEC_MAX] = {0};
    int8_t bflag[1 + FL_SPEC_MAX];
    int64_t spec_drafted = 0, spec_kept = 0;
    bool done = false;
    while (n_gen < max_gen && !done) {
        int32_t t = -1, kept = 0;
        for (int32_t row = 0; row < n_rows; row++) {
            const float *lr = logits + (size_t)row * (size_t)hp->n_vocab;
            if (gram && (st = grammar_row(gram, &voc, tok, gbits, lr, masked))) goto fail;
            t = fl_sample(smp, gram ? masked : lr, hp->n_vocab, gen, n_ids + n_gen);
            if (lp) { /* the sampler only read the logits */
                fl_token_logprob *rec = lp + (size_t)n_gen * (size_t)(1 + n_lp);
                rec[0].token = t;
                fl_logprobs(lr, hp->n_vocab, t, (int32_t)n_lp, &rec[0].logprob, rec + 1);
            }
            if (fl_tokenizer_is_eog(tok, t)) {
                done = true;
                break;
            }
            if (gram && (st = fl_grammar_guide_feed(gram, voc.text + voc.off[t], (size_t)(voc.off[t + 1] - voc.off[t])))) goto fail;
            gen[n_ids + n_gen++] = t;
            if (!json && rank == 0) {
                int32_t pl = fl_token_to_piece(tok, t, piece, sizeof piece, false);
                if (pl > 0 && n_pending + (size_t)pl < sizeof pending) {
                    memcpy(pending + n_pending, piece, (size_t)pl);
                    n_pending += (size_t)pl;
                }
                size_t ok = fl_utf8_complete_prefix(pending, n_pending);
                fwrite(pending, 1, ok, stdout);
                fflush(stdout);
                memmove(pending, pending + ok, n_pending - ok);
                n_pending -= ok;
            }
            if (n_gen == max_gen || (gram && fl_grammar_guide_finished(gram))) { /* (a sentence nothing can follow) */
                done = true;
                break;
            }
            if (row == n_rows - 1 || t != draft[row]) break;
            kept++;
        }
        spec_kept += kept;
        if (done) break;
        if (kept < n_draft && (st = fl_kv_seq_truncate(kv.pk, 0, (int32_t)(n_ids + n_gen - 1)))) goto fail;
        int32_t p1 = (int32_t)(n_ids + n_gen - 1) - (int32_t)n_shifted, s1 = 0;
        if (shift && p1 >= n_ctx) { /* full: keep the sinks and the most recent half of the rest */
            const int32_t recent = (int32_t)((n_ctx - n_sink) / 2);
            if ((st = fl_kv_seq_stream(kv.pk, 0, (int32_t)n_sink, recent))) goto fail;
            n_shifted += p1 - (int32_t)n_sink - recent;
            p1 = (int32_t)n_sink + recent;
            n_shifts++;
        }
        n_draft = 0;
        if (spec_k > 0) { /* drafts: as many as may still be generated and fit in the context */
            int64_t k = spec_k;
            if (k > max_gen - n_gen - 1) k = max_gen - n_gen - 1;
            if (k > n_ctx - (n_ids + n_gen)) k = n_ctx - (n_ids + n_gen);
            if (k > 0 && drafter.m) {
                if ((st = drafter_run(&drafter, gen, n_ids + n_gen, (int32_t)k, draft, &n_draft))) goto fail;
            } else if (k > 0) {
                n_draft = fl_spec_ngram(gen, (int32_t)(n_ids + n_gen), spec_lo, spec_hi, (int32_t)k, draft);
            }
            spec_drafted += n_draft;
        }
        if (n_draft == 0) {
            fl_batch b = {1, &t, &p1, &s1, NULL};
            if ((st = tpm ? fl_tp_forward(tpm, &b, &kv.iface, kv.ctx, logits) : fl_model_forward(m, &b, &kv.iface, kv.ctx, logits))) goto fail;
        } else {
            for (int32_t j = 0; j <= n_draft; j++) {
                btok[j] = j ? draft[j - 1] : t;
                bpos[j] = p1 + j;
                bflag[j] = 1;
            }
            fl_batch b = {1 + n_draft, btok, bpos, bseq, bflag};
            if ((st = fl_model_forward(m, &b, &kv.iface, kv.ctx, logits))) goto fail;
        }
        n_rows = 1 + n_draft;
    }
    const double t2 = fl_clock_s();
    if (!json && rank == 0) {
        fwrite(pending, 1, n_pending, stdout);
        printf("\n");
    }
    const double prefill_tps = (double)n_ids / (t1 - t0 > 0 ? t1 - t0 : 1e-9);
    const double decode_tps = n_gen > 1 ? (double)(n_gen - 1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0;
    /* the whole continuation as text */
    out_cap = (size_t)n_gen * 64 + 16;
    out_text = fl_alloc(FL_MEM_MISC, out_cap, 16);
    if (!out_text) goto fail;
    int64_t tl = fl_detokenize(tok, gen + n_ids, n_gen, out_text, (int64_t)out_cap, false, false);
    out_text[tl < 0 ? 0 : tl] = 0;
    if (json && rank == 0) {
        fl_mem_install_cjson_hooks();
        const size_t fail0 = fl_mem_thread_failures();
        cJSON *o = cJSON_CreateObject();
        fl_cli_json_add(o, "prompt_tokens", cJSON_CreateIntArray(ids, (int)n_ids));
        fl_cli_json_add(o, "tokens", cJSON_CreateIntArray(gen + n_ids, (int)n_gen));
        cJSON_AddStringToObject(o, "text", out_text);
        if (lp) { /* [{token, logprob, top: [[token, logprob] ...]}] per generated token */
            cJSON *a = cJSON_AddArrayToObject(o, "logprobs");
            for (int64_t g = 0; g < n_gen; g++) {
                const fl_token_logprob *rec = lp + (size_t)g * (size_t)(1 + n_lp);
                cJSON *e = cJSON_CreateObject(), *top = cJSON_CreateArray();
                cJSON_AddNumberToObject(e, "token", rec[0].token);
                cJSON_AddNumberToObject(e, "logprob", rec[0].logprob);
                for (int64_t k = 1; k <= n_lp; k++) {
                    cJSON *pair = cJSON_CreateArray();
                    fl_cli_json_add(pair, NULL, cJSON_CreateNumber(rec[k].token));
                    fl_cli_json_add(pair, NULL, cJSON_CreateNumber(rec[k].logprob));
                    fl_cli_json_add(top, NULL, pair);
                }
                fl_cli_json_add(e, "top", top);
                fl_cli_json_add(a, NULL, e);
            }
        }
        cJSON *tm = cJSON_AddObjectToObject(o, "timings");
        cJSON_AddNumberToObject(tm, "prefill_tok_s", prefill_tps);
        cJSON_AddNumberToObject(tm, "decode_tok_s", decode_tps);
        if (spec_k > 0) {
            cJSON *sj = cJSON_AddObjectToObject(o, "spec");
            cJSON_AddNumberToObject(sj, "draft_tokens", (double)spec_drafted);
            cJSON_AddNumberToObject(sj, "accepted_tokens", (double)spec_kept);
        }
        cJSON *kj = cJSON_AddObjectToObject(o, "kv");
        cJSON_AddStringToObject(kj, "layout", kv.paged ? "paged" : "contiguous");
        cJSON_AddStringToObject(kj, "type", fl_type_name(kv.type));
        cJSON_AddNumberToObject(kj, "bytes_per_token", fl_cli_kv_bytes_per_token(&kv, hp));
        cJSON_AddNumberToObject(kj, "context_shifts", (double)n_shifts);
        cJSON_AddNumberToObject(kj, "positions_dropped", (double)n_shifted);
        if (fl_cli_print_json_with_memory(NULL, o, fail0)) goto fail;
    } else if (!json) {
        if (tpm) fprintf(stderr, "rank %d of %lld: ", rank, (long long)n_tp);
        fprintf(stderr, "prefill: %lld tokens, %.1f tok/s; decode: %lld tokens, %.1f tok/s", (long long)n_ids,
                prefill_tps, (long long)n_gen, decode_tps);
        if (spec_k > 0) fprintf(stderr, "; speculative decoding: %lld of %lld draft tokens kept", (long long)spec_kept, (long long)spec_drafted);
        fprintf(stderr, "\n");
        fl_mem_report(stderr);
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "fitllm run: %s\n", fl_last_error()[0] ? fl_last_error() : "failed");
    if (out_text) fl_free(FL_MEM_MISC, out_text, out_cap);
    fl_free(FL_MEM_MISC, gen, gen_bytes);
    fl_free(FL_MEM_MISC, lp, lp_bytes);
    fl_free(FL_MEM_ACT, logits, logits_bytes);
    fl_sampler_free(smp);
    fl_grammar_guide_free(gram);
    fl_free(FL_MEM_MISC, gbits, gbits ? ((size_t)voc.n + 63) / 64 * 8 : 0); /* (allocated once voc was built) */
    fl_free(FL_MEM_ACT, masked, masked ? (size_t)voc.n * sizeof *masked : 0);
    fl_vocab_text_free(&voc);
    if (gbnf) fl_free(FL_MEM_MISC, gbnf, gbnf_len + 1);
    fl_cli_kv_free(&kv);
    drafter_free(&drafter);
    if (ids) fl_free(FL_MEM_MISC, ids, (size_t)(n_ids + 1) * sizeof(int32_t));
    fl_tokenizer_free(tok);
    if (tpm) fl_tp_free(tpm);
    else fl_model_free(m);
    fl_comm_free(comm);
    if (text_owned) fl_free(FL_MEM_MISC, text, text_len + 1);
    return rc;
}
