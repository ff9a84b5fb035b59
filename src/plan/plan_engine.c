/* The engine-exact plan (plan_engine.h): the engine's own size functions, added up. */
#include "plan/plan_engine.h"
#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/mask_cache.h"
#include "engine/request.h"
#include "engine/sampling.h"
#include "plan/plan.h"

#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "formats/gguf.h"
#include "kernels/matmul.h"
#include "kv/kv_cache.h"
#include "kv/paged_attn.h"
#include "model/arch.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/tokenizer.h"
#include "core/alloc.h"

#include <string.h>
#include <sys/stat.h>

static uint64_t r64(uint64_t n) { return (n + 63) & ~(uint64_t)63; }

/* Bytes fl_matmul allocates (FL_MEM_SCRATCH) for one call: W [ne1][K] of type t, M rows
 * (asked of kernels/matmul, so the plan follows the kernels' workspaces exactly). */
static uint64_t matmul_scratch(int32_t t, int64_t M, int64_t K, int nth) {
    return fl_plan_matmul_scratch(t, M, K, nth);
}

typedef struct mat { int32_t type; int64_t ne0, ne1; } mat;

static fl_status find(const fl_gguf *g, const char *name, mat *m, bool required) {
    const fl_gguf_tensor *t = fl_gguf_find_tensor(g, name);
    if (!t) {
        m->ne0 = m->ne1 = 0;
        return required ? fl_set_error(FL_ERR_FORMAT, "missing tensor %s", name) : FL_OK;
    }
    m->type = t->type;
    m->ne0 = t->ne[0];
    m->ne1 = t->ne[1];
    return FL_OK;
}

fl_status fl_plan_engine(const fl_plan_engine_in *in, fl_plan_engine_out *out) {
    memset(out, 0, sizeof *out);
    if (!in->model_path) return fl_set_error(FL_ERR_INVALID, "%s: no model path", __func__);
    if (in->max_seqs < 1 || in->max_batch_tokens < 1 || in->n_ctx < 0 || in->kv_block < 0 || in->spec_tokens < 0 || in->spec_tokens > FL_SPEC_MAX)
        return fl_set_error(FL_ERR_INVALID, "%s: bad parameters (max_seqs %d, max_batch_tokens %d)", __func__,
                            in->max_seqs, in->max_batch_tokens);
    struct stat sb;
    if (stat(in->model_path, &sb) != 0) return fl_set_error(FL_ERR_IO, "%s: cannot stat %s", __func__, in->model_path);
    /* the parsed GGUF and the tokenizer are built here to count their MISC bytes exactly: the
     * engine builds the same ones from the same file */
    const size_t misc0 = fl_mem_current(FL_MEM_MISC);
    fl_gguf *g = NULL;
    fl_status st = fl_gguf_open(in->model_path, &g);
    if (st) return st;
    const size_t misc1 = fl_mem_current(FL_MEM_MISC);
    out->gguf_bytes = misc1 > misc0 ? misc1 - misc0 : 0;
    {
        fl_tokenizer *tok = NULL;
        if ((st = fl_tokenizer_new(g, &tok)) == FL_ERR_NOMEM) goto done;
        if (st == FL_OK) {
            const size_t misc2 = fl_mem_current(FL_MEM_MISC);
            out->tokenizer_bytes = misc2 > misc1 ? misc2 - misc1 : 0;
            char piece[256];
            int64_t sum = 0, n = fl_tokenizer_n_vocab(tok);
            for (int32_t t = 0; t < n; t++) {
                const int32_t l = fl_token_to_piece(tok, t, piece, sizeof piece, false);
                sum += l > 0 ? l : 0;
            }
            out->avg_piece_bytes = n > 0 ? (double)sum / (double)n : 1.0;
            out->vocab_text_bytes = (uint64_t)sum;
            fl_tokenizer_free(tok);
        }
        fl_clear_error();
        const fl_gguf_kv *ct = fl_gguf_find(g, "tokenizer.chat_template");
        if (in->chat_template) out->tokenizer_bytes += strlen(in->chat_template) + 1; /* the engine's copy */
        else if (ct && ct->value.type == FL_GGUF_STRING) out->tokenizer_bytes += ct->value.v.str.len + 1;
    }
    fl_hparams hp;
    if ((st = fl_hparams_from_gguf(g, &hp))) goto done;
    const int nth = in->n_threads > 0 ? in->n_threads : (fl_threads_get() > 0 ? fl_threads_get() : 1);
    const int32_t wt = in->weights_type;
    out->file_bytes = (uint64_t)sb.st_size;
    out->n_vocab = hp.n_vocab;
    out->n_ctx = in->n_ctx > 0 ? in->n_ctx : hp.n_ctx_train > 0 ? hp.n_ctx_train : 2048;

    /* weights: every tensor's bytes in the file; the matrices converted at load */
    for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) out->tensor_bytes += fl_gguf_tensor_at(g, i)->size;
    out->meta_bytes = out->file_bytes > out->tensor_bytes ? out->file_bytes - out->tensor_bytes : 0;
    mat te = {0}, outm = {0}, lay[7];
    if ((st = find(g, FL_TN_TOKEN_EMBD, &te, true)) || (st = find(g, FL_TN_OUTPUT, &outm, false))) goto done;
    const char *const names[7] = {FL_TN_ATTN_Q, FL_TN_ATTN_K, FL_TN_ATTN_V, FL_TN_ATTN_OUT, FL_TN_FFN_GATE, FL_TN_FFN_UP, FL_TN_FFN_DOWN};
    uint64_t conv = 0, read_bytes = 0; /* converted; bytes the matmuls read */
    int64_t n_mat = 0;
    uint64_t mm = 0; /* the largest matmul workspace of a step */
    const int64_t T = in->max_batch_tokens, R = fl_engine_rows(in->max_seqs, in->spec_tokens, in->max_batch_tokens);
    int32_t type_embd = te.type, type_out = te.type;
    {
        uint64_t c = fl_model_converted_bytes(wt, te.type, te.ne0, te.ne1);
        conv += c;
        if (c) type_embd = type_out = wt;
    }
    if (outm.ne0) {
        uint64_t c = fl_model_converted_bytes(wt, outm.type, outm.ne0, outm.ne1);
        conv += c;
        type_out = c ? wt : outm.type;
        read_bytes += c ? c : fl_plan_tensor_bytes(outm.type, outm.ne0, outm.ne1);
        n_mat += outm.ne0 * outm.ne1;
    } else {
        read_bytes += fl_plan_tensor_bytes(type_embd, te.ne0, te.ne1);
        n_mat += te.ne0 * te.ne1;
    }
    (void)type_embd;
    if (outm.ne0) type_out = fl_r8_load_type(type_out, outm.ne1, in->repack); /* (tied: the embeddings, never repacked) */
    uint64_t s = matmul_scratch(type_out, R, hp.n_embd, nth);
    if (s > mm) mm = s;
    for (int il = 0; il < hp.n_layer; il++) {
        char n[96];
        for (int k = 0; k < 7; k++)
            if ((st = find(g, fl_arch_tensor_name(n, sizeof n, names[k], il), &lay[k], true))) goto done;
        for (int k = 0; k < 7; k++) {
            uint64_t c = fl_model_converted_bytes(wt, lay[k].type, lay[k].ne0, lay[k].ne1);
            conv += c;
            int32_t t = c ? wt : lay[k].type;
            read_bytes += c ? fl_plan_tensor_bytes(wt, lay[k].ne0, lay[k].ne1) : fl_plan_tensor_bytes(t, lay[k].ne0, lay[k].ne1);
            n_mat += lay[k].ne0 * lay[k].ne1;
            s = matmul_scratch(fl_r8_load_type(t, lay[k].ne1, in->repack), T, lay[k].ne0, nth);
            if (s > mm) mm = s;
        }
    }
    out->n_params = n_mat;
    out->bits_per_weight = n_mat ? 8.0 * (double)read_bytes / (double)n_mat : 0;
    out->bytes[FL_MEM_MAPPED] = out->file_bytes;
    out->bytes[FL_MEM_WEIGHTS] = conv;

    /* KV: the paged pool (engine_model.c's fl_kv_config) */
    fl_kv_config kc = {.n_layer = hp.n_layer, .n_head = hp.n_head_local, .n_head_kv = hp.n_head_kv_local,
                       .head_dim = hp.head_dim, .type = in->kv_type, .block_size = in->kv_block > 0 ? in->kv_block : 16};
    out->kv_bytes_per_block = fl_kv_bytes_per_block(&kc);
    if (!out->kv_bytes_per_block) {
        st = fl_set_error(FL_ERR_INVALID, "%s: KV type %s does not fit head_dim %d", __func__, fl_type_name(in->kv_type), hp.head_dim);
        goto done;
    }
    out->kv_blocks = (int64_t)(in->kv_mem / out->kv_bytes_per_block);
    out->bytes[FL_MEM_KV] = (uint64_t)out->kv_blocks * out->kv_bytes_per_block;

    if (in->n_loras < 0 || in->n_loras > FL_MAX_LORAS || (in->n_loras && !in->lora_paths)) {
        st = fl_set_error(FL_ERR_INVALID, "%s: %d LoRA adapters (at most %d)", __func__, in->n_loras, FL_MAX_LORAS);
        goto done;
    }
    int32_t lora_rank = 0;
    int64_t lora_n = 0;
    for (int32_t i = 0; i < in->n_loras; i++) { /* each adapter, opened as the model opens it */
        struct stat lb;
        if (stat(in->lora_paths[i], &lb) != 0) {
            st = fl_set_error(FL_ERR_IO, "%s: cannot stat %s", __func__, in->lora_paths[i]);
            goto done;
        }
        const size_t m0 = fl_mem_current(FL_MEM_MISC);
        fl_lora *lo = NULL;
        if ((st = fl_lora_open(in->lora_paths[i], &hp, in->lora_scales ? in->lora_scales[i] : 1.0f, false, &lo))) goto done;
        const size_t m1 = fl_mem_current(FL_MEM_MISC);
        out->lora_file_bytes += (uint64_t)lb.st_size;
        out->lora_misc_bytes += m1 > m0 ? m1 - m0 : 0;
        if (lo->rank_max > lora_rank) lora_rank = lo->rank_max;
        if (lo->n_max > lora_n) lora_n = lo->n_max;
        fl_lora_free(lo);
    }
    if (in->lora_slots < 0 || in->n_loras + in->lora_slots > FL_MAX_LORAS || (in->lora_slots && (in->max_lora_rank < 1 || in->max_lora_rank > 4096))) {
        st = fl_set_error(FL_ERR_INVALID, "%s: %d LoRA adapters + %d slots of rank %d (at most %d in all)", __func__, in->n_loras,
                          in->lora_slots, in->max_lora_rank, FL_MAX_LORAS);
        goto done;
    }
    if (in->lora_slots) { /* each reserves the largest adapter of its rank; the buffers take any */
        size_t fc, mc;
        fl_lora_slot_caps(&hp, in->max_lora_rank, &fc, &mc);
        out->lora_slot_file_bytes = (uint64_t)in->lora_slots * fc;
        out->lora_slot_misc_bytes = (uint64_t)in->lora_slots * mc;
        out->lora_file_bytes += out->lora_slot_file_bytes;
        out->lora_misc_bytes += out->lora_slot_misc_bytes;
        if (in->max_lora_rank > lora_rank) lora_rank = in->max_lora_rank;
        lora_n = fl_lora_n_bound(&hp);
    }
    if (in->n_loras + in->lora_slots) { /* the model's table of them, the forward's two buffers */
        out->lora_misc_bytes += (uint64_t)(in->n_loras + in->lora_slots) * sizeof(fl_lora *);
        out->lora_ws_bytes = fl_lora_workspace_bytes(lora_rank, lora_n, in->max_batch_tokens + in->max_seqs);
        out->bytes[FL_MEM_MAPPED] += out->lora_file_bytes;
    }

    /* ACT: the model's workspace (with the adapter's buffers) and the engine's logits */
    out->ws_bytes = fl_model_workspace_bytes(&hp, in->max_batch_tokens + in->max_seqs, (int32_t)R) + out->lora_ws_bytes;
    out->logits_bytes = (uint64_t)R * (uint64_t)hp.n_vocab * 4;
    out->bytes[FL_MEM_ACT] = out->ws_bytes + out->logits_bytes;

    /* SCRATCH: batch arrays, the largest matmul workspace, the attention workspace */
    const uint64_t Ts = (uint64_t)in->max_batch_tokens + (uint64_t)in->max_seqs;
    out->batch_bytes = Ts * 17 + (uint64_t)R * (sizeof(void *) + 2 * sizeof(int32_t)); /* tokens, positions, sequences, adapters,
                                                                                         * logit flags; row_req, row_pos, row_spec */
    out->batch_bytes += (uint64_t)in->max_seqs * (uint64_t)(in->n_loras + in->lora_slots) * sizeof(float); /* a step's adapter mixes */
    out->matmul_scratch = mm;
    {   /* per thread: K/V block, scores, FL_PAGED_Q_TILE-row query tile states (paged_attn.c);
         * partials of split decodes: max_seqs x partitions x n_head x (head_dim + 2) */
        const uint64_t bs = (uint64_t)kc.block_size, hd = (uint64_t)hp.head_dim;
        const uint64_t grp = (uint64_t)(hp.n_head_local / hp.n_head_kv_local);
        uint64_t per = 2 * bs * hd + bs + 2 * FL_PAGED_Q_TILE * grp * (hd + 2);
        per = (per + 15) & ~(uint64_t)15;
        const uint64_t part_tok = (256 + bs - 1) / bs * bs;
        const uint64_t parts = ((uint64_t)out->n_ctx + part_tok - 1) / part_tok;
        uint64_t need = 4 * (per * (uint64_t)nth + (parts > 1 ? (uint64_t)in->max_seqs * parts * (uint64_t)hp.n_head_local * (hd + 2) : 0)) +
                        16 * ((uint64_t)in->max_seqs + 1);
        /* f16 KV: the queries of the step, rounded to f16, follow the kernel's part (kv_cache.c) */
        if (in->kv_type == FL_TYPE_F16)
            need = r64(need) + (uint64_t)in->max_batch_tokens * (uint64_t)hp.n_head_local * hd * 4;
        uint64_t cap = 65536;
        while (cap < need) cap *= 2;
        out->attn_ws = cap;
    }
    out->bytes[FL_MEM_SCRATCH] = out->batch_bytes + out->matmul_scratch + out->attn_ws;

    /* MISC: bookkeeping (plan_engine.h), from the size functions of the modules that allocate it */
    {
        uint64_t ctx2 = 64, text2 = 64;
        while (ctx2 < (uint64_t)out->n_ctx) ctx2 *= 2;
        const double text = (out->avg_piece_bytes > 0 ? out->avg_piece_bytes : 1.0) * (double)out->n_ctx;
        while ((double)text2 < text) text2 *= 2;
        const uint64_t V = (uint64_t)hp.n_vocab;
        fl_kv_config kp = kc; /* the engine's paged cache (engine_model.c) */
        kp.mem_bytes = (size_t)in->kv_mem;
        kp.n_seq_max = FL_ENGINE_SEQ_IDS(in->max_seqs);
        kp.prefix_cache = in->prefix_cache != 0;
        kp.swap_dir = in->swap_dir;
        out->misc_static = out->gguf_bytes + out->tokenizer_bytes + out->lora_misc_bytes + fl_model_misc_bytes(&hp) +
                           fl_kv_misc_bytes(&kp) + fl_engine_model_misc_bytes(in->max_seqs) +
                           fl_engine_misc_bytes(in->max_seqs, (int32_t)R, in->max_logprobs, out->avg_piece_bytes) +
                           fl_vocab_text_bytes((int32_t)V, out->vocab_text_bytes) + /* engine.c vocab_text_build: */
                           V + 4 * V + fl_mask_words((int32_t)V) * 8;               /* flags, masked row, grammar mask */
        out->mask_cache_bytes = fl_mask_cache_bytes(in->guide_masks, (int32_t)V);
        out->misc_static += out->mask_cache_bytes;
        if (in->max_logprobs >= 0) { /* engine.c: records with the request, the poll's copy */
            const uint64_t rec = 8 * (1 + (uint64_t)in->max_logprobs), step = (uint64_t)R * (1 + (uint64_t)in->max_logprobs) + 1;
            uint64_t nc = 256;
            while (nc < step) nc *= 2;
            out->logprob_bytes = (uint64_t)in->max_seqs * (uint64_t)out->n_ctx * (rec + 4) + 8 * (nc > 256 ? nc + nc / 2 : nc); /* (+ a prompt token's rank) */
        }
        /* a step's arrays in the cache; per request its struct, its sampler (struct and 16 B per
         * token of the vocabulary), its token ids, its sequence's in the cache and its block
         * table, its streamed text; and the old copy of one of those arrays while it doubles
         * (one thread grows them, one at a time) */
        const uint64_t seq_arrays = fl_kv_seq_misc_bytes(&kp, out->n_ctx);
        out->model_misc_bytes = fl_model_misc_bytes(&hp);
        out->kv_misc_bytes = fl_kv_misc_bytes(&kp);
        out->kv_seq_misc_bytes = seq_arrays;
        out->kv_step_misc_bytes = fl_kv_step_misc_bytes(in->max_batch_tokens);
        out->misc_requests = fl_kv_step_misc_bytes(in->max_batch_tokens) +
                             (uint64_t)in->max_seqs * (sizeof(fl_request) + fl_sampler_struct_bytes() + 16 * V + 4 * (uint64_t)out->n_ctx +
                                                       seq_arrays + text2) +
                             (seq_arrays > text2 ? seq_arrays : text2) / 2 + out->logprob_bytes;
        out->bytes[FL_MEM_MISC] = out->misc_static + out->misc_requests;
    }
    if (in->embeddings) { /* engine.c: the step's hidden states (ACT), their flags, owners and positions
                           * (SCRATCH); a pooled vector per request and the poll's copy of them (MISC) */
        const uint64_t Te = (uint64_t)in->max_batch_tokens + (uint64_t)in->max_seqs, E = (uint64_t)hp.n_embd;
        const uint64_t act = Te * E * 4, scratch = Te * (1 + sizeof(void *) + 4);
        uint64_t nc = 256;
        while (nc < (uint64_t)in->max_seqs * E) nc *= 2;
        const uint64_t misc = (uint64_t)in->max_seqs * E * 4 + 4 * (nc > 256 ? nc + nc / 2 : nc); /* (a growth holds both) */
        out->embd_bytes = act + scratch + misc;
        out->bytes[FL_MEM_ACT] += act;
        out->bytes[FL_MEM_SCRATCH] += scratch;
        out->bytes[FL_MEM_MISC] += misc;
    }
    if (in->spec_draft_model) { /* the draft model (engine_model.c draft_new): planned as an engine of its own, its parts taken */
        fl_plan_engine_in din = *in;
        din.model_path = in->spec_draft_model;
        din.spec_draft_model = NULL;
        din.weights_type = -1;
        din.n_ctx = out->n_ctx;
        din.spec_tokens = 0;
        din.max_logprobs = -1;
        din.embeddings = 0;
        din.n_loras = 0;
        din.lora_paths = NULL;
        din.lora_slots = 0;
        din.chat_template = NULL;
        din.kv_mem = 0;
        fl_plan_engine_out d;
        if ((st = fl_plan_engine(&din, &d))) goto done;
        const int32_t bs = in->kv_block > 0 ? in->kv_block : 16;
        din.kv_mem = (uint64_t)(FL_ENGINE_DRAFT_BLOCKS(in->max_seqs, out->n_ctx, bs) - 1) * d.kv_bytes_per_block;
        if ((st = fl_plan_engine(&din, &d))) goto done;
        uint64_t *db = out->draft_bytes;
        db[FL_MEM_MAPPED] = d.bytes[FL_MEM_MAPPED];
        db[FL_MEM_WEIGHTS] = d.bytes[FL_MEM_WEIGHTS];
        db[FL_MEM_KV] = d.bytes[FL_MEM_KV];
        db[FL_MEM_ACT] = d.ws_bytes + d.logits_bytes;
        db[FL_MEM_SCRATCH] = fl_engine_draft_scratch_bytes(in->max_batch_tokens) + d.attn_ws +
                             (d.matmul_scratch > out->matmul_scratch ? d.matmul_scratch - out->matmul_scratch : 0);
        db[FL_MEM_MISC] = d.gguf_bytes + d.model_misc_bytes + d.kv_misc_bytes + d.kv_step_misc_bytes +
                          (uint64_t)in->max_seqs * d.kv_seq_misc_bytes + fl_engine_draft_misc_bytes(in->max_seqs);
        for (int c = 0; c < FL_MEM_COUNT; c++) out->bytes[c] += db[c];
    }
    out->bytes[FL_MEM_GUIDE] = in->guide_mem; /* budgets, enforced: at most these */
    out->bytes[FL_MEM_NET] = in->net_mem;
    for (int c = 0; c < FL_MEM_COUNT; c++) out->total += out->bytes[c];
done:
    fl_gguf_free(g);
    return st;
}

fl_status fl_plan_engine_kv_mem(const fl_plan_engine_in *in0, uint64_t mem, uint64_t *kv_mem) {
    fl_plan_engine_in in = *in0;
    in.kv_mem = 0;
    fl_plan_engine_out o;
    fl_status st = fl_plan_engine(&in, &o);
    if (st) return st;
    char a[32], b[32], c[32];
    fl_plan_fmt_bytes(mem, b, sizeof b);
    const uint64_t w = o.bytes[FL_MEM_WEIGHTS] + o.bytes[FL_MEM_MAPPED];
    if (w >= mem) {
        fl_plan_fmt_bytes(w, a, sizeof a);
        fl_plan_fmt_bytes(w - mem, c, sizeof c);
        return fl_set_error(FL_ERR_BUDGET, "the weights alone (%s) exceed the memory limit %s by %s", a, b, c);
    }
    /* every block costs its bytes and its bookkeeping (pool entry, hash buckets, prefix entry) */
    const fl_kv_config kb = {.block_size = in.kv_block, .prefix_cache = in.prefix_cache != 0};
    const uint64_t per = o.kv_bytes_per_block + fl_kv_block_misc_bytes(&kb);
    if (o.total + 2 * per > mem) {
        fl_plan_fmt_bytes(o.total + 2 * per, a, sizeof a);
        fl_plan_fmt_bytes(o.total + 2 * per - mem, c, sizeof c);
        return fl_set_error(FL_ERR_BUDGET,
                            "weights + step buffers + bookkeeping + constraints (guide_mem)%s + 2 KV blocks (%s) exceed the memory limit %s by %s",
                            in.net_mem ? " + server buffers (net_mem)" : "", a, b, c);
    }
    uint64_t nb = (mem - o.total) / per;
    for (;; nb--) { /* the estimate is exact up to the hash table's rounding: check it */
        in.kv_mem = nb * o.kv_bytes_per_block;
        if ((st = fl_plan_engine(&in, &o))) return st;
        if (o.total <= mem || nb <= 2) break;
    }
    *kv_mem = in.kv_mem;
    return FL_OK;
}
