/*
 * tensor.h - a plain tensor descriptor (ggml-style): type, ne[4] elements per dim (ne[0] is
 * the contiguous row), nb[4] byte strides, data pointer, name.  A descriptor never owns its
 * data: views into an mmap or an arena are freed with their owner.
 */
#ifndef FL_TENSOR_H
#define FL_TENSOR_H

#include "core/dtype.h"

#define FL_MAX_DIMS 4

typedef struct fl_tensor {
    int32_t type;           /* fl_type */
    int32_t n_dims;
    int64_t ne[FL_MAX_DIMS]; /* elements per dim; unused dims are 1 */
    size_t nb[FL_MAX_DIMS];  /* byte strides */
    void *data;
    const char *name;        /* borrowed */
} fl_tensor;

/* Fill a contiguous descriptor. Returns 0 if the row length is not a multiple of the block. */
int fl_tensor_init(fl_tensor *t, int32_t type, int32_t n_dims, const int64_t *ne, void *data);
int64_t fl_tensor_nelements(const fl_tensor *t);
size_t fl_tensor_nbytes(const fl_tensor *t);
static inline int64_t fl_tensor_nrows(const fl_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

#endif
