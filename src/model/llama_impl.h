/*
 * llama_impl.h - the fl_model struct, shared by llama_load.c and llama_fwd.c only.
 * Invariants: weights point into g's mapping (or into owned, which is FL_MEM_WEIGHTS);
 * ws_* describe the one FL_MEM_ACT workspace block (ws == NULL when none).
 */
#ifndef FL_LLAMA_IMPL_H
#define FL_LLAMA_IMPL_H

#include "model/llama.h"
#include "model/lora.h"

typedef struct fl_model_ws {
    unsigned char *block; /* FL_MEM_ACT, `bytes` long */
    size_t bytes;
    int32_t max_tokens, max_logit_rows;
    float *x, *xn, *q, *k, *v, *att, *gate, *up, *out, *xl; /* see llama.h */
    float *lora_xa, *lora_xg, *lora_out; /* with adapters */
} fl_model_ws;

struct fl_model {
    fl_gguf *g;
    fl_hparams hp;
    fl_model_params params;
    fl_tensor tok_embd, output_norm, output;
    fl_layer *layers; /* [n_layer], FL_MEM_MISC */
    fl_model_ws ws;
    bool have_ws;
    unsigned char *wconv;   /* weights converted at load (params.weights_type), FL_MEM_WEIGHTS */
    size_t wconv_bytes;
    size_t wconv_src_bytes; /* file bytes of the converted matrices */
    int64_t wconv_elems;    /* their elements */
    fl_lora **loras;        /* [params.n_loras] the adapters (FL_MEM_MISC), or NULL */
    int32_t lora_rank_max;  /* over the adapters */
    int64_t lora_n_max;
};

#endif
