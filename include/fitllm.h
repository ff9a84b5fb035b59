/*
 * fitllm.h - the public C API of libfitllm.
 *
 * fitllm runs, serves and trains llama-family models in the memory you have, and accounts for
 * every byte.  This header is the only one users include.  It owns:
 *   - status codes (fl_status) and the thread-local last-error message;
 *   - memory categories and the accounting report;
 *   - (later sections) the engine API used by the CLI and the HTTP server.
 *
 * Conventions: functions that can fail because of input, files, memory or the network return
 * fl_status (FL_OK = 0, negative = error, positive = soft outcome); results go through
 * out-parameters.  fl_x_new() returns an owned object or NULL; fl_x_free(NULL) is a no-op.
 */
#ifndef FITLLM_H
#define FITLLM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ---- */
typedef enum fl_status {
    FL_OK = 0,
    FL_NO_KV_SPACE = 1,        /* soft: the KV pool has no room for this step */
    FL_ERR_INVALID = -1,       /* bad argument or input */
    FL_ERR_IO = -2,            /* file system error */
    FL_ERR_NOMEM = -3,         /* allocation failed (system out of memory) */
    FL_ERR_BUDGET = -4,        /* allocation refused: a memory budget would be exceeded */
    FL_ERR_FORMAT = -5,        /* malformed file contents */
    FL_ERR_UNSUPPORTED = -6,   /* valid but not supported (yet) */
    FL_ERR_RANGE = -7,         /* size/count/offset out of range or overflow */
    FL_ERR_INTERNAL = -8,      /* a bug: an invariant failed */
} fl_status;

/* Human-readable name of a status code ("ok", "invalid argument", ...). Never NULL. */
const char *fl_status_str(fl_status st);
/* The message recorded by the last failing call on this thread ("" if none). */
const char *fl_last_error(void);

/* ---- memory accounting ---- */
typedef enum fl_mem_cat {
    FL_MEM_WEIGHTS = 0, /* model weights held in RAM (dequantized / repacked / loaded) */
    FL_MEM_MAPPED,      /* file mappings (mmap of GGUF files) */
    FL_MEM_KV,          /* KV cache blocks */
    FL_MEM_ACT,         /* activations of forward/backward */
    FL_MEM_SCRATCH,     /* per-step scratch arenas, kernel workspaces */
    FL_MEM_GRAD,        /* gradients */
    FL_MEM_OPTIM,       /* optimizer states */
    FL_MEM_COMM,        /* communication buffers */
    FL_MEM_NET,         /* HTTP server buffers */
    FL_MEM_MISC,        /* everything else (tokenizer, metadata, bookkeeping) */
    FL_MEM_COUNT
} fl_mem_cat;

const char *fl_mem_cat_name(fl_mem_cat cat);
size_t fl_mem_current(fl_mem_cat cat);      /* bytes now */
size_t fl_mem_peak(fl_mem_cat cat);         /* high-water mark since start / last reset */
size_t fl_mem_current_total(void);
size_t fl_mem_peak_total(void);
void fl_mem_reset_peaks(void);              /* peak := current, all categories */
/* Budgets: 0 = unlimited. Allocations that would exceed a budget fail with FL_ERR_BUDGET. */
void fl_mem_set_budget(fl_mem_cat cat, size_t bytes);
void fl_mem_set_budget_total(size_t bytes);
size_t fl_mem_budget(fl_mem_cat cat);
/* Text report (one line per non-empty category + total). */
void fl_mem_report(FILE *out);
/* JSON report {"current":{cat:bytes,...,"total":n},"peak":{...}} written into buf (1024 bytes
 * always suffice); returns the length as snprintf does. */
int fl_mem_report_json(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* FITLLM_H */
