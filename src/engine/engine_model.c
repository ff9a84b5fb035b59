/*
 * engine_model.c - fl_engine_new(): the engine over a real llama model.
 *
 * Builds the backend (backend.h): the model (model/llama.h) with a workspace for the step's
 * token budget, the GGUF tokenizer, and the KV cache the params ask for: the paged cache
 * (kv/kv_cache.h) sized from kv_mem, with prefix caching and swap, or the contiguous
 * max-length reservation (kv/kv_contig.h) for the static baseline, as many slots as kv_mem
 * holds.  The KV adapter (kv_adapter.h) turns either into the scheduler's block accounting.
 */
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/kv_adapter.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "kv/kv_cache.h"
#include "kv/kv_contig.h"
#include "kernels/ops.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/tokenizer.h"
#include "plan/plan_engine.h"

#include <string.h>
#include <sys/stat.h>

#define DEFAULT_KV_MEM (256ll << 20)

/* Speculative decoding's draft model: its own paged cache, sequence ids those of the target's
 * cache (a sequence's draft state goes when its target sequence does), batches of at most
 * max_batch_tokens tokens, a logits row per sequence. */
typedef struct draft_model {
    fl_model *model;
    fl_kv_cache *kv;
    fl_kv_iface iface;
    int32_t n_vocab, max_seqs, cap;    /* vocabulary; requests a step drafts for; tokens per batch */
    int32_t *b_tok, *b_pos, *b_seq;    /* [cap] */
    int8_t *b_logit;                   /* [cap] */
    float *logits;                     /* [max_seqs][n_vocab] */
    fl_request **req;                  /* [max_seqs] the queued requests, */
    int32_t *k, *row, n_req;           /* their draft lengths, their rows in a batch (-1: none) */
} draft_model;

typedef struct mbackend {
    fl_model *model;
    draft_model *draft;    /* or NULL */
    fl_sched_kv inner;     /* the adapter's callbacks (wrapped when there is a draft model) */
    fl_tokenizer *tok;
    fl_kv_cache *kv;       /* paged, or */
    fl_kv_contig *contig;  /* contiguous */
    int32_t n_slots;
    fl_kv_adapter *ad;
    fl_kv_iface paged_iface;
    const fl_kv_iface *iface;
    void *kv_ctx;
    char name[128];
    char *chat_template;
    size_t chat_template_size;
    bool budget_set;       /* this engine set the allocator's total budget (mem_total) */
    /* run-time adapters (fl_engine_params.lora_slots): what a slot reserves */
    int32_t lora_rank;
    size_t lora_file_cap, lora_misc_cap;
    bool no_mmap;
} mbackend;

size_t fl_engine_model_misc_bytes(int32_t max_seqs) { return sizeof(mbackend) + fl_kv_adapter_misc_bytes(FL_ENGINE_SEQ_IDS(max_seqs)); }

size_t fl_engine_draft_misc_bytes(int32_t max_seqs) { return sizeof(draft_model) + (size_t)max_seqs * (sizeof(fl_request *) + 2 * sizeof(int32_t)); }
size_t fl_engine_draft_scratch_bytes(int32_t max_batch_tokens) { return (size_t)max_batch_tokens * (3 * sizeof(int32_t) + 1); }

static void draft_free(draft_model *d) {
    if (!d) return;
    const size_t c = (size_t)d->cap, ns = (size_t)d->max_seqs;
    fl_free(FL_MEM_SCRATCH, d->b_tok, c * sizeof(int32_t));
    fl_free(FL_MEM_SCRATCH, d->b_pos, c * sizeof(int32_t));
    fl_free(FL_MEM_SCRATCH, d->b_seq, c * sizeof(int32_t));
    fl_free(FL_MEM_SCRATCH, d->b_logit, c);
    fl_free(FL_MEM_ACT, d->logits, ns * (size_t)d->n_vocab * sizeof(float));
    fl_free(FL_MEM_MISC, d->req, ns * sizeof(fl_request *));
    fl_free(FL_MEM_MISC, d->k, ns * sizeof(int32_t));
    fl_free(FL_MEM_MISC, d->row, ns * sizeof(int32_t));
    fl_kv_free(d->kv);
    fl_model_free(d->model);
    fl_free(FL_MEM_MISC, d, sizeof *d);
}

/* The draft model of p (spec_draft_model) over the target's vocabulary and cache shape. */
static fl_status draft_new(const fl_engine_params *p, const fl_hparams *thp, const fl_gguf *tg, int32_t n_ctx, int32_t kv_type,
                           int32_t block_size, draft_model **out) {
    *out = NULL;
    draft_model *d = fl_calloc(FL_MEM_MISC, 1, sizeof *d);
    if (!d) return FL_ERR_NOMEM;
    fl_model_params mp = fl_model_default_params();
    mp.no_mmap = p->no_mmap != 0;
    mp.repack = p->no_repack == 0;
    fl_status st = fl_model_load(p->spec_draft_model, &mp, &d->model);
    if (st != FL_OK) {
        fl_add_error_context("draft model %s", p->spec_draft_model);
        goto fail;
    }
    const fl_hparams *hp = fl_model_hparams(d->model);
    /* the same vocabulary: its size and every token's text */
    if (hp->n_vocab != thp->n_vocab || !fl_gguf_vocab_equal(tg, fl_model_gguf(d->model))) {
        st = fl_set_error(FL_ERR_INVALID, "draft model %s: its vocabulary (%d tokens) is not the model's (%d tokens, the same texts)",
                          p->spec_draft_model, hp->n_vocab, thp->n_vocab);
        goto fail;
    }
    d->n_vocab = hp->n_vocab;
    d->max_seqs = p->max_seqs;
    d->cap = p->max_batch_tokens;
    fl_kv_config kc = {.n_layer = hp->n_layer, .n_head = hp->n_head_local, .n_head_kv = hp->n_head_kv_local,
                       .head_dim = hp->head_dim, .type = kv_type, .block_size = block_size,
                       .n_blocks = FL_ENGINE_DRAFT_BLOCKS(p->max_seqs, n_ctx, block_size), .n_seq_max = FL_ENGINE_SEQ_IDS(p->max_seqs),
                       .n_ctx = n_ctx, .window = hp->n_swa, .n_rot = hp->rope_dim, .rope_base = hp->rope_freq_base,
                       .prefix_cache = p->prefix_cache != 0, .swap_dir = p->swap_path, .prefault = true};
    if (!(d->kv = fl_kv_new(&kc))) {
        st = FL_ERR_INVALID;
        fl_add_error_context("draft model: KV cache");
        goto fail;
    }
    d->iface = fl_kv_iface_get();
    if ((st = fl_model_workspace_new(d->model, p->max_batch_tokens + p->max_seqs, p->max_seqs)) != FL_OK) goto fail;
    const size_t c = (size_t)d->cap, ns = (size_t)d->max_seqs;
    d->b_tok = fl_alloc(FL_MEM_SCRATCH, c * sizeof(int32_t), 0);
    d->b_pos = fl_alloc(FL_MEM_SCRATCH, c * sizeof(int32_t), 0);
    d->b_seq = fl_alloc(FL_MEM_SCRATCH, c * sizeof(int32_t), 0);
    d->b_logit = fl_alloc(FL_MEM_SCRATCH, c, 0);
    d->logits = fl_alloc(FL_MEM_ACT, ns * (size_t)d->n_vocab * sizeof(float), 0);
    d->req = fl_alloc(FL_MEM_MISC, ns * sizeof(fl_request *), 0);
    d->k = fl_alloc(FL_MEM_MISC, ns * sizeof(int32_t), 0);
    d->row = fl_alloc(FL_MEM_MISC, ns * sizeof(int32_t), 0);
    if (!d->b_tok || !d->b_pos || !d->b_seq || !d->b_logit || !d->logits || !d->req || !d->k || !d->row) {
        st = FL_ERR_NOMEM;
        goto fail;
    }
    *out = d;
    return FL_OK;
fail:
    draft_free(d);
    return st;
}

/* A run-time adapter, refused unless it fits a slot's reservation (fl_lora_slot_caps). */
static fl_status mb_lora_open(void *ctx, const char *path, float scale, void **h) {
    mbackend *m = ctx;
    *h = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return fl_set_error(FL_ERR_IO, "LoRA adapter %s: cannot stat it", path);
    if ((uint64_t)sb.st_size > m->lora_file_cap)
        return fl_set_error(FL_ERR_BUDGET, "LoRA adapter %s: %lld bytes; a slot takes %zu (an adapter of rank %d: --max-lora-rank)", path,
                            (long long)sb.st_size, m->lora_file_cap, m->lora_rank);
    const fl_hparams *hp = fl_model_hparams(m->model);
    fl_lora *l = NULL;
    fl_status st = fl_lora_open(path, hp, scale, m->no_mmap, &l);
    if (st) return st;
    const int64_t n_t = 2 * FL_LORA_TARGETS * (int64_t)hp->n_layer;
    if (l->rank_max > m->lora_rank || fl_gguf_n_kv(l->g) > FL_LORA_SLOT_KEYS || fl_gguf_n_tensors(l->g) > n_t ||
        fl_lora_misc_bytes(l) > m->lora_misc_cap) {
        st = fl_set_error(FL_ERR_BUDGET, "LoRA adapter %s: rank %d, %lld keys, %lld tensors, %zu bytes of index; a slot takes rank %d, "
                          "%d keys, %lld tensors, %zu bytes", path, l->rank_max, (long long)fl_gguf_n_kv(l->g), (long long)fl_gguf_n_tensors(l->g),
                          fl_lora_misc_bytes(l), m->lora_rank, FL_LORA_SLOT_KEYS, (long long)n_t, m->lora_misc_cap);
        fl_lora_free(l);
        return st;
    }
    *h = l;
    return FL_OK;
}

static fl_status mb_lora_put(void *ctx, int32_t k, void *h, void **old) {
    fl_lora *o = NULL;
    const fl_status st = fl_model_lora_put(((mbackend *)ctx)->model, k, h, &o);
    *old = o;
    return st;
}

static void mb_lora_close(void *ctx, void *h) {
    (void)ctx;
    fl_lora_free(h);
}

static bool mb_draft_add(void *ctx, fl_request *r, int32_t k) {
    draft_model *d = ((mbackend *)ctx)->draft;
    if (d->n_req == d->max_seqs) return false;
    d->req[d->n_req] = r;
    d->k[d->n_req++] = k;
    return true;
}

/* The draft token of a logits row (overwritten): its argmax, or -1 when its softmax probability
 * is below p_min. */
static int32_t draft_token(float *x, int32_t n, float p_min) {
    const fl_ops_kernels *ops = fl_ops_kernels_get();
    const int32_t b = (int32_t)ops->argmax(x, n);
    if (p_min <= 0) return b;
    const float mx = x[b];
    for (int32_t i = 0; i < n; i++) x[i] -= mx;
    ops->expf_poly(x, x, n);
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += x[i];
    return 1.0 / sum >= (double)p_min ? b : -1;
}

/* Draft for the queued requests: bring each one's draft sequence up to its tokens (what it holds
 * that its tokens no longer start with is dropped; a sequence whose lag does not fit this step's
 * batch feeds what fits and drafts at a later step), the last token's row gives the first draft
 * token, then one batch per further token; a draft ends early at a token below its request's p_min.  Greedy:
 * a draft is a function of the tokens, so verifying it by the request's own sampler keeps the
 * output exact.  A failed forward drafts nothing.  The draft cache shares prompt blocks by the
 * requests' cache_salt, as the model's does. */
static void mb_draft_run(void *ctx) {
    draft_model *d = ((mbackend *)ctx)->draft;
    int32_t n = 0, rows = 0, kmax = 0;
    for (int32_t i = 0; i < d->n_req; i++) {
        fl_request *r = d->req[i];
        const int32_t id = (int32_t)r->kv_seq;
        d->row[i] = -1;
        r->n_draft = 0;
        if (!fl_kv_seq_exists(d->kv, id)) {
            int32_t cached = 0;
            const fl_status st = r->cache_salt ? fl_kv_seq_add_keyed(d->kv, id, r->tokens, r->n_tokens, &r->cache_salt, sizeof r->cache_salt, &cached)
                                               : fl_kv_seq_add(d->kv, id, r->tokens, r->n_tokens, &cached);
            if (st != FL_OK) {
                fl_clear_error();
                continue;
            }
        }
        int32_t len = 0, keep = 0;
        const int32_t *t = fl_kv_seq_tokens(d->kv, id, &len);
        while (keep < len && keep < r->n_tokens - 1 && t[keep] == r->tokens[keep]) keep++;
        if (keep < len && fl_kv_seq_truncate(d->kv, id, keep) != FL_OK) {
            fl_clear_error();
            continue;
        }
        /* what it lacks (>= 1: the last token, whose row drafts); what the batch has no room
         * for waits for the next step (the part that fits goes in now, so it catches up) */
        const int32_t need = r->n_tokens - keep, take = need < d->cap - n ? need : d->cap - n;
        if (take < 1 || fl_kv_seq_blocks_needed(d->kv, id, take + d->k[i]) > fl_kv_blocks_free(d->kv)) continue;
        for (int32_t j = 0; j < take; j++) {
            d->b_tok[n] = r->tokens[keep + j];
            d->b_pos[n] = keep + j;
            d->b_seq[n] = id;
            d->b_logit[n++] = j == need - 1;
        }
        if (take < need) continue;
        d->row[i] = rows++;
        if (d->k[i] > kmax) kmax = d->k[i];
    }
    for (int32_t step = 0; n > 0 && (step == 0 || rows > 0) && step < (kmax > 0 ? kmax : 1); step++) {
        fl_batch b = {n, d->b_tok, d->b_pos, d->b_seq, d->b_logit, NULL, NULL, NULL};
        if (fl_model_forward(d->model, &b, &d->iface, d->kv, d->logits) != FL_OK) {
            fl_clear_error();
            for (int32_t i = 0; i < d->n_req; i++) d->req[i]->n_draft = 0;
            break;
        }
        n = rows = 0;
        for (int32_t i = 0; i < d->n_req; i++) { /* the next token of each, and what to feed */
            fl_request *r = d->req[i];
            if (d->row[i] < 0) continue;
            const int32_t t = draft_token(d->logits + (size_t)d->row[i] * (size_t)d->n_vocab, d->n_vocab, r->spec_p_min);
            if (t < 0) { /* not sure enough: the draft ends here */
                d->row[i] = -1;
                continue;
            }
            r->draft[r->n_draft] = t;
            if (++r->n_draft == d->k[i]) {
                d->row[i] = -1;
                continue;
            }
            d->b_tok[n] = r->draft[r->n_draft - 1];
            d->b_pos[n] = r->n_tokens - 1 + r->n_draft;
            d->b_seq[n] = (int32_t)r->kv_seq;
            d->b_logit[n++] = 1;
            d->row[i] = rows++;
        }
    }
    d->n_req = 0;
}

/* The scheduler's KV callbacks with a draft model: a target sequence that ends or is swapped out
 * takes its draft sequence with it (drafting rebuilds it from the tokens). */
static int64_t dw_n_free(void *ctx) { mbackend *m = ctx; return m->inner.n_free(m->inner.ctx); }
static fl_status dw_seq_begin(void *ctx, fl_request *r, int32_t *n_cached) { mbackend *m = ctx; return m->inner.seq_begin(m->inner.ctx, r, n_cached); }
static int64_t dw_n_needed(void *ctx, const fl_request *r, int32_t n) { mbackend *m = ctx; return m->inner.n_needed(m->inner.ctx, r, n); }
static fl_status dw_reserve(void *ctx, fl_request *r, int32_t n) { mbackend *m = ctx; return m->inner.reserve(m->inner.ctx, r, n); }
static void dw_seq_end(void *ctx, fl_request *r) {
    mbackend *m = ctx;
    fl_kv_seq_free(m->draft->kv, (int32_t)r->kv_seq);
    m->inner.seq_end(m->inner.ctx, r);
}
static fl_status dw_swap_out(void *ctx, fl_request *r) {
    mbackend *m = ctx;
    fl_status st = m->inner.swap_out(m->inner.ctx, r);
    if (st == FL_OK) fl_kv_seq_free(m->draft->kv, (int32_t)r->kv_seq);
    return st;
}
static fl_status dw_swap_in(void *ctx, fl_request *r) { mbackend *m = ctx; return m->inner.swap_in(m->inner.ctx, r); }
static fl_status dw_fork(void *ctx, fl_request *parent, fl_request *child, int32_t n) {
    mbackend *m = ctx;
    return m->inner.fork(m->inner.ctx, parent, child, n);
}
static fl_status dw_truncate(void *ctx, fl_request *r, int32_t n) { mbackend *m = ctx; return m->inner.truncate(m->inner.ctx, r, n); }

static fl_status mb_forward(void *ctx, const fl_batch *b, float *logits) {
    mbackend *m = ctx;
    return fl_model_forward(m->model, b, m->iface, m->kv_ctx, logits);
}
static void mb_step_done(void *ctx) { fl_kv_adapter_step_done(((mbackend *)ctx)->ad); }
static bool mb_is_eog(void *ctx, int32_t t) {
    mbackend *m = ctx;
    return m->tok ? fl_tokenizer_is_eog(m->tok, t) : false;
}
static int32_t mb_piece(void *ctx, int32_t t, char *buf, int32_t cap) {
    mbackend *m = ctx;
    return m->tok ? fl_token_to_piece(m->tok, t, buf, cap, false) : 0;
}
static int32_t mb_token_text(void *ctx, int32_t t, char *buf, int32_t cap) {
    mbackend *m = ctx;
    return m->tok ? fl_token_to_piece(m->tok, t, buf, cap, true) : -1;
}
static fl_status mb_tokenize(void *ctx, const char *text, size_t len, int add_special, int32_t *out, int64_t cap,
                             int64_t *n_out) {
    mbackend *m = ctx;
    if (!m->tok) return fl_set_error(FL_ERR_UNSUPPORTED, "fl_engine_tokenize: the model has no tokenizer");
    return fl_tokenize(m->tok, text, len, (add_special & FL_TOKENIZE_ADD_SPECIAL) != 0, (add_special & FL_TOKENIZE_PARSE_SPECIAL) != 0, out, cap, n_out);
}
static int64_t mb_detokenize(void *ctx, const int32_t *ids, int64_t n, char *buf, int64_t cap) {
    mbackend *m = ctx;
    return m->tok ? fl_detokenize(m->tok, ids, n, buf, cap, false, false) : -1;
}
static int32_t mb_special(void *ctx, fl_special_token which) {
    mbackend *m = ctx;
    if (!m->tok) return which == FL_SPECIAL_ADD_BOS ? 0 : -1;
    _Static_assert((int)FL_SPECIAL_FIM_SEP == (int)FL_FIM_SEP, "the FIM tokens in the tokenizer's order");
    if (which <= FL_SPECIAL_FIM_SEP) return fl_tokenizer_fim(m->tok, (fl_fim_token)which);
    if (which == FL_SPECIAL_BOS) return fl_tokenizer_bos(m->tok);
    return which == FL_SPECIAL_ADD_BOS ? fl_tokenizer_add_bos(m->tok) : -1;
}

static void mb_kv_stats(void *ctx, fl_backend_kv_stats *st) {
    mbackend *m = ctx;
    fl_kv_adapter_stats(m->ad, st);
    if (m->contig) { /* live tokens of the contiguous slots (cleared slots have length 0) */
        for (int32_t s = 0; s < m->n_slots; s++) st->tokens_live += fl_kv_contig_seq_len(m->contig, s);
        st->bytes_total = (int64_t)fl_mem_current(FL_MEM_KV);
    }
}
static void mb_free(void *ctx) {
    mbackend *m = ctx;
    if (!m) return;
    fl_kv_adapter_free(m->ad);
    draft_free(m->draft);
    fl_kv_free(m->kv);
    fl_kv_contig_free(m->contig);
    fl_tokenizer_free(m->tok);
    fl_model_free(m->model);
    if (m->chat_template) fl_free(FL_MEM_MISC, m->chat_template, m->chat_template_size);
    const bool budget = m->budget_set;
    fl_free(FL_MEM_MISC, m, sizeof *m);
    if (budget) fl_mem_set_budget_total(0);
}
static void contig_clear(void *kv, int32_t slot) { fl_kv_contig_seq_clear(kv, slot); }

fl_status fl_engine_plan_input(const fl_engine_params *p, fl_plan_engine_in *pi) {
    memset(pi, 0, sizeof *pi);
    pi->model_path = p->model_path;
    pi->weights_type = -1;
    if (p->weights_type && p->weights_type[0]) {
        pi->weights_type = fl_type_from_name(p->weights_type);
        if (pi->weights_type < 0) return fl_set_error(FL_ERR_INVALID, "unknown weights type '%s'", p->weights_type);
    }
    const char *kvt = p->kv_type && p->kv_type[0] ? p->kv_type : "f16";
    pi->kv_type = fl_type_from_name(kvt);
    if (pi->kv_type < 0) return fl_set_error(FL_ERR_INVALID, "unknown KV type '%s'", kvt);
    pi->kv_block = p->kv_block_size > 0 ? p->kv_block_size : 16;
    pi->n_ctx = p->n_ctx;
    pi->max_seqs = p->max_seqs;
    pi->max_batch_tokens = p->max_batch_tokens;
    pi->spec_tokens = p->spec_tokens;
    pi->n_threads = p->n_threads;
    pi->kv_mem = (uint64_t)(p->kv_mem > 0 ? p->kv_mem : DEFAULT_KV_MEM);
    pi->prefix_cache = p->prefix_cache != 0;
    pi->repack = p->no_repack == 0;
    pi->max_logprobs = p->max_logprobs;
    pi->guide_masks = p->guide_masks;
    pi->guide_mem = (uint64_t)fl_engine_guide_mem(p);
    pi->net_mem = p->net_mem > 0 ? (uint64_t)p->net_mem : 0;
    pi->embeddings = p->embeddings != 0;
    pi->swap_dir = p->swap_path;
    pi->chat_template = p->chat_template;
    pi->spec_draft_model = p->spec_draft_model;
    pi->lora_paths = p->lora_paths;
    pi->lora_scales = p->lora_scales;
    pi->n_loras = p->n_loras;
    pi->lora_slots = p->lora_slots;
    pi->max_lora_rank = p->max_lora_rank;
    return FL_OK;
}

fl_status fl_engine_new(const fl_engine_params *pin, fl_engine **out) {
    *out = NULL;
    fl_engine_params p;
    if (pin) p = *pin;
    else fl_engine_params_default(&p);
    if (!p.model_path) return fl_set_error(FL_ERR_INVALID, "%s: no model path", __func__);
    if (p.max_seqs < 1 || p.max_batch_tokens < 1 || p.kv_mem < 0 || p.n_ctx < 0 || p.kv_block_size < 0 || p.mem_total < 0)
        return fl_set_error(FL_ERR_INVALID, "%s: bad params (max_seqs %d, max_batch_tokens %d, kv_mem %lld)", __func__,
                            p.max_seqs, p.max_batch_tokens, (long long)p.kv_mem);
    if (p.n_threads > 0 || fl_threads_get() <= 0) fl_threads_set(p.n_threads);
    const bool planned = p.mem_total > 0 && p.kv_mem == 0;
    if (planned) {
        /* the plan sizes the KV pool so that everything the engine allocates fits mem_total */
        if (p.kv_layout == FL_KV_CONTIGUOUS)
            return fl_set_error(FL_ERR_UNSUPPORTED, "%s: mem_total sizes the paged KV cache only (give kv_mem)", __func__);
        fl_plan_engine_in pi;
        fl_status pst = fl_engine_plan_input(&p, &pi);
        uint64_t kvm = 0;
        if (pst == FL_OK) pst = fl_plan_engine_kv_mem(&pi, (uint64_t)p.mem_total, &kvm);
        if (pst != FL_OK) return pst;
        p.kv_mem = (int64_t)kvm;
    }
    mbackend *m = fl_calloc(FL_MEM_MISC, 1, sizeof *m);
    if (!m) return FL_ERR_NOMEM;
    if (planned) { /* the promise is enforced: nothing allocates past it */
        fl_mem_set_budget_total((size_t)p.mem_total);
        m->budget_set = true;
    }
    fl_status st;
    fl_model_params mp = fl_model_default_params();
    if (p.weights_type && p.weights_type[0]) {
        mp.weights_type = fl_type_from_name(p.weights_type);
        if (mp.weights_type < 0) {
            st = fl_set_error(FL_ERR_INVALID, "%s: unknown weights type '%s'", __func__, p.weights_type);
            goto fail;
        }
    }
    mp.no_mmap = p.no_mmap != 0;
    mp.repack = p.no_repack == 0;
    mp.lora_paths = p.lora_paths;
    mp.lora_scales = p.lora_scales;
    mp.n_loras = p.n_loras; /* (every batch names each token's adapter) */
    mp.lora_slots = p.lora_slots;
    mp.lora_slot_rank = p.lora_slots > 0 ? p.max_lora_rank : 0;
    st = fl_model_load(p.model_path, &mp, &m->model);
    if (st != FL_OK) goto fail;
    const fl_hparams *hp = fl_model_hparams(m->model);
    const fl_gguf *g = fl_model_gguf(m->model);
    if ((st = fl_tokenizer_new(g, &m->tok)) != FL_OK) {
        m->tok = NULL;
        if (st == FL_ERR_NOMEM) goto fail; /* (not "a model without a tokenizer") */
        fl_clear_error(); /* no or a malformed tokenizer: token ids still work; text does not */
        st = FL_OK;
    }
    if (fl_gguf_get_str(g, "general.name", m->name, sizeof m->name) != FL_OK) snprintf(m->name, sizeof m->name, "%s", hp->arch);
    const fl_gguf_kv *ct = fl_gguf_find(g, "tokenizer.chat_template");
    if (p.chat_template || (ct && ct->value.type == FL_GGUF_STRING)) { /* (the params' in place of the file's) */
        const size_t n = p.chat_template ? strlen(p.chat_template) : ct->value.v.str.len;
        m->chat_template_size = n + 1;
        m->chat_template = fl_alloc(FL_MEM_MISC, m->chat_template_size, 0);
        if (!m->chat_template) {
            st = FL_ERR_NOMEM;
            goto fail;
        }
        memcpy(m->chat_template, p.chat_template ? p.chat_template : ct->value.v.str.data, n);
        m->chat_template[n] = 0;
    }
    fl_clear_error();
    const int32_t n_ctx = p.n_ctx > 0 ? p.n_ctx : hp->n_ctx_train > 0 ? hp->n_ctx_train : 2048;
    const int64_t kv_mem = p.kv_mem > 0 ? p.kv_mem : DEFAULT_KV_MEM;
    const char *kvt = p.kv_type && p.kv_type[0] ? p.kv_type : "f16";
    int32_t kv_type = fl_type_from_name(kvt);
    if (kv_type < 0) {
        st = fl_set_error(FL_ERR_INVALID, "%s: unknown KV type '%s'", __func__, kvt);
        goto fail;
    }
    int32_t block_size = p.kv_block_size > 0 ? p.kv_block_size : 16;
    if (p.kv_layout == FL_KV_CONTIGUOUS) {
        if (kv_type != FL_TYPE_F16 && kv_type != FL_TYPE_F32) kv_type = FL_TYPE_F16;
        fl_kv_contig_params cp = {hp->n_layer, hp->n_head_local, hp->n_head_kv_local, hp->head_dim, n_ctx, 1,
                                  hp->n_swa, kv_type};
        size_t per_seq = fl_kv_contig_bytes(&cp);
        if (!per_seq || (int64_t)per_seq > kv_mem) {
            st = fl_set_error(FL_ERR_BUDGET, "%s: kv_mem %lld bytes holds no %d-token sequence (%zu bytes each)",
                              __func__, (long long)kv_mem, n_ctx, per_seq);
            goto fail;
        }
        cp.n_seq_max = (int32_t)(kv_mem / (int64_t)per_seq);
        if (cp.n_seq_max > p.max_seqs) cp.n_seq_max = p.max_seqs;
        m->n_slots = cp.n_seq_max;
        st = fl_kv_contig_new(&cp, &m->contig);
        if (st != FL_OK) goto fail;
        st = fl_kv_adapter_new_slots(m->contig, m->n_slots, n_ctx, contig_clear, &m->ad);
        if (st != FL_OK) goto fail;
        m->iface = fl_kv_contig_iface();
        m->kv_ctx = m->contig;
        block_size = n_ctx;
    } else {
        const int32_t n_seq_max = FL_ENGINE_SEQ_IDS(p.max_seqs);
        fl_kv_config kc = {.n_layer = hp->n_layer, .n_head = hp->n_head_local, .n_head_kv = hp->n_head_kv_local,
                           .head_dim = hp->head_dim, .type = kv_type, .block_size = block_size,
                           .mem_bytes = (size_t)kv_mem, .n_seq_max = n_seq_max, .n_ctx = n_ctx,
                           .window = hp->n_swa, .n_rot = hp->rope_dim, .rope_base = hp->rope_freq_base,
                           .prefix_cache = p.prefix_cache != 0, .swap_dir = p.swap_path, .prefault = true};
        m->kv = fl_kv_new(&kc);
        if (!m->kv) {
            st = FL_ERR_INVALID;
            fl_add_error_context("%s: KV cache", __func__);
            goto fail;
        }
        st = fl_kv_adapter_new_paged(m->kv, n_seq_max, &m->ad);
        if (st != FL_OK) goto fail;
        m->paged_iface = fl_kv_iface_get();
        m->iface = &m->paged_iface;
        m->kv_ctx = m->kv;
    }
    /* the step's tokens: the budget plus one padding row per sequence (static baseline) */
    st = fl_model_workspace_new(m->model, p.max_batch_tokens + p.max_seqs, fl_engine_rows(p.max_seqs, p.spec_tokens, p.max_batch_tokens));
    if (st != FL_OK) goto fail;
    fl_engine_backend be = {0};
    be.ctx = m;
    be.n_vocab = hp->n_vocab;
    be.n_embd = hp->n_embd;
    be.n_ctx = n_ctx;
    be.block_size = block_size;
    be.n_blocks = fl_kv_adapter_n_blocks(m->ad);
    be.kv = fl_kv_adapter_iface(m->ad);
    if (p.spec_draft_model) {
        if (p.kv_layout == FL_KV_CONTIGUOUS || p.spec_tokens < 1) {
            st = fl_set_error(FL_ERR_UNSUPPORTED, "%s: a draft model needs the paged KV cache and spec_tokens >= 1", __func__);
            goto fail;
        }
        if ((st = draft_new(&p, hp, g, n_ctx, kv_type, block_size, &m->draft)) != FL_OK) goto fail;
        m->inner = be.kv;
        be.kv = (fl_sched_kv){m, dw_n_free, dw_seq_begin, dw_n_needed, dw_reserve, dw_seq_end, dw_swap_out, dw_swap_in, dw_fork, dw_truncate};
        be.draft_add = mb_draft_add;
        be.draft_run = mb_draft_run;
    }
    if (p.lora_slots > 0) {
        m->lora_rank = p.max_lora_rank;
        m->no_mmap = p.no_mmap != 0;
        fl_lora_slot_caps(hp, p.max_lora_rank, &m->lora_file_cap, &m->lora_misc_cap);
        be.lora_open = mb_lora_open;
        be.lora_put = mb_lora_put;
        be.lora_close = mb_lora_close;
    }
    be.forward = mb_forward;
    be.step_done = mb_step_done;
    be.is_eog = mb_is_eog;
    be.piece = mb_piece;
    be.token_text = mb_token_text;
    be.tokenize = mb_tokenize;
    be.detokenize = mb_detokenize;
    be.special = mb_special;
    be.kv_stats = mb_kv_stats;
    be.free = mb_free;
    be.name = m->name;
    be.chat_template = m->chat_template;
    if (p.kv_layout == FL_KV_CONTIGUOUS && p.max_seqs > m->n_slots) p.max_seqs = m->n_slots;
    return fl_engine_new_backend(&p, &be, out); /* takes m, also on failure */
fail:
    mb_free(m);
    return st;
}
