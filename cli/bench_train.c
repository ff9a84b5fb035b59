/* `fitllm bench train [--json] [--svg PATH]`: activation memory and step time of a synthetic
 * model with activation checkpointing every 1, 2, 4 layers and without; fp32 vs 8-bit AdamW
 * state bytes; the planner's training prediction vs the measured peak. */
#include "cli/bench_train.h"
#include "core/clock.h"
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "train/model.h"
#include "train/optim.h"
#include "train/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU seconds of the process (all threads): the work done, not the waiting for a shared CPU */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct run_result {
    int k;
    size_t act_peak, scratch_peak, grad_peak, weights_peak, optim_peak, total_peak;
    double step_s, step_cpu_s;
    uint64_t plan[FL_MEM_COUNT], plan_total;
    int have_plan;
} run_result;

/* One configuration: build, warm up one step, time `steps` steps (forward, backward, AdamW). */
static fl_status run_one(const fl_train_config *cfg, int64_t ctx, int64_t batch, int k, int steps, int optim8, int lora,
                         int nf4, run_result *r) {
    fl_mem_reset_peaks();
    fl_train_model *m = NULL;
    fl_optim *o = NULL;
    const int64_t N = ctx * batch;
    const size_t ib = (size_t)N * sizeof(int32_t);
    int32_t *tok = fl_alloc(FL_MEM_MISC, ib, 64), *tgt = fl_alloc(FL_MEM_MISC, ib, 64),
            *pos = fl_alloc(FL_MEM_MISC, ib, 64), *cu = fl_alloc(FL_MEM_MISC, (size_t)(batch + 1) * 4, 64);
    fl_status st = (!tok || !tgt || !pos || !cu) ? FL_ERR_NOMEM : FL_OK;
    if (!st) st = fl_train_model_new(cfg, &m);
    if (st) goto done;
    fl_train_model_init_random(m, 42);
    if (lora) { /* LoRA on a frozen base; QLoRA's base quantized here (its f32 copy is setup, not training state) */
        if ((st = fl_train_model_enable_lora(m, lora, 2.0f * (float)lora, 42))) goto done;
        if (nf4 && (st = fl_train_model_quantize_base_nf4(m))) goto done;
        fl_mem_reset_peaks();
    }
    if ((st = fl_train_model_reserve(m, N, k, FL_TRAIN_F32))) goto done;
    float *tp, *tg;
    int64_t n_train;
    fl_train_model_trainable(m, &tp, &tg, &n_train);
    fl_optimizer_config oc = fl_optim_default();
    oc.kind = optim8 ? FL_OPTIMIZER_ADAMW8BIT : FL_OPTIMIZER_ADAMW;
    if ((st = fl_optim_new(&oc, n_train, NULL, -1, &o))) goto done;
    fl_rng rng = {7};
    for (int64_t i = 0; i < N; i++) tok[i] = (int32_t)(fl_rng_u64(&rng) % (uint64_t)cfg->n_vocab);
    for (int64_t b = 0; b <= batch; b++) cu[b] = (int32_t)(b * ctx);
    for (int64_t i = 0; i < N; i++) {
        pos[i] = (int32_t)(i % ctx);
        tgt[i] = (i + 1) % ctx ? tok[i + 1] : -1;
    }
    fl_train_batch bt = {tok, tgt, pos, cu, N, (int32_t)batch};
    double t0 = 0, c0 = 0;
    for (int s = 0; s <= steps; s++) {
        if (s == 1) {
            t0 = fl_clock_s();
            c0 = cpu_s();
        }
        double loss;
        int64_t n;
        fl_train_model_zero_grad(m);
        if ((st = fl_train_model_forward(m, &bt, &loss, &n))) goto done;
        if ((st = fl_train_model_backward(m, &bt, 1.0f / (float)n))) goto done;
        fl_optim_step(o, tp, m->grads, 1e-4f);
    }
    r->step_s = (fl_clock_s() - t0) / steps;
    r->step_cpu_s = (cpu_s() - c0) / steps;
    r->k = k;
    r->act_peak = fl_mem_peak(FL_MEM_ACT);
    r->scratch_peak = fl_mem_peak(FL_MEM_SCRATCH);
    r->grad_peak = fl_mem_peak(FL_MEM_GRAD);
    r->weights_peak = fl_mem_peak(FL_MEM_WEIGHTS);
    r->optim_peak = fl_mem_peak(FL_MEM_OPTIM);
    r->total_peak = fl_mem_peak_total();
done:
    fl_optim_free(o);
    fl_train_model_free(m);
    fl_free(FL_MEM_MISC, tok, ib);
    fl_free(FL_MEM_MISC, tgt, ib);
    fl_free(FL_MEM_MISC, pos, ib);
    fl_free(FL_MEM_MISC, cu, (size_t)(batch + 1) * 4);
    return st;
}

static void write_svg(const char *path, const run_result *r, int n, const fl_train_config *c, int64_t ctx) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "fitllm bench train: cannot write %s\n", path);
        return;
    }
    double mx = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, (double)r[i].act_peak / 1048576.0);
    const int W = 560, H = 360, x0 = 70, y0 = 300, bw = 80;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">Peak activation memory vs checkpoint interval k "
               "(%d layers, embd %d, ctx %lld)</text>\n", 20, c->n_layer, c->n_embd, (long long)ctx);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", x0, y0, W - 20, y0);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", x0, y0, x0, 40);
    for (int t = 0; t <= 4; t++) {
        const double v = mx * t / 4;
        const int y = y0 - (int)(240.0 * t / 4);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.0f MiB</text>\n", x0 - 5, y + 4, v);
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>\n", x0, y, W - 20, y);
    }
    for (int i = 0; i < n; i++) {
        const double v = (double)r[i].act_peak / 1048576.0;
        const int h = mx > 0 ? (int)(240.0 * v / mx) : 0, x = x0 + 30 + i * (bw + 40);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#4a7bb7\"/>\n", x, y0 - h, bw, h);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%.1f MiB, %.2f s</text>\n", x + bw / 2, y0 - h - 6, v,
                r[i].step_s);
        if (r[i].k == 0) fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">no ckpt</text>\n", x + bw / 2, y0 + 16);
        else fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">k = %d</text>\n", x + bw / 2, y0 + 16, r[i].k);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\">labels: peak FL_MEM_ACT, seconds per training step</text>\n", x0, y0 + 40);
    fprintf(f, "</svg>\n");
    fclose(f);
}

int fl_bench_train(int argc, char **argv) {
    fl_opt opts[] = {
        {"layers", 0, FL_OPT_INT, "L  layers of the synthetic model (default 8)"},
        {"embd", 0, FL_OPT_INT, "C  embedding width (default 256)"},
        {"ff", 0, FL_OPT_INT, "F  feed-forward width (default 1024)"},
        {"heads", 0, FL_OPT_INT, "H  attention heads (default 8)"},
        {"kv-heads", 0, FL_OPT_INT, "K  key/value heads (default = heads)"},
        {"vocab", 0, FL_OPT_INT, "V  vocabulary (default 512)"},
        {"ctx-size", 'c', FL_OPT_INT, "CTX  tokens per row (default 1024)"},
        {"batch", 0, FL_OPT_INT, "B  rows per step (default 1)"},
        {"steps", 0, FL_OPT_INT, "N  timed steps per configuration and round, after one warm-up (default 1)"},
        {"rounds", 0, FL_OPT_INT, "R  rounds over all configurations; the fastest round counts (default 3: robust to a shared host)"},
        {"threads", 't', FL_OPT_INT, "N  threads (default all cores)"},
        {"lora", 0, FL_OPT_INT, "R  LoRA adapters of rank R on a frozen base (train --lora R)"},
        {"nf4", 0, FL_OPT_FLAG, "with --lora: the base in NF4 (QLoRA, train --weights nf4)"},
        {"svg", 0, FL_OPT_STR, "PATH  write a plot of activation memory vs k"},
        {"json", 0, FL_OPT_FLAG, "print one JSON object"},
        {0},
    };
    int n_pos;
    int rc = fl_args_parse(argc, argv, opts, "fitllm bench train [--json] [--svg PATH] [shape options]",
                           "Training memory/time with activation checkpointing every 1, 2, 4 layers and without,\n"
                           "fp32 vs 8-bit AdamW state bytes, and the planner's prediction vs the measured peak.",
                           NULL, 0, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
#define OPTI(name, d) (fl_args_get(opts, name)->set ? fl_args_get(opts, name)->i : (d))
    fl_train_config c = {.n_vocab = (int32_t)OPTI("vocab", 512), .n_embd = (int32_t)OPTI("embd", 256),
                         .n_layer = (int32_t)OPTI("layers", 8), .n_head = (int32_t)OPTI("heads", 8),
                         .n_ff = (int32_t)OPTI("ff", 1024), .rope_base = 10000.0f, .rms_eps = 1e-5f};
    c.n_head_kv = (int32_t)OPTI("kv-heads", c.n_head);
    const int64_t ctx = OPTI("ctx-size", 1024), batch = OPTI("batch", 1);
    const int steps = (int)OPTI("steps", 1), rounds = (int)OPTI("rounds", 3);
    const int lora = (int)OPTI("lora", 0), nf4 = fl_args_get(opts, "nf4")->set;
    if (lora < 0 || (nf4 && !lora)) {
        fprintf(stderr, "fitllm bench train: --lora takes a rank >= 1; --nf4 needs --lora\n");
        return 2;
    }
    c.n_ctx = (int32_t)ctx;
    if (fl_args_get(opts, "threads")->set) fl_threads_set((int)fl_args_get(opts, "threads")->i);
    if (c.n_head <= 0 || c.n_embd % c.n_head || ctx < 2 || batch < 1 || steps < 1 || rounds < 1) {
        fprintf(stderr, "fitllm bench train: bad shape\n");
        return 2;
    }
    c.head_dim = c.n_embd / c.n_head;
    c.rope_dim = c.head_dim;
    if (fl_train_config_check(&c) != FL_OK) {
        fprintf(stderr, "fitllm bench train: %s\n", fl_last_error());
        return 2;
    }
    const int ks[4] = {0, 1, 2, 4};
    run_result res[4];
    memset(res, 0, sizeof res);
    /* configurations interleaved round by round; each keeps its fastest round (the memory
     * figures are the same every round) */
    for (int round = 0; round < rounds; round++)
        for (int i = 0; i < 4; i++) {
            run_result rr;
            memset(&rr, 0, sizeof rr);
            fl_status st = run_one(&c, ctx, batch, ks[i], steps, 0, lora, nf4, &rr);
            if (st) {
                fprintf(stderr, "fitllm bench train: %s\n", fl_last_error());
                return 1;
            }
            if (round == 0) res[i] = rr;
            res[i].step_s = fmin(res[i].step_s, rr.step_s);
            res[i].step_cpu_s = fmin(res[i].step_cpu_s, rr.step_cpu_s);
            if (!fl_args_get(opts, "json")->set)
                fprintf(stderr, "round %d k=%d: act peak %.1f MiB, step %.3f s wall, %.3f s cpu\n", round, ks[i],
                        (double)rr.act_peak / 1048576.0, rr.step_s, rr.step_cpu_s);
        }
    for (int i = 0; i < 4; i++) {
        fl_bench_train_shape bs = {c.n_vocab, c.n_embd, c.n_ff, c.n_layer, c.n_head, c.n_head_kv, c.head_dim, ctx,
                                   batch, ks[i], 0, fl_threads_get(), lora, nf4};
        res[i].have_plan = fl_bench_train_plan(&bs, res[i].plan, &res[i].plan_total) == 0;
    }
    /* optimizer states: fp32 vs 8-bit for this model */
    int64_t n_params;
    {
        fl_train_model *m;
        if (fl_train_model_new(&c, &m) != FL_OK) return 1;
        n_params = m->n_params;
        fl_train_model_free(m);
    }
    size_t ob[2];
    for (int q = 0; q < 2; q++) {
        fl_optimizer_config oc = fl_optim_default();
        oc.kind = q ? FL_OPTIMIZER_ADAMW8BIT : FL_OPTIMIZER_ADAMW;
        fl_optim *o;
        fl_mem_reset_peaks();
        if (fl_optim_new(&oc, n_params, NULL, -1, &o) != FL_OK) return 1;
        ob[q] = fl_mem_peak(FL_MEM_OPTIM);
        fl_optim_free(o);
    }
    const double red = (double)res[0].act_peak / (double)res[1].act_peak;
    const double ovh = res[1].step_s / res[0].step_s - 1.0, ovh_cpu = res[1].step_cpu_s / res[0].step_cpu_s - 1.0;
    if (fl_args_get(opts, "svg")->set) write_svg(fl_args_get(opts, "svg")->str, res, 4, &c, ctx);
    printf("{\"bench\":\"train\",\"lora_rank\":%d,\"lora_nf4\":%s,\"rounds\":%d,\"threads\":%d,\"shape\":{\"n_layer\":%d,\"n_embd\":%d,\"n_ff\":%d,\"n_head\":%d,"
           "\"n_head_kv\":%d,\"n_vocab\":%d,\"ctx\":%lld,\"batch\":%lld,\"n_params\":%lld},\"configs\":[",
           lora, nf4 ? "true" : "false", rounds, fl_threads_get(), c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_head_kv, c.n_vocab, (long long)ctx,
           (long long)batch, (long long)n_params);
    for (int i = 0; i < 4; i++) {
        const run_result *r = &res[i];
        const double err = r->have_plan ? ((double)r->plan_total - (double)r->total_peak) / (double)r->total_peak : 0;
        printf("%s{\"ckpt_every\":%d,\"step_s\":%.4f,\"step_cpu_s\":%.4f,\"act_peak_bytes\":%zu,\"scratch_peak_bytes\":%zu,"
               "\"weights_bytes\":%zu,\"grad_bytes\":%zu,\"optim_bytes\":%zu,\"peak_total_bytes\":%zu,"
               "\"plan_act_bytes\":%llu,\"plan_scratch_bytes\":%llu,\"plan_total_bytes\":%llu,\"plan_rel_err\":%.4f}",
               i ? "," : "", r->k, r->step_s, r->step_cpu_s, r->act_peak, r->scratch_peak, r->weights_peak, r->grad_peak,
               r->optim_peak, r->total_peak, (unsigned long long)r->plan[FL_MEM_ACT],
               (unsigned long long)r->plan[FL_MEM_SCRATCH], (unsigned long long)r->plan_total, err);
    }
    printf("],\"act_reduction_k1\":%.3f,\"time_overhead_k1\":%.3f,\"cpu_overhead_k1\":%.3f,\"goal_met\":%s,"
           "\"optim\":{\"adamw_bytes\":%zu,\"adamw8bit_bytes\":%zu,\"ratio\":%.3f}}\n",
           red, ovh, ovh_cpu, red >= 4.0 && ovh_cpu <= 0.40 ? "true" : "false", ob[0], ob[1], (double)ob[0] / (double)ob[1]);
#undef OPTI
    return 0;
}
