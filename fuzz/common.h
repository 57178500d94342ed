/*
 * common.h -- what every fuzz target shares: the invariant check, a
 * growable byte log, the external loop embedded channels run on, and the
 * seeded chunking that feeds one input in pieces (so a target can compare
 * a whole feed against a split one).
 */
#ifndef NR_FUZZ_COMMON_H
#define NR_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "netrun.h"

/* libFuzzer's entry point, which each target defines. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_ASSERT(c)                                                       \
  do {                                                                       \
    if (!(c)) {                                                              \
      fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #c, __FILE__,  \
              __LINE__);                                                     \
      abort();                                                               \
    }                                                                        \
  } while (0)

/* Append n bytes to the growable buffer (*b, *len, *cap). */
static inline void fuzz_append(char **b, size_t *len, size_t *cap,
                               const void *p, size_t n) {
  if (*len + n > *cap) {
    *cap = (*len + n) * 2 + 64;
    *b = realloc(*b, *cap);
    FUZZ_ASSERT(*b != NULL);
  }
  memcpy(*b + *len, p, n);
  *len += n;
}

/* The external loop embedded channels live on (logging off). */
static inline nr_loop_t *fuzz_loop(void) {
  static nr_loop_t *loop;
  if (loop == NULL) {
    nr_log_set_level(NR_LOG_OFF);
    loop = nr_loop_new(&(nr_loop_opts_t){.name = "fuzz", .external = true});
    FUZZ_ASSERT(loop != NULL);
  }
  return loop;
}

/* A seed derived from the input (FNV-1a), never 0. */
static inline uint32_t fuzz_seed(const uint8_t *data, size_t size) {
  uint32_t seed = 2166136261u;
  for (size_t i = 0; i < size; i++)
    seed = (seed ^ data[i]) * 16777619u;
  return seed | 1;
}

/* The size of the next piece of `left` bytes: all of them with seed 0,
 * else 1-8 bytes, or 1-64 one time in four. */
static inline size_t fuzz_chunk(uint32_t *seed, size_t left) {
  if (*seed == 0)
    return left;
  *seed = *seed * 1103515245u + 12345u;
  size_t max = (*seed >> 16) % 4 == 0 ? 64 : 8;
  size_t n = 1 + (*seed >> 8) % max;
  return n < left ? n : left;
}

#endif /* NR_FUZZ_COMMON_H */
