#include "core/mmap.h"
#include "core/alloc.h"
#include "core/status.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

fl_status fl_mmap_open(fl_mmap *m, const char *path) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fl_set_error(FL_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fl_set_error(FL_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fl_set_error(FL_ERR_IO, "'%s' is not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    if (size == 0) {
        close(fd);
        return FL_OK;
    }
    fl_status s = fl_mem_charge(FL_MEM_MAPPED, size);
    if (s != FL_OK) {
        close(fd);
        return s;
    }
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        fl_mem_uncharge(FL_MEM_MAPPED, size);
        return fl_set_error(FL_ERR_IO, "cannot mmap '%s': %s", path, strerror(e));
    }
    m->data = p;
    m->size = size;
    return FL_OK;
}

void fl_mmap_close(fl_mmap *m) {
    if (m->data) {
        munmap((void *)m->data, m->size);
        fl_mem_uncharge(FL_MEM_MAPPED, m->size);
    }
    memset(m, 0, sizeof *m);
}

void fl_mmap_prefetch(const fl_mmap *m, size_t off, size_t len) {
    if (!m->data || off >= m->size) return;
    if (len > m->size - off) len = m->size - off;
    long pg = sysconf(_SC_PAGESIZE);
    size_t start = off & ~((size_t)pg - 1);
    madvise((void *)(m->data + start), len + (off - start), MADV_WILLNEED);
}
