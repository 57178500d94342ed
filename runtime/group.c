/*
 * group.c -- event-loop groups (Netty's MultithreadEventExecutorGroup): N
 * loops created up front, a round-robin chooser with a power-of-two fast
 * path, shutdown of every child, and a termination future that completes
 * once all children have terminated.
 *
 * The chooser (nr_group_next: accepted channels, connects, servers, the
 * group's tasks) passes over a loop that the stall watchdog reports
 * stalled (nr_loop_t.stalled, stall.c), so that one stuck handler does
 * not take every n-th new connection with it; its turn goes to the next
 * loop that is not. The cost is one relaxed load, of the cache line
 * producers read anyway (the loop's state).
 */
#include <stdio.h>
#include <unistd.h>

#include "internal.h"

struct nr_group_s {
  _Alignas(NR_CACHELINE) _Atomic unsigned idx;   /* chooser position */
  _Atomic int terminated;                        /* children terminated */
  char *name;
  int n;
  unsigned mask;                                 /* n - 1 when n is 2^k */
  nr_loop_t **loops;
  nr_promise_t *termination;
  void *data;
};

static void child_terminated(nr_promise_t *p, void *arg) {
  (void)p;
  nr_group_t *g = arg;
  if (atomic_fetch_add(&g->terminated, 1) + 1 == g->n)
    nr_promise_set_success(g->termination, NULL, NULL);
}

nr_group_t *nr_group_new(const nr_group_opts_t *o) {
  nr_group_t *g = aligned_alloc(NR_CACHELINE, sizeof *g);
  if (g == NULL)
    return NULL;
  memset(g, 0, sizeof *g);
  /* A simulated host has NR_SIM_CPUS, whatever machine runs it. */
  g->n = o->threads > 0 ? o->threads
         : nr_sim_current() ? NR_SIM_CPUS : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (g->n < 1)
    g->n = 1;
  g->mask = (g->n & (g->n - 1)) == 0 ? (unsigned)g->n - 1 : 0;
  g->name = strdup(o->name ? o->name : "group");
  g->loops = calloc((size_t)g->n, sizeof *g->loops);
  g->termination = nr_promise_new();
  if (!g->name || !g->loops || !g->termination)
    goto fail;
  for (int i = 0; i < g->n; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s-%d", g->name, i + 1);
    nr_loop_opts_t lo = {.name = name, .io_ratio = o->io_ratio,
                         .rebuild_threshold = o->rebuild_threshold,
                         .max_pending = o->max_pending,
                         .on_start = o->on_start, .on_exit = o->on_exit,
                         .ud = o->ud, .stall_threshold = o->stall_threshold,
                         .stall_timeout = o->stall_timeout,
                         .on_stall = o->on_stall};
    if ((g->loops[i] = nr_loop_new(&lo)) == NULL)
      goto fail;
    g->loops[i]->group = g;
    nr_promise_add_listener(g->loops[i]->termination, NULL, child_terminated,
                            g);
  }
  return g;
fail:
  for (int i = 0; g->loops && i < g->n && g->loops[i]; i++)
    nr_loop_free(g->loops[i]);
  free(g->loops);
  free(g->name);
  if (g->termination)
    nr_promise_release(g->termination);
  free(g);
  errno = ENOMEM;
  return NULL;
}

void nr_group_free(nr_group_t *g) {
  if (g == NULL)
    return;
  for (int i = 0; i < g->n; i++)
    nr_loop_free(g->loops[i]);
  free(g->loops);
  free(g->name);
  nr_promise_release(g->termination);
  free(g);
}

static inline unsigned slot(const nr_group_t *g, unsigned i) {
  return g->mask || g->n == 1 ? i & g->mask : i % (unsigned)g->n;
}

static inline bool is_stalled(const nr_loop_t *l) {
  return atomic_load_explicit(&((nr_loop_t *)l)->stalled,
                              memory_order_relaxed);
}

/* Loop i's turn when it is stalled: the next loop that is not, or loop i
 * when every one is. */
static __attribute__((noinline)) nr_loop_t *past_stalled(nr_group_t *g,
                                                         unsigned i) {
  for (unsigned k = 1; k < (unsigned)g->n; k++) {
    nr_loop_t *l = g->loops[slot(g, i + k)];
    if (!is_stalled(l))
      return l;
  }
  return g->loops[slot(g, i)];
}

nr_loop_t *nr_group_next(nr_group_t *g) {
  unsigned i = atomic_fetch_add_explicit(&g->idx, 1, memory_order_relaxed);
  nr_loop_t *l = g->loops[slot(g, i)];
  return __builtin_expect(!is_stalled(l), 1) ? l : past_stalled(g, i);
}

int nr_group_size(const nr_group_t *g) { return g->n; }
const char *nr_group_name(const nr_group_t *g) { return g->name; }
void *nr_group_data(const nr_group_t *g) { return g->data; }
void nr_group_set_data(nr_group_t *g, void *data) { g->data = data; }
nr_loop_t *nr_group_loop(const nr_group_t *g, int i) {
  return i >= 0 && i < g->n ? g->loops[i] : NULL;
}

nr_promise_t *nr_group_shutdown_gracefully(nr_group_t *g, uint64_t quiet,
                                           uint64_t timeout) {
  for (int i = 0; i < g->n; i++)
    nr_loop_shutdown_gracefully(g->loops[i], quiet, timeout);
  return g->termination;
}

nr_promise_t *nr_group_termination_future(const nr_group_t *g) {
  return g->termination;
}

static bool all(const nr_group_t *g, bool (*pred)(const nr_loop_t *)) {
  for (int i = 0; i < g->n; i++)
    if (!pred(g->loops[i]))
      return false;
  return true;
}

bool nr_group_is_shutting_down(const nr_group_t *g) {
  return all(g, nr_loop_is_shutting_down);
}
bool nr_group_is_shutdown(const nr_group_t *g) {
  return all(g, nr_loop_is_shutdown);
}
bool nr_group_is_terminated(const nr_group_t *g) {
  return all(g, nr_loop_is_terminated);
}
