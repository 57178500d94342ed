/*
 * interpose.c -- time(2) for the `netrun` executable and what it loads.
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
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <time.h>

#include "netrun.h"

time_t time(time_t *out);
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
