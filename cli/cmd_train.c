/* `fitllm train`: fine-tune a GGUF model (full, LoRA, QLoRA on an NF4 base) or train one from
 * scratch on a text file; held-out perplexity before/after, checkpoints, GGUF export. */
#include "cli/cli.h"
#include "core/clock.h"
#include "dist/dist.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "formats/gguf.h"
#include "model/tokenizer.h"
#include "train/data.h"
#include "train/model.h"
#include "train/trainer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* "--init": a preset name or "key=value,..." with keys layers, embd, heads, kv_heads, ff, ctx,
 * rope_base.  Vocabulary comes from the tokenizer. */
static int parse_init(const char *spec, int32_t n_vocab, fl_train_config *c) {
    *c = (fl_train_config){.n_vocab = n_vocab, .n_ctx = 512, .n_embd = 64, .n_layer = 5, .n_head = 8,
                           .n_head_kv = 4, .n_ff = 172, .rope_base = 10000.0f, .rms_eps = 1e-5f};
    if (!strcmp(spec, "tiny")) { /* the stories260K shape */
    } else if (!strcmp(spec, "small")) {
        c->n_embd = 128; c->n_layer = 6; c->n_head = 8; c->n_head_kv = 4; c->n_ff = 384;
    } else if (!strcmp(spec, "base")) {
        c->n_embd = 288; c->n_layer = 6; c->n_head = 6; c->n_head_kv = 6; c->n_ff = 768; c->n_ctx = 256;
    } else {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", spec);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(tok, '=');
            if (!eq) return -1;
            *eq = 0;
            const long v = strtol(eq + 1, NULL, 10);
            if (!strcmp(tok, "layers")) c->n_layer = (int32_t)v;
            else if (!strcmp(tok, "embd")) c->n_embd = (int32_t)v;
            else if (!strcmp(tok, "heads")) c->n_head = c->n_head_kv = (int32_t)v;
            else if (!strcmp(tok, "kv_heads")) c->n_head_kv = (int32_t)v;
            else if (!strcmp(tok, "ff")) c->n_ff = (int32_t)v;
            else if (!strcmp(tok, "ctx")) c->n_ctx = (int32_t)v;
            else if (!strcmp(tok, "rope_base")) c->rope_base = (float)v;
            else return -1;
        }
    }
    if (c->n_head <= 0 || c->n_embd % c->n_head) return -1;
    c->head_dim = c->n_embd / c->n_head;
    c->rope_dim = c->head_dim;
    return fl_train_config_check(c) == FL_OK ? 0 : -1;
}

/* Read a text file; raw: one running document (held > 0: the last `held` fraction of the bytes,
 * cut at a blank line, goes to *heldout as a second running document). */
static fl_status read_text(const char *path, const fl_tokenizer *tok, bool raw, double held, fl_train_data *d,
                           fl_train_data *heldout) {
    FILE *f = fopen(path, "rb");
    if (!f) return fl_set_error(FL_ERR_IO, "cannot open %s", path);
    struct stat sb;
    if (fstat(fileno(f), &sb) || sb.st_size <= 0) {
        fclose(f);
        return fl_set_error(FL_ERR_IO, "%s is empty or unreadable", path);
    }
    const size_t n = (size_t)sb.st_size;
    char *buf = fl_alloc(FL_MEM_MISC, n, 64);
    if (!buf) {
        fclose(f);
        return FL_ERR_NOMEM;
    }
    const size_t got = fread(buf, 1, n, f);
    fclose(f);
    size_t cut = n;
    if (raw && held > 0) { /* the last `held` of the bytes, from a blank line on */
        cut = (size_t)((1.0 - held) * (double)n);
        while (cut + 1 < n && !(buf[cut] == '\n' && buf[cut + 1] == '\n')) cut++;
        if (cut + 1 >= n) cut = (size_t)((1.0 - held) * (double)n);
    }
    fl_status st = got == n ? fl_train_data_from_text_ex(tok, buf, cut, raw, d) : fl_set_error(FL_ERR_IO, "short read of %s", path);
    if (!st && raw && held > 0) {
        st = fl_train_data_from_text_ex(tok, buf + cut, n - cut, true, heldout);
        if (st) fl_train_data_free(d);
    }
    if (st) fl_add_error_context("%s", path);
    fl_free(FL_MEM_MISC, buf, n);
    return st;
}

/* The files a run writes besides OUT: its adapters (OUT.lora.gguf, ".gguf" replaced) and its
 * checkpoint (OUT.ckpt, or fitllm-train.ckpt without -o). */
static void out_paths(const char *out, char lora[1024], char ckpt[1024]) {
    lora[0] = 0;
    if (out) {
        const size_t n = strlen(out), stem = n > 5 && !strcmp(out + n - 5, ".gguf") ? n - 5 : n;
        snprintf(lora, 1024, "%.*s.lora.gguf", (int)stem, out);
    }
    snprintf(ckpt, 1024, "%s.ckpt", out ? out : "fitllm-train");
}

/* Merge an adapter file (written by --lora training) into base and export a plain GGUF. */
static int merge_lora(const char *base, const char *adapter, const char *out) {
    fl_gguf *g = NULL, *ga = NULL;
    fl_train_model *m = NULL;
    uint32_t rank = 0;
    float alpha = 0;
    fl_status st = fl_gguf_open(base, &g);
    if (!st) st = fl_gguf_open(adapter, &ga);
    if (!st && (fl_gguf_get_u32(ga, "lora.rank", &rank) || fl_gguf_get_f32(ga, "lora.alpha", &alpha)))
        st = fl_set_error(FL_ERR_FORMAT, "%s: not a fitllm LoRA adapter (lora.rank / lora.alpha missing)", adapter);
    if (!st) st = fl_train_model_load_gguf(g, &m);
    if (!st) st = fl_train_model_enable_lora(m, (int32_t)rank, alpha, 0);
    if (!st) st = fl_train_model_read_lora(m, ga);
    if (!st) st = fl_train_model_save_gguf(m, out, g);
    if (st) fprintf(stderr, "fitllm train: %s\n", fl_last_error());
    else fprintf(stderr, "merged %s (rank %u, alpha %g) into %s -> %s\n", adapter, rank, (double)alpha, base, out);
    fl_train_model_free(m);
    fl_gguf_free(ga);
    fl_gguf_free(g);
    return st ? 1 : 0;
}

static void mib(char *b, size_t n, size_t bytes) { snprintf(b, n, "%.1f MiB", (double)bytes / 1048576.0); }

int fl_cmd_train(int argc, char **argv) {
    fl_opt opts[] = {
        {"model", 'm', FL_OPT_STR, "BASE.gguf  model to fine-tune (its tokenizer is used)"},
        {"init", 0, FL_OPT_STR, "SHAPE  train from scratch: tiny|small|base or layers=L,embd=C,heads=H,kv_heads=K,ff=F,ctx=N"},
        {"tokenizer", 0, FL_OPT_STR, "GGUF  tokenizer source for --init (its tokenizer.* keys are copied to the output)"},
        {"file", 'f', FL_OPT_STR, "TRAIN.txt  training text (documents separated by blank lines)"},
        {"val", 0, FL_OPT_STR, "VAL.txt  held-out text (default: hold out --val-frac of the training documents)"},
        {"val-frac", 0, FL_OPT_FLOAT, "F  fraction of documents held out when --val is absent (default 0.05)"},
        {"ctx-size", 'c', FL_OPT_INT, "CTX  tokens per row (default 256)"},
        {"batch", 0, FL_OPT_INT, "B  rows per micro-batch (default 4)"},
        {"grad-accum", 0, FL_OPT_INT, "K  micro-batches per optimizer step (default 1)"},
        {"steps", 0, FL_OPT_INT, "N  optimizer steps (default 100)"},
        {"epochs", 0, FL_OPT_FLOAT, "E  train for E passes over the data instead of --steps"},
        {"time-limit", 0, FL_OPT_FLOAT, "SEC  stop after SEC seconds (the schedule still spans --steps)"},
        {"lr", 0, FL_OPT_FLOAT, "LR  peak learning rate (default 1e-3)"},
        {"min-lr", 0, FL_OPT_FLOAT, "LR  final learning rate (default lr/10)"},
        {"warmup", 0, FL_OPT_INT, "W  warmup steps (default 10)"},
        {"schedule", 0, FL_OPT_STR, "cosine|linear|constant  LR decay after warmup (default cosine)"},
        {"clip", 0, FL_OPT_FLOAT, "NORM  clip the gradient norm (default 1, 0 = off)"},
        {"weight-decay", 0, FL_OPT_FLOAT, "WD  AdamW weight decay on matrices (default 0.1)"},
        {"checkpoint-every", 0, FL_OPT_INT, "K  activation checkpointing: keep the input of every K-th layer (0 = keep all)"},
        {"precision", 0, FL_OPT_STR, "f32|bf16|fp16  compute precision (fp32 master weights; fp16 uses loss scaling)"},
        {"loss-scale", 0, FL_OPT_FLOAT, "S  fp16's initial loss scale (default 32768; halved on overflow, doubled every 200 good steps)"},
        {"optim", 0, FL_OPT_STR, "adamw|adamw8bit  optimizer (8-bit: block-wise quantized states)"},
        {"lora", 0, FL_OPT_INT, "R  train LoRA adapters of rank R on a frozen base"},
        {"lora-alpha", 0, FL_OPT_FLOAT, "A  LoRA scale numerator (default 2R)"},
        {"weights", 0, FL_OPT_STR, "nf4  quantize the frozen base to NF4 at load time (QLoRA; needs --lora)"},
        {"raw", 0, FL_OPT_FLAG, "the text is one running document (no per-document BOS/EOS, positions run on): llama.cpp perplexity's view"},
        {"bucket", 0, FL_OPT_FLAG, "one document per sequence, length-bucketed batches (default: --pack)"},
        {"pack", 0, FL_OPT_FLAG, "pack several documents per row with block-diagonal attention (default)"},
        {"save-every", 0, FL_OPT_INT, "N  write the checkpoint OUT.ckpt every N steps (atomic)"},
        {"resume", 0, FL_OPT_STR, "CKPT  continue from a checkpoint"},
        {"eval-every", 0, FL_OPT_INT, "N  held-out loss every N steps (default: start and end only)"},
        {"eval-tokens", 0, FL_OPT_INT, "N  cap the held-out tokens evaluated (default all)"},
        {"merge-lora", 0, FL_OPT_STR, "ADAPTER.gguf  merge saved adapters into -m BASE and write -o OUT.gguf (no training)"},
        {"output", 'o', FL_OPT_STR, "OUT.gguf  final weights (LoRA: merged, adapters also in OUT.lora.gguf)"},
        {"seed", 0, FL_OPT_INT, "S  seed for init, LoRA and shuffling (default 1234)"},
        {"threads", 't', FL_OPT_INT, "N  threads (default all cores; under mpirun: cores / ranks)"},
        {"zero", 0, FL_OPT_INT, "S  data parallel with ZeRO stage S (1 or 2) over the ranks of `mpirun -np N`"},
        {"json", 0, FL_OPT_FLAG, "one JSON object per step and per evaluation on stdout"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts,
                          "fitllm train (-m BASE.gguf | --init SHAPE --tokenizer TOK.gguf) -f TRAIN.txt [options]",
                          "Train or fine-tune a llama model on a text file in little memory: activation\n"
                          "checkpointing, bf16/fp16 compute, 8-bit AdamW, LoRA/QLoRA, packing.  Prints\n"
                          "held-out perplexity before and after; writes OUT.gguf that `fitllm run` loads.",
                          NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
#define OPT(name) fl_args_get(opts, name)
    const char *base = OPT("model")->str, *init = OPT("init")->str, *train_path = OPT("file")->str;
    if (OPT("merge-lora")->set) {
        if (!base || !OPT("output")->set) {
            fprintf(stderr, "fitllm train: --merge-lora needs -m BASE.gguf and -o OUT.gguf\n");
            return 2;
        }
        if (fl_cli_overwrites_input("train", OPT("output")->str, 2, (const char *const[]){base, OPT("merge-lora")->str},
                                    (const char *const[]){"base model", "adapter"}))
            return 2;
        return merge_lora(base, OPT("merge-lora")->str, OPT("output")->str);
    }
    if ((!base) == (!init) || !train_path) {
        fprintf(stderr, "fitllm train: need exactly one of -m / --init, and -f (see --help)\n");
        return 2;
    }
    if (init && !OPT("tokenizer")->set) {
        fprintf(stderr, "fitllm train: --init needs --tokenizer GGUF (e.g. stories260K.gguf)\n");
        return 2;
    }
    { /* the outputs (weights, adapters, checkpoint) must not replace an input; resuming from the
       * checkpoint this run writes is allowed */
        const char *o = OPT("output")->str;
        char lp[1024], cp[1024];
        out_paths(o, lp, cp);
        const char *const in[] = {base, OPT("tokenizer")->str, train_path, OPT("val")->str, OPT("resume")->str};
        const char *const what[] = {"base model", "tokenizer", "training text", "held-out text", "checkpoint to resume"};
        if (fl_cli_overwrites_input("train", o, 5, in, what) || (o && fl_cli_overwrites_input("train", lp, 5, in, what)) ||
            fl_cli_overwrites_input("train", cp, 4, in, what))
            return 2;
    }
    fl_trainer_opts to = fl_trainer_default_opts();
    if (OPT("ctx-size")->set) to.ctx = OPT("ctx-size")->i;
    if (OPT("batch")->set) to.batch = OPT("batch")->i;
    if (OPT("grad-accum")->set) to.grad_accum = OPT("grad-accum")->i;
    if (OPT("steps")->set) to.steps = OPT("steps")->i;
    if (OPT("lr")->set) to.lr = (float)OPT("lr")->f;
    to.min_lr = OPT("min-lr")->set ? (float)OPT("min-lr")->f : to.lr / 10.0f;
    if (OPT("warmup")->set) to.warmup = OPT("warmup")->i;
    if (OPT("clip")->set) to.clip = (float)OPT("clip")->f;
    if (OPT("weight-decay")->set) to.optim.weight_decay = (float)OPT("weight-decay")->f;
    if (OPT("checkpoint-every")->set) to.ckpt_every = (int)OPT("checkpoint-every")->i;
    if (OPT("loss-scale")->set) {
        const double ls = OPT("loss-scale")->f;
        if (!(ls >= 1.0 && ls <= 1e30)) { fprintf(stderr, "fitllm train: --loss-scale takes 1 to 1e30\n"); return 2; }
        to.loss_scale_init = (float)ls;
    }
    if (OPT("seed")->set) to.seed = (uint64_t)OPT("seed")->i;
    if (OPT("bucket")->set) to.batch_mode = FL_BATCH_BUCKET;
    if (OPT("threads")->set) fl_threads_set((int)OPT("threads")->i);
    fl_comm *comm = NULL;
    int zrank = 0;
    if (OPT("zero")->set) {
        if (OPT("zero")->i < 1 || OPT("zero")->i > 2) { fprintf(stderr, "fitllm train: --zero takes 1 or 2\n"); return 2; }
        if (fl_comm_new(NULL, NULL, &comm) != FL_OK) { fprintf(stderr, "fitllm train: %s\n", fl_last_error()); return 1; }
        to.comm = comm;
        to.zero_stage = (int)OPT("zero")->i;
        zrank = fl_comm_rank(comm);
        if (!OPT("threads")->set) {
            int per = fl_threads_get() / fl_comm_size(comm);
            fl_threads_set(per > 0 ? per : 1);
        }
        if (zrank > 0) { /* every rank holds the same parameters: rank 0 reports and writes */
            if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) return 1;
        }
    }
    const char *sched = OPT("schedule")->str, *prec = OPT("precision")->str, *optim = OPT("optim")->str;
    if (sched) {
        if (!strcmp(sched, "cosine")) to.sched = FL_LR_COSINE;
        else if (!strcmp(sched, "linear")) to.sched = FL_LR_LINEAR;
        else if (!strcmp(sched, "constant")) to.sched = FL_LR_CONSTANT;
        else { fprintf(stderr, "fitllm train: unknown --schedule '%s'\n", sched); return 2; }
    }
    if (prec) {
        if (!strcmp(prec, "f32") || !strcmp(prec, "fp32")) to.precision = FL_TRAIN_F32;
        else if (!strcmp(prec, "bf16")) to.precision = FL_TRAIN_BF16;
        else if (!strcmp(prec, "fp16") || !strcmp(prec, "f16")) to.precision = FL_TRAIN_FP16;
        else { fprintf(stderr, "fitllm train: unknown --precision '%s'\n", prec); return 2; }
    }
    if (optim) {
        if (!strcmp(optim, "adamw")) to.optim.kind = FL_OPTIMIZER_ADAMW;
        else if (!strcmp(optim, "adamw8bit")) to.optim.kind = FL_OPTIMIZER_ADAMW8BIT;
        else { fprintf(stderr, "fitllm train: unknown --optim '%s'\n", optim); return 2; }
    }
    const int lora = OPT("lora")->set ? (int)OPT("lora")->i : 0;
    const char *wq = OPT("weights")->str;
    if (wq && (strcasecmp(wq, "nf4") || !lora || !base)) {
        fprintf(stderr, "fitllm train: --weights supports nf4 only, with --lora and -m\n");
        return 2;
    }
    if (to.ctx < 2 || to.batch < 1 || to.grad_accum < 1 || to.steps < 1 || lora < 0 || to.ckpt_every < 0) {
        fprintf(stderr, "fitllm train: -c, --batch, --grad-accum, --steps must be positive\n");
        return 2;
    }
    const bool json = OPT("json")->set, tty = isatty(2) && !json;
    if (json) fl_mem_install_cjson_hooks();

    int rc = 1;
    fl_gguf *g = NULL;
    fl_tokenizer *tok = NULL;
    fl_train_model *m = NULL;
    fl_trainer *t = NULL;
    fl_train_data train = {0}, held = {0};
    fl_status st;
    const char *tok_path = base ? base : OPT("tokenizer")->str;
    if ((st = fl_gguf_open(tok_path, &g)) || (st = fl_tokenizer_new(g, &tok))) goto fail;
    if (base) { /* QLoRA: the base matrices frozen as NF4 as they are read, never whole in f32 */
        if ((st = wq ? fl_train_model_load_gguf_nf4(g, &m) : fl_train_model_load_gguf(g, &m))) goto fail;
    } else {
        fl_train_config cfg;
        if (parse_init(init, fl_tokenizer_n_vocab(tok), &cfg)) {
            fprintf(stderr, "fitllm train: bad --init '%s'\n", init);
            rc = 2;
            goto out;
        }
        if (cfg.n_ctx < to.ctx) cfg.n_ctx = (int32_t)to.ctx;
        if ((st = fl_train_model_new(&cfg, &m))) goto fail;
        fl_train_model_init_random(m, to.seed);
    }
    if (lora) {
        const float alpha = OPT("lora-alpha")->set ? (float)OPT("lora-alpha")->f : 2.0f * (float)lora;
        if ((st = fl_train_model_enable_lora(m, lora, alpha, to.seed))) goto fail;
    }
    /* data */
    double t0 = fl_clock_s();
    const bool raw = OPT("raw")->set;
    const double vfrac = OPT("val-frac")->set ? OPT("val-frac")->f : 0.05;
    if ((st = read_text(train_path, tok, raw, OPT("val")->set ? 0.0 : vfrac, &train, &held))) goto fail;
    if (OPT("val")->set) {
        if ((st = read_text(OPT("val")->str, tok, raw, 0.0, &held, NULL))) goto fail;
    } else if (!raw && (st = fl_train_data_split(&train, vfrac, &held))) {
        goto fail;
    }
    if (OPT("epochs")->set) {
        const double per_step = (double)(to.ctx * to.batch * to.grad_accum);
        to.steps = (int64_t)ceil(OPT("epochs")->f * (double)train.n_ids / per_step);
        if (to.steps < 1) to.steps = 1;
    }
    if (to.warmup >= to.steps) to.warmup = to.steps / 10;
    fprintf(stderr, "train: %lld documents, %lld tokens; held-out: %lld documents, %lld scored tokens (tokenized in %.1f s)\n",
            (long long)train.n_docs, (long long)train.n_ids, (long long)held.n_docs,
            (long long)fl_train_data_n_scored(&held), fl_clock_s() - t0);
    fprintf(stderr, "model: %lld parameters (%d layers, embd %d, ff %d, heads %d/%d, vocab %d)%s%s\n",
            (long long)m->n_full, m->cfg.n_layer, m->cfg.n_embd, m->cfg.n_ff, m->cfg.n_head, m->cfg.n_head_kv,
            m->cfg.n_vocab, lora ? ", LoRA" : "", wq ? " on an NF4 base" : "");
    if ((st = fl_trainer_new(m, &train, &to, &t))) goto fail;
    if (OPT("resume")->set) {
        if ((st = fl_trainer_load(t, OPT("resume")->str))) goto fail;
        fprintf(stderr, "resumed from %s at step %lld\n", OPT("resume")->str, (long long)fl_trainer_step_count(t));
    }
    const int64_t eval_tokens = OPT("eval-tokens")->set ? OPT("eval-tokens")->i : 0;
    const double unigram = fl_train_unigram_loss(&train, &held, m->cfg.n_vocab, eval_tokens);
    const int64_t eval_every = OPT("eval-every")->set ? OPT("eval-every")->i : 0;
    const int64_t save_every = OPT("save-every")->set ? OPT("save-every")->i : 0;
    const char *out = OPT("output")->str;
    char ckpt[1024], lora_path[1024];
    out_paths(out, lora_path, ckpt);
    double l0 = 0;
    if ((st = fl_train_eval(m, &held, to.ctx, to.batch, eval_tokens, &l0, NULL))) goto fail;
    fprintf(stderr, "held-out before: loss %.4f  ppl %.3f   (unigram baseline: loss %.4f  ppl %.3f)\n", l0, exp(l0),
            unigram, exp(unigram));
    if (json)
        printf("{\"event\":\"eval\",\"step\":%lld,\"loss\":%.6f,\"ppl\":%.6f,\"unigram_ppl\":%.6f}\n",
               (long long)fl_trainer_step_count(t), l0, exp(l0), exp(unigram));
    const double tl = OPT("time-limit")->set ? OPT("time-limit")->f : 0.0;
    const double t_start = fl_clock_s();
    double t_last = t_start;
    int64_t tok_window = 0;
    while (fl_trainer_step_count(t) < to.steps) {
        fl_step_stats s;
        if ((st = fl_trainer_step(t, &s))) goto fail;
        const int64_t step = fl_trainer_step_count(t);
        tok_window += s.tokens;
        const double tn = fl_clock_s(), el = tn - t_start;
        const double tps = (double)tok_window / (tn - t_last > 1e-9 ? tn - t_last : 1e-9);
        tok_window = 0;
        t_last = tn;
        const size_t peak = fl_mem_peak_total();
        if (json) {
            /* an fp16 overflow's norm is inf / NaN, which JSON has no number for: null */
            char gn[32];
            if (isfinite(s.grad_norm)) snprintf(gn, sizeof gn, "%.4f", s.grad_norm);
            else snprintf(gn, sizeof gn, "null");
            printf("{\"event\":\"step\",\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%s,\"tokens\":%lld,"
                   "\"tokens_per_s\":%.1f,\"peak_bytes\":%zu,\"skipped\":%s,\"loss_scale\":%g,\"elapsed_s\":%.2f}\n",
                   (long long)step, s.loss, (double)s.lr, gn, (long long)s.tokens, tps, peak,
                   s.skipped ? "true" : "false", (double)s.loss_scale, el);
            fflush(stdout);
        } else if (tty) {
            char pk[32];
            mib(pk, sizeof pk, peak);
            const int w = 30, done = (int)(w * step / to.steps);
            fprintf(stderr, "\r[%.*s%*s] step %lld/%lld  loss %.4f  %.0f tok/s  peak %s%s   ", done,
                    "##############################", w - done, "", (long long)step, (long long)to.steps, s.loss, tps, pk,
                    s.skipped ? "  (skipped: fp16 overflow)" : "");
        } else if (step % 10 == 0 || step == to.steps || step == 1) {
            fprintf(stderr, "step %lld/%lld loss %.4f lr %.3g gnorm %.3f %.0f tok/s peak %.1f MiB%s\n", (long long)step,
                    (long long)to.steps, s.loss, (double)s.lr, s.grad_norm, tps, (double)peak / 1048576.0,
                    s.skipped ? " (skipped: fp16 overflow)" : "");
        }
        if (save_every > 0 && step % save_every == 0 && (st = fl_trainer_save(t, ckpt))) goto fail;
        if (eval_every > 0 && step % eval_every == 0 && step < to.steps) {
            double l;
            if ((st = fl_train_eval(m, &held, to.ctx, to.batch, eval_tokens, &l, NULL))) goto fail;
            if (json) printf("{\"event\":\"eval\",\"step\":%lld,\"loss\":%.6f,\"ppl\":%.6f}\n", (long long)step, l, exp(l));
            else fprintf(stderr, "%sheld-out at step %lld: loss %.4f ppl %.3f\n", tty ? "\n" : "", (long long)step, l, exp(l));
        }
        if (tl > 0 && el >= tl) {
            fprintf(stderr, "%stime limit reached after %lld steps\n", tty ? "\n" : "", (long long)step);
            break;
        }
    }
    if (tty) fprintf(stderr, "\n");
    const double train_s = fl_clock_s() - t_start;
    double l1 = 0;
    if ((st = fl_train_eval(m, &held, to.ctx, to.batch, eval_tokens, &l1, NULL))) goto fail;
    fprintf(stderr, "held-out after %lld steps (%.1f s): loss %.4f  ppl %.3f   (before: ppl %.3f, unigram: ppl %.3f)\n",
            (long long)fl_trainer_step_count(t), train_s, l1, exp(l1), exp(l0), exp(unigram));
    char pk[32];
    mib(pk, sizeof pk, fl_mem_peak_total());
    fprintf(stderr, "peak memory %s (weights %.1f MiB, grads %.1f MiB, optimizer %.1f MiB, activations %.1f MiB)\n", pk,
            (double)fl_mem_peak(FL_MEM_WEIGHTS) / 1048576.0, (double)fl_mem_peak(FL_MEM_GRAD) / 1048576.0,
            (double)fl_mem_peak(FL_MEM_OPTIM) / 1048576.0, (double)fl_mem_peak(FL_MEM_ACT) / 1048576.0);
    if (json) {
        printf("{\"event\":\"done\",\"steps\":%lld,\"train_s\":%.2f,\"loss_before\":%.6f,\"ppl_before\":%.6f,"
               "\"loss_after\":%.6f,\"ppl_after\":%.6f,\"unigram_ppl\":%.6f,\"peak_bytes\":%zu,\"act_peak_bytes\":%zu,"
               "\"optim_bytes\":%zu,\"peak_by_category\":{",
               (long long)fl_trainer_step_count(t), train_s, l0, exp(l0), l1, exp(l1), exp(unigram),
               fl_mem_peak_total(), fl_mem_peak(FL_MEM_ACT), fl_optim_state_bytes(fl_trainer_optim(t)));
        /* each category's peak (this rank's), beside `fitllm plan --train`'s prediction */
        for (int c = 0; c < FL_MEM_COUNT; c++)
            printf("%s\"%s\":%zu", c ? "," : "", fl_mem_cat_name((fl_mem_cat)c), fl_mem_peak((fl_mem_cat)c));
        printf("}}\n");
    }
    if (save_every > 0 && (st = fl_trainer_save(t, ckpt))) goto fail;
    if (out && zrank == 0) {
        if (lora) { /* the adapters first: what the run learned is on disk whatever the export meets */
            if ((st = fl_train_model_save_lora(m, lora_path))) goto fail;
            fprintf(stderr, "wrote %s (adapters)\n", lora_path);
        }
        if ((st = fl_train_model_save_gguf(m, out, g))) goto fail;
        fprintf(stderr, "wrote %s\n", out);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "fitllm train: %s\n", fl_last_error());
out:
    fl_trainer_free(t);
    fl_train_data_free(&train);
    fl_train_data_free(&held);
    fl_train_model_free(m);
    fl_tokenizer_free(tok);
    fl_gguf_free(g);
    fl_comm_free(comm);
    return rc;
#undef OPT
}
