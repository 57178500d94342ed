/*
 * http_stats.c -- the HTTP server codec's response counters, by status.
 *
 * Each thread that answers HTTP takes a stripe of its own on its first
 * response and keeps it for life: it alone writes that stripe, with a
 * relaxed load and store (plain moves; no lock-prefixed add per response),
 * and the metrics renderer reads every stripe from another thread with
 * relaxed loads, summing them. Stripes are never reused (a thread that
 * ended leaves its counts behind); the threads past the first STRIPES - 1
 * share the last stripe, which is therefore added to atomically.
 */
#include <stdatomic.h>
#include <stdint.h>

#include "codec/http.h"

#define STRIPES 64
#define CODES (NR_HTTP_STATUS_MAX - NR_HTTP_STATUS_MIN + 1)

typedef struct stripe_s {
  _Atomic uint64_t n[CODES];
} stripe_t;

static stripe_t stripes[STRIPES];
static _Atomic int taken;
static _Thread_local stripe_t *mine;

static stripe_t *claim(void) {
  int i = atomic_fetch_add(&taken, 1);
  mine = &stripes[i < STRIPES - 1 ? i : STRIPES - 1];
  return mine;
}

void nr_http_count_status(int status) {
  if (status < NR_HTTP_STATUS_MIN || status > NR_HTTP_STATUS_MAX)
    return;
  stripe_t *s = mine ? mine : claim();
  _Atomic uint64_t *c = &s->n[status - NR_HTTP_STATUS_MIN];
  if (s == &stripes[STRIPES - 1]) {
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
    return;
  }
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}

void nr_http_status_counts(uint64_t *out) {
  int used = atomic_load(&taken);
  used = used < STRIPES ? used : STRIPES;
  for (int i = 0; i < CODES; i++)
    out[i] = 0;
  for (int s = 0; s < used; s++)
    for (int i = 0; i < CODES; i++)
      out[i] += atomic_load_explicit(&stripes[s].n[i], memory_order_relaxed);
}
