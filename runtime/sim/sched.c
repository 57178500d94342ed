/*
 * sim/sched.c -- simulated loops and the scheduler that steps them.
 *
 * Every loop made in a world runs on the world's thread: each as a fiber
 * (its own stack; thread_main of executor.c runs there as on a thread),
 * except the main context's loop (the external loop of the thread that
 * entered the world: sim.run's caller), which runs on the thread's own
 * stack and is the scheduler. A loop gives the scheduler its turn back
 * whenever it selects (poll.c's epoll_wait): blocked until its selector
 * has an event or its deadline comes, or still runnable -- each select is
 * a scheduling point, so loops interleave at the grain of an iteration.
 *
 * The scheduler runs only while the main loop waits (sim_schedule): it
 * runs the network's events that are due, wakes the loops whose deadline
 * came, picks one of the runnable loops at random (the seed's choice:
 * that is the order the seed draws) and switches to it, until the main
 * loop is picked. When nothing can run, the clock jumps to the next event
 * or deadline; when there is none either, nothing can ever happen and the
 * main loop's wait fails (w->stuck, NR_ESIMSTUCK).
 *
 * Fibers switch with a few instructions of assembly on x86-64 (ucontext's
 * swapcontext makes a system call for the signal mask on every switch);
 * elsewhere with ucontext. Under AddressSanitizer and ThreadSanitizer
 * every switch is announced to them. A fiber's stack is mapped with a guard page below it.
 *
 * Threads: the world's thread only.
 */
#include <stdio.h>
#include <sys/mman.h>

#include "world.h"

#if !defined(__x86_64__) || defined(NR_SIM_UCONTEXT)
#define USE_UCONTEXT 1
#include <ucontext.h>
#endif

#define STACK_SIZE ((size_t)1 << 20)       /* per fiber, mapped lazily */
#define GUARD ((size_t)4096)
#define SCRATCH ((size_t)16384)            /* nr_loop_scratch */
/* Fiber i's mapping is at STACKS + i * STRIDE when that is free: the same
 * address in every run of a seed, in-process or not, so that what Lua
 * derives from addresses on the stack (a state's string hash seed) is the
 * same too. */
#define STACKS ((uintptr_t)0x6e0000000000ull)
#define STRIDE ((uintptr_t)4 << 20)

/* ThreadSanitizer is told of every switch (as of a thread's stack
 * changing hands: __tsan_switch_to_fiber), and fibers take the address
 * the kernel gives: ThreadSanitizer's shadow owns STACKS, and it ends the
 * process at a fixed mapping there. So a seed replays under it in
 * process but not across processes (the determinism check runs without
 * it). */
#if defined(__SANITIZE_THREAD__)
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
#define TSAN_FIBERS 1
#define TSAN_SWITCH(fiber) __tsan_switch_to_fiber(fiber, 0)
#else
#define TSAN_FIBERS 0
#define TSAN_SWITCH(fiber) ((void)(fiber))
#endif

#if defined(__SANITIZE_ADDRESS__)
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom,
                                    size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save,
                                     const void **bottom_old,
                                     size_t *size_old);
#define ASAN_START(save, bottom, size) \
  __sanitizer_start_switch_fiber(save, bottom, size)
#define ASAN_FINISH(save, bottom, size) \
  __sanitizer_finish_switch_fiber(save, bottom, size)
#else
#define ASAN_START(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#define ASAN_FINISH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#endif

struct sim_fiber_s {
#ifdef USE_UCONTEXT
  ucontext_t ctx;
#else
  void *sp;                  /* saved stack pointer while switched out */
#endif
  char *mem;                 /* the mapping: guard page, scratch, stack */
  size_t size;               /* of the stack */
  void *fake;                /* ASan's fake stack while switched out */
  void *tsan;                /* ThreadSanitizer's fiber (NULL without it) */
};

/* The scheduler's (main context's) side of every switch. */
#ifdef USE_UCONTEXT
static ucontext_t sched_ctx;
#else
static void *sched_sp;
#endif
static void *sched_fake;
static void *sched_tsan;     /* the main context, to ThreadSanitizer */
static const void *sched_bottom;
static size_t sched_size;

/* ---- the switch -------------------------------------------------------------------- */

#ifndef USE_UCONTEXT
/* sim_switch(&save, to): push the callee-saved registers and the
 * floating-point control words, save the stack pointer in *save, load
 * `to`, pop theirs, return on their stack. sim_start is where a new
 * fiber's first switch returns to: it calls r13(r12). */
void sim_switch(void **save, void *to);
void sim_start(void);
__asm__(".text\n"
        ".globl sim_switch\n"
        ".hidden sim_switch\n"
        ".type sim_switch,@function\n"
        "sim_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size sim_switch, .-sim_switch\n"
        ".globl sim_start\n"
        ".hidden sim_start\n"
        ".type sim_start,@function\n"
        "sim_start:\n"
        "  movq %r12, %rdi\n"
        "  callq *%r13\n"
        "  ud2\n"
        ".size sim_start, .-sim_start\n");
#endif

static void fiber_main(simloop_t *s);

#ifdef USE_UCONTEXT
static simloop_t *starting;
static void uc_entry(void) { fiber_main(starting); }
#endif

static int fiber_new(simloop_t *s) {
  sim_fiber_t *f = calloc(1, sizeof *f);
  if (f == NULL)
    return -ENOMEM;
  f->size = STACK_SIZE;
  size_t len = GUARD + SCRATCH + f->size;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK;
  void *at = (void *)(STACKS + (uintptr_t)(s->id % 65536) * STRIDE);
  f->mem = MAP_FAILED;
  if (!TSAN_FIBERS)
    f->mem = mmap(at, len, PROT_READ | PROT_WRITE, flags | MAP_FIXED_NOREPLACE,
                  -1, 0);
  if (f->mem != MAP_FAILED && f->mem != at) {    /* (an old kernel: a hint) */
    munmap(f->mem, len);
    f->mem = MAP_FAILED;
  }
  if (f->mem == MAP_FAILED)
    f->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (f->mem == MAP_FAILED) {
    free(f);
    return -ENOMEM;
  }
  mprotect(f->mem, GUARD, PROT_NONE);
#if TSAN_FIBERS
  f->tsan = __tsan_create_fiber(0);
#endif
  char *bottom = f->mem + GUARD + SCRATCH;
#ifdef USE_UCONTEXT
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = bottom;
  f->ctx.uc_stack.ss_size = f->size;
  f->ctx.uc_link = NULL;
  makecontext(&f->ctx, uc_entry, 0);
#else
  /* The frame sim_switch pops: control words, r15 r14 r13 r12 rbx rbp,
   * then sim_start as the return address, at an address 8 mod 16 so that
   * sim_start's call is made on an aligned stack. */
  uintptr_t top = ((uintptr_t)(bottom + f->size) & ~(uintptr_t)15) - 8;
  uint64_t *sp = (uint64_t *)top;
  *sp = (uint64_t)(uintptr_t)sim_start;
  *--sp = 0;                                   /* rbp */
  *--sp = 0;                                   /* rbx */
  *--sp = (uint64_t)(uintptr_t)s;              /* r12: the argument */
  *--sp = (uint64_t)(uintptr_t)fiber_main;     /* r13: the function */
  *--sp = 0;                                   /* r14 */
  *--sp = 0;                                   /* r15 */
  *--sp = 0x037f00001f80ull;                   /* fpu cw 0x37f, mxcsr 0x1f80 */
  f->sp = sp;
#endif
  s->fiber = f;
  return 0;
}

static void fiber_free(sim_fiber_t *f) {
  if (f == NULL)
    return;
#if TSAN_FIBERS
  __tsan_destroy_fiber(f->tsan);
#endif
  munmap(f->mem, GUARD + SCRATCH + f->size);
  free(f);
}

void *nr_loop_scratch(const nr_loop_t *l, size_t *size) {
  simloop_t *s = l ? l->sim : NULL;
  if (s == NULL || s->fiber == NULL)
    return NULL;
  *size = SCRATCH;
  return s->fiber->mem + GUARD;
}

/* The main context switches to fiber s and is back once s yields. */
static void switch_in(simloop_t *s) {
  sim_fiber_t *f = s->fiber;
  ASAN_START(&sched_fake, f->mem + GUARD + SCRATCH, f->size);
#if TSAN_FIBERS
  sched_tsan = __tsan_get_current_fiber();
#endif
  TSAN_SWITCH(f->tsan);
#ifdef USE_UCONTEXT
  starting = s;
  swapcontext(&sched_ctx, &f->ctx);
#else
  sim_switch(&sched_sp, f->sp);
#endif
  ASAN_FINISH(sched_fake, NULL, NULL);
}

/* Fiber s gives the main context its turn (dying: never to come back). */
static void switch_out(simloop_t *s, bool dying) {
  sim_fiber_t *f = s->fiber;
  ASAN_START(dying ? NULL : &f->fake, sched_bottom, sched_size);
  TSAN_SWITCH(sched_tsan);
#ifdef USE_UCONTEXT
  swapcontext(&f->ctx, &sched_ctx);
#else
  sim_switch(&f->sp, sched_sp);
#endif
  ASAN_FINISH(f->fake, &sched_bottom, &sched_size);
}

/* ---- the runnable set ------------------------------------------------------------------ */

static void runnable_add(nr_sim_t *w, simloop_t *s) {
  if (s->ridx >= 0)
    return;
  if (w->nrunnable == w->rcap) {
    int cap = w->rcap ? w->rcap * 2 : 16;
    simloop_t **v = realloc(w->runnable, (size_t)cap * sizeof *v);
    if (v == NULL) {
      nr_log(NR_LOG_ERROR, "sim: out of memory scheduling a loop");
      return;
    }
    w->runnable = v;
    w->rcap = cap;
  }
  s->ridx = w->nrunnable;
  w->runnable[w->nrunnable++] = s;
}

/* Out of the set, keeping the others' order (the seed's choices index
 * it, so its order must be the same in every run of a seed). */
static void runnable_remove(nr_sim_t *w, simloop_t *s) {
  if (s->ridx < 0)
    return;
  for (int i = s->ridx; i + 1 < w->nrunnable; i++) {
    w->runnable[i] = w->runnable[i + 1];
    w->runnable[i]->ridx = i;
  }
  w->nrunnable--;
  s->ridx = -1;
}

void sim_wake(simloop_t *s) {
  if (s->state != SL_BLOCKED)
    return;
  s->state = SL_RUNNABLE;
  runnable_add(s->w, s);
}

/* ---- loops ------------------------------------------------------------------------------- */

struct nr_simloop_s *nr__sim_attach(nr_loop_t *l) {
  nr_sim_t *w = sim_here();
  if (__builtin_expect(w == NULL, 1))
    return NULL;
  simloop_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;                 /* (then it is a real loop: logged below) */
  nr_loop_t *cur = nr_loop_current();
  sim_retain(w);
  s->w = w;
  s->loop = l;
  s->id = ++w->loop_ids;
  s->ridx = -1;
  s->state = SL_NEW;
  s->host = cur && cur->sim && !cur->sim->main ? cur->sim->host
            : w->creating ? w->creating : w->hosts[0];
  if (l->external) {
    if (w->main != NULL) {       /* one main context per world */
      nr_sim_release(w);
      free(s);
      errno = EBUSY;
      return NULL;
    }
    s->main = true;
    s->state = SL_RUNNABLE;      /* it is running: the caller */
    w->main = s;
  }
  s->next = w->loops;
  w->loops = s;
  sim_trace(w, 0x10, s->id, (uint64_t)s->host->idx);
  return s;
}

int nr__sim_start(nr_loop_t *l, void *(*fn)(void *)) {
  simloop_t *s = l->sim;
  int rc = fiber_new(s);
  if (rc < 0)
    return rc;
  s->fn = fn;
  s->state = SL_RUNNABLE;
  runnable_add(s->w, s);
  return 0;
}

static void fiber_main(simloop_t *s) {
  ASAN_FINISH(NULL, &sched_bottom, &sched_size);
  s->fn(s->loop);
  s->state = SL_DONE;
  runnable_remove(s->w, s);
  sim_trace(s->w, 0x11, s->id, 0);
  switch_out(s, true);
  abort();                       /* never resumed */
}

void nr__sim_detach(nr_loop_t *l) {
  simloop_t *s = l->sim;
  if (s == NULL)
    return;
  nr_sim_t *w = s->w;
  runnable_remove(w, s);
  for (simloop_t **pp = &w->loops; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  if (w->main == s)
    w->main = NULL;
  if (s->ep != NULL)
    s->ep = NULL;
  fiber_free(s->fiber);
  l->sim = NULL;
  free(s);
  nr_sim_release(w);
}

bool nr_loop_is_simulated(const nr_loop_t *l) { return l && l->sim != NULL; }

nr_sim_host_t *nr_sim_loop_host(const nr_loop_t *l) {
  return l && l->sim ? l->sim->host : NULL;
}

bool nr__sim_stuck(nr_loop_t *l) {
  return l->sim != NULL && l->sim->w->stuck;
}

/* ---- the scheduler ------------------------------------------------------------------------ */

/* Wake the blocked loops whose deadline came; the earliest deadline left. */
static uint64_t wake_due(nr_sim_t *w) {
  uint64_t next = NR_NONE;
  for (simloop_t *s = w->loops; s; s = s->next) {
    if (s->state != SL_BLOCKED)
      continue;
    if (s->deadline <= w->now)
      sim_wake(s);
    else if (s->deadline < next)
      next = s->deadline;
  }
  return next;
}

/* Loops that never all block -- one re-arming a timer of no delay at a
 * deadline it then finds not yet passed, two that keep waking each other
 * -- would hold the clock still for ever, where real time would move on
 * under them (and end the first at once). Past STILL_STEPS steps without
 * a jump, each step moves the clock STILL_TICK, as a spin's reads do
 * (world.c). A busy instant of a normal world takes a few thousand. */
#define STILL_STEPS 200000
#define STILL_TICK ((uint64_t)10000)     /* ns: 10 us */

void sim_schedule(nr_sim_t *w) {
  simloop_t *m = w->main;
  w->stuck = false;
  for (;;) {
    sim_run_due(w);
    uint64_t next = wake_due(w);
    if (w->nrunnable == 0) {
      uint64_t ev = sim_next_event(w);
      if (ev < next)
        next = ev;
      if (next == NR_NONE || next > w->limit) {
        w->stuck = true;             /* nothing can ever happen (before */
        return;                      /* the limit) */
      }
      w->now = next;                 /* the clock jumps */
      w->still = 0;
      continue;
    }
    if (++w->still > STILL_STEPS)    /* a livelock: time passes as it would */
      w->now += STILL_TICK;
    simloop_t *s = w->runnable[w->nrunnable == 1 ? 0
                               : (int)(sim_rand(w) % (uint64_t)w->nrunnable)];
    w->stats.steps++;
    sim_trace(w, 0x12, s->id, 0);
    if (s == m)
      return;
    w->running = s;
    w->reads = 0;
    nr__loop_set_current(s->loop);
    switch_in(s);
    w->running = NULL;
    nr__loop_set_current(m ? m->loop : w->outer);
    if (s->state == SL_DONE) {     /* its stack goes now: the next run's */
      fiber_free(s->fiber);        /* loop of that id gets the address */
      s->fiber = NULL;
    }
  }
}

void sim_yield(simloop_t *s, bool block, uint64_t deadline) {
  if (block) {
    s->state = SL_BLOCKED;
    s->deadline = deadline;
    runnable_remove(s->w, s);
  }
  if (s->main) {
    if (block)
      sim_schedule(s->w);
    s->state = SL_RUNNABLE;
    runnable_add(s->w, s);
    s->w->reads = 0;
    return;
  }
  switch_out(s, false);
}

/* ---- a blocking wait on an executor ---------------------------------------------------- */

static void wake_waiter(nr_promise_t *p, void *arg) {
  (void)p;
  sim_wake(arg);
}

int nr_sim_wait(nr_promise_t *p) {
  nr_loop_t *l = nr_loop_current();
  simloop_t *s = l ? l->sim : NULL;
  if (s == NULL)
    return -EINVAL;
  if (nr_promise_is_done(p))
    return 0;
  nr_promise_add_listener(p, NULL, wake_waiter, s);
  while (!nr_promise_is_done(p)) {
    s->ep = NULL;
    sim_yield(s, true, NR_NONE);
    if (s->main && s->w->stuck)
      return NR_ESIMSTUCK;
  }
  return 0;
}
