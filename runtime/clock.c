/*
 * clock.c -- the runtime's clock: monotonic nanoseconds (nr_now), read by
 * timers, deadlines, the stall detector and the logger's rate limit.
 * Any thread.
 */
#include <time.h>

#include "netrun.h"

uint64_t nr_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
