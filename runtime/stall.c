/*
 * stall.c -- the stall watchdog (DESIGN.md §8.4): one thread for the
 * process, started with the first loop that has a stall_threshold, that
 * notices a loop whose current task or handler call has run too long.
 *
 * The loop pays two relaxed stores per iteration (busy_since when it wakes
 * and when it blocks, the task being run) and one per task (task_fn). The
 * watchdog samples every watched loop a few times per threshold: a loop
 * is stuck while it is busy and neither its
 * busy_since nor its tasks_run has moved -- together they are the run's
 * mark. A run that began in an earlier sample is timed from the sample
 * that first saw its mark, so a stall is never over-reported.
 *
 * The watchdog tells the loop of each run it sees in progress (wd_seen),
 * so that the loop times that run when it ends (max_busy, "the longest
 * run" in executor.c), and flags a loop it reports stalled (stalled) until
 * the run ends, so that group choosers pass it over (group.c).
 *
 * What is stuck is reported once per stall by whoever claims its mark
 * first: the loop's on_stall callback (the Lua bindings get a traceback on
 * the loop thread itself), or, if that cannot or does not answer within a
 * grace period, the watchdog, naming the C task. Past stall_timeout the
 * callback is asked to interrupt the run, again every stall_timeout; and
 * so is a run still stuck once its loop's shutdown timeout has passed --
 * the loop would check that timeout itself, were it not stuck.
 *
 * Threads: the list and every loop's `wd` fields belong to the watchdog,
 * under wd_lock. A loop is listed from after on_start until before on_exit
 * (nr__watch_add/remove, on the loop thread): the callback never runs while
 * the loop's own state is being made or torn down.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

#include "internal.h"

#define PERIOD_MIN NR_MS(10)
#define PERIOD_MAX NR_MS(250)
#define GRACE NR_MS(100)       /* for the loop thread to answer a report */

static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cond;
static bool cond_made;
static nr_loop_t *watched;
/* The watchdog runs while its generation is the current one: the removal
 * that empties the list moves on and joins it, so that no watchdog code
 * runs once the last loop is gone (the module may be unloaded then). */
static pthread_t wd_thread;
static bool started;
static uintptr_t generation;
static uint64_t period = PERIOD_MAX;

static double secs(uint64_t ns) { return (double)ns / 1e9; }

/* What the watchdog can say of a run no Lua hook described. */
static void describe(nr_loop_t *l, char *buf, size_t n) {
  uintptr_t fn = atomic_load_explicit(&l->task_fn, memory_order_relaxed);
  Dl_info info;
  if (fn == 0) {
    snprintf(buf, n, "handling I/O events");
  } else if (dladdr((void *)fn, &info) && info.dli_fname) {
    /* The object and offset are for addr2line: static functions have no
     * dynamic symbol. */
    const char *file = strrchr(info.dli_fname, '/');
    snprintf(buf, n, "the C task %s%sat %s+%#lx",
             info.dli_sname ? info.dli_sname : "", info.dli_sname ? " " : "",
             file ? file + 1 : info.dli_fname,
             (unsigned long)(fn - (uintptr_t)info.dli_fbase));
  } else {
    snprintf(buf, n, "the C task at %#lx", (unsigned long)fn);
  }
}

static void log_stall(nr_loop_t *l, uint64_t busy) {
  char what[256];
  describe(l, what, sizeof what);
  nr_log(NR_LOG_WARN,
         "%s: stalled: one run has lasted %.1f s, in %s (no Lua code "
         "answered: a C function or a blocking call)",
         l->name, secs(busy), what);
}

/* Report a run of `busy` ns once: ask the loop, or say what we know when
 * it cannot answer, or has not within GRACE. */
static void report(nr_loop_t *l, uint64_t mark, uint64_t busy, uint64_t now) {
  struct nr_watch_s *w = &l->wd;
  if (!w->reported && busy >= l->stall_threshold) {
    w->reported = true;
    atomic_store_explicit(&l->stalled, true, memory_order_relaxed);
    atomic_fetch_add(&l->stalls, 1);
    w->asked = l->on_stall &&
               l->on_stall(l, NR_STALL_REPORT, busy, mark, l->ud);
    w->asked_at = now;
    if (!w->asked && nr_loop_stall_claim(l, mark))
      log_stall(l, busy);
  } else if (w->asked && now - w->asked_at >= GRACE) {
    w->asked = false;
    if (nr_loop_stall_claim(l, mark))
      log_stall(l, busy);
  }
}

/* Interrupt a run past stall_timeout, or a reported one once its loop's
 * shutdown is overdue; again every such period while it lasts. */
static void interrupt(nr_loop_t *l, uint64_t mark, uint64_t busy,
                      uint64_t now) {
  struct nr_watch_s *w = &l->wd;
  uint64_t every = l->stall_timeout;
  uint64_t overdue = atomic_load_explicit(&l->shutdown_deadline,
                                          memory_order_relaxed);
  if (overdue != 0 && now >= overdue && w->reported &&
      (every == 0 || every > l->stall_threshold))
    every = l->stall_threshold;
  if (!every || busy < every || !l->on_stall ||
      (w->interrupted_at != 0 && now - w->interrupted_at < every))
    return;
  if (every != l->stall_timeout && !w->overdue) {
    w->overdue = true;                 /* said once: a C run stays stuck */
    nr_log(NR_LOG_WARN, "%s: shutdown timed out while a run is stuck: "
           "interrupting it", l->name);
  }
  w->interrupted_at = now;
  l->on_stall(l, NR_STALL_INTERRUPT, busy, mark, l->ud);
}

/* The reported run is over: choosers may pick the loop again. Written
 * only when it changes (producers read its cache line on every task). */
static void unstall(nr_loop_t *l) {
  if (l->wd.reported)
    atomic_store_explicit(&l->stalled, false, memory_order_relaxed);
}

/* One sample of one loop at `now`. */
static void check(nr_loop_t *l, uint64_t now) {
  struct nr_watch_s *w = &l->wd;
  uint64_t since = atomic_load_explicit(&l->busy_since, memory_order_relaxed);
  if (since == 0) {                      /* blocked in its selector */
    unstall(l);
    w->mark = w->since = 0;
    w->reported = false;
    w->sampled_at = now;
    return;
  }
  uint64_t mark = since + atomic_load_explicit(&l->tasks_run,
                                               memory_order_relaxed);
  if (mark != w->mark) {                 /* moved on since the last sample */
    /* A new iteration began at `since`; a new task, somewhere between the
     * last sample and now: count from now. The loop times the run when it
     * ends, from no earlier than the last sample (executor.c). */
    atomic_store_explicit(&l->wd_seen, w->sampled_at ? w->sampled_at : 1,
                          memory_order_relaxed);
    unstall(l);
    w->start = since != w->since ? since : now;
    w->since = since;
    w->mark = mark;
    w->reported = w->asked = w->overdue = false;
    w->interrupted_at = 0;
  }
  uint64_t busy = now > w->start ? now - w->start : 0;
  if (busy > atomic_load_explicit(&l->max_busy, memory_order_relaxed))
    atomic_store_explicit(&l->max_busy, busy, memory_order_relaxed);
  report(l, mark, busy, now);
  interrupt(l, mark, busy, now);
  w->sampled_at = now;
}

static void *watchdog_main(void *arg) {
  uintptr_t gen = (uintptr_t)arg;
  nr__log_set_thread_name("watchdog");
  pthread_mutex_lock(&wd_lock);
  while (gen == generation) {
    uint64_t now = nr_now();
    for (nr_loop_t *l = watched; l; l = l->wd.next)
      check(l, now);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t at = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec +
                  period;
    ts.tv_sec = (time_t)(at / 1000000000ull);
    ts.tv_nsec = (long)(at % 1000000000ull);
    pthread_cond_timedwait(&wd_cond, &wd_lock, &ts);
  }
  pthread_mutex_unlock(&wd_lock);
  return NULL;
}

/* Under wd_lock. */
static void start(void) {
  if (!cond_made) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wd_cond, &ca);
    pthread_condattr_destroy(&ca);
    cond_made = true;
  }
  /* The thread keeps the creating loop's signal mask: in the netrun
   * command, SIGINT and SIGTERM stay blocked, as everywhere but there. */
  int rc = pthread_create(&wd_thread, NULL, watchdog_main,
                          (void *)generation);
  if (rc != 0) {
    nr_log(NR_LOG_WARN, "cannot start the stall watchdog: %s", strerror(rc));
    return;
  }
  started = true;
}

/* A simulated loop has no watchdog thread (runtime/sim/ runs every loop
 * on one thread): the simulation checks the running loop itself while a
 * run spins on the virtual clock, as the watchdog samples a real one. */
void nr__watch_check(nr_loop_t *l, uint64_t now) {
  pthread_mutex_lock(&wd_lock);
  check(l, now);
  pthread_mutex_unlock(&wd_lock);
}

void nr__watch_add(nr_loop_t *l) {
  uint64_t p = l->stall_threshold / 4;
  if (l->stall_timeout && l->stall_timeout / 4 < p)
    p = l->stall_timeout / 4;
  p = p < PERIOD_MIN ? PERIOD_MIN : p > PERIOD_MAX ? PERIOD_MAX : p;
  pthread_mutex_lock(&wd_lock);
  if (!started)
    start();
  if (p < period)
    period = p;
  l->wd = (struct nr_watch_s){.next = watched, .listed = true};
  watched = l;
  pthread_mutex_unlock(&wd_lock);
}

void nr__watch_remove(nr_loop_t *l) {
  bool stop = false;
  pthread_t th = (pthread_t)0;
  pthread_mutex_lock(&wd_lock);
  if (l->wd.listed) {
    for (nr_loop_t **pp = &watched; *pp; pp = &(*pp)->wd.next)
      if (*pp == l) {
        *pp = l->wd.next;
        break;
      }
    l->wd.listed = false;
    if (watched == NULL && started) {
      stop = true;
      th = wd_thread;
      started = false;
      generation++;
      period = PERIOD_MAX;
      pthread_cond_signal(&wd_cond);
    }
  }
  pthread_mutex_unlock(&wd_lock);
  if (stop)
    pthread_join(th, NULL);
}
