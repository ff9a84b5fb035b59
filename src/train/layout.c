/* The trainer's shapes and memory layout (layout.h): what fl_train_model_reserve allocates,
 * counted or carved. */
#include "train/layout.h"
#include "core/status.h"
#include "kernels/sgemm.h"

#include <math.h>

/* ---------------------------------------------------------------- shapes */

fl_status fl_train_config_check(const fl_train_config *c) {
    if (c->n_vocab <= 0 || c->n_embd <= 0 || c->n_layer <= 0 || c->n_head <= 0 || c->n_head_kv <= 0 ||
        c->head_dim <= 0 || c->n_ff <= 0 || c->n_ctx <= 0)
        return fl_set_error(FL_ERR_INVALID, "%s: every dimension must be positive", __func__);
    if (c->n_head % c->n_head_kv)
        return fl_set_error(FL_ERR_INVALID, "%s: n_head %d not a multiple of n_head_kv %d", __func__, c->n_head,
                            c->n_head_kv);
    if (!isfinite(c->rms_eps) || c->rms_eps < 0.0f || !isfinite(c->rope_base) || c->rope_base <= 0.0f)
        return fl_set_error(FL_ERR_INVALID, "%s: rms_eps %g must be finite and >= 0, rope_base %g finite and > 0", __func__,
                            (double)c->rms_eps, (double)c->rope_base);
    if (c->rope_dim <= 0 || c->rope_dim > c->head_dim || c->rope_dim % 2)
        return fl_set_error(FL_ERR_INVALID, "%s: rope_dim %d must be even and <= head_dim %d", __func__, c->rope_dim,
                            c->head_dim);
    if ((int64_t)c->n_vocab * c->n_embd > ((int64_t)1 << 40) || (int64_t)c->n_ff * c->n_embd > ((int64_t)1 << 40))
        return fl_set_error(FL_ERR_INVALID, "%s: model too large", __func__);
    return FL_OK;
}

bool fl_train_param_is_matrix(fl_train_param p) { return p >= FL_TP_WQ && p <= FL_TP_FFN_DOWN && p != FL_TP_FFN_NORM; }

bool fl_train_param_per_layer(fl_train_param p) { return p != FL_TP_TOK_EMBD && p != FL_TP_OUT_NORM && p != FL_TP_OUTPUT; }

int fl_train_param_shape(const fl_train_config *c, fl_train_param p, int64_t ne[2]) {
    const int64_t C = c->n_embd, Q = (int64_t)c->n_head * c->head_dim, KV = (int64_t)c->n_head_kv * c->head_dim;
    const int64_t F = c->n_ff, V = c->n_vocab;
    ne[1] = 1;
    switch (p) {
    case FL_TP_TOK_EMBD: case FL_TP_OUTPUT: ne[0] = C; ne[1] = V; return 2;
    case FL_TP_ATTN_NORM: case FL_TP_FFN_NORM: case FL_TP_OUT_NORM: ne[0] = C; return 1;
    case FL_TP_WQ: ne[0] = C; ne[1] = Q; return 2;
    case FL_TP_WK: case FL_TP_WV: ne[0] = C; ne[1] = KV; return 2;
    case FL_TP_WO: ne[0] = Q; ne[1] = C; return 2;
    case FL_TP_FFN_GATE: case FL_TP_FFN_UP: ne[0] = C; ne[1] = F; return 2;
    case FL_TP_FFN_DOWN: ne[0] = F; ne[1] = C; return 2;
    default: FL_UNREACHABLE();
    }
}

/* ---------------------------------------------------------------- gradient buckets */

static const fl_train_param k_head[] = {FL_TP_OUT_NORM, FL_TP_OUTPUT};
static const fl_train_param k_layer[] = {FL_TP_ATTN_NORM, FL_TP_WQ,       FL_TP_WK,    FL_TP_WV,      FL_TP_WO,
                                         FL_TP_FFN_NORM,  FL_TP_FFN_GATE, FL_TP_FFN_UP, FL_TP_FFN_DOWN};
static const fl_train_param k_embd[] = {FL_TP_TOK_EMBD};

int fl_train_grad_bucket_kinds(const fl_train_config *c, int bucket, const fl_train_param **kinds) {
    if (bucket == FL_TRAIN_BUCKET_HEAD) { *kinds = k_head; return 2; }
    if (bucket >= 0 && bucket < c->n_layer) { *kinds = k_layer; return 9; }
    if (bucket == c->n_layer) { *kinds = k_embd; return 1; }
    return 0;
}

int64_t fl_train_layer_numel(const fl_train_config *c, fl_train_param p) { /* one layer's, or the tensor's */
    int64_t ne[2];
    fl_train_param_shape(c, p, ne);
    return ne[0] * ne[1];
}

int64_t fl_train_grad_bucket_elems(const fl_train_config *c, int bucket) {
    const fl_train_param *k;
    int64_t s = 0;
    for (int i = fl_train_grad_bucket_kinds(c, bucket, &k) - 1; i >= 0; i--) s += fl_train_layer_numel(c, k[i]);
    return s;
}

int64_t fl_train_grad_bucket_max(const fl_train_config *c) {
    int64_t mx = fl_train_grad_bucket_elems(c, FL_TRAIN_BUCKET_HEAD);
    if (c->n_layer > 0 && fl_train_grad_bucket_elems(c, 0) > mx) mx = fl_train_grad_bucket_elems(c, 0);
    return fl_train_grad_bucket_elems(c, c->n_layer) > mx ? fl_train_grad_bucket_elems(c, c->n_layer) : mx;
}

int64_t fl_train_param_numel(const fl_train_config *c, fl_train_param p) {
    int64_t ne[2];
    fl_train_param_shape(c, p, ne);
    return ne[0] * ne[1] * (fl_train_param_per_layer(p) ? c->n_layer : 1);
}


/* Walk the layout: with base == NULL only count bytes; otherwise also set the pointers. */
#define TAKE(ptr, n)                                                           \
    do {                                                                       \
        if (base) (ptr) = (float *)(base + off);                               \
        off += (((size_t)(n) * sizeof(float)) + 63) & ~(size_t)63;             \
    } while (0)

/* The saved activations (FL_MEM_ACT): lay them out at base (NULL: only count); returns bytes. */
size_t fl_train_carve_acts(const fl_train_config *c, int64_t N, int k, int r, unsigned char *base, act_layout *L) {
    const int64_t C = c->n_embd, Q = (int64_t)c->n_head * c->head_dim, KV = (int64_t)c->n_head_kv * c->head_dim;
    const int64_t F = c->n_ff, V = c->n_vocab, H = c->n_head, nl = c->n_layer;
    size_t off = 0;
    const int n_slots = k == 0 ? (int)nl : (k < nl ? k : (int)nl);
    const int n_ckpt = k == 0 ? 0 : (int)((nl + k - 1) / k);
    for (int s = 0; s < n_slots; s++) {
        layer_acts dummy, *a = base ? &L->slots[s] : &dummy;
        a->inp = NULL;
        if (k == 0 || s > 0) TAKE(a->inp, N * C);
        TAKE(a->ln1, N * C); TAKE(a->rstd1, N); TAKE(a->q, N * Q); TAKE(a->k, N * KV); TAKE(a->v, N * KV);
        TAKE(a->att, N * Q); TAKE(a->lse, N * H); TAKE(a->mid, N * C); TAKE(a->ln2, N * C); TAKE(a->rstd2, N);
        TAKE(a->g, N * F); TAKE(a->u, N * F); TAKE(a->h, N * F);
        for (int p = 0; p < FL_TP_COUNT; p++) {
            a->xa[p] = NULL;
            if (r > 0 && fl_train_param_is_matrix((fl_train_param)p)) TAKE(a->xa[p], N * r);
        }
    }
    for (int j = 0; j < n_ckpt; j++) {
        float *dummy = NULL;
        TAKE(*(base ? &L->ckpt[j] : &dummy), N * C);
    }
    act_layout tmpL;
    act_layout *P = base ? L : &tmpL;
    TAKE(P->xL, N * C); TAKE(P->lnf, N * C); TAKE(P->rstdf, N); TAKE(P->logits, N * V);
    TAKE(P->losses, N); TAKE(P->ce_lse, N); TAKE(P->dloss, N);
    if (base) {
        L->n_slots = n_slots;
        L->n_ckpt = n_ckpt;
    }
    return off;
}

/* The backward temporaries (FL_MEM_SCRATCH: workspace, live only within a backward, kept for the
 * next step): lay them out at base (NULL: only count); returns bytes.  The FFN part (dF1, dF2)
 * and the attention part (dq, dk, dv) are never live at once, so they share one region of
 * max(Q + 2 KV, 2 F) per token. */
size_t fl_train_carve_bwd(const fl_train_config *c, int64_t N, int r, unsigned char *base, act_layout *P) {
    const int64_t C = c->n_embd, Q = (int64_t)c->n_head * c->head_dim, KV = (int64_t)c->n_head_kv * c->head_dim;
    const int64_t F = c->n_ff;
    size_t off = 0;
    act_layout tmpL;
    if (!base) P = &tmpL;
    TAKE(P->dres, N * C); TAKE(P->dbuf, N * (C > Q ? C : Q));
    const int64_t un = (Q + 2 * KV > 2 * F ? Q + 2 * KV : 2 * F);
    float *u0 = NULL;
    TAKE(u0, N * un);
    if (base) {
        P->dF1 = u0;
        P->dF2 = u0 + N * F;
        P->dq = u0;
        P->dk = u0 + N * Q;
        P->dv = u0 + N * (Q + KV);
    }
    P->dlora = NULL;
    if (r > 0) TAKE(P->dlora, N * r);
    return off;
}
#undef TAKE

size_t fl_train_act_table_bytes(const fl_train_config *c, int k) {
    const int n_slots = k == 0 ? c->n_layer : (k < c->n_layer ? k : c->n_layer);
    const int n_ckpt = k == 0 ? 0 : (c->n_layer + k - 1) / k;
    return sizeof(act_layout) + (size_t)n_slots * sizeof(layer_acts) + (size_t)n_ckpt * sizeof(float *);
}

size_t fl_train_act_bytes(const fl_train_config *cfg, int64_t max_tokens, int ckpt_every, int lora_rank) {
    return fl_train_carve_acts(cfg, max_tokens, ckpt_every, lora_rank, NULL, NULL) + fl_train_act_table_bytes(cfg, ckpt_every);
}

size_t fl_train_bwd_bytes(const fl_train_config *cfg, int64_t max_tokens, int lora_rank) {
    return fl_train_carve_bwd(cfg, max_tokens, lora_rank, NULL, NULL);
}


/* ---- the f32 products' scratch ---- */

static size_t gemm_max(size_t cur, int64_t M, int64_t N, int64_t K, int nth) {
    const size_t b = fl_sgemm_scratch_bytes(M, N, K, nth);
    return b > cur ? b : cur;
}

/* y = x W^T with W (O, I) over N tokens, as model.c's linear_forward / linear_backward run it */
static size_t linear_gemm(size_t cur, int64_t N, int64_t I, int64_t O, int64_t r, int nth) {
    cur = gemm_max(cur, N, O, I, nth); /* y = x W^T */
    cur = gemm_max(cur, N, I, O, nth); /* dx += dy W */
    if (r == 0) return gemm_max(cur, O, I, N, nth); /* dW += dy^T x */
    cur = gemm_max(cur, N, r, I, nth); /* xa = x A^T */
    cur = gemm_max(cur, N, O, r, nth); /* y += xa B^T */
    cur = gemm_max(cur, N, r, O, nth); /* dxa = dy B */
    cur = gemm_max(cur, O, r, N, nth); /* dB += dy^T xa */
    cur = gemm_max(cur, N, I, r, nth); /* dx += dxa A */
    return gemm_max(cur, r, I, N, nth); /* dA += dxa^T x */
}

size_t fl_train_gemm_scratch_bytes(const fl_train_config *c, int64_t N, int lora_rank, int nth) {
    const int64_t C = c->n_embd, Q = (int64_t)c->n_head * c->head_dim, KV = (int64_t)c->n_head_kv * c->head_dim;
    const int64_t F = c->n_ff, V = c->n_vocab, r = lora_rank > 0 ? lora_rank : 0;
    size_t b = 0;
    b = linear_gemm(b, N, C, Q, r, nth);  /* wq */
    b = linear_gemm(b, N, C, KV, r, nth); /* wk, wv */
    b = linear_gemm(b, N, Q, C, r, nth);  /* wo */
    b = linear_gemm(b, N, C, F, r, nth);  /* gate, up */
    b = linear_gemm(b, N, F, C, r, nth);  /* down */
    b = gemm_max(b, N, V, C, nth);        /* logits = x W_out^T */
    b = gemm_max(b, N, C, V, nth);        /* dx += dlogits W_out */
    if (r == 0) b = gemm_max(b, V, C, N, nth);
    return b;
}
