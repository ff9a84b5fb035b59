/*
 * pp.h - pipeline parallelism for llama inference: layers split across ranks, micro-batches.
 *
 * Stage r (= rank) of N holds layers [l0, l1) (n_layer / N each, the first n_layer % N stages
 * one more) and runs the model's own forward on them: the loaded model's layer table and
 * n_layer are narrowed to the stage (this file includes model/llama_impl.h; fl_pp_free restores
 * them before freeing).  Stage 0 embeds the tokens; a later stage receives the residual stream
 * x [n][n_embd] from stage r-1 through the model's embed hook (fl_model_params.embed); every
 * stage but the last sends its residual stream to r+1 after its layers; the last stage computes
 * the logits, which are broadcast to every rank.
 *
 * Micro-batches: fl_pp_forward cuts the batch into n_micro contiguous token ranges and streams
 * them through the stages with blocking send/recv, so while stage r works on micro-batch m,
 * stage r-1 can already run m+1 (chunked prefill: micro-batch m of a sequence needs the KV of
 * the earlier micro-batches, which every stage has already stored).  Messages: n x n_embd f32
 * per micro-batch and stage boundary, plus the logits broadcast.
 *
 * Weights stay zero-copy views into the mapping (only the stage's layers are ever read); the
 * KV cache of a stage covers its n_layer (the local count from fl_model_hparams).
 * Errors: FL_ERR_UNSUPPORTED for more ranks than layers; communicator errors (FL_ERR_IO).
 * Collective: every rank calls fl_pp_forward with the same batch.  Not thread-safe.
 */
#ifndef FL_PP_H
#define FL_PP_H

#include "dist/dist.h"
#include "model/llama.h"

typedef struct fl_pp_model fl_pp_model;

/* Layers [*l0, *l1) of stage r of n for n_layer layers. */
void fl_pp_stage_layers(int32_t n_layer, int32_t r, int32_t n, int32_t *l0, int32_t *l1);

fl_status fl_pp_load(const char *path, fl_comm *comm, fl_pp_model **out);
void fl_pp_free(fl_pp_model *p);
fl_model *fl_pp_model_get(fl_pp_model *p); /* n_layer of its hparams = this stage's layers */

/* Forward of b in n_micro micro-batches; logits [R][n_vocab] (R = fl_batch_n_logits(b)) on every
 * rank.  The model workspace must hold ceil(n_tokens / n_micro) tokens and as many logit rows. */
fl_status fl_pp_forward(fl_pp_model *p, const fl_batch *b, int32_t n_micro, const fl_kv_iface *kv, void *kv_ctx,
                        float *logits);

#endif
