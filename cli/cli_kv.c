/* The KV cache of `fitllm run` / `fitllm perplexity` (see cli_kv.h). */
#include "cli/cli_kv.h"

#include "core/dtype.h"
#include "core/status.h"
#include "kv/kv_quant.h"

#include <string.h>

fl_status fl_cli_kv_new(const fl_hparams *hp, const char *layout, const char *type, int64_t block_size, int32_t n_ctx,
                        fl_cli_kv *out) {
    memset(out, 0, sizeof *out);
    const bool paged = !layout || !strcmp(layout, "paged");
    if (!paged && strcmp(layout, "contiguous"))
        return fl_set_error(FL_ERR_INVALID, "unknown --kv-layout '%s' (paged or contiguous)", layout);
    const int32_t t = type ? fl_type_from_name(type) : FL_TYPE_F16;
    if (t < 0 || !fl_kv_type_ok(t))
        return fl_set_error(FL_ERR_INVALID, "--kv-type '%s' is not a KV type (f32 f16 bf16 fp8_e4m3 fp8_e5m2 q8_0 q4_0)",
                            type);
    if (block_size < 0 || block_size > 4096) return fl_set_error(FL_ERR_INVALID, "--block-size %lld out of range", (long long)block_size);
    out->paged = paged;
    out->type = t;
    fl_status st;
    if (!paged) {
        if (t != FL_TYPE_F16 && t != FL_TYPE_F32)
            return fl_set_error(FL_ERR_INVALID, "the contiguous KV cache stores f16 or f32, not %s", fl_type_name(t));
        fl_kv_contig_params kp = {hp->n_layer, hp->n_head_local, hp->n_head_kv_local, hp->head_dim, n_ctx, 1, hp->n_swa, t};
        if ((st = fl_kv_contig_new(&kp, &out->ck))) return st;
        out->iface = *fl_kv_contig_iface();
        out->ctx = out->ck;
        return FL_OK;
    }
    const int32_t bs = block_size > 0 ? (int32_t)block_size : 16;
    fl_kv_config c = {0};
    c.n_layer = hp->n_layer;
    c.n_head = hp->n_head_local;
    c.n_head_kv = hp->n_head_kv_local;
    c.head_dim = hp->head_dim;
    c.type = t;
    c.block_size = bs;
    c.n_blocks = (n_ctx + bs - 1) / bs + 1;
    c.n_seq_max = 1;
    c.n_ctx = n_ctx;
    c.window = hp->n_swa;
    c.n_rot = hp->rope_dim;
    c.rope_base = hp->rope_freq_base;
    out->block_size = bs;
    if (!(out->pk = fl_kv_new(&c))) return FL_ERR_INVALID; /* the error message is set */
    out->iface = fl_kv_iface_get();
    out->ctx = out->pk;
    return FL_OK;
}

void fl_cli_kv_reset(fl_cli_kv *kv) {
    if (kv->pk) fl_kv_seq_free(kv->pk, 0);
    if (kv->ck) fl_kv_contig_clear(kv->ck);
}

void fl_cli_kv_free(fl_cli_kv *kv) {
    fl_kv_free(kv->pk);
    fl_kv_contig_free(kv->ck);
    memset(kv, 0, sizeof *kv);
}

double fl_cli_kv_bytes_per_token(const fl_cli_kv *kv, const fl_hparams *hp) {
    if (kv->pk) return (double)fl_kv_bytes_per_token(fl_kv_config_get(kv->pk));
    return 2.0 * hp->n_layer * hp->n_head_kv_local * hp->head_dim * (kv->type == FL_TYPE_F16 ? 2.0 : 4.0);
}
