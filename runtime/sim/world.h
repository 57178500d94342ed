/*
 * sim/world.h -- the simulation's own structures, shared by its files:
 *   world.c   the world: seed and generator, virtual clock, trace hash,
 *             hosts, links (latency, partitions), the event queue, and
 *             the clock seam's table;
 *   sched.c   simulated loops as fibers and the scheduler that steps them;
 *   poll.c    simulated descriptors, selectors (epoll) and wakeups
 *             (eventfd), and the transport seam's table;
 *   tcp.c     TCP: listen, connect, accept, data with latency and bounded
 *             buffers, half-close, reset, partitions;
 *   udp.c     UDP: datagrams with loss, duplication and reordering.
 *
 * Threads: everything here belongs to the world's thread (the one that
 * entered it): loops are fibers of that thread, so no lock is needed. The
 * world's reference count is atomic because the last simulated loop or
 * descriptor may be released after the world was left (a group freed by
 * a collector later).
 */
#ifndef NR_SIM_WORLD_H
#define NR_SIM_WORLD_H

#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>

#include "../internal.h"
#include "sim.h"

/* ---- events --------------------------------------------------------------- */

typedef void (*sim_event_fn)(nr_sim_t *w, void *obj, uint64_t arg);

typedef struct sim_event_s {
  uint64_t at, seq;
  sim_event_fn fn, drop;
  void *obj;
  uint64_t arg;
} sim_event_t;

/* Run fn(w, obj, arg) at virtual time at (ties in the order scheduled);
 * drop(w, obj, arg) instead if the world goes first. */
void sim_at(nr_sim_t *w, uint64_t at, sim_event_fn fn, sim_event_fn drop,
            void *obj, uint64_t arg);

/* ---- hosts and links --------------------------------------------------------- */

struct nr_sim_host_s {
  nr_sim_t *w;
  int idx;                       /* 0, 1, ... in order of creation */
  char *name;
  char addr[16];                 /* "10.0.0.1" */
  uint32_t ip;                   /* host order */
  uint16_t next_port;            /* the next ephemeral port */
  struct sim_tcp_s *listeners;   /* bound listening sockets */
  struct sim_udp_s *udps;        /* bound datagram sockets */
};

typedef struct sim_link_s {
  uint64_t latency;              /* one-way */
  bool cut;                      /* partitioned */
} sim_link_t;

/* ---- simulated loops ----------------------------------------------------------- */

enum { SL_NEW, SL_RUNNABLE, SL_BLOCKED, SL_DONE };

typedef struct sim_fiber_s sim_fiber_t;

typedef struct nr_simloop_s {
  nr_sim_t *w;
  nr_loop_t *loop;
  nr_sim_host_t *host;
  uint64_t id;                   /* in order of creation */
  int state;
  bool main;                     /* the main context's loop: no fiber */
  int ridx;                      /* index in w->runnable, -1 if not there */
  uint64_t deadline;             /* while blocked: when to wake it */
  struct sim_epoll_s *ep;        /* the selector it blocks on */
  sim_fiber_t *fiber;
  void *(*fn)(void *);
  struct nr_simloop_s *next;     /* the world's list */
} simloop_t;

/* ---- the world --------------------------------------------------------------------- */

struct nr_sim_s {
  _Atomic int refs;
  uint64_t id;                   /* per process, for namespaces */
  uint64_t seed;
  uint64_t rng[4];               /* xoshiro256** */
  uint64_t now, start;           /* virtual monotonic ns */
  int64_t epoch;                 /* wall seconds at start */
  uint64_t trace;                /* FNV-1a over the events */
  FILE *trace_log;               /* NETRUN_SIM_TRACE: each event, as text */
  nr_sim_stats_t stats;
  bool entered;
  nr_loop_t *outer;              /* the thread's loop before it entered */
  /* hosts and links */
  nr_sim_host_t **hosts;
  int nhosts, hcap;
  sim_link_t *links;             /* hcap x hcap */
  nr_sim_host_t *creating;       /* where the main context's loops go */
  uint64_t latency, local_latency;
  double loss, dup, reorder;
  size_t sndbuf, rcvbuf;
  /* events */
  sim_event_t *evq;
  size_t nev, evcap;
  uint64_t evseq;
  /* loops */
  simloop_t *loops, *main, *running;
  simloop_t **runnable;
  int nrunnable, rcap;
  uint64_t loop_ids, conn_ids;
  bool stuck;
  uint64_t limit;                /* the clock stops short of it (NR_NONE) */
  uint64_t reads;                /* clock reads since the last scheduling
                                    point: a run that spins on the clock */
  uint64_t still;                /* steps since the clock last jumped: loops
                                    that keep each other (or themselves)
                                    runnable forever (sched.c, STILL_STEPS) */
  /* TCP connections alive (tcp.c), for resets */
  struct sim_conn_s *conns;
};

/* world.c */
uint64_t sim_rand(nr_sim_t *w);
double sim_uniform(nr_sim_t *w);           /* [0, 1) */
void sim_trace(nr_sim_t *w, uint64_t kind, uint64_t a, uint64_t b);
void sim_trace_bytes(nr_sim_t *w, const void *p, size_t n);
/* The host with address ip (host order; 127/8 is `from` itself), or NULL. */
nr_sim_host_t *sim_host_by_ip(nr_sim_t *w, nr_sim_host_t *from, uint32_t ip);
sim_link_t *sim_link(nr_sim_t *w, const nr_sim_host_t *a,
                     const nr_sim_host_t *b);
uint64_t sim_latency(nr_sim_t *w, const nr_sim_host_t *a,
                     const nr_sim_host_t *b);
bool sim_cut(nr_sim_t *w, const nr_sim_host_t *a, const nr_sim_host_t *b);
/* The world entered on this thread. */
nr_sim_t *sim_here(void);
void sim_retain(nr_sim_t *w);
/* The event queue's next time, or NR_NONE. */
uint64_t sim_next_event(const nr_sim_t *w);
/* Run the events due at w->now or before; whether any ran. */
bool sim_run_due(nr_sim_t *w);

/* sched.c */
/* Make s runnable (it has something to do). */
void sim_wake(simloop_t *s);
/* Run the other loops until the main one may go on (its selector has
 * events, its deadline came) or nothing can happen (w->stuck). */
void sim_schedule(nr_sim_t *w);
/* The calling fiber yields: blocked until its selector wakes it or its
 * deadline (NR_NONE: none), or still runnable (a scheduling point). */
void sim_yield(simloop_t *s, bool block, uint64_t deadline);

/* poll.c: simulated descriptors */
enum { SFD_EPOLL = 1, SFD_EVENT, SFD_TCP, SFD_UDP };

typedef struct sim_reg_s sim_reg_t;

typedef struct sim_fd_s {
  int kind, fd;
  nr_sim_t *w;
  nr_sim_host_t *host;
  sim_reg_t *regs;               /* selectors watching it */
} sim_fd_t;

/* Register d (kind, w and host set) under a new descriptor number; it
 * holds a reference to its world. -1 and EMFILE when full. */
int sim_fd_add(sim_fd_t *d);
sim_fd_t *sim_fd_get(int fd, int kind);
/* Unregister d from its selectors and its number, and drop its world
 * reference (d itself is the caller's to free). */
void sim_fd_remove(sim_fd_t *d);
/* d's readiness changed (may have become ready): tell its selectors. */
void sim_notify(sim_fd_t *d);
/* The events d is ready for (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP...). */
uint32_t sim_ready(sim_fd_t *d);
/* Whether selector ep has an event ready now. */
bool sim_epoll_ready(struct sim_epoll_s *ep);

/* The transport seam's table (poll.c), installed by nr_sim_enter. */
extern const nr_transport_t nr__sim_transport;

/* tcp.c and udp.c (poll.c's table calls them by kind) */
int sim_tcp_socket(nr_sim_t *w, nr_sim_host_t *h);
uint32_t sim_tcp_ready(sim_fd_t *d);
int sim_tcp_close(sim_fd_t *d);
int sim_udp_socket(nr_sim_t *w, nr_sim_host_t *h);
uint32_t sim_udp_ready(sim_fd_t *d);
int sim_udp_close(sim_fd_t *d);
extern const nr_transport_t sim_tcp_ops, sim_udp_ops;
/* Reset the connections between a and b (NULL: any). How many. */
int sim_tcp_reset(nr_sim_t *w, nr_sim_host_t *a, nr_sim_host_t *b);
/* A partition ended: held data goes on. */
void sim_tcp_healed(nr_sim_t *w);

/* Addresses: a sockaddr_in's address and port in host order. */
static inline uint32_t sim_ip(const struct sockaddr_in *sa) {
  return ntohl(sa->sin_addr.s_addr);
}
static inline uint16_t sim_port(const struct sockaddr_in *sa) {
  return ntohs(sa->sin_port);
}
void sim_sockaddr(struct sockaddr_in *sa, uint32_t ip, uint16_t port);
/* Copy a sockaddr_in out as getsockname does. */
void sim_addr_out(const struct sockaddr_in *in, struct sockaddr *sa,
                  socklen_t *len);

#define SIM_LOOPBACK 0x7f000001u

#endif /* NR_SIM_WORLD_H */
