/* infer-plugin-cpu: what the greedy LM heads' screens share (infer_cpu_bf16.c's "greedy LM head",
 * infer_cpu_kernels.c's "greedy Q8_0 LM head"): a row's best lower bound over the units that
 * screen its columns, and a unit's list of candidate columns. */
#ifndef INFER_CPU_SCREEN_H
#define INFER_CPU_SCREEN_H
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* The float a bound's bits hold. */
static inline float screen_top(_Atomic uint32_t *top) {
  uint32_t bits = atomic_load_explicit(top, memory_order_relaxed);
  float t;
  memcpy(&t, &bits, sizeof t);
  return t;
}

/* top = max(top, t) (t a float; the bits of floats compare as the floats do only for
 * non-negative values, so the comparison is on the floats). Returns the new maximum. */
static inline float screen_raise(_Atomic uint32_t *top, float t) {
  uint32_t old = atomic_load_explicit(top, memory_order_relaxed), want;
  float cur;
  do {
    memcpy(&cur, &old, sizeof cur);
    if (!(t > cur)) return cur;
    memcpy(&want, &t, sizeof want);
  } while (!atomic_compare_exchange_weak_explicit(top, &old, want, memory_order_relaxed,
                                                  memory_order_relaxed));
  return t;
}

/* Keep column n (upper bound up) in a row's list (cn, cu, *cc of cap) if up >= t; when the list
 * is full, compact it to the columns still at t or above, and if none goes, *cc = -1 (the row
 * takes every column of the unit). */
static inline void screen_keep(int32_t *cn, float *cu, int32_t *cc, int cap, float t, int n,
                               float up) {
  if (*cc < 0 || up < t) return;
  if (*cc == cap) {
    int k = 0;
    for (int i = 0; i < cap; i++)
      if (cu[i] >= t) {
        cn[k] = cn[i];
        cu[k++] = cu[i];
      }
    if (k == cap) {
      *cc = -1;
      return;
    }
    *cc = k;
  }
  cn[*cc] = n;
  cu[(*cc)++] = up;
}

/* -inf as a bound's bits (the start of every row's best lower bound). */
static inline void screen_init_top(_Atomic uint32_t *top) {
  float ninf = -INFINITY;
  uint32_t bits;
  memcpy(&bits, &ninf, sizeof bits);
  atomic_init(top, bits);
}
#endif
