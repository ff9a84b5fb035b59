/*
 * rng.h - the training RNG: a 64-bit state (splitmix64), small enough to store in a checkpoint
 * so a resumed run draws exactly the numbers the uninterrupted run would have drawn.
 * Not thread-safe: one state per user.
 */
#ifndef FL_TRAIN_RNG_H
#define FL_TRAIN_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct fl_rng {
    uint64_t s;
} fl_rng;

static inline uint64_t fl_rng_u64(fl_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [0, 1) with 53 bits */
static inline double fl_rng_uniform(fl_rng *r) { return (double)(fl_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

/* standard normal (Box-Muller, one value per call) */
static inline double fl_rng_normal(fl_rng *r) {
    double u1 = fl_rng_uniform(r), u2 = fl_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
