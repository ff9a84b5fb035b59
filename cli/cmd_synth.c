/* `fitllm synth`: write a llama-shaped GGUF with random weights (for speed and memory tests).
 *
 *   fitllm synth --preset tinyllama-1.1b --type Q4_0 -o tl.gguf
 *   fitllm synth --n-embd 256 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 768 --n-vocab 512 ...
 *
 * Weights: N(0, 0.02) (std given by --std), norms 1.  Each row is generated from a hash of
 * (seed, tensor, row), so the file does not depend on the thread count; rows are generated and
 * quantized straight to --type (no f32 copy of the model is held).  Vocabulary: the
 * tokenizer.ggml.* keys of --vocab-from FILE (n_vocab becomes its size), else a byte-level
 * "llama" vocabulary: <unk> <s> </s>, the 256 byte tokens <0xXX>, and placeholder tokens up to
 * n_vocab.  Standard llama keys and general.file_type are written. */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "formats/gguf.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

typedef struct synth_shape {
    const char *name;
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float rope_base;
    bool tied;
} synth_shape;

static const synth_shape presets[] = {
    {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000, 2048, 10000.0f, false},
    {"llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256, 8192, 500000.0f, true},
    {"llama-2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, 10000.0f, false},
    {"llama-3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, 500000.0f, false},
    {"synth256", 256, 2, 4, 2, 768, 512, 1024, 10000.0f, false},
};
#define N_PRESETS (sizeof presets / sizeof presets[0])

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

typedef struct gen_ctx {
    int32_t type;
    int64_t K, rows;
    uint64_t seed;
    float std, constant; /* std == 0: every value = constant */
    char *dst;
    size_t rs;
    float *scratch; /* [nth][K] */
} gen_ctx;

static void gen_task(void *p, int ith, int nth) {
    gen_ctx *c = p;
    int64_t lo, hi;
    fl_split_range(c->rows, ith, nth, &lo, &hi);
    float *x = c->scratch + (size_t)ith * (size_t)c->K;
    for (int64_t r = lo; r < hi; r++) {
        uint64_t s = mix64(c->seed ^ mix64((uint64_t)r + 0x9E3779B97F4A7C15ULL));
        for (int64_t k = 0; k < c->K; k += 2) {
            if (c->std == 0) { x[k] = c->constant; if (k + 1 < c->K) x[k + 1] = c->constant; continue; }
            s = mix64(s + 0x9E3779B97F4A7C15ULL);
            const double u1 = ((s >> 11) + 1) * 0x1.0p-53, u2 = ((s & 0x7FFFFFFF) + 0.5) * 0x1.0p-31;
            const double rad = sqrt(-2 * log(u1)) * c->std;
            x[k] = (float)(rad * cos(6.283185307179586 * u2));
            if (k + 1 < c->K) x[k + 1] = (float)(rad * sin(6.283185307179586 * u2));
        }
        fl_quantize_row(c->type, x, c->dst + (size_t)r * c->rs, c->K);
    }
}

typedef struct tensor_buf { void *p; size_t n; } tensor_buf;

int fl_cmd_synth(int argc, char **argv) {
    fl_opt opts[] = {
        {"preset", 0, FL_OPT_STR, "NAME  tinyllama-1.1b | llama-3.2-1b | llama-2-7b | llama-3-8b | synth256"},
        {"n-embd", 0, FL_OPT_INT, "N  embedding size"},
        {"n-layer", 0, FL_OPT_INT, "N  layers"},
        {"n-head", 0, FL_OPT_INT, "N  attention heads"},
        {"n-head-kv", 0, FL_OPT_INT, "N  KV heads (default: n-head)"},
        {"n-ff", 0, FL_OPT_INT, "N  feed-forward size"},
        {"n-vocab", 0, FL_OPT_INT, "N  vocabulary size"},
        {"n-ctx", 0, FL_OPT_INT, "N  training context length (metadata)"},
        {"type", 0, FL_OPT_STR, "T  block type of 2-D weights: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K..Q6_K IQ4_NL (default F16)"},
        {"output", 'o', FL_OPT_STR, "FILE  output GGUF (required)"},
        {"seed", 0, FL_OPT_INT, "N  random seed (default 1)"},
        {"std", 0, FL_OPT_FLOAT, "S  standard deviation of the weights (default 0.02)"},
        {"vocab-from", 0, FL_OPT_STR, "FILE  copy the tokenizer.ggml.* keys of this GGUF"},
        {"tied", 0, FL_OPT_FLAG, "no output.weight (tied to token_embd)"},
        {"threads", 't', FL_OPT_INT, "N  threads (default: all cores)"},
        {0},
    };
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm synth (--preset NAME | --n-embd N --n-layer N ...) [--type T] -o FILE",
                          "Write a llama-shaped GGUF with random weights and the standard llama keys.", NULL, 0, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    synth_shape sh = {"custom", 0, 0, 0, 0, 0, 0, 2048, 10000.0f, false};
    if (opts[0].set) {
        bool found = false;
        for (size_t i = 0; i < N_PRESETS; i++)
            if (!strcasecmp(opts[0].str, presets[i].name)) { sh = presets[i]; found = true; }
        if (!found) {
            fprintf(stderr, "fitllm synth: unknown preset '%s' (see --help)\n", opts[0].str);
            return 2;
        }
    }
    if (opts[1].set) sh.n_embd = opts[1].i;
    if (opts[2].set) sh.n_layer = opts[2].i;
    if (opts[3].set) sh.n_head = opts[3].i;
    if (opts[4].set) sh.n_head_kv = opts[4].i;
    else if (!opts[0].set) sh.n_head_kv = sh.n_head;
    if (opts[5].set) sh.n_ff = opts[5].i;
    if (opts[6].set) sh.n_vocab = opts[6].i;
    if (opts[7].set) sh.n_ctx = opts[7].i;
    if (opts[13].set) sh.tied = true;
    int32_t type = FL_TYPE_F16;
    if (opts[8].set && ((type = fl_type_from_name(opts[8].str)) < 0 || type >= FL_TYPE_GGML_COUNT || !fl_quantize_supported(type) || type == FL_TYPE_Q8_K)) {
        fprintf(stderr, "fitllm synth: unsupported --type '%s'\n", opts[8].str);
        return 2;
    }
    if (!opts[9].set) {
        fprintf(stderr, "fitllm synth: -o FILE is required\n");
        return 2;
    }
    if (opts[14].set) fl_threads_set((int)opts[14].i);
    const uint64_t seed = opts[10].set ? (uint64_t)opts[10].i : 1;
    const float wstd = opts[11].set ? (float)opts[11].f : 0.02f;

    fl_gguf *vg = NULL;
    const fl_gguf_value *vtoks = NULL;
    if (opts[12].set) {
        if (fl_gguf_open(opts[12].str, &vg) != FL_OK) {
            fprintf(stderr, "fitllm synth: %s\n", fl_last_error());
            return 1;
        }
        vtoks = fl_gguf_get_arr(vg, "tokenizer.ggml.tokens");
        if (!vtoks) {
            fprintf(stderr, "fitllm synth: %s has no tokenizer.ggml.tokens\n", opts[12].str);
            fl_gguf_free(vg);
            return 1;
        }
        sh.n_vocab = (int64_t)vtoks->v.arr.n;
    } else if (sh.n_vocab == 0) sh.n_vocab = 259;
    if (sh.n_embd <= 0 || sh.n_layer <= 0 || sh.n_head <= 0 || sh.n_head_kv <= 0 || sh.n_ff <= 0 || sh.n_vocab < 3 ||
        sh.n_embd % sh.n_head || sh.n_head % sh.n_head_kv) {
        fprintf(stderr, "fitllm synth: incomplete or inconsistent shape (need --preset or --n-embd --n-layer --n-head --n-ff; "
                        "n-embd %% n-head == 0, n-head %% n-head-kv == 0)\n");
        if (vg) fl_gguf_free(vg);
        return 2;
    }
    const int64_t hd = sh.n_embd / sh.n_head, n_kv = sh.n_head_kv * hd;
    const int32_t blk = fl_type_get(type)->blck_size;
    if (sh.n_embd % blk || sh.n_ff % blk) {
        fprintf(stderr, "fitllm synth: n-embd and n-ff must be multiples of %s's block of %d\n", fl_type_name(type), blk);
        if (vg) fl_gguf_free(vg);
        return 2;
    }

    fl_gguf_writer *w = fl_gguf_writer_new();
    const int max_tensors = 2 + 9 * (int)sh.n_layer + 1;
    tensor_buf *bufs = fl_calloc(FL_MEM_MISC, (size_t)max_tensors, sizeof *bufs);
    char **vocab = NULL;
    float *scores = NULL;
    int32_t *ttypes = NULL;
    int rc = 1, nbuf = 0;
    const int nth = fl_threads_get();
    const size_t scratch_n = (size_t)nth * (size_t)(sh.n_ff > sh.n_embd ? sh.n_ff : sh.n_embd);
    float *scratch = fl_alloc(FL_MEM_SCRATCH, scratch_n * 4, 64);
    if (!w || !bufs || !scratch) goto fail;

    /* metadata */
    static const uint32_t ftypes[FL_TYPE_GGML_COUNT] = {[FL_TYPE_F32] = 0, [FL_TYPE_F16] = 1, [FL_TYPE_Q4_0] = 2,
        [FL_TYPE_Q4_1] = 3, [FL_TYPE_Q8_0] = 7, [FL_TYPE_Q5_0] = 8, [FL_TYPE_Q5_1] = 9, [FL_TYPE_Q2_K] = 10,
        [FL_TYPE_Q3_K] = 12, [FL_TYPE_Q4_K] = 15, [FL_TYPE_Q5_K] = 17, [FL_TYPE_Q6_K] = 18, [FL_TYPE_IQ4_NL] = 25,
        [FL_TYPE_BF16] = 32};
    char name[128];
    snprintf(name, sizeof name, "synth %s %s", sh.name, fl_type_name(type));
    fl_status st = FL_OK;
    st |= fl_gguf_writer_set_str(w, "general.architecture", "llama");
    st |= fl_gguf_writer_set_str(w, "general.name", name);
    st |= fl_gguf_writer_set_u32(w, "general.file_type", ftypes[type]);
    st |= fl_gguf_writer_set_u32(w, "general.quantization_version", 2);
    st |= fl_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)sh.n_ctx);
    st |= fl_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)sh.n_embd);
    st |= fl_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)sh.n_layer);
    st |= fl_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)sh.n_ff);
    st |= fl_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)sh.n_head);
    st |= fl_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)sh.n_head_kv);
    st |= fl_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)hd);
    st |= fl_gguf_writer_set_f32(w, "llama.rope.freq_base", sh.rope_base);
    st |= fl_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    st |= fl_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)sh.n_vocab);
    if (st != FL_OK) goto fail;
    if (vg) {
        for (int64_t i = 0; i < fl_gguf_n_kv(vg); i++) {
            const fl_gguf_kv *kv = fl_gguf_kv_at(vg, i);
            if (kv->key.len > 16 && !memcmp(kv->key.data, "tokenizer.ggml.", 15) && fl_gguf_writer_copy_kv(w, kv) != FL_OK) goto fail;
        }
    } else {
        vocab = fl_calloc(FL_MEM_MISC, (size_t)sh.n_vocab, sizeof(char *));
        scores = fl_calloc(FL_MEM_MISC, (size_t)sh.n_vocab, sizeof(float));
        ttypes = fl_calloc(FL_MEM_MISC, (size_t)sh.n_vocab, sizeof(int32_t));
        if (!vocab || !scores || !ttypes) goto fail;
        for (int64_t i = 0; i < sh.n_vocab; i++) {
            char tok[32];
            if (i == 0) strcpy(tok, "<unk>");
            else if (i == 1) strcpy(tok, "<s>");
            else if (i == 2) strcpy(tok, "</s>");
            else if (i < 259) snprintf(tok, sizeof tok, "<0x%02X>", (unsigned)(i - 3));
            else snprintf(tok, sizeof tok, "<synth%lld>", (long long)i);
            vocab[i] = fl_strdup(FL_MEM_MISC, tok);
            if (!vocab[i]) goto fail;
            ttypes[i] = i < 3 ? (i == 0 ? 2 : 3) : i < 259 ? 6 : 5; /* unknown, control, byte, unused */
            scores[i] = i < 259 ? 0.0f : -1e4f;
        }
        st |= fl_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
        st |= fl_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)vocab, (uint64_t)sh.n_vocab);
        st |= fl_gguf_writer_set_arr(w, "tokenizer.ggml.scores", FL_GGUF_F32, scores, (uint64_t)sh.n_vocab);
        st |= fl_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", FL_GGUF_I32, ttypes, (uint64_t)sh.n_vocab);
        st |= fl_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
        st |= fl_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
        st |= fl_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        if (st != FL_OK) goto fail;
    }

    /* tensors */
    {
        typedef struct { char name[64]; int64_t K, N; bool norm; } tdesc;
        tdesc td[9 * 128 + 3];
        int n = 0;
#define ADD(nm, k, nn, isnorm) do { snprintf(td[n].name, sizeof td[n].name, "%s", nm); td[n].K = k; td[n].N = nn; td[n].norm = isnorm; n++; } while (0)
        ADD("token_embd.weight", sh.n_embd, sh.n_vocab, false);
        if (sh.n_layer > 128) { fl_set_error(FL_ERR_RANGE, "at most 128 layers"); goto fail; }
        for (int l = 0; l < (int)sh.n_layer; l++) {
            char b[64];
#define LADD(suffix, k, nn, isnorm) do { snprintf(b, sizeof b, "blk.%d.%s", l, suffix); ADD(b, k, nn, isnorm); } while (0)
            LADD("attn_norm.weight", sh.n_embd, 1, true);
            LADD("attn_q.weight", sh.n_embd, sh.n_embd, false);
            LADD("attn_k.weight", sh.n_embd, n_kv, false);
            LADD("attn_v.weight", sh.n_embd, n_kv, false);
            LADD("attn_output.weight", sh.n_embd, sh.n_embd, false);
            LADD("ffn_norm.weight", sh.n_embd, 1, true);
            LADD("ffn_gate.weight", sh.n_embd, sh.n_ff, false);
            LADD("ffn_up.weight", sh.n_embd, sh.n_ff, false);
            LADD("ffn_down.weight", sh.n_ff, sh.n_embd, false);
        }
        ADD("output_norm.weight", sh.n_embd, 1, true);
        if (!sh.tied) ADD("output.weight", sh.n_embd, sh.n_vocab, false);
        uint64_t total = 0, done = 0, bytes = 0;
        for (int i = 0; i < n; i++) total += (uint64_t)(td[i].K * td[i].N);
        const bool tty = isatty(2) != 0;
        for (int i = 0; i < n; i++) {
            const int32_t tt = td[i].norm ? FL_TYPE_F32 : type;
            gen_ctx c = {tt, td[i].K, td[i].N, mix64(seed * 1000003ULL + (uint64_t)i), td[i].norm ? 0.0f : wstd, 1.0f,
                         NULL, fl_type_row_size(tt, td[i].K), scratch};
            bufs[nbuf].n = c.rs * (size_t)c.rows;
            bufs[nbuf].p = c.dst = fl_alloc(FL_MEM_WEIGHTS, bufs[nbuf].n, 64);
            if (!c.dst) goto fail;
            nbuf++;
            fl_parallel_n(gen_task, &c, nth);
            const int64_t ne[2] = {td[i].K, td[i].N};
            if (fl_gguf_writer_add_tensor(w, td[i].name, tt, td[i].norm ? 1 : 2, ne, c.dst) != FL_OK) goto fail;
            done += (uint64_t)(td[i].K * td[i].N);
            bytes += bufs[nbuf - 1].n;
            if (tty) fprintf(stderr, "\rsynth: %5.1f%%", 100.0 * (double)done / (double)total);
        }
        if (tty) fprintf(stderr, "\n");
        if (fl_gguf_writer_write(w, opts[9].str, NULL, NULL) != FL_OK) goto fail;
        printf("synth: wrote %s: %s shape n_embd=%lld n_layer=%lld n_head=%lld n_head_kv=%lld n_ff=%lld n_vocab=%lld, "
               "%.3f B params, %s, %.2f MiB of tensors\n",
               opts[9].str, sh.name, (long long)sh.n_embd, (long long)sh.n_layer, (long long)sh.n_head,
               (long long)sh.n_head_kv, (long long)sh.n_ff, (long long)sh.n_vocab, (double)total / 1e9, fl_type_name(type),
               (double)bytes / 1048576.0);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "fitllm synth: %s\n", fl_last_error());
done:
    for (int i = 0; i < nbuf; i++) fl_free(FL_MEM_WEIGHTS, bufs[i].p, bufs[i].n);
    if (bufs) fl_free(FL_MEM_MISC, bufs, (size_t)max_tensors * sizeof *bufs);
    if (vocab) {
        for (int64_t i = 0; i < sh.n_vocab; i++)
            if (vocab[i]) fl_free(FL_MEM_MISC, vocab[i], strlen(vocab[i]) + 1);
        fl_free(FL_MEM_MISC, vocab, (size_t)sh.n_vocab * sizeof(char *));
    }
    if (scores) fl_free(FL_MEM_MISC, scores, (size_t)sh.n_vocab * sizeof(float));
    if (ttypes) fl_free(FL_MEM_MISC, ttypes, (size_t)sh.n_vocab * sizeof(int32_t));
    if (scratch) fl_free(FL_MEM_SCRATCH, scratch, scratch_n * 4);
    fl_gguf_writer_free(w);
    if (vg) fl_gguf_free(vg);
    return rc;
}
