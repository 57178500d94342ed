/*
 * sim/poll.c -- simulated descriptors: the table of their numbers, the
 * selectors (epoll, level-triggered, as the loops use it) and wakeups
 * (eventfd), and the transport seam's table (sys.h) that routes each call
 * on a simulated descriptor to its kind (TCP: tcp.c, UDP: udp.c).
 *
 * A selector keeps a ready list, as epoll does: a registration joins it
 * when its descriptor becomes ready for what it watches (sim_notify, from
 * whoever changed the descriptor), and leaves it when a wait finds it no
 * longer ready; a registration reported stays, moved to the back (level
 * triggered). So a wait costs what is ready, not what is registered. A
 * descriptor's readiness is computed when asked (sim_ready), from its
 * state: nothing is cached that could go stale.
 *
 * Where a loop would block in epoll_wait, it yields to the scheduler
 * (sched.c) until its selector has an event or its deadline comes; where
 * it would not, it yields too, still runnable: every wait is a point
 * where the seed may let another loop run first.
 *
 * Threads: the world's thread, except that a descriptor may be closed
 * from anywhere after its world was left (a collector freeing a group):
 * the table itself is guarded for that.
 */
#include <stdio.h>

#include "world.h"

const nr_transport_t *nr__transport;

/* ---- the descriptor table --------------------------------------------------------------- */

/* One table for the process, made once at its full size (the kernel maps
 * its pages as they are first written), so that a lookup -- every
 * simulated syscall makes one -- takes no lock: only making and freeing
 * numbers (the free list) does. */
#define TAB_MAX (1 << 20)

static pthread_mutex_t tab_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_fd_t *_Atomic *tab;
static int tab_next;                       /* slots ever used */
static int *free_slots, nfree, free_cap;

int sim_fd_add(sim_fd_t *d) {
  pthread_mutex_lock(&tab_lock);
  if (tab == NULL && (tab = calloc(TAB_MAX, sizeof *tab)) == NULL) {
    pthread_mutex_unlock(&tab_lock);
    errno = ENOMEM;
    return -1;
  }
  int slot;
  if (nfree > 0) {
    slot = free_slots[--nfree];
  } else if (tab_next < TAB_MAX) {
    slot = tab_next++;
  } else {
    pthread_mutex_unlock(&tab_lock);
    errno = EMFILE;
    return -1;
  }
  d->fd = NR_SIM_FD_BASE + slot;
  atomic_store_explicit(&tab[slot], d, memory_order_release);
  pthread_mutex_unlock(&tab_lock);
  sim_retain(d->w);
  return d->fd;
}

sim_fd_t *sim_fd_get(int fd, int kind) {
  unsigned slot = (unsigned)(fd - NR_SIM_FD_BASE);
  sim_fd_t *d = tab != NULL && slot < TAB_MAX
                ? atomic_load_explicit(&tab[slot], memory_order_acquire) : NULL;
  if (d == NULL || (kind && d->kind != kind)) {
    errno = d == NULL ? EBADF : ENOTSOCK;
    return NULL;
  }
  return d;
}

static void unregister_all(sim_fd_t *d);

void sim_fd_remove(sim_fd_t *d) {
  unregister_all(d);
  pthread_mutex_lock(&tab_lock);
  int slot = d->fd - NR_SIM_FD_BASE;
  atomic_store_explicit(&tab[slot], NULL, memory_order_relaxed);
  if (nfree == free_cap) {
    int cap = free_cap ? free_cap * 2 : 256;
    int *v = realloc(free_slots, (size_t)cap * sizeof *v);
    if (v != NULL) {
      free_slots = v;
      free_cap = cap;
    }
  }
  if (nfree < free_cap)
    free_slots[nfree++] = slot;          /* (else the slot is never reused) */
  pthread_mutex_unlock(&tab_lock);
  nr_sim_release(d->w);
}

/* ---- selectors ------------------------------------------------------------------------- */

struct sim_reg_s {
  struct sim_epoll_s *ep;
  sim_fd_t *d;
  uint32_t events;
  epoll_data_t data;
  bool ready;                          /* on ep's ready list */
  sim_reg_t *rprev, *rnext;            /* ep's ready list */
  sim_reg_t *dnext;                    /* d's registrations */
  sim_reg_t *eprev, *enext;            /* ep's registrations */
};

typedef struct sim_epoll_s {
  sim_fd_t base;
  sim_reg_t *regs;
  sim_reg_t *rhead, *rtail;
  simloop_t *waiter;                   /* the loop that waits on it */
} sim_epoll_t;

static void ready_push(sim_epoll_t *ep, sim_reg_t *r) {
  r->ready = true;
  r->rnext = NULL;
  r->rprev = ep->rtail;
  *(ep->rtail ? &ep->rtail->rnext : &ep->rhead) = r;
  ep->rtail = r;
}

static void ready_pop(sim_epoll_t *ep, sim_reg_t *r) {
  if (!r->ready)
    return;
  *(r->rprev ? &r->rprev->rnext : &ep->rhead) = r->rnext;
  *(r->rnext ? &r->rnext->rprev : &ep->rtail) = r->rprev;
  r->rprev = r->rnext = NULL;
  r->ready = false;
}

static inline uint32_t reg_events(sim_reg_t *r) {
  return sim_ready(r->d) & (r->events | EPOLLERR | EPOLLHUP);
}

/* r's descriptor may be ready: list it, and wake whoever waits. */
static void reg_check(sim_reg_t *r) {
  if (reg_events(r) == 0)
    return;
  if (!r->ready)
    ready_push(r->ep, r);
  simloop_t *s = r->ep->waiter;
  if (s != NULL && s->state == SL_BLOCKED && s->ep == r->ep)
    sim_wake(s);
}

void sim_notify(sim_fd_t *d) {
  for (sim_reg_t *r = d->regs; r; r = r->dnext)
    reg_check(r);
}

bool sim_epoll_ready(sim_epoll_t *ep) {
  for (sim_reg_t *r = ep->rhead, *n; r; r = n) {
    n = r->rnext;
    if (reg_events(r))
      return true;
    ready_pop(ep, r);
  }
  return false;
}

static void reg_free(sim_reg_t *r) {
  sim_epoll_t *ep = r->ep;
  ready_pop(ep, r);
  *(r->eprev ? &r->eprev->enext : &ep->regs) = r->enext;
  if (r->enext)
    r->enext->eprev = r->eprev;
  for (sim_reg_t **pp = &r->d->regs; *pp; pp = &(*pp)->dnext)
    if (*pp == r) {
      *pp = r->dnext;
      break;
    }
  free(r);
}

static void unregister_all(sim_fd_t *d) {
  while (d->regs)
    reg_free(d->regs);
}

static sim_reg_t *reg_find(sim_epoll_t *ep, sim_fd_t *d) {
  for (sim_reg_t *r = d->regs; r; r = r->dnext)
    if (r->ep == ep)
      return r;
  return NULL;
}

static int ep_ctl(int epfd, int op, int fd, struct epoll_event *ev) {
  sim_epoll_t *ep = (sim_epoll_t *)sim_fd_get(epfd, SFD_EPOLL);
  sim_fd_t *d = sim_fd_get(fd, 0);
  if (ep == NULL || d == NULL)
    return -1;
  sim_reg_t *r = reg_find(ep, d);
  if (op == EPOLL_CTL_DEL || op == EPOLL_CTL_MOD) {
    if (r == NULL) {
      errno = ENOENT;
      return -1;
    }
    if (op == EPOLL_CTL_DEL) {
      reg_free(r);
      return 0;
    }
  } else if (r != NULL) {
    errno = EEXIST;
    return -1;
  } else {
    if ((r = calloc(1, sizeof *r)) == NULL) {
      errno = ENOMEM;
      return -1;
    }
    r->ep = ep;
    r->d = d;
    r->dnext = d->regs;
    d->regs = r;
    r->enext = ep->regs;
    if (ep->regs)
      ep->regs->eprev = r;
    ep->regs = r;
  }
  r->events = ev->events;
  r->data = ev->data;
  reg_check(r);
  return 0;
}

/* The loop making the call: the fiber running, or the main context. */
static simloop_t *caller(nr_sim_t *w) {
  return w->running ? w->running : w->main;
}

/* Up to max events of ep: the ready list walked once, each registration
 * still ready reported and moved to the back, the others dropped. */
static int collect(sim_epoll_t *ep, struct epoll_event *ev, int max) {
  int n = 0;
  sim_reg_t *stop = ep->rtail;
  for (sim_reg_t *r = ep->rhead, *next; r && n < max; r = next) {
    next = r->rnext;
    bool last = r == stop;
    uint32_t e = reg_events(r);
    ready_pop(ep, r);
    if (e) {
      ev[n].events = e;
      ev[n].data = r->data;
      n++;
      ready_push(ep, r);
    }
    if (last)
      break;
  }
  return n;
}

static int ep_wait(int epfd, struct epoll_event *ev, int max, int timeout,
                   uint64_t deadline) {
  sim_epoll_t *ep = (sim_epoll_t *)sim_fd_get(epfd, SFD_EPOLL);
  nr_sim_t *w = sim_here();
  if (ep == NULL || w == NULL || ep->base.w != w) {
    errno = ep == NULL ? EBADF : EPERM;
    return -1;
  }
  simloop_t *s = caller(w);
  if (s == NULL) {
    errno = EPERM;
    return -1;
  }
  bool block = timeout != 0 && !sim_epoll_ready(ep);
  if (block || !s->main) {
    if (block && timeout > 0 && deadline == 0)
      deadline = w->now + NR_MS(timeout);
    s->ep = ep;
    ep->waiter = s;
    sim_yield(s, block, timeout < 0 ? NR_NONE : deadline);
  }
  return collect(ep, ev, max);
}

/* ---- wakeups (eventfd) ------------------------------------------------------------------- */

typedef struct sim_efd_s {
  sim_fd_t base;
  uint64_t count;
} sim_efd_t;

static ssize_t efd_read(sim_efd_t *e, void *buf, size_t n) {
  if (n < 8) {
    errno = EINVAL;
    return -1;
  }
  if (e->count == 0) {
    errno = EAGAIN;
    return -1;
  }
  memcpy(buf, &e->count, 8);
  e->count = 0;
  return 8;
}

static ssize_t efd_write(sim_efd_t *e, const void *buf, size_t n) {
  uint64_t v;
  if (n < 8) {
    errno = EINVAL;
    return -1;
  }
  memcpy(&v, buf, 8);
  e->count += v;
  sim_notify(&e->base);
  return 8;
}

/* ---- readiness, by kind ------------------------------------------------------------------- */

uint32_t sim_ready(sim_fd_t *d) {
  switch (d->kind) {
  case SFD_EVENT:
    return EPOLLOUT | (((sim_efd_t *)d)->count ? EPOLLIN : 0);
  case SFD_TCP:
    return sim_tcp_ready(d);
  case SFD_UDP:
    return sim_udp_ready(d);
  default:
    return 0;
  }
}

/* ---- the transport's table ------------------------------------------------------------------ */

static nr_sim_host_t *host_of(nr_loop_t *l) {
  return l->sim->host;
}

static int t_socket(nr_loop_t *l, int family, int type) {
  nr_sim_t *w = l->sim->w;
  if (family != AF_INET && family != AF_INET6) {
    errno = EAFNOSUPPORT;          /* a simulation has no unix sockets */
    return -1;
  }
  if (type == SOCK_STREAM)
    return sim_tcp_socket(w, host_of(l));
  if (type == SOCK_DGRAM)
    return sim_udp_socket(w, host_of(l));
  errno = EPROTONOSUPPORT;
  return -1;
}

static int t_selector(nr_loop_t *l, int *epfd, int *wakefd) {
  nr_sim_t *w = l->sim->w;
  sim_epoll_t *ep = calloc(1, sizeof *ep);
  sim_efd_t *e = calloc(1, sizeof *e);
  if (ep == NULL || e == NULL) {
    free(ep);
    free(e);
    errno = ENOMEM;
    return -1;
  }
  ep->base.kind = SFD_EPOLL;
  e->base.kind = SFD_EVENT;
  ep->base.w = e->base.w = w;
  ep->base.host = e->base.host = host_of(l);
  *epfd = sim_fd_add(&ep->base);
  *wakefd = sim_fd_add(&e->base);
  return *epfd < 0 || *wakefd < 0 ? -1 : 0;
}

static const nr_transport_t *ops(sim_fd_t *d) {
  return d->kind == SFD_TCP ? &sim_tcp_ops : d->kind == SFD_UDP ? &sim_udp_ops
                                                               : NULL;
}

/* Route a socket call to its kind's table; ENOTSOCK for a selector. */
#define ROUTE(fd, call, ...)                                   \
  do {                                                         \
    sim_fd_t *d_ = sim_fd_get(fd, 0);                          \
    const nr_transport_t *o_ = d_ ? ops(d_) : NULL;            \
    if (d_ == NULL)                                            \
      return -1;                                               \
    if (o_ == NULL || o_->call == NULL) {                      \
      errno = o_ == NULL ? ENOTSOCK : EOPNOTSUPP;              \
      return -1;                                               \
    }                                                          \
    return o_->call(fd, __VA_ARGS__);                          \
  } while (0)

static int t_bind(int fd, const struct sockaddr *sa, socklen_t len) {
  ROUTE(fd, bind, sa, len);
}
static int t_listen(int fd, int backlog) { ROUTE(fd, listen, backlog); }
static int t_accept(int fd, struct sockaddr *sa, socklen_t *len) {
  ROUTE(fd, accept, sa, len);
}
static int t_connect(int fd, const struct sockaddr *sa, socklen_t len) {
  ROUTE(fd, connect, sa, len);
}
static ssize_t t_sendmsg(int fd, const struct msghdr *m) {
  ROUTE(fd, sendmsg, m);
}
static ssize_t t_recvfrom(int fd, void *buf, size_t n, struct sockaddr *sa,
                          socklen_t *len) {
  ROUTE(fd, recvfrom, buf, n, sa, len);
}
static int t_shutdown(int fd, int how) { ROUTE(fd, shutdown, how); }
static int t_getsockopt(int fd, int level, int name, void *v, socklen_t *len) {
  ROUTE(fd, getsockopt, level, name, v, len);
}
static int t_setsockopt(int fd, int level, int name, const void *v,
                        socklen_t len) {
  ROUTE(fd, setsockopt, level, name, v, len);
}
static int t_getsockname(int fd, struct sockaddr *sa, socklen_t *len) {
  ROUTE(fd, getsockname, sa, len);
}
static int t_getpeername(int fd, struct sockaddr *sa, socklen_t *len) {
  ROUTE(fd, getpeername, sa, len);
}
static int t_ioctl(int fd, unsigned long req, int *arg) {
  ROUTE(fd, ioctl, req, arg);
}

static ssize_t t_read(int fd, void *buf, size_t n) {
  sim_fd_t *d = sim_fd_get(fd, 0);
  if (d != NULL && d->kind == SFD_EVENT)
    return efd_read((sim_efd_t *)d, buf, n);
  ROUTE(fd, read, buf, n);
}

static ssize_t t_write(int fd, const void *buf, size_t n) {
  sim_fd_t *d = sim_fd_get(fd, 0);
  if (d != NULL && d->kind == SFD_EVENT)
    return efd_write((sim_efd_t *)d, buf, n);
  ROUTE(fd, write, buf, n);
}

static void epoll_close(sim_epoll_t *ep) {
  while (ep->regs)
    reg_free(ep->regs);
  for (simloop_t *s = ep->base.w->loops; s; s = s->next)
    if (s->ep == ep)
      s->ep = NULL;
}

static int t_close(int fd) {
  sim_fd_t *d = sim_fd_get(fd, 0);
  if (d == NULL)
    return -1;
  switch (d->kind) {
  case SFD_TCP:
    return sim_tcp_close(d);
  case SFD_UDP:
    return sim_udp_close(d);
  case SFD_EPOLL:
    epoll_close((sim_epoll_t *)d);
    break;
  default:
    break;
  }
  sim_fd_remove(d);
  free(d);
  return 0;
}

const nr_transport_t nr__sim_transport = {
    .socket = t_socket, .bind = t_bind, .listen = t_listen,
    .accept = t_accept, .connect = t_connect, .read = t_read,
    .write = t_write, .sendmsg = t_sendmsg, .recvfrom = t_recvfrom,
    .shutdown = t_shutdown, .close = t_close, .getsockopt = t_getsockopt,
    .setsockopt = t_setsockopt, .getsockname = t_getsockname,
    .getpeername = t_getpeername, .ioctl = t_ioctl, .selector = t_selector,
    .epoll_ctl = ep_ctl, .epoll_wait = ep_wait};
