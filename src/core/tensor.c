#include "core/tensor.h"

#include <string.h>

int fl_tensor_init(fl_tensor *t, int32_t type, int32_t n_dims, const int64_t *ne, void *data) {
    memset(t, 0, sizeof *t);
    const fl_type_info *ti = fl_type_get(type);
    if (!ti || n_dims < 1 || n_dims > FL_MAX_DIMS || ne[0] % ti->blck_size) return 0;
    t->type = type;
    t->n_dims = n_dims;
    for (int i = 0; i < FL_MAX_DIMS; i++) t->ne[i] = i < n_dims ? ne[i] : 1;
    t->nb[0] = (size_t)ti->type_size;
    t->nb[1] = fl_type_row_size(type, t->ne[0]);
    for (int i = 2; i < FL_MAX_DIMS; i++) t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
    t->data = data;
    return 1;
}

int64_t fl_tensor_nelements(const fl_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

size_t fl_tensor_nbytes(const fl_tensor *t) { return t->nb[1] * (size_t)fl_tensor_nrows(t); }
