/* The training loop: accumulation, clipping, loss scaling, schedule, checkpoints (trainer.h). */
#include "train/trainer.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"

#include <math.h>
#include <stdio.h>
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
    int world, rank;
    float *gpad;      /* stage 2: gradients padded to fl_zero_padded_n (FL_MEM_GRAD) */
    int64_t gpad_n;
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
    if (t->gpad) fl_free(FL_MEM_GRAD, t->gpad, (size_t)t->gpad_n * sizeof(float));
    fl_free(FL_MEM_MISC, t, sizeof *t);
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
    fl_status st = fl_train_model_reserve(m, (int64_t)nt, o->ckpt_every, o->precision);
    if (st) goto fail;
    float *params, *grads;
    int64_t n;
    fl_train_model_trainable(m, &params, &grads, &n);
    int64_t ranges[2 * FL_OPTIM_MAX_RANGES];
    const int nr = fl_train_model_decay_ranges(m, ranges, FL_OPTIM_MAX_RANGES);
    t->world = o->comm ? fl_comm_size(o->comm) : 1;
    t->rank = o->comm ? fl_comm_rank(o->comm) : 0;
    if (t->world > 1) {
        if (o->precision == FL_TRAIN_FP16) {
            st = fl_set_error(FL_ERR_UNSUPPORTED, "%s: fp16 loss scaling with ZeRO data parallelism is not implemented", __func__);
            goto fail;
        }
        if ((st = fl_zero_new(o->comm, o->zero_stage ? o->zero_stage : 1, n, &t->zero))) goto fail;
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
        if ((o->zero_stage == 2)) {
            t->gpad_n = fl_zero_padded_n(t->zero);
            t->gpad = fl_calloc(FL_MEM_GRAD, (size_t)t->gpad_n, sizeof(float));
            if (!t->gpad) goto nomem;
        }
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

/* The data-parallel end of a step: global loss, ZeRO gradient sum + clip + sharded update. */
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
    s->loss_scale = 1.0f;
    t->cur_lr = lr;
    float *g = grads;
    if (t->gpad) {
        memcpy(t->gpad, grads, (size_t)n * sizeof(float));
        g = t->gpad;
    }
    double norm = 0;
    st = fl_zero_step(t->zero, params, g, t->o.clip, &norm, zero_update, t);
    if (st) return st;
    s->grad_norm = norm;
    t->step++;
    if (!isfinite(norm))
        return fl_set_error(FL_ERR_INVALID, "%s: non-finite gradient norm at step %lld (lower the LR?)", __func__, (long long)t->step);
    fl_train_model_after_update(t->m);
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
    if (t->loss_scale != 1.0f) {
        const float inv = 1.0f / t->loss_scale;
        for (int64_t i = 0; i < n; i++) grads[i] *= inv;
    }
    const double norm = fl_grad_clip(grads, n, t->o.clip);
    s->grad_norm = norm;
    s->loss_scale = t->loss_scale;
    t->step++;
    if (!isfinite(norm)) {
        s->skipped = true;
        if (t->o.precision == FL_TRAIN_FP16) {
            t->loss_scale = t->loss_scale > 1.0f ? t->loss_scale * 0.5f : 1.0f;
            t->good_steps = 0;
            return FL_OK;
        }
        return fl_set_error(FL_ERR_INVALID, "%s: non-finite gradient norm at step %lld (lower the LR?)", __func__,
                            (long long)t->step);
    }
    fl_optim_step(t->opt, params, grads, lr);
    fl_train_model_after_update(t->m);
    if (t->o.precision == FL_TRAIN_FP16 && ++t->good_steps >= FL_LOSS_SCALE_WINDOW) {
        t->loss_scale *= 2.0f;
        t->good_steps = 0;
    }
    return FL_OK;
}

/* ---------------------------------------------------------------- checkpoints */

fl_status fl_trainer_save(fl_trainer *t, const char *path) {
    if (t->zero) return fl_set_error(FL_ERR_UNSUPPORTED, "%s: checkpoints of ZeRO-sharded optimizer states are not implemented", __func__);
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
    for (int i = 0; !st; i++) {
        void *data;
        size_t bytes;
        const char *name;
        if (fl_optim_state(t->opt, i, &data, &bytes, &name) != FL_OK) break;
        char key[96];
        snprintf(key, sizeof key, "optim.%s", name);
        const bool f32 = strstr(name, ".q") == NULL;
        const int64_t ne[1] = {(int64_t)(f32 ? bytes / 4 : bytes)};
        st = fl_gguf_writer_add_tensor(w, key, f32 ? FL_TYPE_F32 : FL_TYPE_I8, 1, ne, data);
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

fl_status fl_trainer_load(fl_trainer *t, const char *path) {
    if (t->zero) return fl_set_error(FL_ERR_UNSUPPORTED, "%s: resuming ZeRO-sharded training is not implemented", __func__);
    fl_gguf *g;
    fl_status st = fl_gguf_open(path, &g);
    if (st) return st;
    uint32_t ver = 0, kind = 0, bs = 0, rank = 0;
    uint64_t step = 0, osteps = 0, pos = 0, epoch = 0, rng = 0, good = 0;
    float scale = 1.0f;
    if (fl_gguf_get_u32(g, "fitllm.train.version", &ver) != FL_OK || ver != FL_TRAIN_CKPT_VERSION) {
        st = fl_set_error(FL_ERR_FORMAT, "%s: %s is not a version %d fitllm checkpoint", __func__, path,
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
        st = fl_set_error(FL_ERR_INVALID, "%s: checkpoint optimizer/LoRA (%u, block %u, rank %u) differ from this run",
                          __func__, kind, bs, rank);
        goto done;
    }
    fl_train_config cfg;
    if ((st = fl_train_config_from_gguf(g, &cfg))) goto done;
    if (cfg.n_embd != t->m->cfg.n_embd || cfg.n_layer != t->m->cfg.n_layer || cfg.n_vocab != t->m->cfg.n_vocab ||
        cfg.n_ff != t->m->cfg.n_ff || cfg.n_head != t->m->cfg.n_head || cfg.n_head_kv != t->m->cfg.n_head_kv) {
        st = fl_set_error(FL_ERR_INVALID, "%s: checkpoint model shape differs", __func__);
        goto done;
    }
    if (t->m->lora_rank <= 0 && (st = fl_train_model_read_params(t->m, g))) goto done;
    if (t->m->lora_rank > 0 && (st = fl_train_model_read_lora(t->m, g))) goto done;
    for (int i = 0;; i++) {
        void *data;
        size_t bytes;
        const char *name;
        if (fl_optim_state(t->opt, i, &data, &bytes, &name) != FL_OK) break;
        char key[96];
        snprintf(key, sizeof key, "optim.%s", name);
        const fl_gguf_tensor *ts = fl_gguf_find_tensor(g, key);
        if (!ts || ts->size != bytes) {
            st = fl_set_error(FL_ERR_FORMAT, "%s: optimizer state '%s' missing or of the wrong size", __func__, key);
            goto done;
        }
        memcpy(data, ts->data, bytes);
    }
    if (t->bat.mode == FL_BATCH_BUCKET) {
        const fl_gguf_tensor *ts = fl_gguf_find_tensor(g, "data.perm");
        if (!ts || ts->size != (size_t)t->bat.n_batches * 8) {
            st = fl_set_error(FL_ERR_FORMAT, "%s: data.perm missing or of the wrong size", __func__);
            goto done;
        }
        memcpy(t->bat.perm, ts->data, ts->size);
    }
    if ((int64_t)pos >= (t->bat.mode == FL_BATCH_PACK ? t->data->n_ids : t->bat.n_batches)) {
        st = fl_set_error(FL_ERR_INVALID, "%s: data position %llu past this corpus", __func__, (unsigned long long)pos);
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
