/* Memory planner formulas: weights, KV, step buffers, training state, sharding, fitting.
 * Every formula is written down in docs/PLANNER.md and the buffers in plan.h. */
#include "plan/plan.h"

#include "dist/zero.h"
#include "kernels/attn.h"
#include "kernels/matmul.h"
#include "kernels/sgemm.h"
#include "kv/paged_attn.h"
#include "train/model.h"
#include "train/optim.h"
#include "core/dtype.h"
#include "core/status.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* ---- saturating u64 arithmetic (a plan of absurd inputs must not wrap into "fits") ---- */

static uint64_t sadd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
static uint64_t smul(uint64_t a, uint64_t b) { return a && b > UINT64_MAX / a ? UINT64_MAX : a * b; }
static uint64_t smul3(uint64_t a, uint64_t b, uint64_t c) { return smul(smul(a, b), c); }
static uint64_t cdiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }
static uint64_t u(int64_t x) { return x > 0 ? (uint64_t)x : 0; }

void fl_plan_fmt_bytes(uint64_t b, char *buf, size_t cap) {
    double x = (double)b;
    if (b == UINT64_MAX) snprintf(buf, cap, "overflow");
    else if (x >= 1099511627776.0) snprintf(buf, cap, "%.2f TiB", x / 1099511627776.0);
    else if (x >= 1073741824.0) snprintf(buf, cap, "%.2f GiB", x / 1073741824.0);
    else if (x >= 1048576.0) snprintf(buf, cap, "%.2f MiB", x / 1048576.0);
    else if (x >= 1024.0) snprintf(buf, cap, "%.2f KiB", x / 1024.0);
    else snprintf(buf, cap, "%llu B", (unsigned long long)b);
}

/* ---- weights ---- */

uint64_t fl_plan_tensor_bytes(int32_t type, int64_t ne0, int64_t n_rows) {
    const fl_type_info *ti = fl_type_get(type);
    if (!ti || ne0 < 0 || n_rows < 0) return 0;
    uint64_t row;
    if (ne0 % ti->blck_size == 0) row = (uint64_t)(ne0 / ti->blck_size) * (uint64_t)ti->type_size;
    else row = cdiv(smul(u(ne0), (uint64_t)ti->type_size * 8), (uint64_t)ti->blck_size * 8); /* partial block: bits */
    uint64_t bytes = smul(row, u(n_rows));
    if (type == FL_TYPE_FP8_E4M3 || type == FL_TYPE_FP8_E5M2) bytes = sadd(bytes, smul(4, u(n_rows))); /* f32 scale per row */
    if (type == FL_TYPE_NF4) bytes = sadd(bytes, smul(4, cdiv(smul(cdiv(u(ne0), 64), u(n_rows)), 256)));
    return bytes;
}

static bool use_more_bits(int64_t l, int64_t n) { return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2; }

int32_t fl_plan_role_type(const fl_plan_wtype *w, fl_plan_role role, int64_t layer, int64_t n_layer) {
    switch (role) {
    case FL_ROLE_OUTPUT_NORM: case FL_ROLE_ATTN_NORM: case FL_ROLE_FFN_NORM: case FL_ROLE_QKV_BIAS: case FL_ROLE_FFN_ROUTER:
        return FL_TYPE_F32;
    case FL_ROLE_OUTPUT: return w->more >= 0 ? w->more : w->base;
    case FL_ROLE_ATTN_V: case FL_ROLE_FFN_DOWN:
        return w->more >= 0 && use_more_bits(layer, n_layer) ? w->more : w->base;
    default: return w->base;
    }
}

/* Elements of a role: ne0 (row length) x rows; 0 rows when the model lacks it. */
static void role_dims(const fl_model_shape *s, fl_plan_role r, int64_t *ne0, int64_t *rows) {
    int64_t qd = s->n_head * s->head_dim, kvd = s->n_head_kv * s->head_dim, ne = s->n_expert > 0 ? s->n_expert : 1;
    *ne0 = s->n_embd;
    *rows = 1;
    switch (r) {
    case FL_ROLE_TOKEN_EMBD: *rows = s->n_vocab; break;
    case FL_ROLE_OUTPUT: *rows = s->tied_output ? 0 : s->n_vocab; break;
    case FL_ROLE_OUTPUT_NORM: case FL_ROLE_ATTN_NORM: case FL_ROLE_FFN_NORM: break;
    case FL_ROLE_ATTN_Q: *rows = qd; break;
    case FL_ROLE_ATTN_K: case FL_ROLE_ATTN_V: *rows = kvd; break;
    case FL_ROLE_ATTN_O: *ne0 = qd; *rows = s->n_embd; break;
    case FL_ROLE_QKV_BIAS: *ne0 = qd + 2 * kvd; *rows = s->qkv_bias ? 1 : 0; break;
    case FL_ROLE_FFN_ROUTER: *rows = s->n_expert; break;
    case FL_ROLE_FFN_GATE: case FL_ROLE_FFN_UP: *rows = s->n_ff * ne; break;
    case FL_ROLE_FFN_DOWN: *ne0 = s->n_ff; *rows = s->n_embd * ne; break;
    default: *rows = 0;
    }
}

static bool role_is_layer(fl_plan_role r) { return r >= FL_ROLE_ATTN_NORM; }
static bool role_is_1d(fl_plan_role r) {
    return r == FL_ROLE_ATTN_NORM || r == FL_ROLE_FFN_NORM || r == FL_ROLE_QKV_BIAS || r == FL_ROLE_OUTPUT_NORM || r == FL_ROLE_FFN_ROUTER;
}

/* Weights of the model split the way sharding needs them. */
typedef struct wparts {
    uint64_t embd, output, other;
    uint64_t split[FL_PLAN_MAX_LAYERS], repl[FL_PLAN_MAX_LAYERS];
    uint64_t kv[FL_PLAN_MAX_LAYERS]; /* part of split: attn_k + attn_v */
} wparts;

static void weight_parts(const fl_model_shape *s, const fl_plan_wtype *w, bool from_file, wparts *p) {
    memset(p, 0, sizeof *p);
    int64_t L = s->n_layer < FL_PLAN_MAX_LAYERS ? s->n_layer : FL_PLAN_MAX_LAYERS;
    if (from_file && s->has_weight_bytes) {
        p->embd = s->w_embd;
        p->output = s->w_output;
        p->other = s->w_other;
        for (int64_t l = 0; l < L; l++) {
            p->split[l] = s->w_layer_split[l];
            p->repl[l] = s->w_layer_repl[l];
            p->kv[l] = s->w_layer_kv[l];
        }
        return;
    }
    for (int r = 0; r < FL_ROLE_COUNT; r++) {
        int64_t ne0, rows;
        role_dims(s, (fl_plan_role)r, &ne0, &rows);
        if (!rows) continue;
        if (!role_is_layer((fl_plan_role)r)) {
            uint64_t b = fl_plan_tensor_bytes(fl_plan_role_type(w, (fl_plan_role)r, -1, s->n_layer), ne0, rows);
            if (r == FL_ROLE_TOKEN_EMBD) p->embd = b;
            else if (r == FL_ROLE_OUTPUT) p->output = b;
            else p->other = sadd(p->other, b);
            continue;
        }
        for (int64_t l = 0; l < L; l++) {
            uint64_t b = fl_plan_tensor_bytes(fl_plan_role_type(w, (fl_plan_role)r, l, s->n_layer), ne0, rows);
            if (role_is_1d((fl_plan_role)r)) p->repl[l] = sadd(p->repl[l], b);
            else p->split[l] = sadd(p->split[l], b);
            if (r == FL_ROLE_ATTN_K || r == FL_ROLE_ATTN_V) p->kv[l] = sadd(p->kv[l], b);
        }
    }
}

uint64_t fl_plan_weights_bytes(const fl_model_shape *s, const fl_plan_wtype *w, bool from_file) {
    wparts p;
    weight_parts(s, w, from_file, &p);
    uint64_t t = sadd(sadd(p.embd, p.output), p.other);
    for (int64_t l = 0; l < s->n_layer && l < FL_PLAN_MAX_LAYERS; l++) t = sadd(t, sadd(p.split[l], p.repl[l]));
    return t;
}

int64_t fl_plan_n_params(const fl_model_shape *s) {
    if (s->has_weight_bytes && s->n_params_file > 0) return s->n_params_file;
    uint64_t n = 0;
    for (int r = 0; r < FL_ROLE_COUNT; r++) {
        int64_t ne0, rows;
        role_dims(s, (fl_plan_role)r, &ne0, &rows);
        uint64_t e = smul(u(ne0), u(rows));
        n = sadd(n, role_is_layer((fl_plan_role)r) ? smul(e, u(s->n_layer)) : e);
    }
    return n > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)n;
}

/* ---- KV ---- */

static bool kv_type_ok(int32_t t) {
    return t == FL_TYPE_F32 || t == FL_TYPE_F16 || t == FL_TYPE_BF16 || t == FL_TYPE_Q8_0 || t == FL_TYPE_Q4_0 ||
           t == FL_TYPE_FP8_E4M3 || t == FL_TYPE_FP8_E5M2;
}

static fl_status check_kv(const fl_model_shape *s, int32_t kv_type) {
    if (!kv_type_ok(kv_type))
        return fl_set_error(FL_ERR_INVALID, "KV type %s is not supported (f32, f16, bf16, q8_0, q4_0, fp8_e4m3, fp8_e5m2)", fl_type_name(kv_type));
    if ((kv_type == FL_TYPE_Q8_0 || kv_type == FL_TYPE_Q4_0) && s->head_dim % 32)
        return fl_set_error(FL_ERR_INVALID, "KV type %s needs head_dim to be a multiple of 32 (it is %lld)", fl_type_name(kv_type), (long long)s->head_dim);
    return FL_OK;
}

/* Bytes of K (or V) for one head over a group of n_tok tokens. */
static uint64_t kv_head_bytes(int32_t t, int64_t head_dim, int64_t n_tok) {
    uint64_t hd = u(head_dim), n = u(n_tok);
    switch (t) {
    case FL_TYPE_F32: return smul3(4, hd, n);
    case FL_TYPE_Q8_0: return smul3(hd / 32, 34, n);
    case FL_TYPE_Q4_0: return smul3(hd / 32, 18, n);
    case FL_TYPE_FP8_E4M3: case FL_TYPE_FP8_E5M2: return sadd(smul(hd, n), 4 * cdiv(n, FL_PLAN_FP8_GROUP));
    default: return smul3(2, hd, n); /* f16, bf16 */
    }
}

fl_status fl_plan_kv_bytes_per_token(const fl_model_shape *s, int32_t kv_type, uint64_t *out) {
    fl_status st = check_kv(s, kv_type);
    if (st) return st;
    /* per FL_PLAN_FP8_GROUP tokens, so fp8 scales come out exact, then per token */
    uint64_t g = smul3(2 * u(s->n_layer), u(s->n_head_kv), kv_head_bytes(kv_type, s->head_dim, FL_PLAN_FP8_GROUP));
    *out = g / FL_PLAN_FP8_GROUP;
    return FL_OK;
}

/* Does layer l use the sliding window?  n_swa of n layers do, spread evenly. */
static bool layer_is_swa(const fl_model_shape *s, int64_t l) {
    if (s->sliding_window <= 0) return false;
    int64_t n = s->n_layer, k = s->n_swa_layers <= 0 || s->n_swa_layers > n ? n : s->n_swa_layers;
    return (l * k) / n != ((l + 1) * k) / n;
}

fl_status fl_plan_kv_bytes(const fl_model_shape *s, int32_t kv_type, int64_t n_ctx, int64_t n_seq, int64_t kv_block,
                           int32_t tp, int32_t sp, int64_t l0, int64_t l1, uint64_t *out) {
    fl_status st = check_kv(s, kv_type);
    if (st) return st;
    if (kv_block <= 0 || kv_block % FL_PLAN_FP8_GROUP)
        return fl_set_error(FL_ERR_INVALID, "KV block of %lld tokens: must be a positive multiple of %d", (long long)kv_block, FL_PLAN_FP8_GROUP);
    if (tp < 1 || sp < 1) return fl_set_error(FL_ERR_INVALID, "tp and sp must be >= 1");
    uint64_t heads = cdiv(u(s->n_head_kv), (uint64_t)tp);
    uint64_t tok = cdiv(u(n_ctx), (uint64_t)sp);
    uint64_t blocks = cdiv(tok, u(kv_block));
    uint64_t blocks_swa = s->sliding_window > 0 ? cdiv(u(s->sliding_window), u(kv_block)) + 1 : blocks;
    uint64_t block_bytes = smul3(2, heads, kv_head_bytes(kv_type, s->head_dim, kv_block));
    uint64_t t = 0;
    for (int64_t l = l0; l < l1; l++) {
        uint64_t nb = layer_is_swa(s, l) && blocks_swa < blocks ? blocks_swa : blocks;
        t = sadd(t, smul(nb, block_bytes));
    }
    *out = smul(t, u(n_seq));
    return FL_OK;
}

/* ---- inference step buffers ---- */

static uint64_t r64(uint64_t n) { return n > UINT64_MAX - 63 ? UINT64_MAX : (n + 63) & ~(uint64_t)63; }

/* FL_MEM_SCRATCH fl_matmul allocates for one call: asked of kernels/matmul itself, so the plan
 * follows the kernels (q8 activations for Q8_0 / Q4_0, AVX-512 weight panels per thread for
 * M > 1, dequantized f32 rows for other types unless they are read in place).  It is the
 * figure for the ISA of this machine. */
uint64_t fl_plan_matmul_scratch(int32_t type, int64_t M, int64_t K, int32_t n_threads) {
    if (M <= 0 || K <= 0 || type == FL_TYPE_F32) return 0;
    fl_tensor W;
    const int64_t ne[2] = {K, 16};
    if (!fl_tensor_init(&W, type, 2, ne, NULL)) return 0;
    return (uint64_t)fl_matmul_scratch_bytes(&W, M, n_threads > 0 ? n_threads : 1);
}

void fl_plan_inference_buffers(const fl_model_shape *s, int64_t n_tokens, int64_t n_ctx, int64_t n_logit_rows,
                               fl_plan_attn attn, int32_t n_threads, int32_t tp, int32_t weight_type,
                               int32_t kv_type, fl_plan_buffers *b) {
    fl_plan_inference_buffers_types(s, n_tokens, n_ctx, n_logit_rows, attn, n_threads, tp, &weight_type, 1, kv_type, b);
}

void fl_plan_inference_buffers_types(const fl_model_shape *s, int64_t n_tokens, int64_t n_ctx, int64_t n_logit_rows,
                                     fl_plan_attn attn, int32_t n_threads, int32_t tp, const int32_t *types,
                                     int n_types, int32_t kv_type, fl_plan_buffers *b) {
    memset(b, 0, sizeof *b);
    uint64_t T = u(n_tokens), R = u(n_logit_rows), tpu = tp > 0 ? (uint64_t)tp : 1, hd = u(s->head_dim);
    uint64_t heads = cdiv(u(s->n_head), tpu), qd = smul(heads, hd), kvh = cdiv(u(s->n_head_kv), tpu), kvd = smul(kvh, hd);
    uint64_t ff = cdiv(smul(u(s->n_ff), s->n_expert_used > 0 ? u(s->n_expert_used) : 1), tpu);
    const uint64_t nth = n_threads > 0 ? (uint64_t)n_threads : 1;
    /* the model's workspace (fl_model_workspace_bytes: every buffer rounded up to 64 bytes) */
    b->x = r64(smul3(T, u(s->n_embd), 4));
    b->xb = b->x;
    b->out = b->x;
    b->q = r64(smul3(T, qd, 4));
    b->k = r64(smul3(T, kvd, 4));
    b->v = b->k;
    b->att = b->q;
    b->hb = r64(smul3(T, ff, 4));
    b->hb2 = b->hb;
    b->xl = r64(smul3(R, u(s->n_embd), 4));
    b->router = s->n_expert > 0 ? smul3(T, u(s->n_expert), 4) : 0;
    b->scores = attn == FL_PLAN_ATTN_NAIVE ? smul(smul3(heads, T, u(n_ctx)), 4) : 0;
    b->logits = smul3(R, cdiv(u(s->n_vocab), tpu), 4); /* the engine's logits rows */
    if (attn == FL_PLAN_ATTN_FLASH) {
        /* the paged-attention workspace (kv/paged_attn.c, 16-token blocks): per thread a K and a
         * V block, their scores and FL_PAGED_Q_TILE query rows' states per head of a KV group;
         * the cache grows it by doubling from 64 KiB */
        const uint64_t g = kvh ? cdiv(heads, kvh) : 1, bs = 16;
        uint64_t per = 2 * bs * hd + bs + smul(2 * FL_PAGED_Q_TILE * g, hd + 2);
        per = (per + 15) & ~(uint64_t)15;
        uint64_t need = smul3(4, per, nth);
        if (kv_type == FL_TYPE_F16) need = sadd(r64(need), smul3(T, qd, 4)); /* f16-rounded queries (kv_cache.c) */
        uint64_t cap = 65536;
        while (cap < need && cap < UINT64_MAX / 2) cap *= 2;
        b->tiles = cap;
    }
    /* the largest matmul workspace of the step: the layers' matrices for T rows (the widest
     * input: n_embd, q width or ffn width), the output matrix for R rows, of any of the types
     * (in a Q4_K_M model the Q6_K matrices' panels are the larger) */
    uint64_t in = u(s->n_embd);
    if (qd > in) in = qd;
    if (ff > in) in = ff;
    for (int i = 0; i < n_types; i++) {
        const uint64_t l = fl_plan_matmul_scratch(types[i], (int64_t)T, (int64_t)in, n_threads);
        const uint64_t o = fl_plan_matmul_scratch(types[i], (int64_t)R, s->n_embd, n_threads);
        if (l > b->qact) b->qact = l;
        if (o > b->qact) b->qact = o;
    }
    b->batch = sadd(smul(T, 17), smul(R, 16)); /* the engine's token / position / sequence / adapter / flag arrays, its rows' */
    uint64_t a[] = {b->x, b->xb, b->out, b->q, b->k, b->v, b->att, b->hb, b->hb2, b->xl, b->router, b->scores, b->logits};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) b->act_total = sadd(b->act_total, a[i]);
    b->scratch_total = sadd(sadd(b->tiles, b->qact), b->batch);
}

uint64_t fl_plan_inference_act_bytes(const fl_model_shape *s, int64_t n_tokens_per_step, int64_t n_ctx, fl_plan_attn attn) {
    fl_plan_buffers b;
    fl_plan_inference_buffers(s, n_tokens_per_step, n_ctx, n_tokens_per_step, attn, 1, 1, FL_TYPE_F16, FL_TYPE_F16, &b);
    return b.act_total;
}

/* ---- training state ---- */

/* The optimizer states of params parameters, as fl_optim_new allocates them (8-bit: blocks of 256) */
static uint64_t optim_bytes(const fl_plan_input *in, uint64_t params) {
    if (params >= (uint64_t)1 << 60) return smul(params, in->optim == FL_PLAN_OPTIM_ADAMW ? 8 : 2);
    return fl_optim_states_bytes_for(in->optim == FL_PLAN_OPTIM_ADAMW ? FL_OPTIMIZER_ADAMW : FL_OPTIMIZER_ADAMW8BIT, params, 256);
}

/* ZeRO stages 1 and 2 as fitllm's trainer runs them (dist/zero.h) over dp ranks for `params`
 * trainable parameters: rank 0, the fullest, keeps the optimizer states of a shard (ceil(P / dp)
 * rounded up to the 8-bit block), the collectives' pieces with the communicator, and of the
 * gradient: stage 1 the whole (*grads on entry); stage 2 the summed shard and, where the
 * backward hands its gradients over a bucket at a time (`bucket` floats of staging, a full
 * fine-tune), that bucket instead of the whole, else the whole too (LoRA's adapters).  The
 * parameters stay whole. */
static void zero_trainer_bytes(const fl_plan_input *in, uint64_t dp, uint64_t params, uint64_t bucket, uint64_t *optim,
                               uint64_t *grads, fl_plan_device *dev) {
    const int64_t shard = fl_zero_stride((int32_t)dp, (int64_t)params, 256);
    uint64_t gshard, comm;
    fl_zero_bytes_for(in->zero_stage, (int32_t)dp, (int64_t)params, 256, 0, &gshard, &comm);
    *optim = optim_bytes(in, (uint64_t)shard < params ? (uint64_t)shard : params);
    if (in->zero_stage == 2 && bucket > 0) *grads = smul(bucket, 4);
    *grads = sadd(*grads, gshard);
    dev->bytes[FL_MEM_COMM] = sadd(comm, fl_comm_object_bytes());
    dev->bytes[FL_MEM_MISC] = sadd(dev->bytes[FL_MEM_MISC], fl_zero_object_bytes());
}

/* The trainer's largest gradient bucket (fl_train_grad_bucket_max) for shape s; 0 where the
 * shape is past what its config holds. */
static uint64_t grad_bucket_elems(const fl_model_shape *s) {
    const int64_t i32 = INT32_MAX;
    if (s->n_vocab > i32 || s->n_embd > i32 || s->n_layer > i32 || s->n_head > i32 || s->n_head_kv > i32 ||
        s->head_dim > i32 || s->n_ff > i32 || s->n_vocab < 1 || s->n_embd < 1 || s->n_expert)
        return 0;
    const fl_train_config c = {.n_vocab = (int32_t)s->n_vocab, .n_embd = (int32_t)s->n_embd, .n_layer = (int32_t)s->n_layer,
                               .n_head = (int32_t)s->n_head, .n_head_kv = (int32_t)s->n_head_kv,
                               .head_dim = (int32_t)s->head_dim, .n_ff = (int32_t)s->n_ff};
    return (uint64_t)fl_train_grad_bucket_max(&c);
}

/* ---- training activations ---- */

static bool is_mixed(const fl_plan_input *in) { return in->weights.base != FL_TYPE_F32; }

void fl_plan_train_act_bytes(const fl_model_shape *s, const fl_plan_input *in, int64_t l0, int64_t l1, bool last_stage,
                             uint64_t *act, uint64_t *scratch) {
    uint64_t tpu = in->tp > 0 ? (uint64_t)in->tp : 1, hd = u(s->head_dim), E = u(s->n_embd);
    const uint64_t elt = 4; /* the trainer keeps its activations in f32, mixed precision too */
    uint64_t ctx_r = cdiv(u(in->n_ctx), in->sp > 0 ? (uint64_t)in->sp : 1);
    uint64_t N = smul(u(in->n_seq), ctx_r); /* tokens on this rank */
    uint64_t heads = cdiv(u(s->n_head), tpu), qd = smul(heads, hd), kvd = smul(cdiv(u(s->n_head_kv), tpu), hd);
    uint64_t ff = cdiv(smul(u(s->n_ff), s->n_expert_used > 0 ? u(s->n_expert_used) : 1), tpu);
    /* saved per layer per token: x_in, attn-norm out, q, k, v, att out, x_mid, ffn-norm out,
     * gate, up, act(gate)*up, router probs; f32 rms and attention statistics */
    uint64_t per = smul(elt, 4 * E + 2 * qd + 2 * kvd + 3 * ff + u(s->n_expert));
    per = sadd(per, smul(4, 2));
    if (in->lora_rank > 0) per = sadd(per, smul3(elt, 7, u(in->lora_rank)));      /* x A^T of each adapted matrix */
    if (in->attn == FL_PLAN_ATTN_FLASH) per = sadd(per, smul(4, heads));          /* logsumexp per head */
    else per = sadd(per, smul3(elt, heads, ctx_r));                          /* probabilities */
    uint64_t nL = l1 > l0 ? (uint64_t)(l1 - l0) : 0, k = in->ckpt_every > 0 ? u(in->ckpt_every) : 0;
    uint64_t a;
    if (!k || k >= nL) a = smul3(N, nL, per);
    else /* checkpoints + one segment, whose first layer reads its input from the checkpoint */
        a = sadd(smul3(N, cdiv(nL, k), smul(E, elt)), smul3(N, k, per) - smul3(N, E, elt));
    /* the last stage: the final residual and norm output, f32 logits, the final rms and per-token
     * loss, logsumexp and loss gradient */
    if (last_stage) a = sadd(a, smul(N, sadd(sadd(smul(2 * E, elt), smul(cdiv(u(s->n_vocab), tpu), 4)), 16)));
    /* backward temporaries (f32, one allocation the trainer keeps): d residual, a buffer of
     * max(E, qd), the widest intermediate gradient, and LoRA's gradient of x A^T */
    uint64_t wide = qd + 2 * kvd > 2 * ff ? qd + 2 * kvd : 2 * ff;
    uint64_t bwd = smul3(N, E + (E > qd ? E : qd) + wide, 4);
    if (in->lora_rank > 0) bwd = sadd(bwd, smul3(N, u(in->lora_rank), 4));
    /* One device and nothing split (fitllm's trainer): its own layout, asked of it as the matmul
     * workspace is asked of the kernels (each buffer rounded up to 64 bytes, the slot table);
     * the formulas above for the rest. */
    const uint64_t i32 = INT32_MAX;
    const int nth_plan = in->n_threads > 0 ? in->n_threads : 1;
    /* the f32 products' packing scratch (kernels/sgemm.h), live within one product: at most
     * FL_SGEMM_KC x FL_SGEMM_NC floats per thread; exact for the trainer's own layout below */
    uint64_t gemm = smul3((uint64_t)nth_plan, (uint64_t)FL_SGEMM_KC * FL_SGEMM_NC, 4);
    if (tpu == 1 && ctx_r == u(in->n_ctx) && l0 == 0 && l1 == s->n_layer && last_stage && !s->n_expert &&
        in->attn == FL_PLAN_ATTN_FLASH && a < (uint64_t)1 << 50 && bwd < (uint64_t)1 << 50 && u(s->n_vocab) <= i32 &&
        E <= i32 && u(s->n_ff) <= i32 && u(s->n_layer) <= 65536 && u(s->n_head) <= i32 && u(s->n_head_kv) <= i32 &&
        hd <= i32 && ctx_r <= i32 && u(in->lora_rank) <= i32 && u(in->ckpt_every) <= i32) {
        const fl_train_config c = {.n_vocab = (int32_t)s->n_vocab, .n_ctx = (int32_t)ctx_r, .n_embd = (int32_t)E,
                                   .n_layer = (int32_t)s->n_layer, .n_head = (int32_t)s->n_head,
                                   .n_head_kv = (int32_t)s->n_head_kv, .head_dim = (int32_t)hd, .n_ff = (int32_t)s->n_ff,
                                   .rope_dim = (int32_t)(hd & ~(uint64_t)1), .rope_base = 10000.0f, .rms_eps = 1e-5f};
        if (fl_train_config_check(&c) == FL_OK) {
            a = fl_train_act_bytes(&c, (int64_t)N, in->ckpt_every > 0 ? (int)in->ckpt_every : 0, in->lora_rank);
            bwd = fl_train_bwd_bytes(&c, (int64_t)N, in->lora_rank);
            gemm = fl_train_gemm_scratch_bytes(&c, (int64_t)N, in->lora_rank, nth_plan);
        } else {
            fl_clear_error();
        }
    }
    *act = a;
    uint64_t sc = bwd;
    /* the attention kernels' workspace, for the length of a call (the larger of the forward's
     * and the backward's): flash where the head size suits its micro-kernels, else the
     * trainer's plain loops (two rows of a sequence's length per thread); never live with a
     * product's scratch, so the larger of the two counts */
    if (in->attn == FL_PLAN_ATTN_FLASH && u(in->n_seq) <= i32 && heads <= i32 && hd <= i32 && smul(N, heads) < (uint64_t)1 << 50 &&
        smul(hd, (uint64_t)(in->n_threads > 0 ? in->n_threads : 1)) < (uint64_t)1 << 30) {
        const int nth = in->n_threads > 0 ? in->n_threads : 1;
        /* the micro-batch's sequences: given, or at most one per token (packed documents) */
        uint64_t nseq = in->train_seqs > 0 ? u(in->train_seqs) : N;
        if (nseq > i32) nseq = i32;
        uint64_t ws;
        if (hd % 8 == 0) {
            const uint64_t f = fl_attn_flash_workspace_bytes((int32_t)nseq, (int32_t)hd, nth);
            const uint64_t b = fl_attn_backward_scratch_bytes((int64_t)N, (int32_t)nseq, (int32_t)heads, (int32_t)hd, nth);
            ws = f > b ? f : b;
        } else {
            ws = smul3((uint64_t)nth, smul(2, ctx_r), 4);
        }
        sc = sadd(sc, ws > gemm ? ws : gemm);
    } else {
        sc = sadd(sc, gemm);
    }
    if (in->attn == FL_PLAN_ATTN_NAIVE) sc = sadd(sc, smul(smul3(u(in->n_seq), heads, ctx_r), smul(ctx_r, 4)));
    if (in->lora_nf4) { /* one base matrix dequantized at a time: the largest */
        const uint64_t att = smul(E, qd > kvd ? qd : kvd), ffn = smul(E, ff);
        sc = sadd(sc, smul(att > ffn ? att : ffn, 4));
    }
    *scratch = sc;
}

/* ---- inputs ---- */

void fl_plan_input_default(fl_plan_input *in, const fl_model_shape *s) {
    memset(in, 0, sizeof *in);
    fl_plan_parse_wtype("f16", &in->weights);
    in->weights_from_file = s && s->has_weight_bytes;
    in->kv_type = FL_TYPE_F16;
    in->n_ctx = s && s->n_ctx_train > 0 ? s->n_ctx_train : 4096;
    in->n_seq = 1;
    in->n_prefill = 512;
    in->kv_block = 16;
    in->attn = FL_PLAN_ATTN_FLASH;
    in->n_threads = 1;
    in->optim = FL_PLAN_OPTIM_ADAMW;
    in->tp = in->pp = in->sp = in->dp = 1;
}

fl_status fl_plan_parse_wtype(const char *name, fl_plan_wtype *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name);
    out->more = -1;
    size_t n = strlen(name);
    if (n > 2 && !strcasecmp(name + n - 2, "_M")) {
        char base[16];
        if (n - 2 >= sizeof base) return fl_set_error(FL_ERR_INVALID, "unknown weight type '%s'", name);
        memcpy(base, name, n - 2);
        base[n - 2] = 0;
        if (!strcasecmp(base, "q4_K")) out->base = FL_TYPE_Q4_K;
        else if (!strcasecmp(base, "q5_K")) out->base = FL_TYPE_Q5_K;
        else return fl_set_error(FL_ERR_INVALID, "unknown weight mix '%s' (q4_K_M, q5_K_M)", name);
        out->more = FL_TYPE_Q6_K;
        return FL_OK;
    }
    int32_t t = fl_type_from_name(name);
    const fl_type_info *ti = t >= 0 ? fl_type_get(t) : NULL;
    if (!ti || (t >= FL_TYPE_I8 && t <= FL_TYPE_F64))
        return fl_set_error(FL_ERR_INVALID, "unknown weight type '%s' (f32, f16, bf16, q8_0, q4_0, q4_K, q6_K, nf4, fp8, q4_K_M, ...)", name);
    out->base = t;
    return FL_OK;
}

/* ---- the plan ---- */

static fl_status check_input(const fl_model_shape *s, const fl_plan_input *in) {
    if (s->n_layer < 1 || s->n_layer > FL_PLAN_MAX_LAYERS)
        return fl_set_error(FL_ERR_INVALID, "model has %lld layers (1..%d supported)", (long long)s->n_layer, FL_PLAN_MAX_LAYERS);
    if (s->n_embd < 1 || s->n_head < 1 || s->n_head_kv < 1 || s->head_dim < 1 || s->n_vocab < 1 || s->n_ff < 1)
        return fl_set_error(FL_ERR_INVALID, "model shape is incomplete (n_embd %lld, n_head %lld, n_head_kv %lld, head_dim %lld, n_vocab %lld, n_ff %lld)",
                            (long long)s->n_embd, (long long)s->n_head, (long long)s->n_head_kv, (long long)s->head_dim,
                            (long long)s->n_vocab, (long long)s->n_ff);
    /* bounds that keep every product of dimensions inside 64 bits */
    if (s->n_embd > FL_PLAN_MAX_DIM || s->n_ff > FL_PLAN_MAX_DIM || s->n_head > FL_PLAN_MAX_DIM ||
        s->n_head_kv > FL_PLAN_MAX_DIM || s->head_dim > FL_PLAN_MAX_DIM || s->n_vocab > FL_PLAN_MAX_VOCAB ||
        s->n_expert > FL_PLAN_MAX_EXPERTS || s->sliding_window < 0 || s->n_swa_layers < 0)
        return fl_set_error(FL_ERR_INVALID, "model shape out of range (dimensions <= %lld, vocab <= %lld, experts <= %d)",
                            (long long)FL_PLAN_MAX_DIM, (long long)FL_PLAN_MAX_VOCAB, FL_PLAN_MAX_EXPERTS);
    if (s->n_expert < 0 || s->n_expert_used < 0 || s->n_expert_used > s->n_expert)
        return fl_set_error(FL_ERR_INVALID, "%lld of %lld experts used", (long long)s->n_expert_used, (long long)s->n_expert);
    if (in->tp < 1 || in->pp < 1 || in->sp < 1 || in->dp < 1)
        return fl_set_error(FL_ERR_INVALID, "tp, pp, sp and dp must be >= 1");
    if (s->n_head % in->tp)
        return fl_set_error(FL_ERR_INVALID, "--tp %d does not divide the %lld attention heads", in->tp, (long long)s->n_head);
    if (in->pp > s->n_layer || in->pp > FL_PLAN_MAX_STAGES)
        return fl_set_error(FL_ERR_INVALID, "--pp %d: more stages than the %lld layers (or > %d)", in->pp, (long long)s->n_layer, FL_PLAN_MAX_STAGES);
    if (in->n_ctx < 1 || in->n_seq < 1 || in->n_prefill < 1 || in->n_threads < 1)
        return fl_set_error(FL_ERR_INVALID, "context, batch, prefill chunk and threads must be >= 1");
    if (in->zero_stage < 0 || in->zero_stage > 3) return fl_set_error(FL_ERR_INVALID, "ZeRO stage %d (0..3)", in->zero_stage);
    if (in->offload_layers < 0 || in->offload_layers > s->n_layer)
        return fl_set_error(FL_ERR_INVALID, "cannot offload %lld of %lld layers", (long long)in->offload_layers, (long long)s->n_layer);
    if (in->ckpt_every < 0) return fl_set_error(FL_ERR_INVALID, "--checkpoint-every must be >= 0");
    if (in->slack_frac < 0 || in->slack_frac > 10) return fl_set_error(FL_ERR_INVALID, "slack fraction %g out of range", in->slack_frac);
    if (!fl_type_get(in->weights.base)) return fl_set_error(FL_ERR_INVALID, "unknown weight type %d", in->weights.base);
    if (in->lora_rank < 0 || in->lora_rank > 4096) return fl_set_error(FL_ERR_INVALID, "LoRA rank %d (1..4096)", in->lora_rank);
    if ((in->lora_rank > 0 || in->lora_nf4) && !in->train) return fl_set_error(FL_ERR_INVALID, "a LoRA rank is planned for training (--train)");
    if (in->lora_nf4 && in->lora_rank <= 0) return fl_set_error(FL_ERR_INVALID, "an NF4 base needs LoRA (the base is frozen)");
    if (in->lora_rank > 0) {
        if (in->weights.base != FL_TYPE_F32)
            return fl_set_error(FL_ERR_INVALID, "LoRA plans are of fp32 training (--weights f32, or nf4 for a QLoRA base), not %s", in->weights.name);
        if (in->tp * in->pp * in->sp != 1 || (in->dp > 1 && in->zero_stage != 1 && in->zero_stage != 2) ||
            (in->dp == 1 && in->zero_stage) || in->offload_layers || s->n_expert)
            return fl_set_error(FL_ERR_INVALID, "LoRA is planned on one device, or data parallel with ZeRO 1 or 2 "
                                                "(the trainer's), for dense models without offload");
    }
    if (in->train) {
        int32_t t = in->weights.base;
        if (in->weights.more >= 0 || (t != FL_TYPE_F32 && t != FL_TYPE_F16 && t != FL_TYPE_BF16))
            return fl_set_error(FL_ERR_INVALID, "training needs f32 weights, or f16/bf16 for mixed precision (not %s)", in->weights.name);
    }
    return check_kv(s, in->kv_type);
}

fl_status fl_plan_compute(const fl_model_shape *s, const fl_plan_input *in, fl_plan_result *out) {
    memset(out, 0, sizeof *out);
    fl_status st = check_input(s, in);
    if (st) return st;
    const int64_t L = s->n_layer;
    const uint64_t tp = (uint64_t)in->tp, dp = (uint64_t)in->dp;
    const bool from_file = in->weights_from_file && s->has_weight_bytes && !in->train;
    wparts parts; /* 4 KiB */
    const wparts *pp_ = &parts;
    /* training: f32 parameters (mixed precision rounds a second f32 copy to bf16 / fp16 values
     * for the forward: fitllm's trainer emulates 16-bit numerics, it does not store 16 bits) */
    const uint64_t elt = in->train ? 4 : 0;
    out->n_params = fl_plan_n_params(s);
    if (in->train) {
        /* every tensor (norms too) in the train dtype: f32 bytes / 4 x elt */
        fl_plan_wtype f32;
        fl_plan_parse_wtype("f32", &f32);
        weight_parts(s, &f32, false, &parts);
        parts.embd = parts.embd / 4 * elt;
        parts.output = parts.output / 4 * elt;
        parts.other = parts.other / 4 * elt;
        for (int64_t l = 0; l < L; l++) {
            parts.split[l] = parts.split[l] / 4 * elt;
            parts.repl[l] = parts.repl[l] / 4 * elt;
            parts.kv[l] = parts.kv[l] / 4 * elt;
        }
        out->weights_total = smul(u(out->n_params), is_mixed(in) ? 2 * elt : elt);
    } else {
        weight_parts(s, &in->weights, from_file, &parts);
        out->weights_total = fl_plan_weights_bytes(s, &in->weights, from_file);
    }
    if ((st = fl_plan_kv_bytes_per_token(s, in->kv_type, &out->kv_bytes_per_token))) return st;
    int32_t wt = from_file && s->file_type >= 0 ? s->file_type : in->weights.base;
    int32_t wts[64] = {wt}; /* every matrix type: the workspace is the largest of theirs */
    int n_wts = 1;
    if (from_file && s->file_type >= 0) {
        for (int t = 0; t < 64; t++)
            if ((s->file_types >> t & 1) && t != wt) wts[n_wts++] = t;
    } else if (in->weights.more >= 0 && in->weights.more != wt)
        wts[n_wts++] = in->weights.more;
    int64_t first_off = L - in->offload_layers; /* layers >= this run on the host */

    out->n_dev = in->pp;
    for (int32_t d = 0; d < in->pp; d++) {
        fl_plan_device *dev = &out->dev[d];
        int64_t b = L * d / in->pp, e = L * (d + 1) / in->pp;
        bool first = d == 0, last = d == in->pp - 1;
        dev->layer_begin = b;
        dev->layer_end = e;
        /* weights of this stage; the largest layer (for the ZeRO-3 gather buffer) */
        uint64_t w = 0, wmax = 0;
        for (int64_t l = b; l < e; l++) {
            /* K/V projections split by whole kv heads: 1/tp of them, or one head each
             * (replicated) when there are more ranks than kv heads (as dist/tp.c does) */
            const uint64_t kvp = pp_->kv[l] <= pp_->split[l] ? pp_->kv[l] : 0;
            const uint64_t kv_share = (uint64_t)tp > u(s->n_head_kv) && s->n_head_kv > 0 ? cdiv(kvp, u(s->n_head_kv)) : cdiv(kvp, tp);
            uint64_t wl = sadd(sadd(cdiv(pp_->split[l] - kvp, tp), kv_share), pp_->repl[l]);
            if (wl > wmax) wmax = wl;
            if (l >= first_off) out->host[FL_MEM_WEIGHTS] = sadd(out->host[FL_MEM_WEIGHTS], wl);
            else w = sadd(w, wl);
        }
        if (first) w = sadd(w, cdiv(pp_->embd, tp));
        if (last) {
            w = sadd(w, sadd(cdiv(pp_->output, tp), pp_->other));
            if (s->tied_output && in->pp > 1) w = sadd(w, cdiv(pp_->embd, tp)); /* the last stage needs the tied matrix too */
        }
        if (in->train) /* the trainer's model object and its optimizer's */
            dev->bytes[FL_MEM_MISC] = sadd(dev->bytes[FL_MEM_MISC], sizeof(fl_train_model) + fl_optim_object_bytes());
        if (in->train && in->lora_rank > 0) {
            /* the frozen base: its 7 matrices per layer f32 or NF4 (rows of a multiple of 64), the
             * rest f32; the adapters f32 with their grads and optimizer states */
            const uint64_t C = u(s->n_embd), Qd = smul(u(s->n_head), u(s->head_dim)), KVd = smul(u(s->n_head_kv), u(s->head_dim)),
                           F = u(s->n_ff), r = u(in->lora_rank);
            const uint64_t mi[7] = {C, C, C, Qd, C, C, F}, mo[7] = {Qd, KVd, KVd, C, F, F, C};
            uint64_t mat32 = 0, frozen = 0, adapters = 0;
            for (int j = 0; j < 7; j++) {
                const uint64_t f32b = smul3(mi[j], mo[j], 4);
                mat32 = sadd(mat32, f32b);
                frozen = sadd(frozen, in->lora_nf4 && mi[j] % 64 == 0 ? smul(fl_type_row_size(FL_TYPE_NF4, (int64_t)mi[j]), mo[j]) : f32b);
                adapters = sadd(adapters, smul3(r, sadd(mi[j], mo[j]), 4));
            }
            const uint64_t nL = (uint64_t)(e - b);
            w = sadd(sadd(w - smul(nL, mat32), smul(nL, frozen)), smul(nL, adapters));
            uint64_t grads = smul(nL, adapters), optim = optim_bytes(in, grads / 4);
            if (dp > 1 && grads / 4 < (uint64_t)1 << 50) zero_trainer_bytes(in, dp, grads / 4, 0, &optim, &grads, dev);
            dev->bytes[FL_MEM_GRAD] = grads;
            dev->bytes[FL_MEM_OPTIM] = optim;
            fl_plan_train_act_bytes(s, in, b, e, last, &dev->bytes[FL_MEM_ACT], &dev->bytes[FL_MEM_SCRATCH]);
        } else if (in->train) {
            uint64_t params = w / elt;
            uint64_t grads = w, optim = optim_bytes(in, params);
            if (is_mixed(in)) w = smul(w, 2); /* + the rounded compute copy */
            if ((in->zero_stage == 1 || in->zero_stage == 2) && dp > 1 && params < (uint64_t)1 << 50) {
                zero_trainer_bytes(in, dp, params, grad_bucket_elems(s), &optim, &grads, dev);
            } else if (in->zero_stage >= 1) { /* the textbook sharding (stage 3: fitllm's trainer has none) */
                optim = cdiv(optim, dp);
                if (in->zero_stage >= 2) grads = cdiv(grads, dp);
            }
            if (in->zero_stage >= 3) {
                w = cdiv(w, dp);
                dev->bytes[FL_MEM_COMM] = wmax; /* one layer gathered at a time */
            }
            dev->bytes[FL_MEM_GRAD] = grads;
            dev->bytes[FL_MEM_OPTIM] = optim;
            fl_plan_train_act_bytes(s, in, b, e, last, &dev->bytes[FL_MEM_ACT], &dev->bytes[FL_MEM_SCRATCH]);
        } else {
            uint64_t kv = 0, kv_host = 0;
            int64_t e_dev = e < first_off ? e : (first_off > b ? first_off : b);
            if ((st = fl_plan_kv_bytes(s, in->kv_type, in->n_ctx, in->n_seq, in->kv_block, in->tp, in->sp, b, e_dev, &kv))) return st;
            if ((st = fl_plan_kv_bytes(s, in->kv_type, in->n_ctx, in->n_seq, in->kv_block, in->tp, in->sp, e_dev, e, &kv_host))) return st;
            if (in->offload_kv) {
                kv_host = sadd(kv_host, kv);
                kv = 0;
            }
            out->host[FL_MEM_KV] = sadd(out->host[FL_MEM_KV], kv_host);
            dev->bytes[FL_MEM_KV] = kv;
            /* the engine's step: the prefill budget plus one row per sequence */
            int64_t step = (int64_t)cdiv(sadd(u(in->n_prefill), u(in->n_seq)), (uint64_t)in->sp);
            fl_plan_buffers buf;
            int64_t rows = last ? (int64_t)smul(u(in->n_seq), sadd(1, u(in->spec_tokens))) : 0;
            if (rows > (int64_t)sadd(u(in->n_prefill), u(in->n_seq))) rows = (int64_t)sadd(u(in->n_prefill), u(in->n_seq)); /* (within a step's tokens) */
            fl_plan_inference_buffers_types(s, step, in->n_ctx, rows, in->attn, in->n_threads, in->tp, wts,
                                            n_wts, in->kv_type, &buf);
            dev->bytes[FL_MEM_ACT] = buf.act_total;
            dev->bytes[FL_MEM_SCRATCH] = buf.scratch_total;
            if (last) out->buf = buf;
        }
        dev->bytes[FL_MEM_WEIGHTS] = w;
        uint64_t t = 0;
        for (int c = 0; c < FL_MEM_COUNT; c++) t = sadd(t, dev->bytes[c]);
        uint64_t slack = sadd(in->slack_bytes, (uint64_t)(in->slack_frac * (double)t));
        dev->bytes[FL_MEM_MISC] = sadd(dev->bytes[FL_MEM_MISC], slack);
        dev->total = sadd(t, slack);
        if (dev->total > out->max_total) {
            out->max_total = dev->total;
            out->max_dev = d;
        }
    }
    for (int c = 0; c < FL_MEM_COUNT; c++) out->host_total = sadd(out->host_total, out->host[c]);
    return FL_OK;
}

fl_status fl_plan_kv_pool_bytes(const fl_model_shape *s, const fl_plan_input *in, uint64_t mem, uint64_t *kv_bytes) {
    fl_plan_result r;
    fl_status st = fl_plan_compute(s, in, &r);
    if (st) return st;
    uint64_t best = UINT64_MAX;
    for (int32_t d = 0; d < r.n_dev; d++) {
        const fl_plan_device *dev = &r.dev[d];
        uint64_t other = dev->total - dev->bytes[FL_MEM_KV];
        char a[32], b[32], c[32];
        fl_plan_fmt_bytes(mem, b, sizeof b);
        if (dev->bytes[FL_MEM_WEIGHTS] >= mem) {
            fl_plan_fmt_bytes(dev->bytes[FL_MEM_WEIGHTS], a, sizeof a);
            fl_plan_fmt_bytes(dev->bytes[FL_MEM_WEIGHTS] - mem, c, sizeof c);
            return fl_set_error(FL_ERR_BUDGET, "the weights alone (%s) exceed the memory limit %s by %s", a, b, c);
        }
        if (other >= mem) {
            fl_plan_fmt_bytes(other, a, sizeof a);
            fl_plan_fmt_bytes(other - mem, c, sizeof c);
            return fl_set_error(FL_ERR_BUDGET, "weights + step buffers + slack (%s) exceed the memory limit %s by %s, leaving nothing for the KV cache",
                                a, b, c);
        }
        if (mem - other < best) best = mem - other;
    }
    *kv_bytes = best;
    return FL_OK;
}

/* ---- fitting ---- */

static fl_status fits(const fl_model_shape *s, const fl_plan_input *in, uint64_t budget, bool *ok, uint64_t *need) {
    fl_plan_result r;
    fl_status st = fl_plan_compute(s, in, &r);
    if (st) return st;
    *ok = r.max_total <= budget;
    if (need) *need = r.max_total;
    return FL_OK;
}

static fl_status nothing_fits(uint64_t budget, uint64_t need, const char *what) {
    char a[32], b[32], c[32];
    fl_plan_fmt_bytes(budget, a, sizeof a);
    fl_plan_fmt_bytes(need, b, sizeof b);
    fl_plan_fmt_bytes(need - budget, c, sizeof c);
    return fl_set_error(FL_ERR_BUDGET, "nothing fits in %s: the smallest plan (%s) needs %s, %s more", a, what, b, c);
}

/* Largest v in [lo, cap] (multiples of step) with pred(v) true; pred(lo) must be true. */
typedef fl_status (*probe_fn)(const fl_model_shape *, fl_plan_input *, int64_t, uint64_t, bool *);

static fl_status probe_ctx(const fl_model_shape *s, fl_plan_input *in, int64_t v, uint64_t budget, bool *ok) {
    in->n_ctx = v;
    return fits(s, in, budget, ok, NULL);
}
static fl_status probe_seq(const fl_model_shape *s, fl_plan_input *in, int64_t v, uint64_t budget, bool *ok) {
    in->n_seq = v;
    return fits(s, in, budget, ok, NULL);
}

static fl_status search(const fl_model_shape *s, fl_plan_input *in, uint64_t budget, int64_t step, int64_t cap, probe_fn f,
                        int64_t *out) {
    int64_t lo = 1, hi = 2; /* in units of step: lo fits */
    bool ok;
    fl_status st;
    while (hi <= cap / step) {
        if ((st = f(s, in, hi * step, budget, &ok))) return st;
        if (!ok) break;
        lo = hi;
        hi *= 2;
    }
    if (hi > cap / step) hi = cap / step + 1;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((st = f(s, in, mid * step, budget, &ok))) return st;
        if (ok) lo = mid;
        else hi = mid;
    }
    *out = lo * step;
    return FL_OK;
}

#define FL_PLAN_FIT_CAP ((int64_t)1 << 26) /* 64M tokens / sequences: "unbounded" */

fl_status fl_plan_fit_ctx(const fl_model_shape *s, const fl_plan_input *in0, uint64_t budget, int64_t *n_ctx) {
    fl_plan_input in = *in0;
    bool ok;
    uint64_t need;
    in.n_ctx = in.kv_block;
    fl_status st = fits(s, &in, budget, &ok, &need);
    if (st) return st;
    if (!ok) {
        char what[64];
        snprintf(what, sizeof what, "context %lld", (long long)in.n_ctx);
        return nothing_fits(budget, need, what);
    }
    return search(s, &in, budget, in.kv_block, FL_PLAN_FIT_CAP, probe_ctx, n_ctx);
}

fl_status fl_plan_fit_seq(const fl_model_shape *s, const fl_plan_input *in0, uint64_t budget, int64_t *n_seq) {
    fl_plan_input in = *in0;
    bool ok;
    uint64_t need;
    in.n_seq = 1;
    fl_status st = fits(s, &in, budget, &ok, &need);
    if (st) return st;
    if (!ok) {
        char what[64];
        snprintf(what, sizeof what, "1 sequence of %lld tokens", (long long)in.n_ctx);
        return nothing_fits(budget, need, what);
    }
    return search(s, &in, budget, 1, FL_PLAN_FIT_CAP, probe_seq, n_seq);
}

fl_status fl_plan_fit_types(const fl_model_shape *s, const fl_plan_input *in0, uint64_t budget, fl_plan_input *out) {
    static const char *const wtypes[] = {"f16", "q8_0", "q6_K", "q5_K_M", "q4_K_M", "q4_0", "q3_K", "q2_K"};
    static const int32_t kvtypes[] = {FL_TYPE_F16, FL_TYPE_Q8_0, FL_TYPE_FP8_E4M3, FL_TYPE_Q4_0};
    fl_plan_input in = *in0;
    in.weights_from_file = false;
    uint64_t need_min = UINT64_MAX;
    fl_status st;
    for (size_t i = 0; i < sizeof wtypes / sizeof wtypes[0]; i++) {
        if ((st = fl_plan_parse_wtype(wtypes[i], &in.weights))) return st;
        for (size_t k = 0; k < sizeof kvtypes / sizeof kvtypes[0]; k++) {
            in.kv_type = kvtypes[k];
            if (check_kv(s, in.kv_type)) {
                fl_clear_error();
                continue;
            }
            bool ok;
            uint64_t need;
            if ((st = fits(s, &in, budget, &ok, &need))) return st;
            if (ok) {
                *out = in;
                return FL_OK;
            }
            if (need < need_min) need_min = need;
        }
    }
    if (need_min == UINT64_MAX) return fl_set_error(FL_ERR_INVALID, "no KV type suits head_dim %lld", (long long)s->head_dim);
    return nothing_fits(budget, need_min, "q2_K weights, the smallest KV type");
}
