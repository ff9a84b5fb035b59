/*
 * mmap.h - read-only file mappings, counted as FL_MEM_MAPPED.
 * fl_mmap_open maps the whole file (PROT_READ, MAP_PRIVATE) and charges its size to MAPPED;
 * fl_mmap_close unmaps and uncharges.  An empty file maps to data == NULL, size == 0.
 * fl_mmap_open_read instead reads the file into anonymous memory (llama.cpp's --no-mmap), 2 MiB
 * aligned and advised MADV_HUGEPAGE, then made read-only; it is charged to MAPPED all the same
 * (the file's size, as for the mapping; they count in RSS and cannot be dropped by the page
 * cache).  The rest of the last 2 MiB page (< 2 MiB, untouched unless the kernel backs it
 * with a huge page) is not charged.  Where the
 * kernel grants huge pages, streaming the weights takes fewer TLB misses: Q4_0 decode of a
 * TinyLlama-shaped model on a 2-core KVM guest ran 17% faster (docs/QUANT.md).
 */
#ifndef FL_MMAP_H
#define FL_MMAP_H

#include "fitllm.h"

#include <stdbool.h>

typedef struct fl_mmap {
    const unsigned char *data;
    size_t size;
    size_t anon_bytes; /* fl_mmap_open_read: the anonymous mapping's length (0: a file mapping) */
} fl_mmap;

fl_status fl_mmap_open(fl_mmap *m, const char *path);
fl_status fl_mmap_open_read(fl_mmap *m, const char *path);
void fl_mmap_close(fl_mmap *m);
/* Make the whole mapping writable (private: written pages become the process's own copies,
 * the file is never changed) or read-only again; for rewriting weights in place at load (the
 * Q4_0_R8 repack).  FL_ERR_IO if the kernel refuses. */
fl_status fl_mmap_protect(const fl_mmap *m, bool writable);
/* Hint that [off, off+len) will be read soon (MADV_WILLNEED); errors are ignored. */
void fl_mmap_prefetch(const fl_mmap *m, size_t off, size_t len);

#endif
