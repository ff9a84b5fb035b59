/* `fitllm bench tokenize`: tokenizer throughput on a text file, as JSON.
 *   fitllm bench tokenize -m VOCAB.gguf -f TEXT [--repeat N] [--special]
 * or, for GPT-2 style files, --encoder encoder.json --merges vocab.bpe --pre KIND.
 * Prints {"vocab":..., "bytes":..., "tokens":..., "tokenize_s":..., "mb_per_s":...,
 * "detokenize_s":..., "roundtrip":..., "roundtrip_pieces":..., "peak_scratch_bytes":...}.
 * roundtrip: fl_detokenize gives the text back (BPE vocabs with clean_spaces rewrite " ," etc.,
 * so it can be false there); roundtrip_pieces: the concatenated pieces give it back. */
#include "cli/cli.h"
#include "core/clock.h"
#include "core/alloc.h"
#include "core/status.h"
#include "formats/gguf.h"
#include "model/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? fl_alloc(FL_MEM_MISC, (size_t)n + 1, 0) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        fl_free(FL_MEM_MISC, b, (size_t)n + 1);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = 0;
        *len = (size_t)n;
    }
    return b;
}

int fl_bench_tokenize(int argc, char **argv) {
    fl_opt opts[] = {
        {"model", 'm', FL_OPT_STR, "GGUF  file with tokenizer.ggml.* metadata"},
        {"file", 'f', FL_OPT_STR, "TEXT  text file to tokenize (required)"},
        {"encoder", 0, FL_OPT_STR, "JSON  GPT-2 style encoder.json (instead of -m)"},
        {"merges", 0, FL_OPT_STR, "BPE  GPT-2 style merges file (with --encoder)"},
        {"pre", 0, FL_OPT_STR, "KIND  pre-tokenizer for --encoder (default llama-bpe)"},
        {"repeat", 'r', FL_OPT_INT, "N  runs; the best time is reported (default 1)"},
        {"special", 0, FL_OPT_FLAG, "parse special-token texts"},
        {NULL, 0, 0, NULL},
    };
    const char *pos[1];
    int n_pos = 0;
    int rc = fl_args_parse(argc, argv, opts, "fitllm bench tokenize (-m VOCAB.gguf | --encoder J --merges M) -f TEXT",
                           "Tokenizer speed on a text file (JSON).", pos, 0, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    fl_opt *m = fl_args_get(opts, "model"), *f = fl_args_get(opts, "file"), *enc = fl_args_get(opts, "encoder");
    fl_opt *mer = fl_args_get(opts, "merges"), *pre = fl_args_get(opts, "pre"), *rep = fl_args_get(opts, "repeat");
    bool special = fl_args_get(opts, "special")->set;
    if (!f->set || (!m->set && !(enc->set && mer->set))) {
        fprintf(stderr, "fitllm bench tokenize: need -f TEXT and -m VOCAB.gguf (or --encoder and --merges)\n");
        return 2;
    }
    int repeat = rep->set ? (int)rep->i : 1;
    if (repeat < 1) repeat = 1;
    fl_tokenizer *t = NULL;
    fl_status st;
    if (m->set) {
        fl_gguf *g = NULL;
        st = fl_gguf_open(m->str, &g);
        if (!st) st = fl_tokenizer_new(g, &t);
        fl_gguf_free(g);
    } else {
        st = fl_tokenizer_new_bpe_files(enc->str, mer->str, pre->set ? pre->str : "llama-bpe", &t);
    }
    if (st) {
        fprintf(stderr, "fitllm bench tokenize: %s\n", fl_last_error());
        return 1;
    }
    size_t len = 0;
    char *text = slurp(f->str, &len);
    if (!text) {
        fprintf(stderr, "fitllm bench tokenize: cannot read '%s'\n", f->str);
        fl_tokenizer_free(t);
        return 1;
    }
    int64_t cap = (int64_t)len + 16, n = 0;
    int32_t *ids = fl_alloc(FL_MEM_MISC, (size_t)cap * sizeof(int32_t), 0);
    char *back = fl_alloc(FL_MEM_MISC, len + 16, 0);
    double best = 1e30, best_d = 1e30;
    int64_t dl = -1;
    fl_mem_reset_peaks();
    for (int r = 0; r < repeat && ids && back && !st; r++) {
        double t0 = fl_clock_s();
        st = fl_tokenize(t, text, len, false, special, ids, cap, &n);
        double t1 = fl_clock_s();
        if (!st && n > cap) { /* more ids than bytes (a vocabulary without "▁", say): again at its size */
            fl_free(FL_MEM_MISC, ids, (size_t)cap * sizeof(int32_t));
            cap = n;
            ids = fl_alloc(FL_MEM_MISC, (size_t)cap * sizeof(int32_t), 0);
            r--;
            continue;
        }
        if (!st) dl = fl_detokenize(t, ids, n, back, (int64_t)len + 16, true, special);
        double t2 = fl_clock_s();
        if (t1 - t0 < best) best = t1 - t0;
        if (t2 - t1 < best_d) best_d = t2 - t1;
    }
    int ret = 0;
    if (!ids || !back || st) {
        fprintf(stderr, "fitllm bench tokenize: %s\n", fl_last_error());
        ret = 1;
    } else {
        bool rt = dl == (int64_t)len && memcmp(back, text, len) == 0;
        /* the pieces alone (no SPM prefix-space removal, no clean_spaces) */
        size_t pl = 0;
        bool rt_pieces = true;
        char piece[1024];
        for (int64_t i = 0; i < n && rt_pieces; i++) {
            int32_t k = fl_token_to_piece(t, ids[i], piece, sizeof piece, special);
            const char *p = piece;
            if (i == 0 && !strcmp(fl_tokenizer_kind(t), "llama") && k > 0 && piece[0] == ' ') p++, k--;
            rt_pieces = k >= 0 && pl + (size_t)k <= len && memcmp(text + pl, p, (size_t)k) == 0;
            pl += (size_t)(k > 0 ? k : 0);
        }
        rt_pieces = rt_pieces && pl == len;
        printf("{\"vocab\":\"%s\",\"kind\":\"%s\",\"pre\":\"%s\",\"bytes\":%zu,\"tokens\":%lld,\"tokenize_s\":%.4f,"
               "\"mb_per_s\":%.2f,\"detokenize_s\":%.4f,\"roundtrip\":%s,\"roundtrip_pieces\":%s,\"peak_scratch_bytes\":%zu}\n",
               m->set ? m->str : enc->str, fl_tokenizer_kind(t), fl_tokenizer_pre(t), len, (long long)n, best,
               (double)len / 1e6 / best, best_d, rt ? "true" : "false", rt_pieces ? "true" : "false", fl_mem_peak(FL_MEM_SCRATCH));
    }
    if (ids) fl_free(FL_MEM_MISC, ids, (size_t)cap * sizeof(int32_t));
    if (back) fl_free(FL_MEM_MISC, back, len + 16);
    fl_free(FL_MEM_MISC, text, len + 1);
    fl_tokenizer_free(t);
    return ret;
}
