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
#include <dlfcn.h>
#include <sys/random.h>
#include <time.h>

#include "internal.h"

const nr_clock_t *_Atomic nr__clock;

/* Whether a simulation exists (then the calling thread may be its). */
static inline bool maybe_virtual(void) {
  return __builtin_expect(
      atomic_load_explicit(&nr__clock, memory_order_relaxed) != NULL, 0);
}

/* The simulation's table when the calling thread runs on it, else NULL;
 * out of line, so that the production path is a load and a branch. */
static __attribute__((noinline)) const nr_clock_t *virtual_clock(void) {
  const nr_clock_t *c = atomic_load_explicit(&nr__clock, memory_order_relaxed);
  return c != NULL && c->owns() ? c : NULL;
}

static inline uint64_t read_clock(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Each reading: the system's unless a simulation owns the thread. */
static __attribute__((noinline)) uint64_t read_virtual(clockid_t id) {
  const nr_clock_t *c = virtual_clock();
  if (c == NULL)
    return read_clock(id);
  return id == CLOCK_REALTIME ? c->wall() : c->now();
}

uint64_t nr_now(void) {
  if (maybe_virtual())
    return read_virtual(CLOCK_MONOTONIC);
  return read_clock(CLOCK_MONOTONIC);
}

uint64_t nr_now_coarse(void) {
  if (maybe_virtual())
    return read_virtual(CLOCK_MONOTONIC);
  return read_clock(CLOCK_MONOTONIC_COARSE);
}

uint64_t nr_wall_ns(void) {
  if (maybe_virtual())
    return read_virtual(CLOCK_REALTIME);
  return read_clock(CLOCK_REALTIME);
}

/* The C library's time(), found once: the `netrun` executable defines a
 * time() of its own (bin/interpose.c) that this need not go through. */
static time_t (*_Atomic libc_time)(time_t *);

static __attribute__((noinline)) time_t first_time(void) {
  time_t (*f)(time_t *) = (time_t (*)(time_t *))dlsym(RTLD_NEXT, "time");
  if (f == NULL) {
    struct timespec ts;                 /* (what time() reads: the tick) */
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return ts.tv_sec;
  }
  atomic_store_explicit(&libc_time, f, memory_order_relaxed);
  return f(NULL);
}

int64_t nr_wall_sec(void) {
  if (maybe_virtual())
    return (int64_t)(read_virtual(CLOCK_REALTIME) / 1000000000ull);
  time_t (*f)(time_t *) = atomic_load_explicit(&libc_time, memory_order_relaxed);
  return __builtin_expect(f != NULL, 1) ? f(NULL) : first_time();
}

void nr_random_bytes(void *buf, size_t n) {
  const nr_clock_t *c = maybe_virtual() ? virtual_clock() : NULL;
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

bool nr_clock_is_virtual(void) {
  return maybe_virtual() && virtual_clock() != NULL;
}
