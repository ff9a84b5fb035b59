/* fl_matmul: the dispatching driver (see matmul.h).  Integer paths (8-bit activations) for the
 * block types that have kernels on the current ISA (GEMV / row dots for a few tokens, row panels
 * or AMX tiles for more), the f32 path (dequantize rows + f32 dot) for every other type or when
 * f32 activations are requested. */
#include "kernels/matmul.h"
#include "core/dtype.h"
#include "kernels/convert.h"
#include "kernels/dispatch.h"
#include "kernels/quant.h"
#include "core/alloc.h"
#include "core/cpu.h"
#include "core/log.h"
#include "core/status.h"
#include "core/threads.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_f32_act = -1;

void fl_matmul_set_f32_act(bool on) { g_f32_act = on ? 1 : 0; }

bool fl_matmul_f32_act(void) {
    if (g_f32_act < 0) {
        const char *e = getenv("FL_MATMUL_F32ACT");
        g_f32_act = (e && *e && strcmp(e, "0") != 0) ? 1 : 0;
    }
    return g_f32_act == 1;
}

static int g_llama_order = -1;

void fl_matmul_set_llama_order(bool on) { g_llama_order = on ? 1 : 0; }

bool fl_matmul_llama_order(void) {
    if (g_llama_order < 0) {
        const char *e = getenv("FL_MATMUL_LLAMA");
        g_llama_order = (e && *e && strcmp(e, "0") != 0) ? 1 : 0;
    }
    return g_llama_order == 1;
}

/* The GEMVs' prefetch distances (kernels/matmul.h). */
int fl_gemv_pf_near = 4096, fl_gemv_pf_far = 0;

void fl_gemv_prefetch_defaults(void) {
    const bool intel = fl_cpu()->intel;
    int near = intel ? 1024 : 4096, far = intel ? 8192 : 0;
    const char *e = getenv("FL_GEMV_PF");
    if (e && *e) {
        int n, f;
        if (sscanf(e, "%d,%d", &n, &f) == 2 && n >= 0 && f >= 0 && n <= (1 << 20) && f <= (1 << 20)) near = n, far = f;
        else FL_LOG_WARN("FL_GEMV_PF=%s not understood (NEAR,FAR in bytes)", e);
    }
    fl_gemv_pf_near = near;
    fl_gemv_pf_far = far;
}

/* Does W take 8-bit activations in the current mode, and through the llama.cpp-order path?
 * On AVX-512 Q4_K does (VNNI GEMV, panel GEMM) and Q6_K for one-token steps (its GEMV; larger
 * steps dequantize unless AMX is there); on AVX2 every quantized GGUF type: Q8_0 / Q4_0 through
 * the GEMV, the others through maddubs row dots for a few tokens, and all through the row panels
 * past them. */
static bool amx_path(int32_t type, int64_t M);
static bool gemv_path(int32_t type, int64_t M);
static bool panel_path(int32_t type, int64_t M);

static bool int8_path(int32_t type, int64_t M, bool *llama) {
    *llama = false;
    if (fl_matmul_f32_act()) return false;
    if (fl_k16_type(type)) /* its AVX-512 kernels; on another ISA the f32 path (dequantized rows) */
        return fl_isa_get() == FL_ISA_AVX512 && !fl_matmul_llama_order() && M <= INT32_MAX;
    if (fl_r8_base(type) >= 0) /* its AVX2 / AVX-512 kernels or the reference */
        return !fl_matmul_llama_order() && M <= INT32_MAX;
    if (fl_matmul_llama_order() && (type == FL_TYPE_Q8_0 || type == FL_TYPE_Q4_0 || type == FL_TYPE_Q5_0)) {
        *llama = true;
        return true;
    }
    const bool simd = fl_isa_get() == FL_ISA_AVX512 || fl_isa_get() == FL_ISA_AVX2;
    if (type == FL_TYPE_Q4_K) /* AVX2: row dots for one token, panels for more (same sums) */
        return simd && !fl_matmul_llama_order() && M <= INT32_MAX;
    if (type == FL_TYPE_Q8_0 || type == FL_TYPE_Q4_0) return true;
    /* AVX2: the row panels of Q5_K, Q6_K, Q4_1, Q5_0, Q5_1, IQ4_NL, Q3_K, Q2_K (panel_path says where) */
    if (!fl_matmul_llama_order() && panel_path(type, M)) return true;
    if (type == FL_TYPE_Q6_K) /* (AVX2: a few tokens), and steps of > 16 tokens on the AMX tiles (half-block tiles) */
        return (gemv_path(type, M) && simd && !fl_matmul_llama_order()) || (!fl_matmul_llama_order() && amx_path(type, M));
    if ((type == FL_TYPE_Q5_K || type == FL_TYPE_Q3_K || type == FL_TYPE_Q2_K || type == FL_TYPE_Q4_1 || type == FL_TYPE_Q5_0 ||
         type == FL_TYPE_Q5_1 || type == FL_TYPE_IQ4_NL) &&
        gemv_path(type, M) && fl_isa_get() == FL_ISA_AVX2 && !fl_matmul_llama_order())
        return true; /* row dots */
    if ((type == FL_TYPE_Q5_K || type == FL_TYPE_Q3_K || type == FL_TYPE_Q2_K || type == FL_TYPE_Q4_1 || type == FL_TYPE_Q5_0 || type == FL_TYPE_Q5_1 || type == FL_TYPE_IQ4_NL) &&
        M == 1 && fl_isa_get() == FL_ISA_AVX512 && !fl_matmul_llama_order())
        return true; /* their AVX-512 GEMVs */
    return !fl_matmul_llama_order() && amx_path(type, M); /* Q4_1, Q5_0, Q5_1, IQ4_NL, Q5_K, Q3_K: AMX */
}

typedef float (*dot_fn)(const float *, const float *, int64_t);

static float dot_ggml_f32_ref(const float *a, const float *b, int64_t n) { return fl_mm_dot_ggml_ref(a, b, n, false); }
static float dot_ggml_f16_ref(const float *a, const float *b, int64_t n) { return fl_mm_dot_ggml_ref(a, b, n, true); }

static fl_gemm_q8_fn gemm_for(fl_isa isa) {
    return isa == FL_ISA_AVX512 ? fl_gemm_q8_avx512 : isa == FL_ISA_AVX2 ? fl_gemm_q8_avx2 : fl_gemm_q8_ref;
}
static dot_fn dot_for(fl_isa isa) {
    return isa == FL_ISA_AVX512 ? fl_mm_dot_f32_avx512 : isa == FL_ISA_AVX2 ? fl_mm_dot_f32_avx2 : dot_ggml_f32_ref;
}

float fl_mm_dot_f32(const float *a, const float *b, int64_t n) { return dot_for(fl_isa_get())(a, b, n); }
float fl_mm_dot_f16vals(const float *a, const float *b, int64_t n) {
    const fl_isa isa = fl_isa_get();
    return isa == FL_ISA_AVX512 ? fl_mm_dot_f16vals_avx512(a, b, n) : isa == FL_ISA_AVX2 ? fl_mm_dot_f16vals_avx2(a, b, n)
                                                                                         : dot_ggml_f16_ref(a, b, n);
}

/* ---- integer path ---- */

typedef struct {
    const fl_tensor *W;
    const float *x;
    float *y;
    int64_t M;
    fl_act_q8 act;
    fl_gemm_q8_fn gemm;
    char *panels; /* AVX-512 GEMM: [nth][fl_panel_bytes(K)] repacked row panels, else NULL;
                   * AMX: [nth][amx_group_max][fl_amx_panel_bytes] */
    size_t panel_bytes;
    char *amx_act;     /* AMX: activation tiles (fl_amx_act_bytes), else NULL */
    bool act_all;      /* the AVX-512 quantizer fills dv, sv, o4, o6 too (not for the AVX-512 R8 tiles) */
    char *act16;       /* act16_path: the activations as 16-token records (fl_act16_bytes), else NULL */
    size_t act16_bytes;
    _Atomic int64_t next; /* next unit (panel, group of panels) to take: dynamic split */
    /* fl_matmul_n: the matrices sharing x (GEMV and the AMX rows path take their units from one
     * counter; W, y above are the first) */
    int nw;
    const fl_tensor *Wv[FL_MATMUL_N_MAX];
    float *yv[FL_MATMUL_N_MAX];
    int64_t ubase[FL_MATMUL_N_MAX + 1]; /* matrix i's units (GEMV: row tiles) are [ubase[i], ubase[i + 1]) */
    int64_t take;                       /* GEMV, r8_shares: units per take from a share */
    int64_t share_rows;                 /* GEMV, r8_shares: rows per unit (row_shares) */
    int nshare;                         /* GEMV, r8_shares: the shares (the threads counted when they were made) */
    _Atomic uint64_t share[FL_THREADS_MAX]; /* GEMV, r8_shares: share t's untaken units [front, back), 32 | 32 bits */
    int64_t pgroup;                     /* AVX-512 panels: panels a thread's scratch holds (panel_group_max);
                                         * with > 1 a unit is a group of them (groups[i] per matrix) */
    int64_t groups[FL_MATMUL_N_MAX];
    int64_t unit_rows; /* panels one at a time (pgroup 1): rows per unit, FL_PANEL_ROWS or, where the
                        * AVX-512 R8 tiles take 32 rows a pass, two panels */
    bool rows_all; /* AVX-512 with act16: quantize every token into the rows too (no panel scratch) */
    bool r8_shares; /* one token tile on the AVX-512 groups (R8 2-16 tokens, R16 2-8): units of 32 rows in shares (row_shares) */
} q8_ctx;

/* The matrix a unit u (0 <= u < ubase[nw]) belongs to. */
static int unit_matrix(const int64_t *ubase, int64_t u) {
    int i = 0;
    while (u >= ubase[i + 1]) i++;
    return i;
}

/* Rows per tile of the GEMV shares and the tile path: the repacked types are addressed by groups
 * (8 rows, Q4_K_R16 / Q6_K_R16 16). */
static int64_t row_tile(int32_t type) { return fl_r8_group_rows(type) ? fl_r8_group_rows(type) : 4; }

static void q8_quant_task(void *p, int ith, int nth) {
    q8_ctx *c = p;
    const int64_t K = c->W->ne[0];
    if (fl_isa_get() == FL_ISA_AVX512 && c->act16) {
        /* by blocks, in runs of 16 (whole cache lines of the per-block arrays): each thread
         * quantizes every token of its blocks straight into the records too, so no record is
         * written by two threads and none is copied from the rows afterwards (M > 8: no qs4) */
        const int64_t nb = c->act.nb, runs = (nb + 15) / 16;
        int64_t lo, hi;
        fl_split_range(runs, ith, nth, &lo, &hi);
        const int64_t b0 = lo * 16, b1 = hi * 16 < nb ? hi * 16 : nb;
        /* the tiles of more than 8 tokens read only the records; a last group of 8 or fewer the
         * rows (q8_panel_task) */
        const int64_t rows_from = c->rows_all ? 0 : c->M % FL_ACT16_TOKENS <= 8 ? c->M - c->M % FL_ACT16_TOKENS : c->M;
        for (int64_t m = 0; m < c->M && b0 < b1; m++)
            fl_act_q8_quantize_blocks_avx512(&c->act, m, c->x + m * K, b0, b1, c->act_all, m >= rows_from, c->act16);
        return;
    }
    int64_t lo, hi;
    fl_split_range(c->M, ith, nth, &lo, &hi);
    if (fl_isa_get() == FL_ISA_AVX512)
        for (int64_t m = lo; m < hi; m++) {
            fl_act_q8_quantize_blocks_avx512(&c->act, m, c->x + m * K, 0, c->act.nb, c->act_all, true, NULL);
            if (c->act.qs4) fl_act_q8_order_q4(&c->act, m); /* (one token: the Q4_0 order for the VBMI GEMV) */
        }
    else {
        void (*quant)(fl_act_q8 *, int64_t, const float *) = fl_isa_get() == FL_ISA_AVX2 ? fl_act_q8_quantize_row_avx2 : fl_act_q8_quantize_row;
        for (int64_t m = lo; m < hi; m++) quant(&c->act, m, c->x + m * K);
    }
    if (c->amx_act) /* the activation tiles: 8 tokens at a time where this thread has all 8 */
        for (int64_t m = lo; m < hi;) {
            if (m % 8 == 0 && m + 8 <= hi) {
                fl_amx_act_pack8_avx512(&c->act, m, c->amx_act);
                m += 8;
            } else
                fl_amx_act_pack_row_avx512(&c->act, m++, c->amx_act);
        }
}

#define TOK_TILE 4
/* GEMV: each thread streams its own contiguous share of the call's row tiles (all its matrices,
 * which have one K and type, end to end), taking GEMV_TAKE_BYTES at a time from the front; a
 * thread whose share is done takes from the back of the share with the most left, so a thread
 * the scheduler holds back does not hold up the others.  Against chunks of 1 MiB taken
 * dynamically from one counter (the threads' chunks interleaved, so each chunk started a new
 * stream; fixed chunks before that had left the last one running alone), a Zen 5 VM, 2
 * threads, `fitllm run` on TinyLlama-shaped models, 256 tokens, the one-token matmuls timed in
 * the process and the two alternated layer by layer: Q4_0 0.952-0.962 of the time at 256 KiB to
 * 1 MiB takes (64 KiB 0.98-0.99, 16 KiB 1.09-1.11: small takes from the back start a cold
 * stream each), Q8_0 0.959-0.961 (an A-A control 0.994-1.004); a static split without the
 * taking from the back ran 1.07-1.14. */
#define GEMV_TAKE_BYTES (512 * 1024)
#define CHUNK_BYTES (192 * 1024) /* weight rows per chunk: stay in L2 while all tokens pass */

/* Take up to c->take row tiles from thread r's share: from its front (r itself) or its back
 * (another thread, its own share done).  Returns the count, *t0 the first. */
static int64_t share_take(q8_ctx *c, int r, bool front, int64_t *t0) {
    uint64_t v = atomic_load_explicit(&c->share[r], memory_order_relaxed);
    for (;;) {
        const int64_t f = (int64_t)(v >> 32), b = (int64_t)(v & 0xFFFFFFFFu);
        if (f >= b) return 0;
        const int64_t n = b - f < c->take ? b - f : c->take;
        const uint64_t nv = front ? ((uint64_t)(f + n) << 32) | (uint64_t)b : ((uint64_t)f << 32) | (uint64_t)(b - n);
        if (atomic_compare_exchange_weak_explicit(&c->share[r], &v, nv, memory_order_relaxed, memory_order_relaxed)) {
            *t0 = front ? f : b - n;
            return n;
        }
    }
}

/* The GEMV on rows [n0, n1) of matrix i (per-call work on the activations, Q2_K / Q3_K's, is
 * done once per take and matrix). */
static void gemv_span(const q8_ctx *c, int i, int64_t n0, int64_t n1) {
    const fl_tensor *W = c->Wv[i];
    c->gemm(W->type, (const char *)W->data + n0 * W->nb[1], W->nb[1], (int)(n1 - n0), &c->act, 0, (int)c->M, c->yv[i] + n0, W->ne[1]);
}

/* Share the call's units of rt rows (ubase) among nth threads (GEMV_TAKE_BYTES a take; nth <= FL_THREADS_MAX). */
static void row_shares(q8_ctx *c, int nth, int64_t rt) {
    const fl_tensor *W = c->Wv[0];
    c->nshare = nth;
    c->share_rows = rt;
    for (int i = 0; i < c->nw; i++) c->ubase[i + 1] = c->ubase[i] + (c->Wv[i]->ne[1] + rt - 1) / rt;
    c->take = (int64_t)(GEMV_TAKE_BYTES / ((size_t)rt * W->nb[1]));
    if (c->take < 1) c->take = 1;
    for (int t = 0; t < nth; t++) {
        int64_t lo, hi;
        fl_split_range(c->ubase[c->nw], t, nth, &lo, &hi);
        atomic_init(&c->share[t], ((uint64_t)lo << 32) | (uint64_t)hi);
    }
}

typedef void (*span_fn)(const q8_ctx *c, int i, int64_t n0, int64_t n1);

/* Units [t0, t0 + n) of the call (matrix i's are [ubase[i], ubase[i + 1]), share_rows rows
 * each): span(c, i, n0, n1) once per matrix they touch, on its rows [n0, n1). */
static void run_spans(const q8_ctx *c, int64_t t0, int64_t n, span_fn span) {
    const int64_t rt = c->share_rows;
    for (int i = 0; i < c->nw && n > 0; i++) {
        if (t0 >= c->ubase[i + 1]) continue;
        const int64_t Ni = c->Wv[i]->ne[1], k = c->ubase[i + 1] - t0 < n ? c->ubase[i + 1] - t0 : n;
        const int64_t n0 = (t0 - c->ubase[i]) * rt, n1 = n0 + k * rt < Ni ? n0 + k * rt : Ni;
        span(c, i, n0, n1);
        t0 += k;
        n -= k;
    }
}

/* Thread ith's part of a call on shares: its own share from the front, then the back of the
 * share with the most left until none has any; each take's rows through span (run_spans). */
static void run_shares(q8_ctx *c, int ith, span_fn span) {
    int64_t t0, n;
    if (ith < c->nshare)
        while ((n = share_take(c, ith, true, &t0)) > 0) run_spans(c, t0, n, span);
    for (;;) { /* (every share: the call may run on fewer threads than there are shares) */
        int r = -1;
        int64_t most = 0;
        for (int t = 0; t < c->nshare; t++) {
            const uint64_t v = atomic_load_explicit(&c->share[t], memory_order_relaxed);
            const int64_t left = (int64_t)(v & 0xFFFFFFFFu) - (int64_t)(v >> 32);
            if (left > most) most = left, r = t;
        }
        if (r < 0) break;
        if ((n = share_take(c, r, false, &t0)) > 0) run_spans(c, t0, n, span);
    }
}

static void q8_gemm_task(void *p, int ith, int nth) {
    q8_ctx *c = p;
    const int64_t N = c->W->ne[1];
    const size_t ldw = c->W->nb[1];
    /* split rows in multiples of the row tile */
    int64_t lo, hi;
    const int64_t rt = row_tile(c->W->type), ntiles = (N + rt - 1) / rt;
    fl_split_range(ntiles, ith, nth, &lo, &hi);
    lo *= rt;
    hi = hi * rt < N ? hi * rt : N;
    if (gemv_path(c->W->type, c->M)) { /* GEMV: the thread's share (row_shares), then the others' backs */
        run_shares(c, ith, gemv_span);
        return;
    }
    int64_t chunk = (int64_t)(CHUNK_BYTES / ldw);
    chunk = chunk < rt ? rt : chunk - chunk % rt;
    for (int64_t n0 = lo; n0 < hi; n0 += chunk) {
        const int64_t n1 = n0 + chunk < hi ? n0 + chunk : hi;
        for (int64_t m = 0; m < c->M; m += TOK_TILE) {
            const int nt = (int)(c->M - m < TOK_TILE ? c->M - m : TOK_TILE);
            for (int64_t n = n0; n < n1; n += rt) {
                const int nr = (int)(n1 - n < rt ? n1 - n : rt);
                c->gemm(c->W->type, (const char *)c->W->data + n * ldw, ldw, nr, &c->act, m, nt, c->y + m * N + n, N);
            }
        }
    }
}

/* The GEMV (chunks of rows taken dynamically from all the matrices, which share one quantized
 * x): one token, or on AVX2 steps of up to 3 Q4_0 / 4 Q8_0 tokens, whose tokens share each row's
 * codes (fl_gemm_q8_avx2), 3 Q4_K / Q5_K and 2 Q6_K tokens (their row dots).  There a panel's pack costs about as much as 2 tokens through it,
 * and the weights stream from memory once either way.  `fitllm bench serve -m tl-T.gguf -n M
 * --max-seqs M --prompt-len 16 --gen-len 48 --kv-mem 256MiB -t 2`, decode tok/s, panels ->
 * this GEMV, three alternated pairs (means): Q4_0 M = 2 34.8 -> 45.5, M = 3 48.4 -> 49.4; Q8_0
 * M = 2 21.6 -> 32.3, M = 3 31.8 -> 44.8, M = 4 37.8 -> 44.9.  Q4_0 at 4 tokens (2 rows x 4
 * tokens) lost to the panels in `bench matmul -p 4` (101, 86, 87 against 134, 130, 112 GOP/s),
 * Q8_0 at 6 and 8 tokens (twice through the rows) was even with them.  The K-quants' row dots
 * (fl_gemm_q8_avx2: each row from L1 for every token, the one-token bits) likewise: Q4_K M = 2
 * 15.6, 13.1 -> 30.0, 29.8 and M = 3 23.8, 21.3 -> 29.6, 31.2 against its panels, even at 4;
 * Q6_K, whose alternative past one token is dequantized rows and the f32 path, M = 2 6.3, 6.5
 * -> 14.6, 13.1, M = 4 9.3, 10.7 -> 19.9, 17.2, M = 8 13.4 -> 20.4, M = 16 15.3 -> 19.9.  Since
 * Q5_K and Q6_K have panels as well (`fitllm bench matmul -p M --types Q5_K,Q6_K --stream-mib
 * 256`, all shapes, row dots against panels, alternated: Q5_K M = 2 48.6, 48.5 / 28.5, 28.1
 * GOP/s, M = 3 47.9, 52.7, 50.6 / 34.9, 41.9, 37.4, M = 4 even (53.1, 45.8, 43.8 / 53.3, 40.4,
 * 47.7), M = 8 60 / 84; Q6_K M = 2 32.6, 36.1 / 29.2, 34.6, M = 3 32.9, 34.5, 40.9 / 44.4, 43.1,
 * 48.8, M = 4 35.1, 36.5, 29.6 / 65.0, 64.3, 49.3), Q5_K takes the row dots up to 3 tokens and
 * Q6_K up to 2.  Q3_K and Q2_K take their row dots (kernels/avx2/rowdot_avx2.c) up to 4 tokens:
 * row dots / panels, same command with --stream-mib 128, GOP/s, Q3_K M = 2 46.8 / 22.0, M = 3
 * 47.5 / 30.4, M = 4 54.1 / 39.1, M = 6 52.2 / 51.7, M = 8 46.3 / 75.3; Q2_K M = 2 62.6 / 35.1,
 * M = 3 46.9 / 43.9, M = 4 60.2 / 54.4, M = 6 60.8 / 72.9.  Q4_1, Q5_0, Q5_1 and IQ4_NL take
 * theirs for one token only (M = 1, GEMV GB/s: Q4_1 7.7 -> 11.9, IQ4_NL 7.8 -> 11.2; at M = 2
 * the panels already won, Q4_1 74.0 against 49.6 GOP/s). */
#define GEMV_MAX_Q4_0 3
#define GEMV_MAX_Q8_0 4
#define GEMV_MAX_Q4_K 3
#define GEMV_MAX_Q5_K 3
#define GEMV_MAX_Q6_K 2
#define GEMV_MAX_Q3_K 4
#define GEMV_MAX_Q2_K 4
static bool g_few_token_gemv = true;

void fl_matmul_set_few_token_gemv(bool on) { g_few_token_gemv = on; }

int64_t fl_matmul_gemv_max_tokens(int32_t type) {
    if (fl_isa_get() != FL_ISA_AVX2 || !g_few_token_gemv) return 1;
    switch (type) {
    case FL_TYPE_Q4_0: case FL_TYPE_Q4_0_R8: return GEMV_MAX_Q4_0;
    case FL_TYPE_Q8_0: case FL_TYPE_Q8_0_R8: return GEMV_MAX_Q8_0;
    case FL_TYPE_Q4_K: return GEMV_MAX_Q4_K;
    case FL_TYPE_Q5_K: return GEMV_MAX_Q5_K;
    case FL_TYPE_Q6_K: return GEMV_MAX_Q6_K;
    case FL_TYPE_Q3_K: return GEMV_MAX_Q3_K;
    case FL_TYPE_Q2_K: return GEMV_MAX_Q2_K;
    default: return 1;
    }
}

static bool gemv_path(int32_t type, int64_t M) { return M >= 1 && M <= fl_matmul_gemv_max_tokens(type); }
_Static_assert(GEMV_MAX_Q4_0 <= FL_GEMV_MAX_TOKENS && GEMV_MAX_Q8_0 <= FL_GEMV_MAX_TOKENS, "fl_gemm_q8_avx2's GEMV"); /* (the row dots take any count) */

/* The row-panel GEMM (M > 1) for Q8_0 / Q4_0 / Q4_K on AVX-512 and AVX2, and Q5_K / Q6_K on
 * AVX2 (on AVX2 it replaced 2 x 2 register tiles with lanes along K, which spent about 11
 * instructions per 32 products on horizontal work and per-block scales, and Q4_K's row dots:
 * `fitllm bench matmul -p 512` all shapes Q4_0 ~85 -> ~190 GOP/s, Q4_K ~70 -> ~195; Q5_K / Q6_K
 * had dequantized rows and the f32 path: `fitllm bench model -p 128 -n 0` pp 19-24 -> 103-124
 * tok/s). */
static bool panel_path(int32_t type, int64_t M) {
    const fl_isa isa = fl_isa_get();
    const bool own = type == FL_TYPE_Q4_1 || type == FL_TYPE_Q5_0 || type == FL_TYPE_Q5_1 || type == FL_TYPE_IQ4_NL ||
                     type == FL_TYPE_Q3_K || type == FL_TYPE_Q2_K; /* panels for every step on AVX2 */
    if (fl_r8_base(type) >= 0) return (isa == FL_ISA_AVX2 || isa == FL_ISA_AVX512) && M > 1 && M <= INT32_MAX && !gemv_path(type, M);
    if (fl_k16_type(type)) return isa == FL_ISA_AVX512 && M > 1 && M <= INT32_MAX;
    if (M <= 1 || M > INT32_MAX || gemv_path(type, M)) return false;
    const bool common = type == FL_TYPE_Q4_0 || type == FL_TYPE_Q8_0 || type == FL_TYPE_Q4_K;
    /* AVX-512 has panels of its own for the common types; the rest take the AVX2 panels there
     * (panel_avx512), which the AMX tiles replace from 13 tokens where they are usable */
    return ((isa == FL_ISA_AVX512 || isa == FL_ISA_AVX2) && (common || own || type == FL_TYPE_Q5_K || type == FL_TYPE_Q6_K));
}

/* Whether the panel path runs AVX-512 panels (fl_panel_pack_avx512 / fl_panel_gemm_avx512, and
 * the R8 kernels) or the AVX2 ones.  Q5_K, Q6_K, Q4_1, Q5_0, Q5_1, IQ4_NL, Q3_K and Q2_K have
 * only AVX2 panels: on AVX-512 their steps of 2-12 tokens (all of them without AMX) had taken the
 * f32 path, `fitllm bench matmul -t 2 -p 16` all shapes 55-63 GOP/s, against 136-271 with
 * FL_KERNELS=avx2 on the same Zen 4. */
static bool panel_direct(int32_t type, int64_t M);
static bool panel_avx512(int32_t type, int64_t M) {
    if (fl_k16_type(type) && type != FL_TYPE_Q4_K_R16) return panel_direct(type, M); /* (past that: the AVX2 panels) */
    return fl_isa_get() == FL_ISA_AVX512 && (fl_r8_group_rows(type) || type == FL_TYPE_Q4_0 || type == FL_TYPE_Q8_0 ||
                                             type == FL_TYPE_Q4_K);
}

/* Q4_0_R8 steps of up to this many tokens run the tile on the groups, without the pack: one core,
 * 256 x 2048 rows in cache, pack + tile against the tile on the groups, alternated in one
 * process, the same bits (a microbenchmark): 4 tokens 103 -> 175 GOP/s, 8 128 -> 171, 16 149
 * -> 170 (K 5632: 140 -> 168), 24 187 -> 202, 32 154 -> 165 and 199 -> 206, 40 201 -> 205, 64
 * and 512 even to 0.96x. */
#define R8_DIRECT_Q4_0 32
/* AVX-512 steps of more than one token tile (8) take groups of panels: a thread packs a group
 * that fits L2 (PANEL_GROUP_BYTES), then every 8-token tile of the step passes all its panels
 * while its activations stay in L1; one panel at a time streamed the whole step's activations
 * (M x K codes and their scales, 1 MiB and more at 512 tokens) from L3 once per panel. */
#define PANEL_GROUP_BYTES (384 * 1024)
static int64_t panel_group_max(int32_t type, int64_t K, int64_t M) {
    if (!panel_avx512(type, M) || M <= 8) return 1;
    /* the R8 types' tiles read the rows themselves: a group is 16 rows of the matrix */
    const size_t bytes = panel_direct(type, M) ? FL_PANEL_ROWS * fl_type_row_size(type, K) : fl_panel_bytes_for(type, K);
    const int64_t g = (int64_t)(PANEL_GROUP_BYTES / bytes);
    return g < 1 ? 1 : g;
}

/* Q4_K_R16 / Q6_K_R16 steps of up to this many tokens run their tile on the groups (16 rows x 8
 * tokens a pass); more take the base type's panels packed from the groups (Q4_K: AVX-512's,
 * whose passes of 16 tokens share each super-block's scales and unpacked codes twice as
 * widely; Q6_K: the AVX2 panels).  `fitllm bench matmul --types T,T_R16 -t 2` all shapes in
 * cache, GOP/s, the panels (from the file's rows) against the tile, two alternated runs each:
 * Q4_K 32 tokens 704, 699 / 853, 870; 64 752, 837 / 761, 730; 512 803, 669 / 621, 625; Q6_K 24
 * 434, 419 / 489, 485; 32 484, 466 / 493, 474; 64 544, 528 / 488, 484; 512 556 / 337. */
#define K16_DIRECT_MAX 32
/* The panel path runs the tile on the weight rows as they are, with no pack and no panel scratch:
 * AVX-512 on the R8 types and the R16 types (up to K16_DIRECT_MAX tokens), AVX2 on Q8_0_R8 (its
 * vectors are the tile's layout). */
static bool panel_direct(int32_t type, int64_t M) {
    if (fl_b16_type(type)) return fl_isa_get() == FL_ISA_AVX512; /* (every step: no panels of their own) */
    if (fl_k16_type(type)) return fl_isa_get() == FL_ISA_AVX512 && M <= K16_DIRECT_MAX;
    return fl_r8_base(type) >= 0 && (type == FL_TYPE_Q8_0_R8 || fl_isa_get() == FL_ISA_AVX512);
}
/* The type a panel of W's rows computes as (an R16 type's panels are its base type's). */
static int32_t panel_type(int32_t type) { return fl_k16_type(type) ? fl_k16_base(type) : type; }

/* R8 steps of 11 tokens or more (passes of 11-16 of the 16-token records) run on the AMX-INT8
 * tiles where they are usable (fl_amx_r8_gemm16, the same bits): the fold per block is the VNNI
 * tile's, the 128 vpdpbusd become one TDPBSSD.  Against the VNNI tile, alternated call by call in
 * one process (fl_matmul, 2 threads, 8 matrices of each shape cycled so the weights stream from
 * memory, median of 40 paired speedups, 2048 x 2048, 5632 x 2048 and 2048 x 5632): 16 tokens
 * Q4_0 1.27-1.36, Q8_0 1.12-1.23; 12 tokens 1.01-1.17; 11 tokens 1.03-1.10; 10 tokens 0.95-1.13
 * and 9 0.92-1.05 (the tile multiplies 16 tokens whatever the pass has); 32 and 48 tokens
 * 1.06-1.32. */
#define R8_AMX_MIN_TOKENS 11
static bool r8_amx(int32_t type, int64_t M) {
    return fl_r8_base(type) >= 0 && fl_isa_get() == FL_ISA_AVX512 && M >= R8_AMX_MIN_TOKENS && fl_cpu()->avx512vbmi && fl_amx_usable();
}

/* AVX-512 steps of more than 8 tokens on its own panels or the R8 groups pass 16 tokens at a time
 * (fl_panel_gemm16_avx512, fl_r8_gemm16_avx512), their activations in 16-token records (act16,
 * fl_act16_bytes of scratch). */
static bool act16_path(int32_t type, int64_t M, int64_t K) {
    /* (only the groups loop of q8_panel_task takes them: panel_group_max > 1; the R16 tiles read
     * the rows) */
    return panel_avx512(type, M) && !(fl_k16_type(type) && panel_direct(type, M)) && M > 8 && panel_path(type, M) && !amx_path(type, M) && panel_group_max(type, K, M) > 1;
}

/* The AVX-512 tile straight on rows [n, n + nr) of a repacked W (panel_direct), tokens [m, m + nt). */
static void direct_gemm(const fl_tensor *W, int64_t n, int nr, const fl_act_q8 *a, int64_t m, int nt, float *y) {
    const char *w = (const char *)W->data + n * W->nb[1];
    if (fl_k16_type(W->type)) fl_k16_gemm_avx512(W->type, w, W->nb[1], nr, a, m, nt, y, W->ne[1]);
    else fl_r8_gemm_avx512(W->type, w, W->nb[1], nr, a, m, nt, y, W->ne[1]);
}

/* The AVX-512 tiles on rows [n0, n1) of matrix i (units of 32 rows), every token of a step:
 * the R8 groups at 2-16 tokens (9-16 from their records, fl_r8_gemm16_avx512, which prefetches
 * the rows as they stream; 2-8 from fl_act_q8's rows), the R16 groups at 2-8 tokens
 * (fl_k16_gemm_avx512; 9-32 take groups of panels, two token tiles each).  Such a step (batched
 * decode) reads each row once, so it takes the GEMV's shares (row_shares, run_shares): each
 * thread streams its own contiguous share of the call's
 * rows, the tiles' prefetch running on into its next take.  Before, units taken from one
 * counter (9-16 tokens: groups of panels; 2-8: single 32-row units) interleaved the threads, so
 * each unit began a new stream, and the last could leave one thread working alone.  The
 * matmuls of a TinyLlama-shaped layer (q, k, v and gate, up as fl_matmul_n), 24 layers' weights
 * streamed, 2 Zen 4 threads, the two alternated layer by layer (a throwaway harness), time of
 * the old units over the shares: 16 tokens Q8_0 1.035, 1.018, 1.017, 1.016, Q4_0 1.036, 1.016,
 * 1.045; Q8_0 at 12 tokens 1.013, Q4_0 at 10 1.044; 8 tokens Q8_0 1.048, 1.139, Q4_0 1.078,
 * 1.189; 4 tokens Q8_0 1.038, 1.010, Q4_0 1.106, 1.210; 2 tokens Q8_0 1.020, 1.057, Q4_0 1.115,
 * 1.182; the R16 types at 4 tokens Q4_K 1.109, Q5_K 1.136, Q6_K 1.148, Q3_K 1.242, Q2_K
 * 1.293, Q4_1 1.165, Q5_0 1.168 (2 and 8 tokens: Q4_K 1.092, 1.105, Q6_K 1.352, 1.221).  Takes
 * of 128 KiB to 2 MiB against the GEMV's 512 KiB: no better (0.98-1.03, 16 tokens). */
static void r8_span(const q8_ctx *c, int i, int64_t n0, int64_t n1) {
    const fl_tensor *W = c->Wv[i];
    if (c->act16)
        fl_r8_gemm16_avx512(W->type, (const char *)W->data + n0 * W->nb[1], W->nb[1], (int)(n1 - n0), c->act16, c->act.nb, (int)c->M,
                            c->yv[i] + n0, W->ne[1], true);
    else direct_gemm(W, n0, (int)(n1 - n0), &c->act, 0, (int)c->M, c->yv[i] + n0);
}

/* Each thread repacks 16-row panels into its own scratch and runs every token through the panel
 * (fl_panel_gemm_avx512 / _avx2).  The units are the panels of all the matrices (fl_matmul_n:
 * q, k, v or gate, up share one quantized x and one parallel pass, and the small k, v spread
 * over the threads with the rest). */
static void q8_panel_task(void *p, int ith, int nth) {
    q8_ctx *c = p;
    const bool avx512 = panel_avx512(c->W->type, c->M); /* (fl_matmul_n: the matrices share one type) */
    void (*pack)(int32_t, const void *, size_t, int, int64_t, void *) = avx512 ? fl_panel_pack_avx512 : fl_panel_pack_avx2;
    const int64_t K = c->W->ne[0], units = c->ubase[c->nw];
    (void)nth;
    char *pan = c->panels ? c->panels + (size_t)ith * (size_t)c->pgroup * c->panel_bytes : NULL; /* (none where panel_direct) */
    if (c->r8_shares) {
        run_shares(c, ith, r8_span);
        return;
    }
    if (c->pgroup > 1) { /* groups of panels (panel_group_max), 8-token tiles through each group */
        const bool amx_r8 = c->act16 && r8_amx(c->W->type, c->M);
        if (amx_r8) fl_amx_r8_begin();
        for (int64_t u = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed); u < units;
             u = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed)) {
            const int i = unit_matrix(c->ubase, u);
            const fl_tensor *W = c->Wv[i];
            const int64_t N = W->ne[1], np = (N + FL_PANEL_ROWS - 1) / FL_PANEL_ROWS, ng = c->groups[i];
            const bool direct = panel_direct(W->type, c->M);
            const int64_t gi = u - c->ubase[i];
            int64_t g0 = gi * np / ng, g1 = (gi + 1) * np / ng;
            if (direct) { /* whole pairs of panels: a group of an odd count ran its last panel in the
                           * 16-row tile (one broadcast per vpdpbusd).  16 tokens over 24 streamed
                           * matrices, alternated call by call: 5632 x 2048 (groups of 19-20) Q4_0
                           * 1.016, Q8_0 1.036; 2048 x 5632 (6-7) Q4_0 1.020; 512 tokens in cache
                           * 1.00-1.01 */
                const int64_t npr = (np + 1) / 2;
                g0 = 2 * (gi * npr / ng), g1 = 2 * ((gi + 1) * npr / ng);
                if (g1 > np) g1 = np;
            }
            const size_t ldw = W->nb[1];
            for (int64_t pi = g0; pi < g1 && !direct; pi++) {
                const int64_t n = pi * FL_PANEL_ROWS;
                pack(W->type, (const char *)W->data + n * ldw, ldw, (int)(N - n < FL_PANEL_ROWS ? N - n : FL_PANEL_ROWS), K,
                     pan + (size_t)(pi - g0) * c->panel_bytes);
            }
            const int64_t mt = c->act16 ? FL_ACT16_TOKENS : 8; /* tokens per tile */
            for (int64_t m = 0; m < c->M; m += mt) {
                const int nt = (int)(c->M - m < mt ? c->M - m : mt);
                const char *ra = c->act16 ? c->act16 + (size_t)(m / FL_ACT16_TOKENS) * fl_act16_bytes(FL_ACT16_TOKENS, K) : NULL;
                for (int64_t pi = g0; pi < g1; pi++) {
                    const int64_t n = pi * FL_PANEL_ROWS;
                    int nr = (int)(N - n < FL_PANEL_ROWS ? N - n : FL_PANEL_ROWS);
                    if (ra && amx_r8 && nt >= R8_AMX_MIN_TOKENS) fl_amx_r8_gemm16(W->type, (const char *)W->data + n * ldw, ldw, nr, ra, c->act.nb, nt, c->yv[i] + m * N + n, N);
                    else if (ra && nt > 8 && direct) { /* two panels' rows at a time: its 32-row tiles, which
                                                        * prefetch them in the first token tile only (the
                                                        * group's rows stay in L2 for the rest) */
                        if (pi + 1 < g1) nr = (int)(N - n < 2 * FL_PANEL_ROWS ? N - n : 2 * FL_PANEL_ROWS), pi++;
                        fl_r8_gemm16_avx512(W->type, (const char *)W->data + n * ldw, ldw, nr, ra, c->act.nb, nt, c->yv[i] + m * N + n, N,
                                            m == 0);
                    }
                    else if (ra && nt > 8) fl_panel_gemm16_avx512(panel_type(W->type), pan + (size_t)(pi - g0) * c->panel_bytes, nr, ra, c->act.nb, nt, c->yv[i] + m * N + n, N);
                    else if (direct) direct_gemm(W, n, nr, &c->act, m, nt, c->yv[i] + m * N + n);
                    else fl_panel_gemm_avx512(panel_type(W->type), pan + (size_t)(pi - g0) * c->panel_bytes, nr, &c->act, m, nt, c->yv[i] + m * N + n, N);
                }
            }
        }
        if (amx_r8) fl_amx_end();
        return;
    }
    /* panels taken dynamically (see the GEMV loop), one ahead: on AVX2 the tiles prefetch the
     * next panel's rows meanwhile (at a few tokens per step the weights stream from memory once,
     * and the pack otherwise stalls on them: `fitllm bench serve` at 16 sequences, Q8_0,
     * spent 27% of its samples in the pack) */
    int64_t u = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
    while (u < units) {
        const int64_t un = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        const int i = unit_matrix(c->ubase, u);
        const fl_tensor *W = c->Wv[i];
        const int64_t N = W->ne[1], n = (u - c->ubase[i]) * c->unit_rows;
        const size_t ldw = W->nb[1];
        const int nr = (int)(N - n < c->unit_rows ? N - n : c->unit_rows);
        /* the tile straight on the groups: panel_direct (AVX-512 both R8 types, AVX2 Q8_0_R8), and on
         * AVX2 Q4_0_R8 for whole panels of steps up to R8_DIRECT_Q4_0 tokens (past that the pack
         * costs less than unpacking each vector per use) */
        const bool direct = panel_direct(W->type, c->M) || (W->type == FL_TYPE_Q4_0_R8 && nr == FL_PANEL_ROWS && c->M <= R8_DIRECT_Q4_0);
        if (!direct) pack(W->type, (const char *)W->data + n * ldw, ldw, nr, K, pan);
        if (avx512 && direct) direct_gemm(W, n, nr, &c->act, 0, (int)c->M, c->yv[i] + n);
        else if (avx512) fl_panel_gemm_avx512(panel_type(W->type), pan, nr, &c->act, 0, (int)c->M, c->yv[i] + n, N);
        else {
            const char *pf = NULL;
            size_t pf_bytes = 0;
            if (un < units) { /* the next panel's rows, maybe of the next matrix */
                const int j = unit_matrix(c->ubase, un);
                const int64_t Nj = c->Wv[j]->ne[1], n1 = (un - c->ubase[j]) * FL_PANEL_ROWS;
                pf = (const char *)c->Wv[j]->data + (size_t)n1 * c->Wv[j]->nb[1];
                pf_bytes = (size_t)(Nj - n1 < FL_PANEL_ROWS ? Nj - n1 : FL_PANEL_ROWS) * c->Wv[j]->nb[1];
            }
            if (direct) fl_r8_gemm_avx2_pf(W->type, (const char *)W->data + n * ldw, ldw, nr, &c->act, 0, (int)c->M, c->yv[i] + n, N, pf, pf_bytes);
            else if (fl_isa_get() == FL_ISA_AVX512 && fl_panel_halves_avx512(panel_type(W->type)))
                fl_panel_gemm_halves_avx512(panel_type(W->type), pan, nr, &c->act, 0, (int)c->M, c->yv[i] + n, N, pf, pf_bytes);
            else fl_panel_gemm_avx2_pf(W->type, pan, nr, &c->act, 0, (int)c->M, c->yv[i] + n, N, pf, pf_bytes);
        }
        u = un;
    }
}

/* AMX GEMM (M >= 13): each thread takes a group of panels at a time, packs them into its scratch,
 * then runs every 16-token tile through all of them (the tile stays in L2 while they pass).
 * Panels of a group fit L2: each thread's scratch holds amx_group_max of them whatever N is (so
 * the scratch of a step does not depend on the matrix's rows); a matrix with few panels takes
 * fewer at a time, so every thread gets >= 4 groups. */
static int64_t amx_group_max(int32_t type, int64_t K) {
    const int64_t g = (int64_t)((512 * 1024) / fl_amx_panel_bytes(type, K));
    return g < 1 ? 1 : g;
}

/* How many groups the panels are cut into: a multiple of the threads, at least 4 per thread,
 * so that no group exceeds amx_group_max; group i is panels [i np / ng, (i + 1) np / ng), sizes
 * within one of each other, so the threads finish together (with groups of the full size the
 * last one was a remainder: 2048 rows as 9 groups of 14 panels and one of 2 left a thread
 * idle for a group) */
static int64_t panel_groups(int64_t N, int64_t g, int nth) {
    const int64_t np = (N + FL_AMX_ROWS - 1) / FL_AMX_ROWS;
    int64_t ng = nth * ((np + nth * g - 1) / (nth * g));
    if (ng < 4 * (int64_t)nth) ng = 4 * (int64_t)nth;
    return ng < np ? ng : np;
}

static int64_t amx_groups(int32_t type, int64_t N, int64_t K, int nth) { return panel_groups(N, amx_group_max(type, K), nth); }

/* Steps of more than 12 tokens (a tile of 16 at least 13/16 used).  At 16 tokens (batched decode
 * of 16 sequences) the tiles beat the VNNI panels: `fitllm bench serve -m tl-q4_0.gguf -n 16
 * --max-seqs 16 ...` ITL p50 135 / 127 ms against 160 / 145 (Q8_0 141 / 164 against 186 / 164),
 * alternated in one session; `fitllm bench matmul -p 12` was even and `-p 8` favoured the panels
 * (Q4_0 168-211 against 214-228 GOP/s), whose cost shrinks with the tokens where a tile's does not.
 * (Those were the file-layout panels, packed per call.  On the Intel KVM guest the R8 groups'
 * VNNI tiles, with no pack, beat these tiles at 16-48 tokens, so where AMX-BF16 is there too the
 * loader repacks Q4_0 / Q8_0 and these tiles only see them with --no-repack: docs/QUANT.md.) */
#define AMX_MIN_TOKENS 13
static bool amx_path(int32_t type, int64_t M) {
    return M >= AMX_MIN_TOKENS && M <= INT32_MAX && fl_amx_type(type) && fl_amx_usable();
}

/* One token tile of Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K (batched decode): each panel is used once, so its rows go
 * straight to the tiles (fl_amx_gemm_rows) with no panel in between; pairs of panels are taken
 * dynamically, one ahead, the next pair's rows prefetched meanwhile.  Against the panels (built
 * at 4112012, runs alternated): `fitllm bench serve -m tl-T.gguf -n 16 --max-seqs 16
 * --prompt-len 16 --gen-len 48 --kv-mem 256MiB -t 2` ITL p50 Q4_0 111 / 107 ms against 137 / 122,
 * Q8_0 102 / 99 against 150 / 139. */
static bool amx_rows_path(int32_t type, int64_t M) {
    return amx_path(type, M) && M <= FL_AMX_TOK &&
           (type == FL_TYPE_Q4_0 || type == FL_TYPE_Q8_0 || type == FL_TYPE_Q4_K || type == FL_TYPE_Q5_K || type == FL_TYPE_Q6_K);
}

static void q8_amx_rows_task(void *p, int ith, int nth) {
    q8_ctx *c = p;
    (void)ith;
    (void)nth;
    const int64_t K = c->W->ne[0], units = c->ubase[c->nw]; /* units: pairs of panels of all the matrices */
    fl_amx_begin(c->W->type);
    int64_t u = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
    while (u < units) {
        const int64_t un = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        const int i = unit_matrix(c->ubase, u);
        const fl_tensor *W = c->Wv[i];
        const int64_t N = W->ne[1], n = (u - c->ubase[i]) * 2 * FL_AMX_ROWS;
        const size_t ldw = W->nb[1];
        const int nr = (int)(N - n < 2 * FL_AMX_ROWS ? N - n : 2 * FL_AMX_ROWS);
        const char *pf = NULL;
        size_t pf_bytes = 0;
        if (un < units) { /* the next pair's rows, maybe of the next matrix */
            const int j = unit_matrix(c->ubase, un);
            const int64_t Nj = c->Wv[j]->ne[1], n1 = (un - c->ubase[j]) * 2 * FL_AMX_ROWS;
            pf = (const char *)c->Wv[j]->data + (size_t)n1 * c->Wv[j]->nb[1];
            pf_bytes = (size_t)(Nj - n1 < 2 * FL_AMX_ROWS ? Nj - n1 : 2 * FL_AMX_ROWS) * c->Wv[j]->nb[1];
        }
        fl_amx_gemm_rows(W->type, (const char *)W->data + (size_t)n * ldw, ldw, nr, K, c->amx_act, (int)c->M, c->yv[i] + n, N,
                         pf, pf_bytes);
        u = un;
    }
    fl_amx_end();
}

static void q8_amx_task(void *p, int ith, int nth) {
    q8_ctx *c = p;
    const int64_t K = c->W->ne[0], M = c->M, units = c->ubase[c->nw]; /* units: the groups of all the matrices */
    const int64_t tiles = (M + FL_AMX_TOK - 1) / FL_AMX_TOK;
    (void)nth;
    char *pan = c->panels + (size_t)ith * (size_t)amx_group_max(c->W->type, K) * c->panel_bytes;
    fl_amx_begin(c->W->type);
    /* groups taken dynamically, one ahead: while a group's tiles run, its successor's weight rows
     * (maybe of the next matrix) are prefetched (at a few tokens per step the weights stream from
     * memory once) */
    int64_t u = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
    while (u < units) {
        const int64_t un = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        const int i = unit_matrix(c->ubase, u);
        const fl_tensor *W = c->Wv[i];
        const int64_t N = W->ne[1], np = (N + FL_AMX_ROWS - 1) / FL_AMX_ROWS, ng = c->ubase[i + 1] - c->ubase[i];
        const int64_t gi = u - c->ubase[i], g0 = gi * np / ng, g1 = (gi + 1) * np / ng;
        const size_t ldw = W->nb[1];
        const char *pf = NULL;
        size_t pf_bytes = 0;
        if (un < units) {
            const int j = unit_matrix(c->ubase, un);
            const fl_tensor *Wj = c->Wv[j];
            const int64_t Nj = Wj->ne[1], npj = (Nj + FL_AMX_ROWS - 1) / FL_AMX_ROWS, ngj = c->ubase[j + 1] - c->ubase[j];
            const int64_t gj = un - c->ubase[j], gn = gj * npj / ngj, gn1 = (gj + 1) * npj / ngj;
            pf = (const char *)Wj->data + (size_t)(gn * FL_AMX_ROWS) * Wj->nb[1];
            pf_bytes = (size_t)((gn1 * FL_AMX_ROWS < Nj ? gn1 * FL_AMX_ROWS : Nj) - gn * FL_AMX_ROWS) * Wj->nb[1];
        }
        for (int64_t pi = g0; pi < g1; pi++) {
            const int64_t n = pi * FL_AMX_ROWS;
            const int nr = (int)(N - n < FL_AMX_ROWS ? N - n : FL_AMX_ROWS);
            fl_amx_panel_pack_avx512(W->type, (const char *)W->data + n * ldw, ldw, nr, K, pan + (size_t)(pi - g0) * c->panel_bytes);
        }
        const int64_t pairs = (g1 - g0 + 1) / 2, calls = pairs * ((tiles + 1) / 2);
        int64_t call = 0;
        for (int64_t mt = 0; mt < tiles; mt += 2) { /* 2 token tiles x 2 panels per kernel call */
            const int ntok = (int)(M - mt * FL_AMX_TOK < 2 * FL_AMX_TOK ? M - mt * FL_AMX_TOK : 2 * FL_AMX_TOK);
            for (int64_t pi = g0; pi < g1; pi += 2, call++) {
                const int two = g1 - pi < 2 ? 1 : 2;
                const int64_t n = pi * FL_AMX_ROWS, nl = (pi + two - 1) * FL_AMX_ROWS;
                const int nr = (int)(N - nl < FL_AMX_ROWS ? N - nl : FL_AMX_ROWS);
                /* this call's share of the prefetch */
                const size_t share = ((pf_bytes + (size_t)calls - 1) / (size_t)calls + 63) & ~(size_t)63;
                const size_t o = (size_t)call * share;
                fl_amx_gemm(W->type, pan + (size_t)(pi - g0) * c->panel_bytes, c->panel_bytes, two, K, c->amx_act, mt,
                            ntok, c->yv[i] + mt * FL_AMX_TOK * N + n, N, nr, o < pf_bytes ? pf + o : NULL,
                            o < pf_bytes ? (pf_bytes - o < share ? pf_bytes - o : share) : 0);
            }
        }
        u = un;
    }
    fl_amx_end();
}

/* ---- AMX-BF16 prefill (M >= AMX_BF16_MIN_TOKENS): no per-block fold ----
 * Each thread takes a group of 16-row panels at a time; K is cut into chunks of BF16_KC: the
 * group's rows are dequantized and rounded into bf16 panels in its scratch (Q4_0 / Q8_0 straight
 * from the blocks, other types through an f32 row of the chunk; a group's chunk fits L2), then
 * every pair of 16-token activation tiles runs through them, the chunks after the first adding
 * to y.  From 64 tokens: each panel's conversion is paid per call, and with fewer token tiles to
 * share it the int8 tiles were even (48 tokens) or ahead (16-32) on 2048 x 2048. */
#define AMX_BF16_MIN_TOKENS 64
#define BF16_KC 1024 /* a multiple of every block size (256) */
#define BF16_GROUP_BYTES (1024 * 1024)

static bool amx_bf16_path(int32_t type, int64_t M) {
    const int32_t base = fl_r8_base(type) >= 0 ? fl_r8_base(type) : type; /* (the R8 groups: fl_amx_bf16_panel_r8) */
    return M >= AMX_BF16_MIN_TOKENS && M <= INT32_MAX && fl_amx_type(base) && fl_amx_bf16_usable();
}

static int64_t bf16_kc(int64_t K) { return K < BF16_KC ? K : BF16_KC; }

static int64_t bf16_group_max(int64_t K) {
    const int64_t g = (int64_t)(BF16_GROUP_BYTES / fl_amx_bf16_panel_bytes(bf16_kc(K)));
    return g < 1 ? 1 : g;
}

/* one thread's scratch: its group's panels (one chunk of K) and an f32 row of the chunk */
static size_t bf16_thread_bytes(int64_t K) {
    return (size_t)bf16_group_max(K) * fl_amx_bf16_panel_bytes(bf16_kc(K)) + (size_t)bf16_kc(K) * sizeof(float);
}

static size_t bf16_scratch_bytes(int64_t M, int64_t K, int nth) {
    return fl_amx_bf16_act_bytes(M, K) + (size_t)nth * bf16_thread_bytes(K);
}

typedef struct {
    const fl_tensor *const *W; /* nw matrices of the same type and K, sharing x */
    float *const *y;
    int nw;
    const float *x;
    int64_t M;
    int64_t gbase[FL_MATMUL_N_MAX + 1]; /* matrix i's groups are [gbase[i], gbase[i + 1]) */
    uint16_t *act;
    char *scratch; /* [nth][bf16_thread_bytes] */
    _Atomic int64_t next;
} bf16_ctx;

static void bf16_act_task(void *p, int ith, int nth) {
    bf16_ctx *c = p;
    int64_t lo, hi;
    fl_split_range((c->M + FL_AMX_TOK - 1) / FL_AMX_TOK, ith, nth, &lo, &hi);
    for (int64_t mt = lo; mt < hi; mt++) fl_amx_bf16_act_pack_avx512(c->x, c->M, c->W[0]->ne[0], mt, c->act);
}

static void bf16_task(void *p, int ith, int nth) {
    bf16_ctx *c = p;
    (void)nth;
    const int64_t K = c->W[0]->ne[0], M = c->M, kc = bf16_kc(K), tiles = (M + FL_AMX_TOK - 1) / FL_AMX_TOK;
    const size_t pstride = fl_amx_bf16_panel_bytes(kc) / sizeof(uint16_t), astride = (size_t)K * FL_AMX_TOK;
    char *mine = c->scratch + (size_t)ith * bf16_thread_bytes(K);
    uint16_t *pan = (uint16_t *)mine;
    float *row = (float *)(mine + (size_t)bf16_group_max(K) * fl_amx_bf16_panel_bytes(kc));
    fl_amx_bf16_begin();
    for (int64_t u = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed); u < c->gbase[c->nw];
         u = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed)) {
        const int i = unit_matrix(c->gbase, u);
        const fl_tensor *W = c->W[i];
        const int64_t N = W->ne[1], np = (N + FL_AMX_ROWS - 1) / FL_AMX_ROWS, ng = c->gbase[i + 1] - c->gbase[i];
        const int64_t gi = u - c->gbase[i], g0 = gi * np / ng, g1 = (gi + 1) * np / ng;
        const size_t ldw = W->nb[1];
        /* R8: N a multiple of 8, a panel is two groups, or one and zeros */
        const bool r8 = fl_r8_base(W->type) >= 0;
        const int step = r8 ? FL_R8_ROWS : 1;
        for (int64_t k0 = 0; k0 < K; k0 += kc) {
            const int64_t kn = K - k0 < kc ? K - k0 : kc;
            const size_t off = fl_type_row_size(W->type, k0);
            for (int64_t pi = g0; pi < g1; pi++)
                for (int r = 0; r < FL_AMX_ROWS; r += step) {
                    const int64_t n = pi * FL_AMX_ROWS + r;
                    uint16_t *pp = pan + (size_t)(pi - g0) * pstride;
                    if (n >= N)
                        for (int z = r; z < r + step; z++) fl_amx_bf16_panel_row_ref(NULL, kn, pp, z);
                    else if (r8) /* (a group's blocks are 8 rows' blocks: its chunk starts 8 x off in) */
                        fl_amx_bf16_panel_r8(W->type, (const char *)W->data + (size_t)n * ldw + (size_t)FL_R8_ROWS * off, kn, pp, r);
                    else {
                        const char *src = (const char *)W->data + (size_t)n * ldw + off;
                        if (!fl_amx_bf16_panel_row_q(W->type, src, kn, pp, r)) { /* other types through an f32 row */
                            fl_dequant_row_avx512(W->type, src, row, kn);
                            fl_amx_bf16_panel_row_avx512(row, kn, pp, r);
                        }
                    }
                }
            for (int64_t mt = 0; mt < tiles; mt += 2) {
                const int ntok = (int)(M - mt * FL_AMX_TOK < 2 * FL_AMX_TOK ? M - mt * FL_AMX_TOK : 2 * FL_AMX_TOK);
                const uint16_t *a = c->act + (size_t)mt * astride + (size_t)k0 * FL_AMX_TOK;
                for (int64_t pi = g0; pi < g1; pi += 2) {
                    const int two = g1 - pi < 2 ? 1 : 2;
                    const int64_t nl = (pi + two - 1) * FL_AMX_ROWS;
                    const int nr = (int)(N - nl < FL_AMX_ROWS ? N - nl : FL_AMX_ROWS);
                    fl_amx_bf16_gemm(pan + (size_t)(pi - g0) * pstride, pstride, two, kn, a, astride, ntok,
                                     c->y[i] + mt * FL_AMX_TOK * N + pi * FL_AMX_ROWS, N, nr, k0 > 0);
                }
            }
        }
    }
    fl_amx_end();
}

/* false (nothing written) when its scratch cannot be had */
static bool bf16_matmul(const fl_tensor *const *W, float *const *y, int nw, const float *x, int64_t M) {
    const int nth = fl_threads_get();
    const int64_t K = W[0]->ne[0];
    const size_t act_bytes = fl_amx_bf16_act_bytes(M, K), th_bytes = (size_t)nth * bf16_thread_bytes(K);
    bf16_ctx c = {W, y, nw, x, M, {0}, NULL, NULL, 0};
    c.act = fl_alloc(FL_MEM_SCRATCH, act_bytes, 64);
    c.scratch = c.act ? fl_alloc(FL_MEM_SCRATCH, th_bytes, 64) : NULL;
    if (!c.scratch) {
        fl_clear_error();
        if (c.act) fl_free(FL_MEM_SCRATCH, c.act, act_bytes);
        return false;
    }
    for (int i = 0; i < nw; i++) /* groups per matrix, as the int8 tiles cut them (none over bf16_group_max) */
        c.gbase[i + 1] = c.gbase[i] + panel_groups(W[i]->ne[1], bf16_group_max(K), nth);
    fl_parallel_n(bf16_act_task, &c, nth);
    fl_parallel_n(bf16_task, &c, nth);
    fl_free(FL_MEM_SCRATCH, c.scratch, th_bytes);
    fl_free(FL_MEM_SCRATCH, c.act, act_bytes);
    return true;
}

/* llama.cpp-order path: rows split over threads, every token through each row */
static void q8_llama_task(void *p, int ith, int nth) {
    q8_ctx *c = p;
    const int64_t N = c->W->ne[1];
    int64_t lo, hi;
    fl_split_range(N, ith, nth, &lo, &hi);
    for (int64_t n = lo; n < hi; n++) {
        const char *w = (const char *)c->W->data + n * c->W->nb[1];
        for (int64_t m = 0; m < c->M; m++) c->y[m * N + n] = fl_dot_q8_llama(c->W->type, w, &c->act, m);
    }
}

/* ---- f32 path ---- */

#define F32_ROWS 8

typedef struct {
    const fl_tensor *W;
    const float *x;
    float *y;
    int64_t M;
    float *buf; /* [nth][F32_ROWS][K] */
    bool wrows; /* fl_mm_wrows_avx512 / _avx2 (f32_wrows), no buf */
    dot_fn dot;
    const fl_convert_kernels *cvt;
} f32_ctx;

static void f32_task(void *p, int ith, int nth) {
    f32_ctx *c = p;
    const int64_t K = c->W->ne[0], N = c->W->ne[1];
    int64_t lo, hi;
    fl_split_range(N, ith, nth, &lo, &hi);
    if (c->wrows) {
        if (lo < hi)
            (fl_isa_get() == FL_ISA_AVX512 ? fl_mm_wrows_avx512 : fl_mm_wrows_avx2)(c->W->type, (const char *)c->W->data + lo * c->W->nb[1],
                                                                                     c->W->nb[1], hi - lo, c->x, c->M, K, c->y + lo, N);
        return;
    }
    float *rows = c->buf ? c->buf + (size_t)ith * F32_ROWS * K : NULL;
    for (int64_t n0 = lo; n0 < hi; n0 += F32_ROWS) {
        const int64_t nr = hi - n0 < F32_ROWS ? hi - n0 : F32_ROWS;
        const float *r[F32_ROWS];
        for (int64_t i = 0; i < nr; i++) {
            const char *src = (const char *)c->W->data + (n0 + i) * c->W->nb[1];
            if (c->W->type == FL_TYPE_F32) r[i] = (const float *)src;
            else {
                if (fl_r8_group_rows(c->W->type)) fl_r8_dequant_row(c->W->type, c->W->data, c->W->nb[1], n0 + i, rows + i * K, K);
                else if (c->W->type == FL_TYPE_F16) c->cvt->f16_to_f32((const uint16_t *)src, rows + i * K, K);
                else if (c->W->type == FL_TYPE_BF16) c->cvt->bf16_to_f32((const uint16_t *)src, rows + i * K, K);
                else if (c->dot == fl_mm_dot_f32_avx512) fl_dequant_row_avx512(c->W->type, src, rows + i * K, K);
                else if (c->dot == fl_mm_dot_f32_avx2) fl_dequant_row_avx2(c->W->type, src, rows + i * K, K);
                else fl_dequant_row(c->W->type, src, rows + i * K, K);
                r[i] = rows + i * K;
            }
        }
        if (c->dot == fl_mm_dot_f32_avx512) fl_mm_rows_f32_avx512(r, (int)nr, c->x, c->M, K, c->y + n0, N, c->W->type == FL_TYPE_F16);
        else {
            /* rows of f16 values: AVX2 and the reference sum their tail in double, as the AVX-512 rows do */
            const bool f16 = c->W->type == FL_TYPE_F16;
            const dot_fn dot = f16 && c->dot == fl_mm_dot_f32_avx2 ? fl_mm_dot_f16vals_avx2 : f16 && c->dot == dot_ggml_f32_ref ? dot_ggml_f16_ref : c->dot;
            for (int64_t m = 0; m < c->M; m++)
                for (int64_t i = 0; i < nr; i++) c->y[m * N + n0 + i] = dot(r[i], c->x + m * K, K);
        }
    }
}

/* Whether the f32 path reads W's rows as they are, with no f32 copy (fl_mm_wrows_avx512 / _avx2). */
static bool f32_wrows(const fl_tensor *W) {
    const fl_isa isa = fl_isa_get();
    if (W->ne[0] % 16 != 0 || (isa != FL_ISA_AVX512 && isa != FL_ISA_AVX2)) return false;
    return W->type == FL_TYPE_F32 || W->type == FL_TYPE_F16 || W->type == FL_TYPE_BF16 || W->type == FL_TYPE_NF4 ||
           W->type == FL_TYPE_FP8_E4M3;
}

size_t fl_matmul_scratch_bytes(const fl_tensor *W, int64_t M, int nth) {
    const int64_t K = W->ne[0];
    if (M <= 0) return 0;
    bool llama;
    if (int8_path(W->type, M, &llama)) {
        if (!llama && amx_bf16_path(W->type, M)) return bf16_scratch_bytes(M, K, nth);
        size_t b = fl_act_q8_bytes(M, K);
        if (!llama && amx_rows_path(W->type, M)) return b + fl_amx_act_bytes(M, K);
        if (!llama && amx_path(W->type, M))
            return b + fl_amx_act_bytes(M, K) + (size_t)nth * (size_t)amx_group_max(W->type, K) * fl_amx_panel_bytes(W->type, K);
        if (!llama && panel_path(W->type, M) && !panel_direct(W->type, M))
            b += (size_t)nth * (size_t)panel_group_max(W->type, K, M) * fl_panel_bytes_for(W->type, K);
        if (!llama && act16_path(W->type, M, K)) b += fl_act16_bytes(M, K);
        return b;
    }
    if (W->type == FL_TYPE_F32) return 0;
    size_t b = f32_wrows(W) ? 0 : (size_t)nth * F32_ROWS * (size_t)K * sizeof(float);
    if (W->type == FL_TYPE_F16 && !fl_matmul_f32_act()) b += (size_t)M * (size_t)K * sizeof(float);
    return b;
}

/* Whether fl_matmul_n can run its nw matrices as one: the same type and K, and a path that takes
 * its units from one counter (GEMV, the AMX rows, the AMX-BF16 tiles). */
static bool fusable(const fl_tensor *const *W, int nw, int64_t M) {
    for (int i = 1; i < nw; i++)
        if (W[i]->type != W[0]->type || W[i]->ne[0] != W[0]->ne[0]) return false;
    bool llama;
    return int8_path(W[0]->type, M, &llama) && !llama &&
           (gemv_path(W[0]->type, M) || panel_path(W[0]->type, M) || amx_rows_path(W[0]->type, M) ||
            amx_bf16_path(W[0]->type, M));
}

static void matmul_n(const fl_tensor *const *Ws, float *const *ys, int nw, const float *x, int64_t M) {
    const fl_tensor *W = Ws[0];
    float *y = ys[0];
    const fl_isa isa = fl_isa_get();
    const int64_t K = W->ne[0];
    if (M <= 0) return;
    bool llama;
    if (int8_path(W->type, M, &llama)) {
        if (!llama && amx_bf16_path(W->type, M) && bf16_matmul(Ws, ys, nw, x, M)) return;
        if (nw > 1 && !gemv_path(W->type, M) && !panel_path(W->type, M) && !amx_rows_path(W->type, M))
            goto each; /* no scratch for the bf16 tiles */
        q8_ctx c = {W, x, y, M, {0}, gemm_for(isa), NULL, 0, NULL, 0};
        c.nw = nw;
        for (int i = 0; i < nw; i++) {
            c.Wv[i] = Ws[i];
            c.yv[i] = ys[i];
        }
        if (fl_act_q8_alloc(&c.act, M, K) == FL_OK) {
            const int nth = fl_threads_get();
            if (fl_r8_group_rows(W->type)) c.act.qs4 = NULL; /* (the Q4_0 order is for the base type's VBMI GEMV: not made) */
            /* the AVX-512 tiles of the repacked types read only codes, d, s and ms (and the records);
             * Q6_K_R16's, Q3_K_R16's and Q2_K_R16's read o6, and the AVX2 panels past 32 tokens of
             * all but Q4_K_R16 read o4 / o6 */
            c.act_all = !(isa == FL_ISA_AVX512 && fl_r8_group_rows(W->type) &&
                          (!fl_k16_type(W->type) || W->type == FL_TYPE_Q4_K_R16 || fl_b16_type(W->type)) &&
                          !llama && !amx_path(W->type, M));
            size_t amx_act_bytes = 0, amx_pan_bytes = 0;
            if (!llama && amx_path(W->type, M)) {
                amx_act_bytes = fl_amx_act_bytes(M, K);
                c.panel_bytes = fl_amx_panel_bytes(W->type, K);
                c.amx_act = fl_alloc(FL_MEM_SCRATCH, amx_act_bytes, 64);
                amx_pan_bytes = amx_rows_path(W->type, M) ? 0 : (size_t)nth * (size_t)amx_group_max(W->type, K) * c.panel_bytes;
                c.panels = c.amx_act && amx_pan_bytes ? fl_alloc(FL_MEM_SCRATCH, amx_pan_bytes, 64) : NULL;
                if (!c.amx_act || (amx_pan_bytes && !c.panels)) { /* no scratch: the AVX-512 paths below (Q6_K: the f32 path) */
                    fl_clear_error();
                    if (c.amx_act) fl_free(FL_MEM_SCRATCH, c.amx_act, amx_act_bytes);
                    c.amx_act = NULL;
                }
            }
            if (nw > 1 && !gemv_path(W->type, M) && !panel_path(W->type, M) && !c.amx_act) { /* no scratch for the AMX rows: one matrix at a time */
                fl_act_q8_free(&c.act);
                goto each;
            }
            if (!c.amx_act && !gemv_path(W->type, M) && !panel_path(W->type, M) && W->type != FL_TYPE_Q8_0 && W->type != FL_TYPE_Q4_0 &&
                !fl_r8_group_rows(W->type) && W->type != FL_TYPE_Q4_K && !llama) {
                fl_act_q8_free(&c.act);
                goto f32_path;
            }
            if (!llama && act16_path(W->type, M, K)) { /* (none: 8-token passes) */
                c.act16_bytes = fl_act16_bytes(M, K);
                c.act16 = fl_alloc(FL_MEM_SCRATCH, c.act16_bytes, 64);
                if (!c.act16) fl_clear_error();
            }
            if (M >= 8) fl_parallel(q8_quant_task, &c);
            else q8_quant_task(&c, 0, 1);
            if (llama) {
                fl_parallel(q8_llama_task, &c);
                fl_act_q8_free(&c.act);
                return;
            }
            atomic_store(&c.next, 0);
            if (c.amx_act) {
                for (int64_t m = M; m % FL_AMX_TOK; m++) fl_amx_act_pack_row(&c.act, m, c.amx_act); /* zero pad */
                if (amx_pan_bytes) {
                    for (int i = 0; i < nw; i++) /* groups of panels (fusable: the same type and K) */
                        c.ubase[i + 1] = c.ubase[i] + amx_groups(W->type, Ws[i]->ne[1], K, nth);
                    fl_parallel_n(q8_amx_task, &c, nth);
                    fl_free(FL_MEM_SCRATCH, c.panels, amx_pan_bytes);
                } else {
                    for (int i = 0; i < nw; i++) /* pairs of panels */
                        c.ubase[i + 1] = c.ubase[i] + (Ws[i]->ne[1] + 2 * FL_AMX_ROWS - 1) / (2 * FL_AMX_ROWS);
                    fl_parallel_n(q8_amx_rows_task, &c, nth);
                }
                fl_free(FL_MEM_SCRATCH, c.amx_act, amx_act_bytes);
                fl_act_q8_free(&c.act);
                return;
            }
            const bool direct = panel_path(W->type, M) && panel_direct(W->type, M); /* panels without a pack */
            c.pgroup = panel_path(W->type, M) ? panel_group_max(W->type, K, M) : 1;
            if (panel_path(W->type, M) && !direct) {
                c.panel_bytes = fl_panel_bytes_for(W->type, K);
                c.panels = fl_alloc(FL_MEM_SCRATCH, (size_t)nth * (size_t)c.pgroup * c.panel_bytes, 64);
                if (!c.panels) { /* no scratch: the tile path below, one matrix at a time */
                    fl_clear_error();
                    if (nw > 1) {
                        if (c.act16) fl_free(FL_MEM_SCRATCH, c.act16, c.act16_bytes);
                        fl_act_q8_free(&c.act);
                        goto each;
                    }
                }
            }
            if (c.panels || direct) {
                c.unit_rows = direct && isa == FL_ISA_AVX512 ? 2 * FL_PANEL_ROWS : FL_PANEL_ROWS; /* (fl_r8_gemm_avx512's 32-row tiles) */
                c.r8_shares = direct && isa == FL_ISA_AVX512 && !r8_amx(W->type, M) &&
                              ((fl_r8_base(W->type) >= 0 && M <= FL_ACT16_TOKENS) || (fl_k16_type(W->type) && M <= 8));
                if (c.r8_shares) row_shares(&c, nth, 2 * FL_PANEL_ROWS);
                else
                    for (int i = 0; i < nw; i++) {
                        c.groups[i] = c.pgroup > 1 ? panel_groups(Ws[i]->ne[1], c.pgroup, nth) : 0;
                        c.ubase[i + 1] = c.ubase[i] + (c.pgroup > 1 ? c.groups[i] : (Ws[i]->ne[1] + c.unit_rows - 1) / c.unit_rows);
                    }
                fl_parallel_n(q8_panel_task, &c, nth);
                if (c.panels) fl_free(FL_MEM_SCRATCH, c.panels, (size_t)nth * (size_t)c.pgroup * c.panel_bytes);
            } else {
                if (gemv_path(W->type, M)) row_shares(&c, fl_threads_get(), row_tile(W->type));
                if (c.act16) { /* (no panel scratch: the tiles below read the rows, which had been left to the records) */
                    c.rows_all = true;
                    fl_parallel(q8_quant_task, &c);
                }
                fl_parallel(q8_gemm_task, &c);
            }
            if (c.act16) fl_free(FL_MEM_SCRATCH, c.act16, c.act16_bytes);
            fl_act_q8_free(&c.act);
            return;
        }
        fl_clear_error(); /* no scratch: fall back to the f32 path */
    }
    if (nw > 1) goto each;
f32_path:;
    const int nth = fl_threads_get();
    f32_ctx c = {W, x, y, M, NULL, f32_wrows(W), dot_for(isa), fl_convert_kernels_get()};
    size_t bytes = 0;
    if (W->type != FL_TYPE_F32 && !c.wrows) {
        bytes = (size_t)nth * F32_ROWS * (size_t)K * sizeof(float);
        c.buf = fl_alloc(FL_MEM_SCRATCH, bytes, 64);
        if (!c.buf) { /* last resort: the single-threaded reference needs no scratch */
            fl_clear_error();
            fl_matmul_ref(W, x, y, M);
            return;
        }
    }
    /* F16 weights take f16 activations (x rounded to f16, as llama.cpp's f16 dot products do),
     * unless f32 activations are asked for. */
    float *xr = NULL;
    const size_t xr_bytes = (size_t)M * (size_t)K * sizeof(float);
    if (W->type == FL_TYPE_F16 && !fl_matmul_f32_act()) {
        xr = fl_alloc(FL_MEM_SCRATCH, xr_bytes, 64);
        if (!xr) fl_clear_error(); /* no scratch: f32 activations */
        else {
            fl_round_f16_row(x, xr, M * K);
            c.x = xr;
        }
    }
    fl_parallel_n(f32_task, &c, nth);
    if (xr) fl_free(FL_MEM_SCRATCH, xr, xr_bytes);
    if (c.buf) fl_free(FL_MEM_SCRATCH, c.buf, bytes);
    return;
each: /* one matrix at a time */
    for (int i = 0; i < nw; i++) matmul_n(&Ws[i], &ys[i], 1, x, M);
}

/* The kernel family matmul_n picks first, in its order (scratch shortfalls aside). */
const char *fl_matmul_kernel_name(int32_t type, int64_t M) {
    bool llama;
    if (M <= 0) return "none";
    if (!int8_path(type, M, &llama)) return "f32";
    if (llama) return "llama-order";
    if (amx_bf16_path(type, M)) return "amx-bf16";
    if (amx_rows_path(type, M)) return "amx-int8-rows";
    if (amx_path(type, M)) return "amx-int8";
    if (r8_amx(type, M)) return "r8-amx";
    if (fl_r8_base(type) >= 0) return fl_isa_get() == FL_ISA_AVX512 ? "r8-vnni" : fl_isa_get() == FL_ISA_AVX2 ? "r8-avx2" : "r8-ref";
    if (fl_k16_type(type)) return panel_direct(type, M) ? "r16-vnni" : "panels";
    if (gemv_path(type, M)) return "gemv";
    if (panel_path(type, M)) return "panels";
    return "tiles";
}

void fl_matmul(const fl_tensor *W, const float *x, float *y, int64_t M) { matmul_n(&W, &y, 1, x, M); }

void fl_matmul_n(int n, const fl_tensor *const *W, float *const *y, const float *x, int64_t M) {
    FL_ASSERT(n >= 0 && n <= FL_MATMUL_N_MAX);
    if (n == 0) return;
    if (n == 1 || fusable(W, n, M)) matmul_n(W, y, n, x, M);
    else
        for (int i = 0; i < n; i++) matmul_n(&W[i], &y[i], 1, x, M);
}
