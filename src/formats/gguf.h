/*
 * gguf.h - GGUF v2/v3 files: a bounds-checked reader over a mapping and a writer.
 *
 * File layout (little-endian):
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 value type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to `general.alignment` (default 32) | tensor data (each tensor aligned)
 * A string is { u64 len | bytes } (no NUL); an array is { u32 elem type | u64 n | elems }, and
 * arrays may nest.
 *
 * Reader: every count, length, offset and product is checked against the bytes left and against
 * overflow before it is used; bad input returns FL_ERR_FORMAT / FL_ERR_RANGE /
 * FL_ERR_UNSUPPORTED with a message naming what is wrong (never a crash or a hang).  Strings
 * and scalar array payloads are borrowed views into the mapping: valid until fl_gguf_free.
 * Keys and tensor names must be non-empty and hold no NUL byte (the writer takes C strings).
 * The parsed index (kv table, tensor infos, string-array item tables) is charged to FL_MEM_MISC.
 * A reader is immutable after open and may be read from several threads.
 *
 * Writer: collects metadata and tensors (tensor data is borrowed until the file is written) and
 * writes header, aligned tensor data and zero padding; the file is written to a temporary name,
 * fsync'ed and renamed, so a crash never leaves a half-written file under the final name.
 * Reading a file and writing it back with fl_gguf_writer_copy_all() gives identical bytes.
 */
#ifndef FL_GGUF_H
#define FL_GGUF_H

#include "fitllm.h"
#include <stdbool.h>
#include <stdint.h>

typedef enum fl_gguf_vtype {
    FL_GGUF_U8 = 0, FL_GGUF_I8 = 1, FL_GGUF_U16 = 2, FL_GGUF_I16 = 3, FL_GGUF_U32 = 4,
    FL_GGUF_I32 = 5, FL_GGUF_F32 = 6, FL_GGUF_BOOL = 7, FL_GGUF_STRING = 8, FL_GGUF_ARRAY = 9,
    FL_GGUF_U64 = 10, FL_GGUF_I64 = 11, FL_GGUF_F64 = 12, FL_GGUF_VTYPE_COUNT
} fl_gguf_vtype;

#define FL_GGUF_DEFAULT_ALIGNMENT 32
#define FL_GGUF_MAX_DIMS 4

typedef struct fl_gguf_str {
    const char *data; /* not NUL-terminated */
    uint64_t len;
} fl_gguf_str;

typedef struct fl_gguf_value fl_gguf_value;
struct fl_gguf_value {
    int32_t type; /* fl_gguf_vtype */
    union {
        uint64_t u64;  /* U8..U64 (zero-extended), BOOL */
        int64_t i64;   /* I8..I64 (sign-extended) */
        double f64;    /* F32, F64 */
        fl_gguf_str str;
        struct {
            int32_t type;              /* element type */
            uint64_t n;                /* element count */
            const unsigned char *raw;  /* scalar elements: packed little-endian in the file */
            fl_gguf_value *items;      /* STRING / ARRAY elements: parsed (n entries) */
        } arr;
    } v;
};

typedef struct fl_gguf_kv {
    fl_gguf_str key;
    fl_gguf_value value;
} fl_gguf_kv;

typedef struct fl_gguf_tensor {
    fl_gguf_str name;
    int32_t n_dims;
    int64_t ne[FL_GGUF_MAX_DIMS]; /* unused dims are 1 */
    int32_t type;                 /* fl_type */
    uint64_t offset;              /* relative to the data section */
    uint64_t size;                /* bytes */
    const void *data;             /* into the mapping */
} fl_gguf_tensor;

typedef struct fl_gguf fl_gguf;

/* Map and parse a file. On failure *out is NULL and the error names the file and the problem. */
fl_status fl_gguf_open(const char *path, fl_gguf **out);
/* The same, no_mmap: the file read into anonymous memory instead (fl_mmap_open_read). */
fl_status fl_gguf_open_ex(const char *path, bool no_mmap, fl_gguf **out);
/* Parse a caller-owned buffer (borrowed for the reader's lifetime). */
fl_status fl_gguf_open_mem(const void *data, size_t size, fl_gguf **out);
void fl_gguf_free(fl_gguf *g);
/* The file's mapping writable (or read-only again), for rewriting tensor data in place at load;
 * FL_ERR_UNSUPPORTED for a gguf opened from memory.  The file itself never changes. */
fl_status fl_gguf_set_writable(fl_gguf *g, bool writable);

uint32_t fl_gguf_version(const fl_gguf *g);
uint32_t fl_gguf_alignment(const fl_gguf *g);
uint64_t fl_gguf_data_offset(const fl_gguf *g);
size_t fl_gguf_file_size(const fl_gguf *g);
const void *fl_gguf_base(const fl_gguf *g);

int64_t fl_gguf_n_kv(const fl_gguf *g);
const fl_gguf_kv *fl_gguf_kv_at(const fl_gguf *g, int64_t i);
const fl_gguf_kv *fl_gguf_find(const fl_gguf *g, const char *key); /* NULL if absent */

/* Typed getters: FL_OK, or FL_ERR_INVALID when the key is absent or of an incompatible type
 * (integer getters accept any integer type whose value fits).  The error message names the key.
 * fl_gguf_get_str copies into buf (NUL-terminated; FL_ERR_RANGE if it does not fit). */
fl_status fl_gguf_get_u32(const fl_gguf *g, const char *key, uint32_t *out);
fl_status fl_gguf_get_i64(const fl_gguf *g, const char *key, int64_t *out);
fl_status fl_gguf_get_f32(const fl_gguf *g, const char *key, float *out);
fl_status fl_gguf_get_bool(const fl_gguf *g, const char *key, bool *out);
fl_status fl_gguf_get_str(const fl_gguf *g, const char *key, char *buf, size_t cap);
/* Array view: element type and count; NULL if absent or not an array. */
const fl_gguf_value *fl_gguf_get_arr(const fl_gguf *g, const char *key);
/* Element i of a scalar array as double / int64 (no bounds check beyond FL_ASSERT); floats
 * convert to int64 truncating toward zero and saturating (NaN gives 0). */
double fl_gguf_arr_f64(const fl_gguf_value *arr, uint64_t i);
int64_t fl_gguf_arr_i64(const fl_gguf_value *arr, uint64_t i);

int64_t fl_gguf_n_tensors(const fl_gguf *g);
const fl_gguf_tensor *fl_gguf_tensor_at(const fl_gguf *g, int64_t i);
const fl_gguf_tensor *fl_gguf_find_tensor(const fl_gguf *g, const char *name);

const char *fl_gguf_vtype_name(int32_t t);
size_t fl_gguf_vtype_size(int32_t t); /* scalar size, 0 for STRING/ARRAY */
/* Format a value for display (strings quoted and cut, arrays summarized). */
void fl_gguf_value_str(const fl_gguf_value *v, char *buf, size_t cap);
bool fl_gguf_str_eq(fl_gguf_str s, const char *c);

/* ---- writer ---- */
typedef struct fl_gguf_writer fl_gguf_writer;

fl_gguf_writer *fl_gguf_writer_new(void);
void fl_gguf_writer_free(fl_gguf_writer *w);
/* Set (or replace, keeping its position) a key. Values are copied. */
fl_status fl_gguf_writer_set_u32(fl_gguf_writer *w, const char *key, uint32_t v);
fl_status fl_gguf_writer_set_i32(fl_gguf_writer *w, const char *key, int32_t v);
fl_status fl_gguf_writer_set_u64(fl_gguf_writer *w, const char *key, uint64_t v);
fl_status fl_gguf_writer_set_f32(fl_gguf_writer *w, const char *key, float v);
fl_status fl_gguf_writer_set_bool(fl_gguf_writer *w, const char *key, bool v);
fl_status fl_gguf_writer_set_str(fl_gguf_writer *w, const char *key, const char *v);
/* Scalar array: n elements of elem_type packed little-endian in data. */
fl_status fl_gguf_writer_set_arr(fl_gguf_writer *w, const char *key, int32_t elem_type, const void *data, uint64_t n);
fl_status fl_gguf_writer_set_arr_str(fl_gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Copy one parsed kv (any type, nested arrays included). */
fl_status fl_gguf_writer_copy_kv(fl_gguf_writer *w, const fl_gguf_kv *kv);
fl_status fl_gguf_writer_remove(fl_gguf_writer *w, const char *key);
/* Add a tensor; data (nbytes = row size x rows) is borrowed until the file is written. */
fl_status fl_gguf_writer_add_tensor(fl_gguf_writer *w, const char *name, int32_t type, int32_t n_dims,
                                    const int64_t *ne, const void *data);
/* Add a tensor whose bytes fill(ud, dst, nbytes) makes when the file is written, one such
 * tensor in memory at a time (ud is borrowed until then); a failed fill fails the write. */
typedef fl_status (*fl_gguf_fill_fn)(void *ud, void *dst, size_t nbytes);
fl_status fl_gguf_writer_add_tensor_fn(fl_gguf_writer *w, const char *name, int32_t type, int32_t n_dims,
                                       const int64_t *ne, fl_gguf_fill_fn fill, void *ud);
/* Add a tensor whose bytes fill_at(ud, dst, offset, nbytes) makes at write time in consecutive
 * pieces [offset, offset + nbytes) of at most `chunk` bytes, into one buffer of that size: a
 * tensor larger than the memory one would want to spend on it.  A failed fill fails the write. */
typedef fl_status (*fl_gguf_fill_at_fn)(void *ud, void *dst, uint64_t offset, size_t nbytes);
fl_status fl_gguf_writer_add_tensor_chunks(fl_gguf_writer *w, const char *name, int32_t type, int32_t n_dims,
                                           const int64_t *ne, fl_gguf_fill_at_fn fill_at, void *ud, size_t chunk);
/* Every kv and tensor of g, in order (with g's alignment and version). */
fl_status fl_gguf_writer_copy_all(fl_gguf_writer *w, const fl_gguf *g);
/* Alignment of the data section and of every tensor: a power of two; sets the
 * general.alignment key too (FL_ERR_INVALID otherwise).  The writer always aligns by the
 * general.alignment key when one is set (32 without it), so files it writes parse back. */
fl_status fl_gguf_writer_set_alignment(fl_gguf_writer *w, uint32_t alignment);
void fl_gguf_writer_set_version(fl_gguf_writer *w, uint32_t version);
/* Write atomically (temp file + fsync + rename). progress(done, total, ud) may be NULL. */
fl_status fl_gguf_writer_write(fl_gguf_writer *w, const char *path,
                               void (*progress)(uint64_t done, uint64_t total, void *ud), void *ud);

/* The MISC bytes g's index holds (its struct, key and tensor tables, parsed arrays), and a bound
 * on what parsing a file of n_kv keys, n_tensors tensors and n_items array elements in all takes
 * at its peak. */
size_t fl_gguf_index_bytes(const fl_gguf *g);
size_t fl_gguf_index_bound(int64_t n_kv, int64_t n_tensors, int64_t n_items);

#endif
