/*
 * layout.h - the trainer's shapes and memory layout, apart from its computation (model.c), so
 * the planner can ask the trainer's sizes without linking it: the parameter shapes and the
 * activation and backward-temporary layouts of fl_train_model_reserve (private to src/train
 * but for fl_train_act_bytes / fl_train_bwd_bytes in model.h).
 *
 *   ACT      the saved activations: per layer slot (k == 0: every layer; k > 0: k slots and the
 *            inputs of layers 0, k, 2k, ...), the final norm, logits and per-token loss, then
 *            the slot table itself (fl_train_act_table_bytes) at the end of the allocation
 *   SCRATCH  the backward temporaries: d residual, dbuf, one region shared by the FFN and
 *            attention gradients, LoRA's gradient of x A^T
 * Every buffer is rounded up to 64 bytes.
 */
#ifndef FL_TRAIN_LAYOUT_H
#define FL_TRAIN_LAYOUT_H

#include "train/model.h"

/* The gradient buckets of a bucketed backward (model.h): bucket b's tensor kinds in their order
 * in the staging buffer (FL_TRAIN_BUCKET_HEAD, the layers 0 .. n_layer - 1, n_layer; 0 kinds
 * past them), its floats, and the floats of one layer's tensor p (all of a global one). */
int fl_train_grad_bucket_kinds(const fl_train_config *c, int bucket, const fl_train_param **kinds);
int64_t fl_train_grad_bucket_elems(const fl_train_config *c, int bucket);
int64_t fl_train_layer_numel(const fl_train_config *c, fl_train_param p);

/* One layer's saved activations.  Shapes for N tokens: */
typedef struct layer_acts {
    float *inp;   /* (N, C) layer input: own buffer, or a stored checkpoint */
    float *ln1;   /* (N, C) */
    float *rstd1; /* (N) */
    float *q;     /* (N, H*hd) after RoPE */
    float *k;     /* (N, Hkv*hd) after RoPE */
    float *v;     /* (N, Hkv*hd) */
    float *att;   /* (N, H*hd) attention output, before wo */
    float *lse;   /* (N, H) */
    float *mid;   /* (N, C) inp + attention */
    float *ln2;   /* (N, C) */
    float *rstd2; /* (N) */
    float *g;     /* (N, F) gate pre-activation */
    float *u;     /* (N, F) up */
    float *h;     /* (N, F) silu(g) * u */
    float *xa[FL_TP_COUNT]; /* LoRA: (N, r) = (alpha/r) inp . A^T of each adapted matrix */
} layer_acts;

typedef struct act_layout {
    int n_slots;       /* layers whose activations are held at once */
    int n_ckpt;        /* stored layer inputs (k > 0) */
    layer_acts *slots; /* [n_slots] */
    float **ckpt;      /* [n_ckpt] (N, C): input of layer j*k */
    float *xL;         /* (N, C) output of the last layer */
    float *lnf;        /* (N, C) */
    float *rstdf;      /* (N) */
    float *logits;     /* (N, V), dlogits in place during backward */
    float *losses;     /* (N) */
    float *ce_lse;     /* (N) */
    float *dloss;      /* (N) */
    /* backward temporaries (their own allocation, FL_MEM_SCRATCH: fl_train_carve_bwd) */
    float *dres;       /* (N, C) gradient of the residual stream */
    float *dbuf;       /* (N, max(C, H*hd)) */
    float *dq;         /* (N, H*hd) */
    float *dk, *dv;    /* (N, Hkv*hd) */
    float *dF1, *dF2;  /* (N, F) */
    float *dlora;      /* (N, r) LoRA backward */
    size_t meta_bytes;
} act_layout;

/* Lay out the saved activations for N tokens at base (NULL: only count; L may be NULL then);
 * returns their bytes (without the table). */
size_t fl_train_carve_acts(const fl_train_config *c, int64_t N, int k, int r, unsigned char *base, act_layout *L);
/* The same for the backward temporaries into P's backward fields. */
size_t fl_train_carve_bwd(const fl_train_config *c, int64_t N, int r, unsigned char *base, act_layout *P);
/* Bytes of the slot table kept after the activations (act_layout, its slots, the checkpoint pointers). */
size_t fl_train_act_table_bytes(const fl_train_config *c, int k);

#endif
