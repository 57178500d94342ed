/*
 * executor.c -- the single-thread executor under every loop (Netty's
 * SingleThreadEventExecutor): lazy thread start, states, the task queue with
 * its shutdown-safe submission, running tasks (due timers first: timer.c),
 * tail tasks, shutdown hooks and the graceful shutdown of confirmShutdown().
 *
 * Threads: producers touch only `tasks`, `tail_tasks`, `state`, `producers`,
 * `enqueued` and `next_wakeup`. Everything else is the loop thread's.
 *
 * Nothing is lost at shutdown: a producer announces itself in `producers`
 * before reading the state, and the loop, after moving to SHUTDOWN, waits
 * for that count to reach zero and drains the queue once more. A producer
 * that arrives later sees SHUTDOWN and is rejected.
 */
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "internal.h"
#include "sim/sim.h"

#define TASK_OWNED 1u
#define SHUTDOWN_POLL NR_MS(100)   /* confirmShutdown's re-check period */

static _Thread_local nr_loop_t *current;

nr_loop_t *nr_loop_current(void) { return current; }

void nr__loop_set_current(nr_loop_t *l) {
  current = l;
  nr__log_set_thread_name(l ? l->name : NULL);
}

bool nr_loop_in_thread(const nr_loop_t *l) { return current == l; }
const char *nr_loop_name(const nr_loop_t *l) { return l->name; }
int nr_loop_state(const nr_loop_t *l) {
  return atomic_load(&((nr_loop_t *)l)->state);
}
bool nr_loop_is_shutting_down(const nr_loop_t *l) {
  return nr_loop_state(l) >= NR_SHUTTING_DOWN;
}
bool nr_loop_is_shutdown(const nr_loop_t *l) {
  return nr_loop_state(l) >= NR_SHUTDOWN;
}
bool nr_loop_is_terminated(const nr_loop_t *l) {
  return nr_loop_state(l) == NR_TERMINATED;
}
nr_group_t *nr_loop_group(const nr_loop_t *l) { return l->group; }
void *nr_loop_data(const nr_loop_t *l) { return l->data; }
_Atomic size_t *nr_loop_memory(nr_loop_t *l) { return &l->memory; }
void nr_loop_set_data(nr_loop_t *l, void *d) { l->data = d; }
nr_promise_t *nr_loop_termination_future(const nr_loop_t *l) {
  return l->termination;
}
int nr_loop_selector_fd(const nr_loop_t *l) { return l->epfd; }

/* ---- construction and the thread --------------------------------------- */

int nr__loop_init(nr_loop_t *l, const nr_loop_opts_t *o) {
  nr__mpsc_init(&l->tasks);
  nr__mpsc_init(&l->tail_tasks);
  atomic_init(&l->next_wakeup, NR_AWAKE);
  atomic_init(&l->state, o->external ? NR_STARTED : NR_NOT_STARTED);
  pthread_mutex_init(&l->hook_lock, NULL);
  l->name = strdup(o->name ? o->name : "loop");
  l->io_ratio = o->io_ratio <= 0 ? 50 : o->io_ratio > 100 ? 100 : o->io_ratio;
  l->rebuild_threshold = o->rebuild_threshold == 0 ? 512
                         : o->rebuild_threshold < 0 ? 0 : o->rebuild_threshold;
  l->max_pending = o->max_pending;
  l->external = o->external;
  /* Made on a simulation's thread: simulated for good (runtime/sim/). Its
   * selector is the simulation's, which never returns early for nothing
   * (no rebuild), and its "thread" a fiber. */
  l->sim = nr__sim_attach(l);
  if (l->sim != NULL)
    l->rebuild_threshold = 0;
  l->on_start = o->on_start;
  l->on_exit = o->on_exit;
  l->ud = o->ud;
  l->stall_threshold = o->stall_threshold;
  l->stall_timeout = o->stall_timeout;
  l->on_stall = o->on_stall;
  l->quiet = NR_SEC(2);
  l->timeout = NR_SEC(15);
  l->termination = nr_promise_new();
  if (l->name == NULL || l->termination == NULL)
    return -ENOMEM;
  int rc = nr__selector_open(l);
  if (rc == 0 && l->external)
    nr__loop_set_current(l);
  return rc;
}

nr_loop_t *nr_loop_new(const nr_loop_opts_t *o) {
  nr_loop_opts_t dflt = {0};
  nr_loop_t *l = aligned_alloc(NR_CACHELINE, sizeof *l);
  if (l == NULL)
    return NULL;
  memset(l, 0, sizeof *l);
  atomic_init(&l->refs, 1);                /* nr_loop_free's */
  int rc = nr__loop_init(l, o ? o : &dflt);
  if (rc < 0) {
    errno = -rc;
    nr_loop_free(l);
    return NULL;
  }
  return l;
}

static void terminate(nr_loop_t *l);

static void *thread_main(void *arg) {
  nr_loop_t *l = arg;
  nr__loop_set_current(l);
  if (l->sim == NULL) {            /* (a fiber shares its thread's name) */
    char tname[16];
    snprintf(tname, sizeof tname, "%s", l->name);
    pthread_setname_np(pthread_self(), tname);
  }
  if (l->on_start)
    l->on_start(l, l->ud);
  if (l->stall_threshold && l->sim == NULL)
    nr__watch_add(l);
  l->last_execution = nr_now();
  nr__loop_run(l);
  terminate(l);
  nr__loop_set_current(NULL);
  return NULL;
}

static void start_thread(nr_loop_t *l) {
  l->thread_started = true;
  if (l->sim != NULL ? nr__sim_start(l, thread_main) != 0
                     : pthread_create(&l->thread, NULL, thread_main, l) != 0) {
    l->thread_started = false;
    nr_log(NR_LOG_ERROR, "%s: cannot start thread: %s", l->name,
           strerror(errno));
    atomic_store(&l->state, NR_TERMINATED);
    nr_promise_set_failure(l->termination, -EAGAIN, "cannot start thread");
  }
}

/* CAS NOT_STARTED -> STARTED; the winner starts the thread. */
static void ensure_started(nr_loop_t *l) {
  int expect = NR_NOT_STARTED;
  if (atomic_compare_exchange_strong(&l->state, &expect, NR_STARTED))
    start_thread(l);
}

/* ---- submission ---------------------------------------------------------- */

void nr__loop_wakeup(nr_loop_t *l) {
  uint64_t one = 1;
  atomic_fetch_add_explicit(&l->wakeups, 1, memory_order_relaxed);
  ssize_t n = nr_sys_write(l->wakefd, &one, sizeof one);
  (void)n;  /* EAGAIN means the counter is saturated: already awake */
}

/* Netty's coalesced wakeup: write the eventfd only if the loop is blocked or
 * about to block. The loop publishes its deadline before it re-checks the
 * queue; we pushed before reading it (both seq_cst), so one side sees the
 * other. The plain load first keeps the line shared while the loop runs. */
static inline void wakeup_if_blocked(nr_loop_t *l) {
  if (atomic_load(&l->next_wakeup) != NR_AWAKE &&
      atomic_exchange(&l->next_wakeup, NR_AWAKE) != NR_AWAKE)
    nr__loop_wakeup(l);
}

static int submit(nr_loop_t *l, nr_mpsc_t *q, nr_task_t *t) {
  /* Checked twice: the first check keeps rejected producers off the
   * counter, so a loop waiting for it to drain cannot be starved. */
  if (atomic_load_explicit(&l->state, memory_order_relaxed) >= NR_SHUTDOWN)
    return NR_EREJECTED;
  atomic_fetch_add(&l->producers, 1);
  int st = atomic_load(&l->state);
  if (st >= NR_SHUTDOWN) {
    atomic_fetch_sub(&l->producers, 1);
    return NR_EREJECTED;
  }
  if (l->max_pending && atomic_load_explicit(&l->enqueued,
                                             memory_order_relaxed) -
                                atomic_load_explicit(&l->dequeued,
                                                     memory_order_relaxed) >=
                            l->max_pending) {
    atomic_fetch_sub(&l->producers, 1);
    return NR_EFULL;
  }
  atomic_fetch_add_explicit(&l->enqueued, 1, memory_order_relaxed);
  nr__mpsc_push(q, t);
  atomic_fetch_sub_explicit(&l->producers, 1, memory_order_release);
  if (st == NR_NOT_STARTED)
    ensure_started(l);
  if (current != l)
    wakeup_if_blocked(l);
  return 0;
}

int nr_loop_execute_task(nr_loop_t *l, nr_task_t *t) {
  t->flags = 0;
  return submit(l, &l->tasks, t);
}

static int submit_owned(nr_loop_t *l, nr_mpsc_t *q, nr_task_fn fn,
                        void *arg) {
  nr_task_t *t = malloc(sizeof *t);
  if (t == NULL)
    return -ENOMEM;
  t->fn = fn;
  t->arg = arg;
  t->flags = TASK_OWNED;
  int rc = submit(l, q, t);
  if (rc < 0)
    free(t);
  return rc;
}

int nr_loop_execute(nr_loop_t *l, nr_task_fn fn, void *arg) {
  return submit_owned(l, &l->tasks, fn, arg);
}

int nr_loop_after_iteration(nr_loop_t *l, nr_task_fn fn, void *arg) {
  return submit_owned(l, &l->tail_tasks, fn, arg);
}

int nr_loop_add_shutdown_hook(nr_loop_t *l, nr_task_fn fn, void *arg) {
  nr_hook_t *h = malloc(sizeof *h);
  if (h == NULL)
    return -ENOMEM;
  h->fn = fn;
  h->arg = arg;
  pthread_mutex_lock(&l->hook_lock);
  if (nr_loop_is_shutdown(l)) {
    pthread_mutex_unlock(&l->hook_lock);
    free(h);
    return NR_EREJECTED;
  }
  h->next = l->hooks;
  l->hooks = h;
  pthread_mutex_unlock(&l->hook_lock);
  return 0;
}

/* ---- running tasks ------------------------------------------------------- */

bool nr__loop_has_tasks(nr_loop_t *l) {
  return l->ready != NULL || !nr__mpsc_empty(&l->tasks) ||
         !nr__mpsc_empty(&l->tail_tasks);
}

bool nr_loop_has_pending_tasks(nr_loop_t *l) {
  NR_ASSERT_LOOP(l);                   /* its heap is the thread's */
  return nr__loop_has_tasks(l) ||
         (nr__heap_peek(&l->heap) && nr__next_deadline(l) <= nr_now());
}

static inline void run_task(nr_loop_t *l, nr_task_t *t) {
  nr_task_fn fn = t->fn;
  void *arg = t->arg;
  if (t->flags & TASK_OWNED)
    free(t);
  atomic_store_explicit(&l->task_fn, (uintptr_t)fn, memory_order_relaxed);
  int rc = fn(arg);
  if (rc != 0)
    nr_log(NR_LOG_WARN, "%s: a task failed: %s", l->name, nr_strerror(rc));
}

static nr_task_t *next_task(nr_loop_t *l) {
  nr_task_t *t = l->ready;
  if (t != NULL) {
    l->ready = atomic_load_explicit(&t->next, memory_order_relaxed);
    return t;
  }
  return nr__mpsc_pop(&l->tasks);
}

static bool run_tail_tasks(nr_loop_t *l) {
  nr_task_t *t;
  bool ran = false;
  while ((t = nr__mpsc_pop(&l->tail_tasks)) != NULL) {
    atomic_fetch_add_explicit(&l->dequeued, 1, memory_order_relaxed);
    run_task(l, t);
    ran = true;
  }
  return ran;
}

/* ---- the longest run (stats max_busy) -------------------------------------
 *
 * A run is what the stall watchdog tells apart by its mark: the I/O
 * processing of an iteration, or one task (with what follows it until the
 * next task or select). The loop times runs from the clock reads it makes
 * anyway -- its wake-up (start_run, loop.c), the start and the end of its
 * task phase, every 64th task -- and keeps the longest in longest_run: a
 * stretch between two of them that holds a single run is that run. Tasks
 * are not timed one by one, as a clock read costs about what a task does;
 * instead, after a task that the watchdog saw in progress (wd_seen: the
 * time of its sample before, when that task had not begun), the loop reads
 * the clock and counts the run from the later of that time and its last
 * clock read. That exceeds the run only by the tasks before it since then,
 * which together lasted less than a watchdog period. On the echo and HTTP
 * paths, where no task runs, the cost is a subtraction and a compare per
 * iteration. */
static inline void note_run(nr_loop_t *l, uint64_t len) {
  if (len > atomic_load_explicit(&l->longest_run, memory_order_relaxed))
    atomic_store_explicit(&l->longest_run, len, memory_order_relaxed);
}

/* After a task the watchdog saw (seen != 0): time it; the new `from`. */
static __attribute__((noinline)) uint64_t time_seen(nr_loop_t *l,
                                                    uint64_t from) {
  uint64_t seen = atomic_exchange_explicit(&l->wd_seen, 0,
                                           memory_order_relaxed);
  uint64_t now = nr_now();
  note_run(l, now - (seen > from ? seen : from));
  return now;
}

/* The one task loop under both of Netty's runAllTasks: due timers, then
 * queued tasks; when `bounded`, stop once `timeout` ns have passed,
 * checking the clock every 64 tasks (so a zero timeout runs at most 64);
 * when not, fetch the timers that fell due meanwhile every 64 tasks. Tail
 * tasks run afterwards. Returns whether any task ran. Times the runs as
 * "the longest run" above says: `from` is the last clock read, `alone`
 * whether one task has run since. */
static inline bool run_tasks(nr_loop_t *l, uint64_t timeout, bool bounded) {
  uint64_t start = nr_now(), n = 0, io = l->run_from;
  if (io != 0)
    note_run(l, start - io);            /* the I/O run: exact */
  /* A wd_seen left from the I/O run times the first task: from `start`. */
  uint64_t from = start;
  int since = 0;                        /* tasks run since `from` */
  nr__timers_fetch_due(l, start);
  nr_task_t *t;
  for (;;) {
    bool from_queue = l->ready == NULL;
    if ((t = next_task(l)) == NULL)
      break;
    if (from_queue)
      nr__stat_add(&l->dequeued, 1);
    /* Counted before it runs: whoever learns of a task's effects (say, a
     * promise it completed) then also sees it in the stats. */
    nr__stat_add(&l->tasks_run, 1);
    run_task(l, t);
    since++;
    if (__builtin_expect(
            atomic_load_explicit(&l->wd_seen, memory_order_relaxed) != 0, 0)) {
      from = time_seen(l, from);
      since = 0;
    }
    if ((++n & 63) == 0) {
      uint64_t now = nr_now();
      if (since == 1)
        note_run(l, now - from);
      from = now;
      since = 0;
      if (bounded && now - start >= timeout)
        break;
      if (!bounded)
        nr__timers_fetch_due(l, now);
    }
  }
  bool tails = run_tail_tasks(l);
  l->spin = l->dequeued_seen != atomic_load_explicit(&l->dequeued,
                                                     memory_order_relaxed);
  l->dequeued_seen = atomic_load_explicit(&l->dequeued, memory_order_relaxed);
  if (n || (tails && io != 0)) {
    uint64_t end = nr_now();
    if (since == 1)
      note_run(l, end - from);          /* the last task and the tail's */
    else if (n == 0)
      note_run(l, end - io);            /* the I/O run and the tail's */
    if (n) {
      l->last_execution = end;
      nr__stat_add(&l->task_time, end - start);
    }
  }
  return n > 0;
}

bool nr__run_all_tasks(nr_loop_t *l) { return run_tasks(l, 0, false); }

bool nr__run_tasks_for(nr_loop_t *l, uint64_t timeout) {
  return run_tasks(l, timeout, true);
}

/* ---- shutdown ------------------------------------------------------------ */

nr_promise_t *nr_loop_shutdown_gracefully(nr_loop_t *l, uint64_t quiet,
                                          uint64_t timeout) {
  if (quiet > timeout)
    quiet = timeout;
  pthread_mutex_lock(&l->hook_lock);
  int old = atomic_load(&l->state);
  while (old < NR_SHUTTING_DOWN &&
         !atomic_compare_exchange_weak(&l->state, &old, NR_SHUTTING_DOWN))
    ;
  if (old < NR_SHUTTING_DOWN) {
    l->quiet = quiet;
    l->timeout = timeout;
    uint64_t now = nr_now();       /* for the stall watchdog; saturated */
    atomic_store_explicit(&l->shutdown_deadline,
                          timeout >= NR_NONE - now ? NR_NONE : now + timeout,
                          memory_order_relaxed);
  }
  pthread_mutex_unlock(&l->hook_lock);
  if (old == NR_NOT_STARTED && !l->external)
    start_thread(l);
  if (old < NR_SHUTTING_DOWN)
    nr__loop_wakeup(l);
  return l->termination;
}

static bool run_hooks(nr_loop_t *l) {
  pthread_mutex_lock(&l->hook_lock);
  nr_hook_t *h = l->hooks;
  l->hooks = NULL;
  pthread_mutex_unlock(&l->hook_lock);
  bool ran = h != NULL;
  for (nr_hook_t *n; h; h = n) {
    n = h->next;
    int rc = h->fn(h->arg);
    if (rc)
      nr_log(NR_LOG_WARN, "%s: a shutdown hook failed: %s", l->name,
             nr_strerror(rc));
    free(h);
  }
  return ran;
}

/* Netty's confirmShutdown: true when the loop may stop. Called repeatedly;
 * between calls the loop waits at most SHUTDOWN_POLL for new tasks. */
bool nr__confirm_shutdown(nr_loop_t *l) {
  if (!nr_loop_is_shutting_down(l))
    return false;
  nr__cancel_timers(l);
  if (l->shutdown_start == 0) {
    l->shutdown_start = nr_now();
    l->last_execution = l->shutdown_start;  /* the quiet period starts now */
  }
  /* Bounded, so producers that never pause cannot hold off the timeout. */
  bool ran = nr__run_tasks_for(l, SHUTDOWN_POLL);
  ran |= run_hooks(l);
  uint64_t now = nr_now();
  /* Timed out also when the shutdown was asked long before this loop got
   * to it: a stuck run held it up (and the stall watchdog broke it). */
  uint64_t asked = atomic_load_explicit(&l->shutdown_deadline,
                                        memory_order_relaxed);
  bool timed_out = now - l->shutdown_start > l->timeout ||
                   (asked != 0 && now >= asked);
  bool down = nr_loop_is_shutdown(l);
  if ((l->channels != NULL || nr__loop_held(l)) && !timed_out && !down)
    return false;                  /* channels still flushing what they took,
                                      or work owed still to come back */
  if (ran)
    return down || l->quiet == 0;
  if (down || timed_out)
    return true;
  return now - l->last_execution > l->quiet;
}

uint64_t nr__shutdown_poll_deadline(nr_loop_t *l, uint64_t deadline) {
  (void)l;
  uint64_t poll = nr_now() + SHUTDOWN_POLL;
  return deadline < poll ? deadline : poll;
}

/* After run() returned: no new tasks from here on, then the final drain. */
static void terminate(nr_loop_t *l) {
  int old = atomic_load(&l->state);
  while (old < NR_SHUTTING_DOWN &&
         !atomic_compare_exchange_weak(&l->state, &old, NR_SHUTTING_DOWN))
    ;
  while (!nr__confirm_shutdown(l))
    nr__loop_iteration(l);
  atomic_store(&l->state, NR_SHUTDOWN);
  while (atomic_load(&l->producers) != 0)
    sched_yield();                 /* a submitter is mid-push: let it land */
  nr__confirm_shutdown(l);
  nr__run_all_tasks(l);  /* finite now: no task can be added */
  nr__channels_abort_all(l);
  nr__run_all_tasks(l);  /* tasks the aborts queued */
  nr__watch_remove(l);             /* before on_exit closes what it watches */
  atomic_store_explicit(&l->busy_since, 0, memory_order_relaxed);
  if (l->on_exit)
    l->on_exit(l, l->ud);
  atomic_store(&l->state, NR_TERMINATED);
  nr_log(NR_LOG_DEBUG, "%s terminated", l->name);
  nr_promise_set_success(l->termination, NULL, NULL);
}

void nr_loop_free(nr_loop_t *l) {
  if (l == NULL)
    return;
  if (l->external && l->termination &&
      atomic_load(&l->state) != NR_TERMINATED) {
    atomic_store(&l->state, NR_SHUTDOWN);
    while (atomic_load(&l->producers) != 0)
      sched_yield();
    nr__cancel_timers(l);
    nr__run_all_tasks(l);
    atomic_store(&l->state, NR_TERMINATED);
    nr_promise_set_success(l->termination, NULL, NULL);
    if (current == l)
      nr__loop_set_current(NULL);
  }
  nr__watch_remove(l);
  if (l->thread_started && l->sim == NULL &&
      !pthread_equal(l->thread, pthread_self()))
    pthread_join(l->thread, NULL);
  atomic_store(&l->state, NR_TERMINATED);  /* (never started) rejects all */
  nr__selector_close(l);
  nr__sim_detach(l);
  nr__heap_free(&l->heap);
  for (nr_hook_t *h = l->hooks, *n; h; h = n) {
    n = h->next;
    free(h);
  }
  l->hooks = NULL;
  nr__loop_release(l);
}

void nr_loop_retain(nr_loop_t *l) { nr__loop_retain(l); }
void nr_loop_release(nr_loop_t *l) { nr__loop_release(l); }

nr_loop_t *nr__loop_retain(nr_loop_t *l) {
  atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
  return l;
}

/* The last reference frees what a terminated loop still answers with: its
 * state, name and termination future. */
void nr__loop_release(nr_loop_t *l) {
  if (atomic_fetch_sub(&l->refs, 1) != 1)
    return;
  pthread_mutex_destroy(&l->hook_lock);
  nr_promise_release(l->termination);
  free(l->name);
  free(l);
}

int nr_loop_run_once(nr_loop_t *l, uint64_t timeout) {
  if (!l->external || current != l)
    return -EPERM;
  uint64_t before = atomic_load(&l->tasks_run), now = nr_now();
  /* Saturate: callers pass "deadline - now" for a deadline of UINT64_MAX,
   * and a sum that wrapped around would be a deadline in the past, making
   * every wait a busy poll. */
  l->run_once_deadline = timeout >= NR_NONE - now ? NR_NONE : now + timeout;
  nr__loop_iteration(l);
  l->run_once_deadline = 0;
  return (int)(atomic_load(&l->tasks_run) - before);
}

void nr_loop_stats(const nr_loop_t *cl, nr_loop_stats_t *o) {
  nr_loop_t *l = (nr_loop_t *)cl;
  uint64_t enq = atomic_load(&l->enqueued), deq = atomic_load(&l->dequeued);
  o->name = l->name;
  o->state = atomic_load(&l->state);
  o->pending_tasks = enq > deq ? enq - deq : 0;
  o->scheduled_tasks = atomic_load(&l->timer_count);
  o->channels = atomic_load(&l->channel_count);
  o->tasks_run = atomic_load(&l->tasks_run);
  o->io_events = atomic_load(&l->io_events);
  o->wakeups = atomic_load(&l->wakeups);
  o->selector_rebuilds = atomic_load(&l->rebuilds);
  o->iterations = atomic_load(&l->iterations);
  o->io_time_ns = atomic_load(&l->io_time);
  o->task_time_ns = atomic_load(&l->task_time);
  o->stalls = atomic_load(&l->stalls);
  /* The longest run that ended, timed on the loop; the watchdog's sample
   * of one still going on (a stuck loop times nothing). */
  uint64_t timed = atomic_load(&l->longest_run),
           sampled = atomic_load(&l->max_busy);
  o->max_busy_ns = timed > sampled ? timed : sampled;
  uint64_t since = atomic_load_explicit(&l->busy_since, memory_order_relaxed),
           now = nr_now();
  o->busy_ns = since && now > since ? now - since : 0;
  o->lag_ns = nr_loop_lag(l);
}

uint64_t nr_loop_lag(nr_loop_t *l) {
  uint64_t lag = atomic_load_explicit(&l->lag, memory_order_relaxed),
           at = atomic_load_explicit(&l->lag_at, memory_order_relaxed),
           now = nr_now();
  return now < at ? lag : lag > now - at ? lag - (now - at) : 0;
}

uint64_t nr_loop_stall_mark(nr_loop_t *l) {
  NR_ASSERT_LOOP(l);
  return atomic_load_explicit(&l->busy_since, memory_order_relaxed) +
         atomic_load_explicit(&l->tasks_run, memory_order_relaxed);
}

bool nr_loop_stall_claim(nr_loop_t *l, uint64_t mark) {
  return atomic_exchange(&l->stall_claimed, mark) != mark;
}
