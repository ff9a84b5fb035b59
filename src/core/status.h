/*
 * status.h - error reporting: fl_status codes (in fitllm.h), a thread-local last-error
 * message, and the assertion macros.
 *
 * The function that detects a failure records why with fl_set_error() and returns a negative
 * fl_status; callers add context only if they have some (fl_add_error_context).
 * FL_ASSERT guards our own invariants (always on, aborts with file:line); untrusted input is
 * never asserted on.  FL_NEVER(x) is sqlite's NEVER(): asserts in debug builds, evaluates to x
 * in release so the caller still handles the case.
 */
#ifndef FL_STATUS_H
#define FL_STATUS_H

#include "fitllm.h"
#include <stdarg.h>

#if defined(__GNUC__)
#define FL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define FL_NORETURN __attribute__((noreturn))
#define FL_LIKELY(x) __builtin_expect(!!(x), 1)
#define FL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define FL_PRINTF(a, b)
#define FL_NORETURN
#define FL_LIKELY(x) (x)
#define FL_UNLIKELY(x) (x)
#endif

/* Record the reason for the failure about to be returned. Always returns st for chaining:
 *   return fl_set_error(FL_ERR_FORMAT, "%s: bad magic", __func__); */
fl_status fl_set_error(fl_status st, const char *fmt, ...) FL_PRINTF(2, 3);
/* Prefix the current message with "ctx: " (e.g. the file name). */
void fl_add_error_context(const char *fmt, ...) FL_PRINTF(1, 2);
void fl_clear_error(void);

FL_NORETURN void fl_abort(const char *file, int line, const char *fmt, ...) FL_PRINTF(3, 4);

#define FL_ASSERT(x) \
    do { if (FL_UNLIKELY(!(x))) fl_abort(__FILE__, __LINE__, "assertion failed: %s", #x); } while (0)
#ifndef NDEBUG
#define FL_DASSERT(x) FL_ASSERT(x)
#define FL_NEVER(x) ((x) ? (fl_abort(__FILE__, __LINE__, "NEVER(%s) fired", #x), 1) : 0)
#else
#define FL_DASSERT(x) ((void)0)
#define FL_NEVER(x) (x)
#endif
#define FL_UNREACHABLE() fl_abort(__FILE__, __LINE__, "unreachable")

#endif
