/*
 * clock.h - monotonic wall-clock time in seconds (CLOCK_MONOTONIC): for timings, rates and
 * deadlines, never for dates.  (The fp32 calibration times its own thread's CPU instead.)
 */
#ifndef FL_CLOCK_H
#define FL_CLOCK_H

double fl_clock_s(void);

#endif
