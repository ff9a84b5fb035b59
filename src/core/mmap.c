#include "core/mmap.h"
#include "core/alloc.h"
#include "core/status.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20)

/* size bytes of fd into 2 MiB-aligned anonymous memory advised MADV_HUGEPAGE, read-only after. */
static fl_status read_anon(fl_mmap *m, int fd, const char *path, size_t size) {
    const size_t len = (size + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    char *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return fl_set_error(FL_ERR_NOMEM, "cannot allocate %zu bytes to read '%s' into: %s", size, path, strerror(errno));
    char *p = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    /* trim to the aligned range: the head (maybe empty) and the tail (never empty) */
    if (p > raw) munmap(raw, (size_t)(p - raw));
    munmap(p + len, HUGE_PAGE - (size_t)(p - raw));
    (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: without THP the pages stay 4 KiB */
    size_t done = 0;
    while (done < size) {
        const size_t want = size - done < ((size_t)1 << 30) ? size - done : (size_t)1 << 30;
        const ssize_t r = pread(fd, p + done, want, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            const int e = r < 0 ? errno : 0;
            munmap(p, len);
            return fl_set_error(FL_ERR_IO, "cannot read '%s' at byte %zu of %zu: %s", path, done, size,
                                e ? strerror(e) : "the file got shorter");
        }
        done += (size_t)r;
    }
    (void)mprotect(p, len, PROT_READ);
    m->data = (const unsigned char *)p;
    m->size = size;
    m->anon_bytes = len;
    return FL_OK;
}

static fl_status open_file(fl_mmap *m, const char *path, bool read) {
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
    if (read) {
        s = read_anon(m, fd, path, size);
        close(fd);
        if (s != FL_OK) fl_mem_uncharge(FL_MEM_MAPPED, size);
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

fl_status fl_mmap_open(fl_mmap *m, const char *path) { return open_file(m, path, false); }
fl_status fl_mmap_open_read(fl_mmap *m, const char *path) { return open_file(m, path, true); }

void fl_mmap_close(fl_mmap *m) {
    if (m->data) {
        munmap((void *)m->data, m->anon_bytes ? m->anon_bytes : m->size);
        fl_mem_uncharge(FL_MEM_MAPPED, m->size);
    }
    memset(m, 0, sizeof *m);
}

fl_status fl_mmap_protect(const fl_mmap *m, bool writable) {
    if (!m->data) return fl_set_error(FL_ERR_IO, "no mapping to change");
    if (mprotect((void *)m->data, m->anon_bytes ? m->anon_bytes : m->size, PROT_READ | (writable ? PROT_WRITE : 0)))
        return fl_set_error(FL_ERR_IO, "cannot make the weights %s: %s", writable ? "writable" : "read-only", strerror(errno));
    return FL_OK;
}

void fl_mmap_prefetch(const fl_mmap *m, size_t off, size_t len) {
    if (!m->data || off >= m->size) return;
    if (len > m->size - off) len = m->size - off;
    long pg = sysconf(_SC_PAGESIZE);
    size_t start = off & ~((size_t)pg - 1);
    madvise((void *)(m->data + start), len + (off - start), MADV_WILLNEED);
}
