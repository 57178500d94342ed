/*
 * interpose.c -- time(2), gettimeofday(2) and clock(3) for the `netrun`
 * executable and what it loads.
 *
 * Inside a simulation (runtime/sim/), on its thread, time() is the
 * simulation's wall clock, as nr_wall_sec is: os.time and os.date, which
 * call time(), read virtual time; so do OpenSSL (certificate validity,
 * session lifetimes) and Lua itself where it calls time() -- which it
 * does to seed each new state's string hashes (luai_makeseed) and
 * math.random: a state made in a simulation is then seeded the same in
 * every run of a seed. `netrun --sim` also freezes it (netrun_freeze_time)
 * before the main state is made, for the same reason.
 *
 * Defined here, in the executable, time() is the one every object of the
 * process calls (the executable exports it: -Wl,-E); the module
 * netrun/core.so that stock lua5.4 loads does not bring it (there, os.time
 * is replaced in Lua: lua/netrun/sim.lua). Any thread.
 *
 * gettimeofday() and clock() likewise, on a simulation's thread only:
 * they are what LuaSocket's gettime and Lua's os.clock call, so a
 * reference to either taken before the world began (`local gettime =
 * socket.gettime` at the top of a file, the function Lua patches
 * replace) reads virtual time too. clock() there is the virtual
 * monotonic clock, in CLOCKS_PER_SEC: a loop spinning on it sees it
 * move, as the world's clock does (runtime/sim/world.c, spin). The
 * runtime itself reads neither (runtime/clock.c: clock_gettime), so the
 * production cost is on these two calls alone; clock_gettime(2) is not
 * interposed (that would put a call on nr_now's path), and a C module
 * that calls it reads the system's clock inside a world (docs/guide/simulation.md).
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "netrun.h"

time_t time(time_t *out);
clock_t clock(void);
void netrun_freeze_time(int64_t t);

static _Atomic int64_t frozen;         /* 0: not frozen */
static time_t (*_Atomic next_time)(time_t *);   /* the C library's */

void netrun_freeze_time(int64_t t) { atomic_store(&frozen, t); }

static __attribute__((noinline)) time_t odd_time(time_t *out) {
  time_t t = nr_clock_is_virtual() ? (time_t)nr_wall_sec()
             : (time_t)atomic_load(&frozen);
  if (t == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    t = ts.tv_sec;
  }
  if (out)
    *out = t;
  return t;
}

time_t time(time_t *out) {
  time_t (*f)(time_t *) = atomic_load_explicit(&next_time,
                                               memory_order_relaxed);
  if (__builtin_expect(f == NULL, 0)) {
    f = (time_t (*)(time_t *))dlsym(RTLD_NEXT, "time");
    if (f == NULL)
      return odd_time(out);
    atomic_store_explicit(&next_time, f, memory_order_relaxed);
  }
  if (__builtin_expect(atomic_load_explicit(&frozen, memory_order_relaxed) != 0,
                       0) || nr_clock_is_virtual())
    return odd_time(out);
  return f(out);
}

/* The C library's f, found once (NULL: not found). */
static void *next_fn(void *_Atomic *slot, const char *name) {
  void *f = atomic_load_explicit(slot, memory_order_relaxed);
  if (__builtin_expect(f == NULL, 0)) {
    f = dlsym(RTLD_NEXT, name);
    atomic_store_explicit(slot, f, memory_order_relaxed);
  }
  return f;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
  static void *_Atomic next;
  if (__builtin_expect(nr_clock_is_virtual(), 0) ||
      next_fn(&next, "gettimeofday") == NULL) {
    uint64_t ns = nr_wall_ns();          /* (the system's if not virtual) */
    tv->tv_sec = (time_t)(ns / 1000000000u);   /* (declared nonnull) */
    tv->tv_usec = (suseconds_t)(ns % 1000000000u / 1000u);
    if (tz)
      memset(tz, 0, sizeof(struct timezone));
    return 0;
  }
  return ((int (*)(struct timeval *, void *))atomic_load_explicit(
      &next, memory_order_relaxed))(tv, tz);
}

clock_t clock(void) {
  static void *_Atomic next;
  if (__builtin_expect(nr_clock_is_virtual(), 0))
    return (clock_t)(nr_now() / (1000000000u / CLOCKS_PER_SEC));
  clock_t (*f)(void) = (clock_t (*)(void))next_fn(&next, "clock");
  if (f == NULL) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (clock_t)(ts.tv_sec * CLOCKS_PER_SEC +
                     ts.tv_nsec / (1000000000 / CLOCKS_PER_SEC));
  }
  return f();
}
