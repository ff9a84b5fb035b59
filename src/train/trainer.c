/* The training loop: accumulation, clipping, loss scaling, schedule, checkpoints (trainer.h). */
#include "train/trainer.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct micro {
    int32_t *tok, *tgt, *pos, *cu;
    fl_train_batch b;
} micro;

struct fl_trainer {
    fl_train_model *m;
    const fl_train_data *data;
    fl_trainer_opts o;
    fl_optim *opt;
    fl_batcher bat;
    micro *mb;       /* [grad_accum] copies of the step's micro-batches */
    int64_t step;
    float loss_scale;
    int64_t good_steps;
    /* ZeRO data parallelism (o.comm with more than one rank) */
    fl_zero *zero;
    bool bucketed; /* stage 2 without a whole gradient: the backward's buckets go to the shards */
    int world, rank;
    float cur_lr;
};

fl_trainer_opts fl_trainer_default_opts(void) {
    return (fl_trainer_opts){.ctx = 256, .batch = 4, .grad_accum = 1, .steps = 100, .lr = 1e-3f, .min_lr = 1e-4f,
                             .warmup = 10, .sched = FL_LR_COSINE, .clip = 1.0f, .ckpt_every = 0,
                             .precision = FL_TRAIN_F32, .optim = fl_optim_default(), .batch_mode = FL_BATCH_PACK,
                             .seed = 1234, .loss_scale_init = 32768.0f};
}

static size_t micro_tokens(const fl_trainer *t) { return (size_t)(t->o.ctx * t->o.batch); }

void fl_trainer_free(fl_trainer *t) {
    if (!t) return;
    const size_t nt = micro_tokens(t);
    if (t->mb) {
        for (int64_t i = 0; i < t->o.grad_accum; i++) {
            fl_free(FL_MEM_MISC, t->mb[i].tok, nt * 4);
            fl_free(FL_MEM_MISC, t->mb[i].tgt, nt * 4);
            fl_free(FL_MEM_MISC, t->mb[i].pos, nt * 4);
            fl_free(FL_MEM_MISC, t->mb[i].cu, (nt + 1) * 4);
        }
        fl_free(FL_MEM_MISC, t->mb, (size_t)t->o.grad_accum * sizeof(micro));
    }
    fl_batcher_deinit(&t->bat);
    fl_optim_free(t->opt);
    fl_zero_free(t->zero);
    if (t->bucketed) fl_train_model_set_grad_sink(t->m, NULL, NULL); /* the sink was this trainer */
    fl_free(FL_MEM_MISC, t, sizeof *t);
}

/* A bucket of the backward's gradients (one micro-batch's) summed into the owners' shards. */
static fl_status zero_sink(void *ud, const fl_train_model *m, int bucket, const float *stage) {
    fl_trainer *t = ud;
    int64_t off, soff, n;
    for (int i = 0; fl_train_grad_bucket_tensor(m, bucket, i, &off, &soff, &n); i++) {
        fl_status st = fl_zero_reduce_range(t->zero, stage + soff, off, n);
        if (st) return st;
    }
    return FL_OK;
}

fl_status fl_trainer_new(fl_train_model *m, const fl_train_data *train, const fl_trainer_opts *o, fl_trainer **out) {
    *out = NULL;
    if (o->ctx < 2 || o->batch < 1 || o->grad_accum < 1 || o->steps < 1 || !(o->lr > 0))
        return fl_set_error(FL_ERR_INVALID, "%s: bad options (ctx %lld, batch %lld, grad_accum %lld, steps %lld)",
                            __func__, (long long)o->ctx, (long long)o->batch, (long long)o->grad_accum,
                            (long long)o->steps);
    fl_trainer *t = fl_calloc(FL_MEM_MISC, 1, sizeof *t);
    if (!t) return FL_ERR_NOMEM;
    t->m = m;
    t->data = train;
    t->o = *o;
    t->loss_scale = o->precision == FL_TRAIN_FP16 ? (o->loss_scale_init > 0 ? o->loss_scale_init : 32768.0f) : 1.0f;
    const size_t nt = micro_tokens(t);
    float *params, *grads;
    int64_t n;
    fl_train_model_trainable(m, &params, &grads, &n);
    int64_t ranges[2 * FL_OPTIM_MAX_RANGES];
    const int nr = fl_train_model_decay_ranges(m, ranges, FL_OPTIM_MAX_RANGES);
    t->world = o->comm ? fl_comm_size(o->comm) : 1;
    t->rank = o->comm ? fl_comm_rank(o->comm) : 0;
    fl_status st = FL_OK;
    if (t->world > 1) {
        /* shards start on the 8-bit optimizer's blocks: their states are slices of one
         * optimizer's over all n parameters (checkpoints) */
        const int64_t align = o->optim.block_size > 0 ? o->optim.block_size : 256;
        if ((st = fl_zero_new(o->comm, o->zero_stage ? o->zero_stage : 1, n, align, 0, &t->zero))) goto fail;
        /* stage 2 of a full fine-tune: no whole gradient, the backward's buckets are summed into
         * the owners' shards as they complete (LoRA's adapters are small: reduce-scattered) */
        t->bucketed = o->zero_stage == 2 && m->lora_rank <= 0;
        if (t->bucketed) fl_train_model_set_grad_sink(m, zero_sink, t);
    }
    if ((st = fl_train_model_reserve(m, (int64_t)nt, o->ckpt_every, o->precision))) goto fail;
    if (t->zero) {
        int64_t off, len;
        fl_zero_shard(t->zero, &off, &len);
        /* this rank's optimizer covers [off, off + len): decay ranges shifted and clipped */
        int64_t sr[2 * FL_OPTIM_MAX_RANGES];
        int ns = 0;
        for (int i = 0; i < (nr < 0 ? 1 : nr); i++) {
            int64_t a = nr < 0 ? 0 : ranges[2 * i], b = nr < 0 ? n : ranges[2 * i + 1];
            if (a < off) a = off;
            if (b > off + len) b = off + len;
            if (a < b) { sr[2 * ns] = a - off; sr[2 * ns + 1] = b - off; ns++; }
        }
        if ((st = fl_optim_new(&o->optim, len > 0 ? len : 1, sr, ns, &t->opt))) goto fail;
    } else if ((st = fl_optim_new(&o->optim, n, ranges, nr, &t->opt))) {
        goto fail;
    }
    if ((st = fl_batcher_init(&t->bat, train, o->batch_mode, o->ctx, o->batch, o->seed))) goto fail;
    t->mb = fl_calloc(FL_MEM_MISC, (size_t)o->grad_accum, sizeof(micro));
    if (!t->mb) goto nomem;
    for (int64_t i = 0; i < o->grad_accum; i++) {
        micro *u = &t->mb[i];
        u->tok = fl_alloc(FL_MEM_MISC, nt * 4, 64);
        u->tgt = fl_alloc(FL_MEM_MISC, nt * 4, 64);
        u->pos = fl_alloc(FL_MEM_MISC, nt * 4, 64);
        u->cu = fl_alloc(FL_MEM_MISC, (nt + 1) * 4, 64);
        if (!u->tok || !u->tgt || !u->pos || !u->cu) goto nomem;
    }
    *out = t;
    return FL_OK;
nomem:
    st = fl_set_error(FL_ERR_NOMEM, "%s: no memory for micro-batches", __func__);
fail:
    fl_trainer_free(t);
    return st;
}

int64_t fl_trainer_step_count(const fl_trainer *t) { return t->step; }
const fl_optim *fl_trainer_optim(const fl_trainer *t) { return t->opt; }

static void copy_batch(micro *u, const fl_train_batch *b) {
    const size_t n = (size_t)b->n_tokens;
    memcpy(u->tok, b->tokens, n * 4);
    memcpy(u->tgt, b->targets, n * 4);
    memcpy(u->pos, b->pos, n * 4);
    memcpy(u->cu, b->cu_seqlens, (size_t)(b->n_seq + 1) * 4);
    u->b = (fl_train_batch){u->tok, u->tgt, u->pos, u->cu, b->n_tokens, b->n_seq};
}

static void zero_update(void *ud, float *params, const float *grads, int64_t n) {
    fl_trainer *t = ud;
    (void)n;
    fl_optim_step(t->opt, params, (float *)grads, t->cur_lr);
}

/* fp16: the gradients back to their true size before the norm and the update. */
static void unscale(const fl_trainer *t, float *g, int64_t n) {
    if (t->loss_scale == 1.0f) return;
    const float inv = 1.0f / t->loss_scale;
    for (int64_t i = 0; i < n; i++) g[i] *= inv;
}

/* A step whose gradient norm is not finite (the parameters untouched): fp16 halves the loss
 * scale and goes on; f32 / bf16 fail. */
static fl_status overflowed(fl_trainer *t, fl_step_stats *s) {
    s->skipped = true;
    if (t->o.precision == FL_TRAIN_FP16) {
        t->loss_scale = t->loss_scale > 1.0f ? t->loss_scale * 0.5f : 1.0f;
        t->good_steps = 0;
        return FL_OK;
    }
    return fl_set_error(FL_ERR_INVALID, "fl_trainer_step: non-finite gradient norm at step %lld (lower the LR?)",
                        (long long)t->step);
}

/* After an update: fp16 doubles the loss scale every FL_LOSS_SCALE_WINDOW good steps. */
static void updated(fl_trainer *t) {
    if (t->o.precision == FL_TRAIN_FP16 && ++t->good_steps >= FL_LOSS_SCALE_WINDOW) {
        t->loss_scale *= 2.0f;
        t->good_steps = 0;
    }
}

/* The data-parallel end of a step: global loss, ZeRO gradient sum + clip + sharded update.  The
 * norm is the global one on every rank, so an fp16 overflow skips the step (and moves the loss
 * scale) on every rank alike. */
static fl_status zero_finish(fl_trainer *t, fl_step_stats *s, double loss, int64_t scored, int64_t tokens, float lr) {
    float *params, *grads;
    int64_t n;
    fl_train_model_trainable(t->m, &params, &grads, &n);
    fl_status st = fl_comm_allreduce_sum_f64(t->o.comm, &loss, 1);
    if (st) return st;
    s->loss = scored ? loss / (double)scored : 0.0;
    s->tokens = tokens;
    s->scored = scored;
    s->lr = lr;
    s->loss_scale = t->loss_scale;
    t->cur_lr = lr;
    int64_t off, len;
    fl_zero_shard(t->zero, &off, &len);
    if (t->bucketed) unscale(t, fl_zero_shard_grads(t->zero), len);
    else unscale(t, grads, n);
    double norm = 0;
    st = fl_zero_step(t->zero, params, t->bucketed ? NULL : grads, t->o.clip, &norm, zero_update, t);
    if (st) return st;
    s->grad_norm = norm;
    t->step++;
    if (!isfinite(norm)) return overflowed(t, s);
    fl_train_model_after_update(t->m);
    updated(t);
    return FL_OK;
}

fl_status fl_trainer_step(fl_trainer *t, fl_step_stats *s) {
    memset(s, 0, sizeof *s);
    /* fetch the step's micro-batches first: the loss weight is 1 / (scored tokens of the step) */
    int64_t scored = 0, tokens = 0;
    for (int64_t i = 0; i < t->o.grad_accum * t->world; i++) {
        /* every rank draws the same sequence and keeps its share: the scored count (the loss
         * weight) is the global one without any communication */
        fl_train_batch b;
        fl_batcher_next(&t->bat, &b);
        if (i % t->world == t->rank) copy_batch(&t->mb[i / t->world], &b);
        scored += fl_batch_n_scored(&b);
        tokens += b.n_tokens;
    }
    float *params, *grads;
    int64_t n;
    fl_train_model_trainable(t->m, &params, &grads, &n);
    fl_train_model_zero_grad(t->m);
    if (t->bucketed) fl_zero_begin(t->zero);
    double loss = 0.0;
    const float dloss = scored ? t->loss_scale / (float)scored : 0.0f;
    for (int64_t i = 0; i < t->o.grad_accum; i++) {
        double l;
        fl_status st = fl_train_model_forward(t->m, &t->mb[i].b, &l, NULL);
        if (!st) st = fl_train_model_backward(t->m, &t->mb[i].b, dloss);
        if (st) return st;
        loss += l;
    }
    const float lr = fl_lr_at(t->o.sched, t->step, t->o.warmup, t->o.steps, t->o.lr, t->o.min_lr);
    if (t->zero) return zero_finish(t, s, loss, scored, tokens, lr);
    s->loss = scored ? loss / (double)scored : 0.0;
    s->tokens = tokens;
    s->scored = scored;
    s->lr = lr;
    /* unscale (fp16), check overflow, clip */
    unscale(t, grads, n);
    const double norm = fl_grad_norm(grads, n); /* (the clip's scale is applied as the optimizer reads) */
    s->grad_norm = norm;
    s->loss_scale = t->loss_scale;
    t->step++;
    if (!isfinite(norm)) return overflowed(t, s);
    fl_optim_step_scaled(t->opt, params, grads, lr, fl_grad_clip_scale(norm, t->o.clip));
    fl_train_model_after_update(t->m);
    updated(t);
    return FL_OK;
}

/* ---------------------------------------------------------------- checkpoints */

/* This rank's parameters [*off, *off + *len) of the n trainable ones (all of them without ZeRO). */
static void shard_of(const fl_trainer *t, int64_t *off, int64_t *len) {
    float *p, *g;
    int64_t n;
    fl_train_model_trainable(t->m, &p, &g, &n);
    *off = 0;
    *len = n;
    if (t->zero) fl_zero_shard(t->zero, off, len);
}

/* Optimizer state i over all n parameters: *full bytes; the part of rank r's shard
 * [off, off + len) is [*lo, *lo + *bytes) of it (the shards start on its units: fl_zero_new's align). */
static void state_part(const fl_trainer *t, int i, int64_t off, int64_t len, size_t *full, size_t *lo, size_t *bytes) {
    float *p, *g;
    int64_t n, per;
    size_t unit;
    fl_train_model_trainable(t->m, &p, &g, &n);
    fl_optim_state_unit(t->opt, i, &per, &unit);
    FL_ASSERT(off % per == 0);
    *full = (size_t)((n + per - 1) / per) * unit;
    *lo = (size_t)(off / per) * unit;
    *bytes = (size_t)((len + per - 1) / per) * unit;
}

/* ZeRO: rank 0 writes each optimizer state over all parameters in pieces of CKPT_PIECE bytes
 * (fl_gguf_writer_add_tensor_chunks: one piece in memory).  For each piece it broadcasts the
 * request {state, first byte, end}; every rank sends the part of its shard's state that falls in
 * it, and rank 0 receives them in rank order.  {-1, 0, 0} ends the save (after the last piece, or
 * where the write stopped early). */
#define CKPT_PIECE ((size_t)16 << 20)

/* FL_CKPT_PIECE=BYTES overrides it (tests: many pieces, parts that straddle them). */
static size_t ckpt_piece(void) {
    const char *e = getenv("FL_CKPT_PIECE");
    const long long v = e ? atoll(e) : 0;
    return v > 0 ? (size_t)v : CKPT_PIECE;
}

typedef struct ckpt_state {
    fl_trainer *t;
    int i;
} ckpt_state;

/* The bytes of state i that rank r's shard holds, clipped to [a, b): [*lo, *hi) of the whole. */
static void part_in(const fl_trainer *t, int i, int r, uint64_t a, uint64_t b, uint64_t *lo, uint64_t *hi) {
    int64_t off, len;
    size_t full, plo, part;
    fl_zero_shard_of(t->zero, r, &off, &len);
    state_part(t, i, off, len, &full, &plo, &part);
    *lo = plo > a ? plo : a;
    *hi = plo + part < b ? plo + part : b;
    if (len <= 0 || *hi < *lo) *hi = *lo;
}

static fl_status fill_state(void *ud, void *dst, uint64_t offset, size_t nbytes) {
    const ckpt_state *cs = ud;
    fl_trainer *t = cs->t;
    int64_t req[3] = {cs->i, (int64_t)offset, (int64_t)(offset + nbytes)};
    fl_status st = fl_comm_bcast(t->o.comm, req, sizeof req, 0);
    if (st) return st;
    void *data;
    size_t bytes;
    const char *name;
    fl_optim_state(t->opt, cs->i, &data, &bytes, &name);
    for (int r = 0; r < t->world && !st; r++) {
        uint64_t lo, hi;
        part_in(t, cs->i, r, offset, offset + nbytes, &lo, &hi);
        if (hi == lo) continue;
        char *to = (char *)dst + (lo - offset);
        if (r == 0) memcpy(to, (const char *)data + lo, (size_t)(hi - lo)); /* rank 0's shard starts at 0 */
        else st = fl_comm_sendrecv(t->o.comm, NULL, 0, -1, to, (size_t)(hi - lo), r);
    }
    return st;
}

/* The other ranks' side of fill_state: send what each request asks of this rank's shard. */
static fl_status zero_send_states(fl_trainer *t) {
    int64_t off, len;
    fl_zero_shard(t->zero, &off, &len);
    for (;;) {
        int64_t req[3];
        fl_status st = fl_comm_bcast(t->o.comm, req, sizeof req, 0);
        if (st) return st;
        if (req[0] < 0) return FL_OK;
        void *data;
        size_t bytes, full, plo, part;
        const char *name;
        if (fl_optim_state(t->opt, (int)req[0], &data, &bytes, &name) != FL_OK)
            return fl_set_error(FL_ERR_INTERNAL, "fl_trainer_save: rank 0 asked for optimizer state %lld", (long long)req[0]);
        uint64_t lo, hi;
        part_in(t, (int)req[0], t->rank, (uint64_t)req[1], (uint64_t)req[2], &lo, &hi);
        if (hi == lo) continue;
        state_part(t, (int)req[0], off, len, &full, &plo, &part);
        if ((st = fl_comm_sendrecv(t->o.comm, (const char *)data + (lo - plo), (size_t)(hi - lo), 0, NULL, 0, -1)))
            return st;
    }
}

static fl_status save_local(fl_trainer *t, const char *path);

fl_status fl_trainer_save(fl_trainer *t, const char *path) {
    if (!t->zero) return save_local(t, path);
    /* collective: rank 0 writes, the others send their optimizer shards; all return rank 0's result */
    fl_status st = t->rank == 0 ? save_local(t, path) : zero_send_states(t);
    if (t->rank == 0) {
        int64_t end[3] = {-1, 0, 0};
        fl_status bs = fl_comm_bcast(t->o.comm, end, sizeof end, 0);
        if (bs) return bs;
    }
    int32_t res = (int32_t)st;
    fl_status bs = fl_comm_bcast(t->o.comm, &res, sizeof res, 0);
    if (bs) return bs;
    if (t->rank > 0 && !st && res) st = fl_set_error((fl_status)res, "fl_trainer_save: rank 0 could not write %s", path);
    return st;
}

static fl_status save_local(fl_trainer *t, const char *path) {
    fl_gguf_writer *w = fl_gguf_writer_new();
    if (!w) return FL_ERR_NOMEM;
    fl_status st = fl_gguf_writer_set_str(w, "general.name", "fitllm-checkpoint");
    st = st ? st : fl_gguf_writer_set_u32(w, "fitllm.train.version", FL_TRAIN_CKPT_VERSION);
    st = st ? st : fl_gguf_writer_set_u64(w, "fitllm.train.step", (uint64_t)t->step);
    st = st ? st : fl_gguf_writer_set_u64(w, "fitllm.train.optim_steps", (uint64_t)fl_optim_steps(t->opt));
    st = st ? st : fl_gguf_writer_set_u64(w, "fitllm.train.data_pos", (uint64_t)t->bat.pos);
    st = st ? st : fl_gguf_writer_set_u64(w, "fitllm.train.data_epoch", (uint64_t)t->bat.epoch);
    st = st ? st : fl_gguf_writer_set_u64(w, "fitllm.train.rng", t->bat.rng.s);
    st = st ? st : fl_gguf_writer_set_f32(w, "fitllm.train.loss_scale", t->loss_scale);
    st = st ? st : fl_gguf_writer_set_u64(w, "fitllm.train.good_steps", (uint64_t)t->good_steps);
    st = st ? st : fl_gguf_writer_set_u32(w, "fitllm.train.optim_kind", (uint32_t)t->o.optim.kind);
    st = st ? st : fl_gguf_writer_set_u32(w, "fitllm.train.block_size", (uint32_t)fl_optim_get_config(t->opt)->block_size);
    st = st ? st : fl_gguf_writer_set_u32(w, "fitllm.train.lora_rank", (uint32_t)t->m->lora_rank);
    st = st ? st : fl_gguf_writer_set_f32(w, "fitllm.train.lora_alpha", t->m->lora_alpha);
    /* LoRA: the base is frozen (it comes from -m again); only the adapters are saved */
    if (!st) st = fl_train_model_add_to_writer(t->m, w, t->m->lora_rank > 0 ? NULL : t->m->params);
    if (!st && t->m->lora_rank > 0) st = fl_train_model_add_lora_to_writer(t->m, w);
    ckpt_state cs[8];
    for (int i = 0; !st; i++) {
        void *data;
        size_t bytes, full, lo, part;
        const char *name;
        if (fl_optim_state(t->opt, i, &data, &bytes, &name) != FL_OK) break;
        FL_ASSERT(i < 8);
        char key[96];
        snprintf(key, sizeof key, "optim.%s", name);
        int64_t per;
        size_t unit;
        fl_optim_state_unit(t->opt, i, &per, &unit);
        state_part(t, i, 0, 0, &full, &lo, &part); /* over all parameters */
        const int64_t ne[1] = {(int64_t)(full / unit)};
        const int32_t type = unit == 1 ? FL_TYPE_I8 : FL_TYPE_F32;
        cs[i] = (ckpt_state){t, i};
        st = t->zero ? fl_gguf_writer_add_tensor_chunks(w, key, type, 1, ne, fill_state, &cs[i], ckpt_piece())
                     : fl_gguf_writer_add_tensor(w, key, type, 1, ne, data);
    }
    if (!st && t->bat.mode == FL_BATCH_BUCKET) {
        const int64_t ne[1] = {t->bat.n_batches};
        st = fl_gguf_writer_add_tensor(w, "data.perm", FL_TYPE_I64, 1, ne, t->bat.perm);
    }
    if (!st) st = fl_gguf_writer_write(w, path, NULL, NULL);
    fl_gguf_writer_free(w);
    return st;
}

static fl_status get_u64(const fl_gguf *g, const char *key, uint64_t *v) {
    const fl_gguf_kv *kv = fl_gguf_find(g, key);
    if (!kv || kv->value.type != FL_GGUF_U64)
        return fl_set_error(FL_ERR_FORMAT, "fl_trainer_load: key '%s' missing or not u64", key);
    *v = kv->value.v.u64;
    return FL_OK;
}

static fl_status load_local(fl_trainer *t, const char *path);

fl_status fl_trainer_load(fl_trainer *t, const char *path) {
    fl_status st = load_local(t, path);
    if (!t->zero) return st;
    /* collective: every rank read the file itself; all fail if any did */
    double bad = st ? 1.0 : 0.0;
    fl_status cs = fl_comm_allreduce_sum_f64(t->o.comm, &bad, 1);
    if (cs) return cs;
    if (!st && bad > 0)
        st = fl_set_error(FL_ERR_IO, "fl_trainer_load: %s could not be read on %.0f of %d ranks (a path every rank can read?)",
                          path, bad, t->world);
    return st;
}

static fl_status load_local(fl_trainer *t, const char *path) {
    fl_gguf *g;
    fl_status st = fl_gguf_open(path, &g);
    if (st) return st;
    uint32_t ver = 0, kind = 0, bs = 0, rank = 0;
    uint64_t step = 0, osteps = 0, pos = 0, epoch = 0, rng = 0, good = 0;
    float scale = 1.0f;
    if (fl_gguf_get_u32(g, "fitllm.train.version", &ver) != FL_OK || ver != FL_TRAIN_CKPT_VERSION) {
        st = fl_set_error(FL_ERR_FORMAT, "fl_trainer_load: %s is not a version %d fitllm checkpoint", path,
                          FL_TRAIN_CKPT_VERSION);
        goto done;
    }
    if ((st = get_u64(g, "fitllm.train.step", &step)) || (st = get_u64(g, "fitllm.train.optim_steps", &osteps)) ||
        (st = get_u64(g, "fitllm.train.data_pos", &pos)) || (st = get_u64(g, "fitllm.train.data_epoch", &epoch)) ||
        (st = get_u64(g, "fitllm.train.rng", &rng)) || (st = get_u64(g, "fitllm.train.good_steps", &good)))
        goto done;
    if ((st = fl_gguf_get_f32(g, "fitllm.train.loss_scale", &scale)) ||
        (st = fl_gguf_get_u32(g, "fitllm.train.optim_kind", &kind)) ||
        (st = fl_gguf_get_u32(g, "fitllm.train.block_size", &bs)) ||
        (st = fl_gguf_get_u32(g, "fitllm.train.lora_rank", &rank)))
        goto done;
    const fl_optimizer_config *oc = fl_optim_get_config(t->opt);
    if ((int)kind != oc->kind || (int32_t)bs != oc->block_size || (int32_t)rank != t->m->lora_rank) {
        st = fl_set_error(FL_ERR_INVALID, "fl_trainer_load: checkpoint optimizer/LoRA (%u, block %u, rank %u) differ from this run",
                          kind, bs, rank);
        goto done;
    }
    fl_train_config cfg;
    if ((st = fl_train_config_from_gguf(g, &cfg))) goto done;
    if (cfg.n_embd != t->m->cfg.n_embd || cfg.n_layer != t->m->cfg.n_layer || cfg.n_vocab != t->m->cfg.n_vocab ||
        cfg.n_ff != t->m->cfg.n_ff || cfg.n_head != t->m->cfg.n_head || cfg.n_head_kv != t->m->cfg.n_head_kv) {
        st = fl_set_error(FL_ERR_INVALID, "fl_trainer_load: checkpoint model shape differs");
        goto done;
    }
    if (t->m->lora_rank <= 0 && (st = fl_train_model_read_params(t->m, g))) goto done;
    if (t->m->lora_rank > 0 && (st = fl_train_model_read_lora(t->m, g))) goto done;
    /* the states cover all parameters: this rank's shard is a slice (any number of ranks) */
    int64_t off, len;
    shard_of(t, &off, &len);
    for (int i = 0;; i++) {
        void *data;
        size_t bytes, full, lo, part;
        const char *name;
        if (fl_optim_state(t->opt, i, &data, &bytes, &name) != FL_OK) break;
        char key[96];
        snprintf(key, sizeof key, "optim.%s", name);
        state_part(t, i, off, len, &full, &lo, &part);
        const fl_gguf_tensor *ts = fl_gguf_find_tensor(g, key);
        if (!ts || ts->size != full) {
            st = fl_set_error(FL_ERR_FORMAT, "fl_trainer_load: optimizer state '%s' missing or of the wrong size", key);
            goto done;
        }
        FL_ASSERT(part <= bytes);
        memcpy(data, (const char *)ts->data + lo, part);
    }
    if (t->bat.mode == FL_BATCH_BUCKET) {
        const fl_gguf_tensor *ts = fl_gguf_find_tensor(g, "data.perm");
        if (!ts || ts->size != (size_t)t->bat.n_batches * 8) {
            st = fl_set_error(FL_ERR_FORMAT, "fl_trainer_load: data.perm missing or of the wrong size");
            goto done;
        }
        memcpy(t->bat.perm, ts->data, ts->size);
    }
    if ((int64_t)pos >= (t->bat.mode == FL_BATCH_PACK ? t->data->n_ids : t->bat.n_batches)) {
        st = fl_set_error(FL_ERR_INVALID, "fl_trainer_load: data position %llu past this corpus", (unsigned long long)pos);
        goto done;
    }
    fl_optim_set_steps(t->opt, (int64_t)osteps);
    t->step = (int64_t)step;
    t->bat.pos = (int64_t)pos;
    t->bat.epoch = (int64_t)epoch;
    t->bat.rng.s = rng;
    t->loss_scale = scale;
    t->good_steps = (int64_t)good;
    fl_train_model_after_update(t->m);
done:
    fl_gguf_free(g);
    return st;
}
