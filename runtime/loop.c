/*
 * loop.c -- the I/O side of a loop (Netty's NioEventLoop.run): the select
 * strategy, io_ratio, coalesced wakeups, spurious-wakeup counting and the
 * selector rebuild. Loop thread only, except nr__loop_wakeup (executor.c).
 *
 * One iteration (nr__loop_iteration) reads like Netty's run():
 *   1. select: tasks pending -> epoll_wait(0) (do not block); otherwise
 *      publish the next deadline in next_wakeup, re-check the queue, block
 *      until the deadline or a wakeup;
 *   2. process the ready events;
 *   3. run due timers (timer.c), then tasks, for at most
 *      io_time * (100 - io_ratio) / io_ratio (all of them when io_ratio is
 *      100);
 *   4. reap the channels closed meanwhile;
 *   5. count selects that returned early having done nothing; after
 *      rebuild_threshold of them in a row, rebuild the selector.
 */
#include <stdio.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "internal.h"

#define MAX_EVENTS 1024
#define SPIN_NS 10000        /* see spin_for_tasks */

static int on_wake(nr_loop_t *l, nr_io_t *io, uint32_t events) {
  (void)events;
  (void)l;
  uint64_t v;
  ssize_t n = nr_sys_read(io->fd, &v, sizeof v);
  (void)n;                       /* EAGAIN: a concurrent read drained it */
  /* A wakeup was asked for (a task, a shutdown, a promise an external loop
   * waits on), so the select did not return prematurely even when no task
   * ran; counting it would rebuild the selector of a main thread that only
   * waits on futures (Netty resets selectCnt on wakeups too). */
  return 1;
}

int nr_sys_selector(nr_loop_t *l, int *epfd, int *wakefd) {
  if (l->sim != NULL)
    return nr__transport->selector(l, epfd, wakefd);
  *epfd = epoll_create1(EPOLL_CLOEXEC);
  *wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  return *epfd < 0 || *wakefd < 0 ? -1 : 0;
}

int nr__selector_open(nr_loop_t *l) {
  int rc = nr_sys_selector(l, &l->epfd, &l->wakefd);
  l->nevents = MAX_EVENTS;
  l->events = malloc(sizeof *l->events * (size_t)l->nevents);
  if (rc < 0 || l->events == NULL)
    return l->events == NULL ? -ENOMEM : -errno;
  l->wake_io.fd = l->wakefd;
  l->wake_io.cb = on_wake;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &l->wake_io};
  return nr_sys_epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wakefd, &ev) < 0 ? -errno
                                                                     : 0;
}

void nr__selector_close(nr_loop_t *l) {
  if (l->epfd > 0)
    nr_sys_close(l->epfd);
  if (l->wakefd > 0)
    nr_sys_close(l->wakefd);
  l->epfd = l->wakefd = -1;
  free(l->events);
  l->events = NULL;
  free(l->rbuf);
  l->rbuf = NULL;
  for (nr_chunk_t *c = l->chunk_cache, *n; c; c = n) {
    n = c->next;
    free(c);
  }
  l->chunk_cache = NULL;
}

/* ---- watchers ------------------------------------------------------------ */

int nr__io_start(nr_loop_t *l, nr_io_t *io, uint32_t events) {
  struct epoll_event ev = {.events = events, .data.ptr = io};
  if (nr_sys_epoll_ctl(l->epfd, EPOLL_CTL_ADD, io->fd, &ev) < 0)
    return -errno;
  io->events = events;
  io->prev = NULL;
  io->next = l->ios;
  if (l->ios)
    l->ios->prev = io;
  l->ios = io;
  return 0;
}

int nr__io_modify(nr_loop_t *l, nr_io_t *io, uint32_t events) {
  if (events == io->events)
    return 0;
  struct epoll_event ev = {.events = events, .data.ptr = io};
  if (nr_sys_epoll_ctl(l->epfd, EPOLL_CTL_MOD, io->fd, &ev) < 0)
    return -errno;
  io->events = events;
  return 0;
}

void nr__io_stop(nr_loop_t *l, nr_io_t *io) {
  nr_sys_epoll_ctl(l->epfd, EPOLL_CTL_DEL, io->fd, NULL);
  if (io->prev)
    io->prev->next = io->next;
  else if (l->ios == io)
    l->ios = io->next;
  if (io->next)
    io->next->prev = io->prev;
  io->prev = io->next = NULL;
}

/* ---- selector rebuild ---------------------------------------------------- */

/* Netty's rebuildSelector: a new epoll instance with every watcher
 * re-registered with its interest set; a watcher that cannot be moved is
 * told so through its callback with EPOLLERR. */
static void rebuild(nr_loop_t *l, int premature) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    nr_log(NR_LOG_WARN, "%s: selector rebuild failed: %s", l->name,
           strerror(errno));
    return;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &l->wake_io};
  epoll_ctl(ep, EPOLL_CTL_ADD, l->wakefd, &ev);
  int moved = 0;
  for (nr_io_t *io = l->ios; io; io = io->next) {
    ev.events = io->events;
    ev.data.ptr = io;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, io->fd, &ev) == 0)
      moved++;
    else
      nr_log(NR_LOG_WARN, "%s: fd %d lost in selector rebuild: %s", l->name,
             io->fd, strerror(errno));
  }
  close(l->epfd);
  l->epfd = ep;
  atomic_fetch_add(&l->rebuilds, 1);
  nr_log(NR_LOG_WARN,
         "%s: selector returned prematurely %d times in a row; rebuilt it "
         "with %d watchers",
         l->name, premature, moved);
}

/* ---- one iteration ------------------------------------------------------- */

static int timeout_ms(uint64_t deadline, uint64_t now) {
  if (deadline == NR_NONE)
    return -1;
  if (deadline <= now)
    return 0;
  uint64_t ms = (deadline - now + 999999) / 1000000;  /* never wake early */
  return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

static int process(nr_loop_t *l, int n) {
  int handled = 0;
  for (int i = 0; i < n; i++) {
    nr_io_t *io = l->events[i].data.ptr;
    if (io == NULL)
      continue;                  /* a stale registration: no work */
    handled += io->cb(l, io, l->events[i].events);
  }
  nr__stat_add(&l->io_events, (uint64_t)n);
  return handled;
}

/* The deadline to block until when there is nothing to do. */
static uint64_t block_deadline(nr_loop_t *l) {
  uint64_t dl = nr__next_deadline(l);
  if (nr_loop_is_shutting_down(l))
    dl = nr__shutdown_poll_deadline(l, dl);
  if (l->run_once_deadline && l->run_once_deadline < dl)
    dl = l->run_once_deadline;
  return dl;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* While producers are feeding the queue, their next task is usually a few
 * hundred nanoseconds away: poll for it briefly before paying for a sleep
 * here and an eventfd write there. Idle loops and pure I/O loops never
 * spin, since `spin` is only set by a pass that ran queued tasks. */
static void spin_for_tasks(nr_loop_t *l) {
  uint64_t until = nr_now() + SPIN_NS;
  for (int i = 1; !nr__loop_has_tasks(l); i++) {
    cpu_relax();
    if ((i & 63) == 0 && nr_now() >= until)
      break;
  }
}

/* What the select of one iteration found. */
typedef struct select_s {
  int n;                       /* ready events */
  bool blocked;                /* it waited (for dl, or a wakeup) */
  uint64_t dl;                 /* the deadline it waited for */
} select_t;

/* 1. Select: poll without waiting while tasks are queued; otherwise
 * publish the deadline in next_wakeup (so that producers know to wake the
 * loop), re-check the queue -- a task queued before the publication is
 * seen here, one queued after it sends a wakeup -- and block. */
static select_t select_events(nr_loop_t *l) {
  select_t s = {0, false, 0};
  if (l->spin && !l->external && l->sim == NULL)
    spin_for_tasks(l);           /* (virtual time does not pass in a spin) */
  if (nr__loop_has_tasks(l)) {
    s.n = nr_sys_epoll_wait(l->epfd, l->events, l->nevents, 0, 0);
  } else {
    s.dl = block_deadline(l);
    atomic_store(&l->next_wakeup, s.dl);   /* seq_cst: before the re-check */
    if (!nr__loop_has_tasks(l)) {
      s.blocked = true;
      atomic_store_explicit(&l->busy_since, 0, memory_order_relaxed);
      nr__loop_blocking(l);                 /* a watcher of idle loops */
      s.n = nr_sys_epoll_wait(l->epfd, l->events, l->nevents,
                              timeout_ms(s.dl, nr_now()), s.dl);
    }
    atomic_store_explicit(&l->next_wakeup, NR_AWAKE, memory_order_relaxed);
  }
  if (s.n < 0) {
    if (errno != EINTR)
      nr_log(NR_LOG_WARN, "%s: epoll_wait: %s", l->name, strerror(errno));
    s.n = 0;
  }
  return s;
}

/* A new stretch of work for the stall watchdog (stall.c): what runs from
 * here until the next select is one run, split further by tasks_run. */
static uint64_t start_run(nr_loop_t *l) {
  uint64_t woke = nr_now();
  atomic_store_explicit(&l->busy_since, woke, memory_order_relaxed);
  atomic_store_explicit(&l->task_fn, 0, memory_order_relaxed);
  l->run_from = woke;            /* for the longest run (executor.c) */
  return woke;
}

/* 3. Run due timers and tasks: all of them when io_ratio is 100; else for
 * io_time * (100 - io_ratio) / io_ratio, the I/O just processed having
 * taken io_time since `woke` (at most 64 tasks when there was none). */
static bool run_tasks(nr_loop_t *l, int n, uint64_t woke) {
  if (l->io_ratio == 100)
    return nr__run_all_tasks(l);
  if (n == 0)
    return nr__run_tasks_for(l, 0);
  uint64_t io = nr_now() - woke;
  nr__stat_add(&l->io_time, io);
  return nr__run_tasks_for(
      l, io * (uint64_t)(100 - l->io_ratio) / (uint64_t)l->io_ratio);
}

/* 5. A select that blocked, woke before its deadline and led to no work
 * was premature; after rebuild_threshold of them in a row the selector is
 * rebuilt (Netty's epoll-spin workaround). */
static void count_premature(nr_loop_t *l, bool worked, const select_t *s) {
  if (worked) {
    l->select_cnt = 0;
    return;
  }
  if (!s->blocked || (s->dl != NR_NONE && nr_now() >= s->dl))
    return;
  if (++l->select_cnt > 3)
    nr_log(NR_LOG_DEBUG, "%s: selector returned prematurely %d times",
           l->name, l->select_cnt);
  if (l->rebuild_threshold > 0 && l->select_cnt >= l->rebuild_threshold) {
    rebuild(l, l->select_cnt);
    l->select_cnt = 0;
  }
}

/* The lag after a run from woke to now: the longer of this run and what
 * is left of the lag before it (internal.h, "lag"). */
static void note_lag(nr_loop_t *l, uint64_t woke) {
  uint64_t now = nr_now(), run = now - woke;
  uint64_t lag = atomic_load_explicit(&l->lag, memory_order_relaxed),
           at = atomic_load_explicit(&l->lag_at, memory_order_relaxed);
  uint64_t left = lag > now - at ? lag - (now - at) : 0;
  atomic_store_explicit(&l->lag, run > left ? run : left, memory_order_relaxed);
  atomic_store_explicit(&l->lag_at, now, memory_order_relaxed);
}

int nr__loop_iteration(nr_loop_t *l) {
  nr__stat_add(&l->iterations, 1);
  select_t s = select_events(l);                    /* 1. select */
  uint64_t woke = start_run(l);
  int handled = s.n > 0 ? process(l, s.n) : 0;      /* 2. process I/O */
  bool ran = run_tasks(l, s.n, woke);               /* 3. timers, tasks */
  if (l->graveyard)
    nr__loop_reap(l);                               /* 4. closed channels */
  count_premature(l, ran || handled > 0, &s);       /* 5. */
  l->run_from = 0;                 /* what runs outside an iteration is not timed */
  note_lag(l, woke);
  return ran;
}

void nr__loop_run(nr_loop_t *l) {
  for (;;) {
    nr__loop_iteration(l);
    if (nr_loop_is_shutting_down(l)) {
      nr__channels_close_all(l);
      if (nr__confirm_shutdown(l))
        break;
    }
  }
}
