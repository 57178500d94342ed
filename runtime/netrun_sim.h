/*
 * netrun_sim.h -- the simulation part of the public C API (runtime/sim/):
 * a world of simulated hosts on one thread, replayed from a seed. Part of
 * netrun.h, which includes it (as it includes netrun.h); the section
 * below states its rules and which functions are the simulation's
 * thread's.
 */
#ifndef NETRUN_SIM_H
#define NETRUN_SIM_H

#include "netrun.h"

/* ---- simulation (runtime/sim/, DESIGN.md §9.4) --------------------------
 *
 * A world of simulated hosts on one thread: every loop made on that
 * thread while the world is entered is simulated -- a fiber stepped by
 * the world's scheduler in an order drawn from the seed, on the world's
 * virtual clock (nr_now, timers and timeouts), its sockets and lookups on
 * the world's in-memory network. All randomness comes from the seed, so a
 * seed replays the same run; nr_sim_trace_hash digests what happened.
 * Functions named "simulation's thread" are called there only. */
typedef struct nr_sim_s nr_sim_t;
typedef struct nr_sim_host_s nr_sim_host_t;
/* The CPUs of a simulated host: a group of 0 threads made there has this
 * many loops, on any machine. */
#define NR_SIM_CPUS 2

typedef struct nr_sim_opts_s {
  uint64_t seed;
  uint64_t latency;          /* one-way, between hosts: default 100 us */
  int64_t epoch;             /* wall clock at the start, seconds since the
                                Unix epoch: default 2025-01-01T00:00:00Z */
  size_t sndbuf, rcvbuf;     /* TCP buffers: default 64 KiB, 128 KiB */
} nr_sim_opts_t;

/* A new world (not entered); NULL and errno. Any thread. */
nr_sim_t *nr_sim_new(const nr_sim_opts_t *opts);
/* Make the calling thread the world's: from here on loops made on it are
 * simulated. -EBUSY while another world is entered in the process. */
int nr_sim_enter(nr_sim_t *w);
/* The thread leaves the world (its loops must have terminated). */
void nr_sim_leave(nr_sim_t *w);
/* Drop the caller's reference; the world goes with the last of its loops
 * and sockets. */
void nr_sim_release(nr_sim_t *w);
/* The world the calling thread runs in, or NULL. */
nr_sim_t *nr_sim_current(void);
/* Whether loop l is simulated (made in a world). Any thread. */
bool nr_loop_is_simulated(const nr_loop_t *l);

/* Hosts, by name (case ignored), made on first use with the next address
 * (10.0.0.1, 10.0.0.2, ...); the first one made is where loops made
 * outside any host go. Simulation's thread. */
nr_sim_host_t *nr_sim_host(nr_sim_t *w, const char *name);
const char *nr_sim_host_name(const nr_sim_host_t *h);
const char *nr_sim_host_addr(const nr_sim_host_t *h);
/* The host loops made by the main context go on from now on (NULL: the
 * first host); returns the previous one. A loop made by a simulated loop
 * goes on that loop's host. */
nr_sim_host_t *nr_sim_set_host(nr_sim_t *w, nr_sim_host_t *h);
/* The host of a simulated loop (NULL for a real one). */
nr_sim_host_t *nr_sim_loop_host(const nr_loop_t *l);

/* The network: one-way latency between a and b (both ways; a == b: the
 * host's own loopback), loss of TCP segments (retransmitted later) and UDP
 * datagrams, UDP duplication and reordering (probabilities 0..1), a
 * partition between a and b (nothing passes either way; a or b NULL: the
 * host is cut from every other), heal (every partition ends), a reset of
 * the TCP connections between a and b (either NULL: any host). */
void nr_sim_latency(nr_sim_t *w, nr_sim_host_t *a, nr_sim_host_t *b,
                    uint64_t ns);
void nr_sim_loss(nr_sim_t *w, double p);
void nr_sim_duplicate(nr_sim_t *w, double p);
void nr_sim_reorder(nr_sim_t *w, double p);
void nr_sim_partition(nr_sim_t *w, nr_sim_host_t *a, nr_sim_host_t *b);
void nr_sim_heal(nr_sim_t *w);
int nr_sim_reset(nr_sim_t *w, nr_sim_host_t *a, nr_sim_host_t *b);

/* The world's clock (ns, nr_now's), its seed, a number from its
 * generator, and a digest of everything that happened so far: every
 * scheduling choice and every packet with its bytes. */
uint64_t nr_sim_now(const nr_sim_t *w);
uint64_t nr_sim_seed(const nr_sim_t *w);
uint64_t nr_sim_random(nr_sim_t *w);
uint64_t nr_sim_trace_hash(const nr_sim_t *w);
/* The clock goes no further than `at` (nr_now's; 0: no limit): a wait
 * that would need it to fails as stuck (NR_ESIMSTUCK). */
void nr_sim_limit(nr_sim_t *w, uint64_t at);
/* Whether the main context's last wait found nothing that could ever
 * happen (before the limit): every loop idle, nothing scheduled. */
bool nr_sim_is_stuck(const nr_sim_t *w);
/* Counters: scheduler steps, packets, connections. */
typedef struct nr_sim_stats_s {
  uint64_t steps, events, connections, bytes, datagrams, resets;
} nr_sim_stats_t;
void nr_sim_stats(const nr_sim_t *w, nr_sim_stats_t *out);

/* On a simulated loop that may block (an executor): wait for p, other
 * loops running meanwhile. 0, or NR_ESIMSTUCK when nothing can complete
 * it. */
int nr_sim_wait(nr_promise_t *p);
/* "sim<id>/<host>/" for the caller's world and host, the prefix of what
 * a host keeps by name (shared dicts: hosts are separate machines); 0 and
 * "" outside a simulation. */
int nr_sim_namespace(char *buf, size_t n);

#endif /* NETRUN_SIM_H */
