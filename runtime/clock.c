/*
 * clock.c -- the runtime's clocks and entropy: monotonic nanoseconds
 * (nr_now, read by timers, deadlines, the stall detector and the logger's
 * rate limit), a coarse monotonic reading (nr_now_coarse, the HTTP
 * server's timeouts), wall time (nr_wall_ns: log lines, the HTTP Date
 * field) and random bytes (nr_random_bytes: WebSocket masks, dict keys).
 * Any thread.
 *
 * The seam: every such read the runtime makes comes here, so that a
 * simulation (runtime/sim/) can answer them from its virtual clock and
 * its seeded generator. While one exists, nr__clock points at its table,
 * and a thread that runs on it (owns() says so: the simulation's thread)
 * gets virtual answers; every other thread, and every thread when there
 * is none, gets the system's. The production cost is one relaxed load and
 * a branch predicted not taken.
 */
#include <sys/random.h>
#include <time.h>

#include "internal.h"

const nr_clock_t *_Atomic nr__clock;

/* The simulation's table when the calling thread runs on it, else NULL. */
static inline const nr_clock_t *virtual_clock(void) {
  const nr_clock_t *c = atomic_load_explicit(&nr__clock, memory_order_relaxed);
  if (__builtin_expect(c != NULL, 0) && c->owns())
    return c;
  return NULL;
}

static inline uint64_t read_clock(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t nr_now(void) {
  const nr_clock_t *c = virtual_clock();
  if (__builtin_expect(c != NULL, 0))
    return c->now();
  return read_clock(CLOCK_MONOTONIC);
}

uint64_t nr_now_coarse(void) {
  const nr_clock_t *c = virtual_clock();
  if (__builtin_expect(c != NULL, 0))
    return c->now();
  return read_clock(CLOCK_MONOTONIC_COARSE);
}

uint64_t nr_wall_ns(void) {
  const nr_clock_t *c = virtual_clock();
  if (__builtin_expect(c != NULL, 0))
    return c->wall();
  return read_clock(CLOCK_REALTIME);
}

int64_t nr_wall_sec(void) {
  const nr_clock_t *c = virtual_clock();
  if (__builtin_expect(c != NULL, 0))
    return (int64_t)(c->wall() / 1000000000ull);
  return time(NULL);
}

void nr_random_bytes(void *buf, size_t n) {
  const nr_clock_t *c = virtual_clock();
  if (c != NULL) {
    c->random(buf, n);
    return;
  }
  /* getrandom(2) without GRND_NONBLOCK only waits before the kernel's
   * pool is first seeded, early in boot; a short read then is not
   * expected, and what is left is filled from the clock. */
  char *p = buf;
  ssize_t got = getrandom(p, n, 0);
  size_t done = got > 0 ? (size_t)got : 0;
  for (uint64_t x = read_clock(CLOCK_MONOTONIC) ^ (uint64_t)(uintptr_t)buf;
       done < n; done++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[done] = (char)x;
  }
}

bool nr_clock_is_virtual(void) { return virtual_clock() != NULL; }
