/*
 * mmap.h - read-only file mappings, counted as FL_MEM_MAPPED.
 * fl_mmap_open maps the whole file (PROT_READ, MAP_PRIVATE) and charges its size to MAPPED;
 * fl_mmap_close unmaps and uncharges.  An empty file maps to data == NULL, size == 0.
 */
#ifndef FL_MMAP_H
#define FL_MMAP_H

#include "fitllm.h"

typedef struct fl_mmap {
    const unsigned char *data;
    size_t size;
} fl_mmap;

fl_status fl_mmap_open(fl_mmap *m, const char *path);
void fl_mmap_close(fl_mmap *m);
/* Hint that [off, off+len) will be read soon (MADV_WILLNEED); errors are ignored. */
void fl_mmap_prefetch(const fl_mmap *m, size_t off, size_t len);

#endif
