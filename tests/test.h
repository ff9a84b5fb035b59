/*
 * test.h - helpers shared by the cmocka test programs.
 *   FL_SHARED_PATH("models/x.gguf") -> path under ../shared (compile-time FL_SHARED_DIR)
 *   fl_test_need_shared(state)      -> skip() with a clear message when ../shared is absent
 *   CHECK_NEAR(a, b, tol), CHECK_NMSE(ref, got, n, tol)
 *   fl_test_mem_zero()              -> assert every memory category is back at zero
 */
#ifndef FL_TEST_H
#define FL_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>

#include "core/alloc.h"

const char *fl_test_shared_path(const char *rel); /* static buffer, rotating x8 */
int fl_test_have_shared(void);
double fl_test_nmse(const float *ref, const float *got, int64_t n);
double fl_test_max_abs_diff(const float *a, const float *b, int64_t n);
/* Read a whole file into a tracked (MISC) buffer; *len excludes the trailing NUL added. */
char *fl_test_read_file(const char *path, size_t *len);
void fl_test_free_file(char *buf, size_t len);
/* Run a shell command, capture stdout into out (NUL-terminated, truncated). Returns exit status. */
int fl_test_run(const char *cmd, char *out, size_t out_cap);

#define FL_SHARED_PATH(rel) fl_test_shared_path(rel)

#define NEED_SHARED()                                                                     \
    do {                                                                                  \
        if (!fl_test_have_shared()) {                                                     \
            fprintf(stderr, "SKIP: shared test data not found at %s\n", FL_SHARED_DIR);   \
            skip();                                                                       \
        }                                                                                 \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                   \
    do {                                                                                        \
        double a_ = (double)(a), b_ = (double)(b);                                              \
        if (!(fabs(a_ - b_) <= (tol)))                                                          \
            fail_msg("%s = %.9g vs %s = %.9g differ by %.3g > %.3g", #a, a_, #b, b_, fabs(a_ - b_), (double)(tol)); \
    } while (0)

#define CHECK_NMSE(ref, got, n, tol)                                                  \
    do {                                                                              \
        double e_ = fl_test_nmse((ref), (got), (n));                                  \
        if (!(e_ <= (tol))) fail_msg("NMSE %.3g > %.3g (%s vs %s)", e_, (double)(tol), #ref, #got); \
    } while (0)

#define fl_test_mem_zero()                                                                 \
    do {                                                                                   \
        if (!fl_mem_all_zero()) {                                                          \
            fl_mem_report(stderr);                                                         \
            fail_msg("memory categories not back at zero");                                \
        }                                                                                  \
    } while (0)

#endif
