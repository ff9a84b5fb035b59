/* `fitllm quantize IN OUT TYPE [--pure] [-t N]`: write a GGUF whose weights are re-quantized.
 *
 * Every 2-D weight whose rows fit the type's block is quantized from f32 (F32/F16/BF16 sources
 * directly; quantized sources are dequantized first, with a warning); 1-D tensors (norms) stay
 * as they are.  Mixes (Q4_K_M, Q5_K_M, Q3_K_M, Q4_K_S, Q5_K_S) keep sensitive tensors at
 * higher precision: output.weight -> Q6_K, and for the _M mixes attn_v / ffn_down -> Q6_K
 * (Q5_K for Q3_K_M) in the first and last eighth of the layers and every third layer between.
 * --pure uses the base type for every 2-D weight.  K-quant rows that are not a multiple of
 * 256 fall back to a 32-block type (Q2_K/Q3_K -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1,
 * Q6_K -> Q8_0).  Sets general.file_type (llama_ftype numbering) and
 * general.quantization_version; metadata and alignment are copied from IN. */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "formats/gguf.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

typedef struct qtype_desc {
    const char *name;
    int32_t base;      /* block type of ordinary weights */
    int32_t sensitive; /* attn_v / ffn_down in "more bits" layers (-1: base) */
    int32_t output;    /* output.weight (-1: base) */
    uint32_t ftype;    /* llama_ftype */
} qtype_desc;

static const qtype_desc qtypes[] = {
    {"F32", FL_TYPE_F32, -1, -1, 0},          {"F16", FL_TYPE_F16, -1, -1, 1},
    {"BF16", FL_TYPE_BF16, -1, -1, 32},       {"Q8_0", FL_TYPE_Q8_0, -1, -1, 7},
    {"Q4_0", FL_TYPE_Q4_0, -1, FL_TYPE_Q6_K, 2}, {"Q4_1", FL_TYPE_Q4_1, -1, FL_TYPE_Q6_K, 3},
    {"Q5_0", FL_TYPE_Q5_0, -1, FL_TYPE_Q6_K, 8}, {"Q5_1", FL_TYPE_Q5_1, -1, FL_TYPE_Q6_K, 9},
    {"Q2_K", FL_TYPE_Q2_K, FL_TYPE_Q4_K, FL_TYPE_Q6_K, 10},
    {"Q3_K_M", FL_TYPE_Q3_K, FL_TYPE_Q5_K, FL_TYPE_Q6_K, 12},
    {"Q4_K_S", FL_TYPE_Q4_K, -1, FL_TYPE_Q6_K, 14}, {"Q4_K_M", FL_TYPE_Q4_K, FL_TYPE_Q6_K, FL_TYPE_Q6_K, 15},
    {"Q5_K_S", FL_TYPE_Q5_K, -1, FL_TYPE_Q6_K, 16}, {"Q5_K_M", FL_TYPE_Q5_K, FL_TYPE_Q6_K, FL_TYPE_Q6_K, 17},
    {"Q6_K", FL_TYPE_Q6_K, -1, -1, 18},       {"IQ4_NL", FL_TYPE_IQ4_NL, -1, FL_TYPE_Q6_K, 25},
    /* plain names of the K types = their _M mix's base with --pure semantics by default */
    {"Q3_K", FL_TYPE_Q3_K, -1, -1, 12},       {"Q4_K", FL_TYPE_Q4_K, -1, -1, 15},
    {"Q5_K", FL_TYPE_Q5_K, -1, -1, 17},
};
#define N_QTYPES (sizeof qtypes / sizeof qtypes[0])

static int32_t fallback_type(int32_t t) {
    switch (t) {
    case FL_TYPE_Q2_K: case FL_TYPE_Q3_K: return FL_TYPE_IQ4_NL;
    case FL_TYPE_Q4_K: return FL_TYPE_Q5_0;
    case FL_TYPE_Q5_K: return FL_TYPE_Q5_1;
    case FL_TYPE_Q6_K: return FL_TYPE_Q8_0;
    default: return FL_TYPE_F16;
    }
}

static bool use_more_bits(int layer, int n_layer) {
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

/* Type for one tensor under the chosen mix. */
static int32_t pick_type(const qtype_desc *q, bool pure, const char *name, int n_layer) {
    if (pure) return q->base;
    if (!strcmp(name, "output.weight") && q->output >= 0) return q->output;
    int layer;
    if (q->sensitive >= 0 && sscanf(name, "blk.%d.", &layer) == 1 &&
        (strstr(name, ".attn_v.weight") || strstr(name, ".ffn_down.weight")) && use_more_bits(layer, n_layer))
        return q->sensitive;
    return q->base;
}

typedef struct progress_state { bool tty; const char *what; } progress_state;

static void draw_bar(const char *what, double frac) {
    int w = 40, fill = (int)(frac * w + 0.5);
    fprintf(stderr, "\r%-10s [", what);
    for (int i = 0; i < w; i++) fputc(i < fill ? '#' : ' ', stderr);
    fprintf(stderr, "] %5.1f%%", 100 * frac);
    if (frac >= 1) fputc('\n', stderr);
    fflush(stderr);
}

static void write_progress(uint64_t done, uint64_t total, void *ud) {
    progress_state *p = ud;
    if (p->tty && total) draw_bar(p->what, (double)done / (double)total);
}

int fl_cmd_quantize(int argc, char **argv) {
    fl_opt opts[] = {
        {"pure", 0, FL_OPT_FLAG, "quantize every 2-D weight to TYPE (no higher-precision sensitive tensors)"},
        {"threads", 't', FL_OPT_INT, "N  threads (default: all cores)"},
        {"quiet", 'q', FL_OPT_FLAG, "no per-tensor lines"},
        {0},
    };
    const char *pos[3];
    int n_pos;
    char about[1024];
    int off = snprintf(about, sizeof about, "Write a copy of IN with its weights quantized to TYPE, one of:\n ");
    for (size_t i = 0; i < N_QTYPES && off < (int)sizeof about - 16; i++) off += snprintf(about + off, sizeof about - (size_t)off, " %s", qtypes[i].name);
    int r = fl_args_parse(argc, argv, opts, "fitllm quantize IN.gguf OUT.gguf TYPE [--pure] [-t N]", about, pos, 3, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    if (n_pos != 3) {
        fprintf(stderr, "fitllm quantize: expected IN OUT TYPE (see --help)\n");
        return 2;
    }
    const qtype_desc *q = NULL;
    for (size_t i = 0; i < N_QTYPES; i++)
        if (!strcasecmp(pos[2], qtypes[i].name)) q = &qtypes[i];
    if (!q) {
        fprintf(stderr, "fitllm quantize: unknown TYPE '%s' (see --help)\n", pos[2]);
        return 2;
    }
    if (fl_cli_overwrites_input("quantize", pos[1], 1, (const char *const[]){pos[0]}, (const char *const[]){"input model"})) return 2;
    if (opts[1].set) fl_threads_set((int)opts[1].i);
    const bool pure = opts[0].set, quiet = opts[2].set;
    progress_state prog = {isatty(2) != 0, "quantize"};

    fl_gguf *g;
    if (fl_gguf_open(pos[0], &g) != FL_OK) {
        fprintf(stderr, "fitllm quantize: %s\n", fl_last_error());
        return 1;
    }
    char arch[64] = "llama", key[128];
    fl_gguf_get_str(g, "general.architecture", arch, sizeof arch);
    snprintf(key, sizeof key, "%s.block_count", arch);
    int64_t n_layer = 0;
    fl_gguf_get_i64(g, key, &n_layer);
    fl_clear_error();

    fl_gguf_writer *w = fl_gguf_writer_new();
    const int64_t nt = fl_gguf_n_tensors(g);
    void **bufs = fl_calloc(FL_MEM_MISC, (size_t)(nt > 0 ? nt : 1), sizeof(void *));
    size_t *sizes = fl_calloc(FL_MEM_MISC, (size_t)(nt > 0 ? nt : 1), sizeof(size_t));
    int rc = 1;
    if (!w || !bufs || !sizes) {
        fl_set_error(FL_ERR_NOMEM, "out of memory for the output's tables (%lld tensors)", (long long)nt);
        goto fail;
    }
    /* the copied general.alignment key (if any) carries the alignment; set it explicitly only
     * when it differs from the default, so files match llama.cpp's key for key */
    if (fl_gguf_alignment(g) != FL_GGUF_DEFAULT_ALIGNMENT) (void)fl_gguf_writer_set_alignment(w, fl_gguf_alignment(g));
    for (int64_t i = 0; i < fl_gguf_n_kv(g); i++)
        if (fl_gguf_writer_copy_kv(w, fl_gguf_kv_at(g, i)) != FL_OK) goto fail;
    if (fl_gguf_writer_set_u32(w, "general.file_type", q->ftype) != FL_OK ||
        fl_gguf_writer_set_u32(w, "general.quantization_version", 2) != FL_OK)
        goto fail;

    uint64_t in_bytes = 0, out_bytes = 0, n_params = 0, total_elems = 0, done_elems = 0;
    for (int64_t i = 0; i < nt; i++) {
        const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
        total_elems += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    }
    for (int64_t i = 0; i < nt; i++) {
        const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        const int64_t K = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
        int32_t type = t->type;
        if (t->n_dims >= 2) {
            type = pick_type(q, pure, name, (int)n_layer);
            if (!fl_type_row_size(type, K)) type = fallback_type(type);
            if (!fl_type_row_size(type, K)) type = FL_TYPE_F16;
        }
        const void *data = t->data;
        if (type != t->type) {
            if (fl_matmul_supported(t->type) != FL_OK) goto fail;
            if (fl_type_get(t->type)->is_quantized && !quiet)
                fprintf(stderr, "warning: %s is %s: requantizing from a quantized source\n", name, fl_type_name(t->type));
            sizes[i] = fl_quantize_size(type, rows, K);
            bufs[i] = fl_alloc(FL_MEM_WEIGHTS, sizes[i], 64);
            float *f = fl_alloc(FL_MEM_SCRATCH, (size_t)K * (size_t)rows * 4, 64);
            if (!bufs[i] || !f) {
                if (f) fl_free(FL_MEM_SCRATCH, f, (size_t)K * (size_t)rows * 4);
                goto fail;
            }
            const size_t rs = fl_type_row_size(t->type, K);
            for (int64_t rr = 0; rr < rows; rr++) fl_dequant_row(t->type, (const char *)t->data + rr * rs, f + rr * K, K);
            fl_status st = fl_quantize_tensor(type, f, rows, K, bufs[i]);
            fl_free(FL_MEM_SCRATCH, f, (size_t)K * (size_t)rows * 4);
            if (st != FL_OK) goto fail;
            data = bufs[i];
        }
        const size_t nbytes = fl_quantize_size(type, rows, K);
        if (fl_gguf_writer_add_tensor(w, name, type, t->n_dims, t->ne, data) != FL_OK) goto fail;
        in_bytes += t->size;
        out_bytes += nbytes;
        n_params += (uint64_t)(K * rows);
        done_elems += (uint64_t)(K * rows);
        if (!quiet && !prog.tty)
            printf("[%4lld/%4lld] %-32s %-8s -> %-8s %10.3f MiB\n", (long long)i + 1, (long long)nt, name,
                   fl_type_name(t->type), fl_type_name(type), nbytes / 1048576.0);
        if (prog.tty) draw_bar("quantize", (double)done_elems / (double)total_elems);
    }
    prog.what = "write";
    if (fl_gguf_writer_write(w, pos[1], write_progress, &prog) != FL_OK) goto fail;
    printf("%s: %s -> %s (%s%s): %.2f MiB -> %.2f MiB, %.3f bits/weight, %.2f MiB saved\n", pos[2], pos[0], pos[1],
           q->name, pure ? ", pure" : "", in_bytes / 1048576.0, out_bytes / 1048576.0,
           n_params ? 8.0 * (double)out_bytes / (double)n_params : 0.0, ((double)in_bytes - (double)out_bytes) / 1048576.0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "fitllm quantize: %s\n", fl_last_error());
done:
    for (int64_t i = 0; bufs && i < nt; i++)
        if (bufs[i]) fl_free(FL_MEM_WEIGHTS, bufs[i], sizes[i]);
    if (bufs) fl_free(FL_MEM_MISC, bufs, (size_t)(nt > 0 ? nt : 1) * sizeof(void *));
    if (sizes) fl_free(FL_MEM_MISC, sizes, (size_t)(nt > 0 ? nt : 1) * sizeof(size_t));
    fl_gguf_writer_free(w);
    fl_gguf_free(g);
    return rc;
}
