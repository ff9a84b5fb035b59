/* `fitllm perplexity`: llama.cpp's perplexity method, and KL divergence against a saved run.
 *
 * The text is tokenized with BOS and cut into chunks of n_ctx tokens; each chunk is evaluated
 * from an empty cache with BOS written over its first token, and only the second half of the
 * chunk is scored: logits at positions j in [n_ctx/2, n_ctx - 1) predict token j + 1.
 * PPL = exp(mean NLL); the +/- is exp(mean) x the standard error of the mean NLL.
 *
 * --kl-base FILE: if FILE does not exist, the log-probabilities of every scored position are
 * saved there (header: magic "FLKL", u32 n_vocab, u32 n_ctx, u32 n_chunk; then f32 rows);
 * if it exists, this run is compared with it: KL(base || this) per position (mean, p99, max)
 * and the rate at which both runs pick the same top token. */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "cli/cli_kv.h"
#include "model/llama.h"
#include "model/tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* log-softmax of x[n] into lp (double accumulation). */
static void log_softmax(const float *x, float *lp, int32_t n) {
    float mx = x[0];
    for (int32_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    const double lse = mx + log(sum);
    for (int32_t i = 0; i < n; i++) lp[i] = (float)((double)x[i] - lse);
}

int fl_cmd_perplexity(int argc, char **argv) {
    fl_opt opts[] = {
        {"model", 'm', FL_OPT_STR, "MODEL  GGUF model file"},
        {"file", 'f', FL_OPT_STR, "FILE  text to score"},
        {"ctx-size", 'c', FL_OPT_INT, "CTX  chunk length (default 512)"},
        {"batch-size", 'b', FL_OPT_INT, "N  tokens per forward step (default CTX)"},
        {"chunks", 0, FL_OPT_INT, "N  score only the first N chunks"},
        {"threads", 't', FL_OPT_INT, "N  threads (default: all cores)"},
        {"kl-base", 0, FL_OPT_STR, "FILE  save log-probs to FILE, or compare with it if it exists (KL divergence)"},
        {"json", 0, FL_OPT_FLAG, "print one JSON object"},
        FL_CLI_KV_OPTS,
        {"no-mmap", 0, FL_OPT_FLAG, "read the model file into memory (huge pages where the kernel grants them) instead of mapping it"},
        {"no-repack", 0, FL_OPT_FLAG, "keep the weights as in the file (by default Q4_0 / Q8_0 matrices are rewritten in place in groups of 8 rows for the kernels, and on AVX-512 without AMX Q4_K / Q5_K / Q6_K / Q3_K / Q2_K / Q4_1 / Q5_0 / Q5_1 / IQ4_NL in groups of 16)"},
        FL_CLI_LORA_OPTS,
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm perplexity -m MODEL -f TEXT [-c CTX] [-b BATCH] [--chunks N] [--kv-type T] [--json]",
                          "Perplexity of MODEL on TEXT with llama.cpp's method (chunks of CTX tokens from an\n"
                          "empty cache, BOS over each chunk's first token, second half of each chunk scored).",
                          NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    const fl_opt *o_model = fl_args_get(opts, "model"), *o_file = fl_args_get(opts, "file");
    if (!o_model->set || !o_file->set) {
        fprintf(stderr, "fitllm perplexity: -m MODEL and -f TEXT are required\n");
        return 2;
    }
    const int64_t n_ctx = fl_args_get(opts, "ctx-size")->set ? fl_args_get(opts, "ctx-size")->i : 512;
    const int64_t n_batch = fl_args_get(opts, "batch-size")->set ? fl_args_get(opts, "batch-size")->i : n_ctx;
    if (n_ctx < 4 || n_ctx > (1 << 20) || n_batch < 1) {
        fprintf(stderr, "fitllm perplexity: need CTX >= 4 and BATCH >= 1\n");
        return 2;
    }
    const bool json = fl_args_get(opts, "json")->set;
    const char *kl_path = fl_args_get(opts, "kl-base")->str;
    fl_threads_set(fl_args_get(opts, "threads")->set ? (int)fl_args_get(opts, "threads")->i : 0);

    int rc = 1;
    fl_status st;
    size_t text_len = 0, logits_bytes = 0, lp_bytes = 0, nll_bytes = 0, aux_bytes = 0;
    unsigned char *aux = NULL; /* pos [bsz] i32, seq [bsz] i32, want [bsz] i8 */
    char *text = NULL;
    fl_model *m = NULL;
    fl_tokenizer *tok = NULL;
    fl_cli_kv kv = {0};
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    float *logits = NULL, *lp = NULL, *lp_base = NULL;
    double *kls = NULL;
    FILE *kf = NULL;
    bool kl_compare = false;

    if (!(text = fl_cli_read_file(o_file->str, &text_len))) goto fail;
    fl_model_params mp = fl_model_default_params();
    mp.no_mmap = fl_args_get(opts, "no-mmap")->set;
    mp.repack = !fl_args_get(opts, "no-repack")->set;
    const char *lora;
    float lora_scale;
    fl_cli_lora_params(opts, &lora, &lora_scale, &mp);
    if ((st = fl_model_load(o_model->str, &mp, &m))) goto fail;
    const fl_hparams *hp = fl_model_hparams(m);
    const int32_t V = hp->n_vocab;
    if ((st = fl_tokenizer_new(fl_model_gguf(m), &tok))) goto fail;
    if ((st = fl_cli_tokenize(tok, text, text_len, &ids, &n_ids))) goto fail;
    int64_t n_chunk = n_ids / n_ctx;
    if (fl_args_get(opts, "chunks")->set && fl_args_get(opts, "chunks")->i < n_chunk)
        n_chunk = fl_args_get(opts, "chunks")->i;
    if (n_chunk < 1) {
        fl_set_error(FL_ERR_INVALID, "the text has %lld tokens, fewer than one chunk of %lld", (long long)n_ids,
                     (long long)n_ctx);
        goto fail;
    }
    const int32_t bsz = (int32_t)(n_batch < n_ctx ? n_batch : n_ctx);
    const int64_t first = n_ctx / 2;
    if ((st = fl_cli_kv_new(hp, fl_args_get(opts, "kv-layout")->str, fl_args_get(opts, "kv-type")->str,
                            fl_args_get(opts, "block-size")->set ? fl_args_get(opts, "block-size")->i : 0, (int32_t)n_ctx,
                            &kv)))
        goto fail;
    if ((st = fl_model_workspace_new(m, bsz, bsz))) goto fail;
    logits_bytes = (size_t)bsz * (size_t)V * sizeof(float);
    lp_bytes = 2 * (size_t)V * sizeof(float);
    const int64_t n_scored_total = n_chunk * (n_ctx - 1 - first);
    nll_bytes = kl_path ? (size_t)n_scored_total * sizeof(double) : 0;
    logits = fl_alloc(FL_MEM_ACT, logits_bytes, 64);
    lp = fl_alloc(FL_MEM_SCRATCH, lp_bytes, 64);
    aux_bytes = (size_t)bsz * 9;
    aux = fl_alloc(FL_MEM_SCRATCH, aux_bytes, 64);
    if (!logits || !lp || !aux) goto fail;
    lp_base = lp + V;
    if (kl_path) {
        kl_compare = access(kl_path, F_OK) == 0;
        kf = fopen(kl_path, kl_compare ? "rb" : "wb");
        if (!kf) {
            fl_set_error(FL_ERR_IO, "cannot open %s", kl_path);
            goto fail;
        }
        uint32_t hdr[4] = {0x4C4B4C46u /* "FLKL" */, (uint32_t)V, (uint32_t)n_ctx, (uint32_t)n_chunk};
        if (kl_compare) {
            uint32_t h[4];
            if (fread(h, sizeof h, 1, kf) != 1 || h[0] != hdr[0] || h[1] != hdr[1] || h[2] != hdr[2] || h[3] < hdr[3]) {
                fl_set_error(FL_ERR_FORMAT, "%s: not a KL base for n_vocab %d, n_ctx %lld, >= %lld chunks", kl_path, V,
                             (long long)n_ctx, (long long)n_chunk);
                goto fail;
            }
            kls = fl_alloc(FL_MEM_MISC, nll_bytes, 64);
            if (!kls) goto fail;
        } else if (fwrite(hdr, sizeof hdr, 1, kf) != 1) {
            fl_set_error(FL_ERR_IO, "cannot write %s", kl_path);
            goto fail;
        }
    }

    double nll = 0, nll2 = 0, kl_sum = 0;
    int64_t count = 0, same_top = 0;
    int32_t *pos = (int32_t *)aux, *seq = pos + bsz;
    int8_t *want = (int8_t *)(seq + bsz);
    memset(seq, 0, (size_t)bsz * sizeof *seq);
    for (int64_t c = 0; c < n_chunk; c++) {
        const int64_t start = c * n_ctx;
        fl_cli_kv_reset(&kv);
        const int32_t saved = ids[start];
        ids[start] = fl_tokenizer_bos(tok) >= 0 ? fl_tokenizer_bos(tok) : saved;
        for (int64_t b0 = 0; b0 < n_ctx; b0 += bsz) {
            const int32_t n = (int32_t)(n_ctx - b0 < bsz ? n_ctx - b0 : bsz);
            for (int32_t j = 0; j < n; j++) {
                pos[j] = (int32_t)(b0 + j);
                want[j] = b0 + j >= first && b0 + j < n_ctx - 1;
            }
            fl_batch b = {n, ids + start + b0, pos, seq, want};
            if (fl_batch_n_logits(&b) == 0) want[n - 1] = 1; /* keep the step well formed; row unused */
            if ((st = fl_model_forward(m, &b, &kv.iface, kv.ctx, logits))) {
                ids[start] = saved;
                goto fail;
            }
            int32_t row = 0;
            for (int32_t j = 0; j < n; j++) {
                if (!want[j]) continue;
                const int64_t p = b0 + j;
                const float *lg = logits + (size_t)row++ * (size_t)V;
                if (!(p >= first && p < n_ctx - 1)) continue;
                log_softmax(lg, lp, V);
                const double l = -(double)lp[ids[start + p + 1]];
                nll += l;
                nll2 += l * l;
                if (kf && !kl_compare && fwrite(lp, sizeof(float), (size_t)V, kf) != (size_t)V) {
                    fl_set_error(FL_ERR_IO, "cannot write %s", kl_path);
                    ids[start] = saved;
                    goto fail;
                }
                if (kl_compare) {
                    if (fread(lp_base, sizeof(float), (size_t)V, kf) != (size_t)V) {
                        fl_set_error(FL_ERR_FORMAT, "%s: truncated", kl_path);
                        ids[start] = saved;
                        goto fail;
                    }
                    double kl = 0;
                    int32_t tb = 0, tc = 0;
                    for (int32_t v = 0; v < V; v++)
                        if (!(lp_base[v] <= 1e-3f) || isinf(lp_base[v])) { /* a log-probability is finite and <= 0 (NaN fails <=) */
                            fl_set_error(FL_ERR_FORMAT, "%s: position %lld holds %g for token %d, not a log-probability", kl_path,
                                         (long long)count, (double)lp_base[v], v);
                            ids[start] = saved;
                            goto fail;
                        }
                    for (int32_t v = 0; v < V; v++) {
                        kl += exp((double)lp_base[v]) * ((double)lp_base[v] - lp[v]);
                        if (lp_base[v] > lp_base[tb]) tb = v;
                        if (lp[v] > lp[tc]) tc = v;
                    }
                    kls[count] = kl;
                    kl_sum += kl;
                    same_top += tb == tc;
                }
                count++;
            }
        }
        ids[start] = saved;
        if (!json && (c + 1) % 100 == 0) fprintf(stderr, "[%lld/%lld] PPL so far %.4f\n", (long long)(c + 1),
                                                  (long long)n_chunk, exp(nll / (double)count));
    }
    const double mean = nll / (double)count;
    const double var = nll2 / (double)count - mean * mean;
    const double ppl = exp(mean);
    const double err = var > 0 && count > 1 ? ppl * sqrt(var / (double)(count - 1)) : 0.0;
    double kl_p99 = 0, kl_max = 0;
    if (kl_compare) {
        qsort(kls, (size_t)count, sizeof *kls, cmp_double);
        kl_p99 = kls[(size_t)((double)(count - 1) * 0.99)];
        kl_max = kls[count - 1];
    }
    if (json) {
        fl_mem_install_cjson_hooks();
        const size_t fail0 = fl_mem_thread_failures();
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "ppl", ppl);
        cJSON_AddNumberToObject(o, "ppl_err", err);
        cJSON_AddNumberToObject(o, "n_ctx", (double)n_ctx);
        cJSON_AddNumberToObject(o, "n_chunk", (double)n_chunk);
        cJSON_AddNumberToObject(o, "n_tokens", (double)n_ids);
        cJSON_AddNumberToObject(o, "n_scored", (double)count);
        cJSON_AddStringToObject(o, "kv_layout", kv.paged ? "paged" : "contiguous");
        cJSON_AddStringToObject(o, "kv_type", fl_type_name(kv.type));
        cJSON_AddNumberToObject(o, "kv_bytes_per_token", fl_cli_kv_bytes_per_token(&kv, hp));
        if (kl_compare) {
            cJSON *k = cJSON_AddObjectToObject(o, "kl");
            cJSON_AddNumberToObject(k, "mean", kl_sum / (double)count);
            cJSON_AddNumberToObject(k, "p99", kl_p99);
            cJSON_AddNumberToObject(k, "max", kl_max);
            cJSON_AddNumberToObject(k, "same_top", (double)same_top / (double)count);
        }
        if (fl_cli_print_json_with_memory(NULL, o, fail0)) goto fail;
    } else {
        printf("%lld tokens, %lld chunks of %lld, %lld scored\n", (long long)n_ids, (long long)n_chunk,
               (long long)n_ctx, (long long)count);
        printf("KV: %s %s, %.0f bytes/token\n", kv.paged ? "paged" : "contiguous", fl_type_name(kv.type),
               fl_cli_kv_bytes_per_token(&kv, hp));
        printf("PPL = %.4f +/- %.4f\n", ppl, err);
        if (kl_compare)
            printf("KL divergence vs %s: mean %.6f, p99 %.6f, max %.6f; same top token %.4f\n", kl_path,
                   kl_sum / (double)count, kl_p99, kl_max, (double)same_top / (double)count);
        else if (kl_path)
            printf("saved log-probs of %lld positions to %s\n", (long long)count, kl_path);
        fl_mem_report(stderr);
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "fitllm perplexity: %s\n", fl_last_error()[0] ? fl_last_error() : "failed");
    if (kf) fclose(kf);
    fl_free(FL_MEM_MISC, kls, nll_bytes);
    fl_free(FL_MEM_SCRATCH, lp, lp_bytes);
    fl_free(FL_MEM_SCRATCH, aux, aux_bytes);
    fl_free(FL_MEM_ACT, logits, logits_bytes);
    fl_cli_kv_free(&kv);
    if (ids) fl_free(FL_MEM_MISC, ids, (size_t)(n_ids + 1) * sizeof(int32_t));
    fl_tokenizer_free(tok);
    fl_model_free(m);
    if (text) fl_free(FL_MEM_MISC, text, text_len + 1);
    return rc;
}
