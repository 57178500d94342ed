/*
 * log.c -- the runtime's logger, clock and error strings.
 *
 * One line per call, written with a single write(2) so lines from several
 * loop threads never interleave. Each line names its thread: the loop's
 * name, or "main". The level comes from NETRUN_LOG once, at first use.
 */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static _Atomic int log_level = -1;
static _Thread_local const char *thread_name;

static int level_from_env(void) {
  const char *s = getenv("NETRUN_LOG");
  static const char *names[] = {"debug", "info", "warn", "error", "off"};
  for (int i = 0; s && i < 5; i++)
    if (strcmp(s, names[i]) == 0)
      return i;
  return NR_LOG_INFO;
}

int nr_log_level(void) {
  int l = atomic_load_explicit(&log_level, memory_order_relaxed);
  if (l < 0) {
    l = level_from_env();
    atomic_store(&log_level, l);
  }
  return l;
}

void nr_log_set_level(int level) { atomic_store(&log_level, level); }

void nr__log_set_thread_name(const char *name) { thread_name = name; }

const char *nr_thread_name(void) {
  return thread_name ? thread_name : "main";
}

void nr_vlog(int level, const char *fmt, va_list ap) {
  static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  if (level < nr_log_level() || level >= NR_LOG_OFF)
    return;
  char line[2048];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line,
                   "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s [%s] ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                   tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, tags[level],
                   nr_thread_name());
  int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
  n = m < 0 ? n : (size_t)(n + m) >= sizeof line - 1 ? (int)sizeof line - 2
                                                     : n + m;
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, n);
  (void)w;  /* nowhere left to report a failed log write */
}

void nr_log(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nr_vlog(level, fmt, ap);
  va_end(ap);
}

uint64_t nr_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *nr_strerror(int code) {
  switch (code) {
  case 0: return "success";
  case NR_EREJECTED: return "rejected: event loop is shut down";
  case NR_EFULL: return "rejected: too many pending tasks";
  case NR_ECANCELLED: return "cancelled";
  case NR_ECLOSED: return "closed";
  case NR_ETOOLONG: return "frame too long";
  case NR_EDEADLOCK: return "blocking operation on an event loop";
  case NR_ETIMEDOUT: return "timeout";
  case NR_EHANDLER: return "handler error";
  default: return code < 0 ? strerror(-code) : "unknown error";
  }
}
