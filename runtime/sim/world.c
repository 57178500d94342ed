/*
 * sim/world.c -- a simulated world: its seed and generator (xoshiro256**
 * seeded by splitmix64: all randomness of a run comes from here), its
 * virtual clock, the trace hash, hosts and the links between them, the
 * event queue the network runs on, and the clock seam's table (clock.c).
 *
 * The virtual clock starts at NR_SIM_START (not 0: code treats 0 as
 * "never") and moves only when the scheduler finds nothing to run: then
 * it jumps to the next event or deadline (sched.c). Wall time is the
 * epoch plus the time passed.
 *
 * The trace hash is FNV-1a (over 64-bit words) of every scheduling choice and every packet
 * (kind, time, parties, bytes): two runs of a seed that behave the same
 * have the same hash, and a run that differs in one byte or one step has
 * another.
 *
 * Threads: one world at a time is entered in a process (`entered`), on
 * one thread (`here`); every function here but the constructor and the
 * reference count runs there.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <strings.h>

#include "world.h"
#include "tls/tls.h"

#define NR_SIM_START NR_SEC(1000000)      /* an uptime of 11.6 days */
#define DEFAULT_EPOCH 1735689600          /* 2025-01-01T00:00:00Z */
#define DEFAULT_LATENCY NR_US(100)
#define LOCAL_LATENCY NR_US(10)
#define NR_US(x) ((uint64_t)(x) * 1000ull)

static _Thread_local nr_sim_t *here;
static _Atomic(nr_sim_t *) entered;
static _Atomic uint64_t world_ids;

nr_sim_t *sim_here(void) { return here; }
nr_sim_t *nr_sim_current(void) { return here; }

/* ---- the generator ----------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

uint64_t sim_rand(nr_sim_t *w) {
  uint64_t *s = w->rng;
  uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return r;
}

double sim_uniform(nr_sim_t *w) {
  return (double)(sim_rand(w) >> 11) * 0x1.0p-53;
}

uint64_t nr_sim_random(nr_sim_t *w) { return sim_rand(w); }

/* ---- the trace ------------------------------------------------------------------------ */

#define FNV_PRIME 0x100000001b3ull

/* FNV-1a over 64-bit words, with a shift folding the high bits back in
 * (a word at a time, the multiply alone would not reach the low ones). */
static inline void mix(nr_sim_t *w, uint64_t v) {
  uint64_t h = (w->trace ^ v) * FNV_PRIME;
  w->trace = h ^ (h >> 29);
}

void sim_trace(nr_sim_t *w, uint64_t kind, uint64_t a, uint64_t b) {
  mix(w, kind);
  mix(w, w->now - w->start);
  mix(w, a);
  mix(w, b);
  if (w->trace_log)
    fprintf(w->trace_log, "%.9f %02llx %llu %llu\n",
            (double)(w->now - w->start) / 1e9, (unsigned long long)kind,
            (unsigned long long)a, (unsigned long long)b);
}

void sim_trace_bytes(nr_sim_t *w, const void *p, size_t n) {
  const unsigned char *c = p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    memcpy(&v, c + i, 8);
    mix(w, v);
  }
  uint64_t tail = n;                       /* the length, and what is left */
  for (; i < n; i++)
    tail = tail << 8 | c[i];
  mix(w, tail);
  if (w->trace_log) {
    fputs("  ", w->trace_log);
    for (size_t i = 0; i < n; i++)
      fputc(c[i] >= 32 && c[i] < 127 ? c[i] : '.', w->trace_log);
    fputc('\n', w->trace_log);
  }
}

uint64_t nr_sim_trace_hash(const nr_sim_t *w) { return w->trace; }
void nr_sim_limit(nr_sim_t *w, uint64_t at) { w->limit = at ? at : NR_NONE; }
bool nr_sim_is_stuck(const nr_sim_t *w) { return w->stuck; }
uint64_t nr_sim_now(const nr_sim_t *w) { return w->now; }
uint64_t nr_sim_seed(const nr_sim_t *w) { return w->seed; }
void nr_sim_stats(const nr_sim_t *w, nr_sim_stats_t *out) { *out = w->stats; }

/* ---- the clock seam ---------------------------------------------------------------------- */

/* A run that reads the clock more than SPIN_READS times between two
 * scheduling points is spinning on it (busy work timed by os.clock, a
 * loop waiting for netrun.now() to move): from there each read moves the
 * clock SPIN_TICK on, as the work would take time, so that it ends; the
 * stall watchdog, which has no thread of its own in a world, looks at the
 * running loop every SPIN_CHECK ticks (stall.c's nr__watch_check). A
 * normal run reads it a few times. */
#define SPIN_READS 10000
#define SPIN_TICK NR_US(10)
#define SPIN_CHECK 100

static __attribute__((noinline)) uint64_t spin(nr_sim_t *w) {
  w->now += SPIN_TICK;
  if ((w->reads - SPIN_READS) % SPIN_CHECK == 0) {
    nr_loop_t *l = w->running ? w->running->loop : NULL;
    if (l != NULL && l->stall_threshold)
      nr__watch_check(l, w->now);
  }
  return w->now;
}

static bool clock_owns(void) { return here != NULL; }
static uint64_t clock_now(void) {
  nr_sim_t *w = here;
  return ++w->reads > SPIN_READS ? spin(w) : w->now;
}
static uint64_t clock_wall(void) {
  return (uint64_t)here->epoch * 1000000000ull + (clock_now() - here->start);
}
static void clock_random(void *buf, size_t n) {
  unsigned char *p = buf;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t r = sim_rand(here);
    memcpy(p + i, &r, n - i < 8 ? n - i : 8);
  }
}

static const nr_clock_t sim_clock = {clock_owns, clock_now, clock_wall,
                                     clock_random};

/* ---- the world ---------------------------------------------------------------------------- */

nr_sim_t *nr_sim_new(const nr_sim_opts_t *o) {
  nr_sim_t *w = calloc(1, sizeof *w);
  if (w == NULL)
    return NULL;
  atomic_init(&w->refs, 1);
  w->id = atomic_fetch_add(&world_ids, 1) + 1;
  w->seed = o ? o->seed : 0;
  uint64_t x = w->seed;
  for (int i = 0; i < 4; i++)
    w->rng[i] = splitmix(&x);
  w->now = w->start = NR_SIM_START;
  w->limit = NR_NONE;
  w->epoch = o && o->epoch ? o->epoch : DEFAULT_EPOCH;
  w->latency = o && o->latency ? o->latency : DEFAULT_LATENCY;
  w->local_latency = LOCAL_LATENCY;
  w->sndbuf = o && o->sndbuf ? o->sndbuf : 64 * 1024;
  w->rcvbuf = o && o->rcvbuf ? o->rcvbuf : 128 * 1024;
  w->trace = 0xcbf29ce484222325ull;
  mix(w, w->seed);
  const char *log = getenv("NETRUN_SIM_TRACE");  /* to tell two runs apart */
  if (log && *log)
    w->trace_log = fopen(log, "a");
  return w;
}

void sim_retain(nr_sim_t *w) { atomic_fetch_add(&w->refs, 1); }

static void world_free(nr_sim_t *w) {
  if (w->trace_log)
    fclose(w->trace_log);
  for (size_t i = 0; i < w->nev; i++)    /* what never happened */
    if (w->evq[i].drop)
      w->evq[i].drop(w, w->evq[i].obj, w->evq[i].arg);
  for (int i = 0; i < w->nhosts; i++) {
    free(w->hosts[i]->name);
    free(w->hosts[i]);
  }
  free(w->hosts);
  free(w->links);
  free(w->evq);
  free(w->runnable);
  free(w);
}

void nr_sim_release(nr_sim_t *w) {
  if (w != NULL && atomic_fetch_sub(&w->refs, 1) == 1)
    world_free(w);
}

int nr_sim_enter(nr_sim_t *w) {
  nr_sim_t *none = NULL;
  if (here != NULL || !atomic_compare_exchange_strong(&entered, &none, w))
    return -EBUSY;
  here = w;
  w->entered = true;
  w->outer = nr_loop_current();
  nr__transport = &nr__sim_transport;
  atomic_store(&nr__clock, &sim_clock);
  nr_tls_simulated_random(true);           /* handshakes replay too */
  if (w->nhosts == 0 && nr_sim_host(w, "main") == NULL) {
    nr_sim_leave(w);
    return -ENOMEM;
  }
  return 0;
}

void nr_sim_leave(nr_sim_t *w) {
  if (here != w)
    return;
  /* The transport's table stays: descriptors of this world may still be
   * closed later (nr__transport is set once and for all). */
  nr_tls_simulated_random(false);
  atomic_store(&nr__clock, NULL);
  if (w->trace_log)
    fflush(w->trace_log);
  w->entered = false;
  here = NULL;
  nr__loop_set_current(w->outer);
  atomic_store(&entered, NULL);
}

/* ---- hosts and links -------------------------------------------------------------------- */

static int grow_hosts(nr_sim_t *w) {
  if (w->nhosts < w->hcap)
    return 0;
  int cap = w->hcap ? w->hcap * 2 : 8;
  nr_sim_host_t **v = realloc(w->hosts, (size_t)cap * sizeof *v);
  sim_link_t *l = calloc((size_t)cap * (size_t)cap, sizeof *l);
  if (v == NULL || l == NULL) {
    if (v)
      w->hosts = v;
    free(l);
    return -ENOMEM;
  }
  for (int i = 0; i < w->hcap; i++)
    memcpy(l + (size_t)i * (size_t)cap, w->links + (size_t)i * (size_t)w->hcap,
           (size_t)w->hcap * sizeof *l);
  free(w->links);
  w->hosts = v;
  w->links = l;
  w->hcap = cap;
  return 0;
}

static nr_sim_host_t *find_host(nr_sim_t *w, const char *name) {
  size_t n = strlen(name);
  if (n > 0 && name[n - 1] == '.')
    n--;                               /* "b." is "b" */
  for (int i = 0; i < w->nhosts; i++)
    if (strlen(w->hosts[i]->name) == n &&
        strncasecmp(w->hosts[i]->name, name, n) == 0)
      return w->hosts[i];
  return NULL;
}

nr_sim_host_t *nr_sim_host(nr_sim_t *w, const char *name) {
  nr_sim_host_t *h = find_host(w, name);
  if (h != NULL)
    return h;
  if (grow_hosts(w) < 0 || (h = calloc(1, sizeof *h)) == NULL)
    return NULL;
  if ((h->name = strdup(name)) == NULL) {
    free(h);
    return NULL;
  }
  h->w = w;
  h->idx = w->nhosts;
  h->ip = (10u << 24) | (uint32_t)(h->idx + 1);   /* 10.0.0.1, ... */
  struct in_addr a = {htonl(h->ip)};
  inet_ntop(AF_INET, &a, h->addr, sizeof h->addr);
  h->next_port = 32768;
  w->hosts[w->nhosts++] = h;
  return h;
}

const char *nr_sim_host_name(const nr_sim_host_t *h) { return h->name; }
const char *nr_sim_host_addr(const nr_sim_host_t *h) { return h->addr; }

nr_sim_host_t *nr_sim_set_host(nr_sim_t *w, nr_sim_host_t *h) {
  nr_sim_host_t *old = w->creating ? w->creating : w->hosts[0];
  w->creating = h;
  return old;
}

nr_sim_host_t *sim_host_by_ip(nr_sim_t *w, nr_sim_host_t *from, uint32_t ip) {
  if ((ip >> 24) == 127 || ip == 0)
    return from;
  for (int i = 0; i < w->nhosts; i++)
    if (w->hosts[i]->ip == ip)
      return w->hosts[i];
  return NULL;
}

sim_link_t *sim_link(nr_sim_t *w, const nr_sim_host_t *a,
                     const nr_sim_host_t *b) {
  int i = a->idx < b->idx ? a->idx : b->idx, j = a->idx ^ b->idx ^ i;
  return &w->links[(size_t)i * (size_t)w->hcap + (size_t)j];
}

uint64_t sim_latency(nr_sim_t *w, const nr_sim_host_t *a,
                     const nr_sim_host_t *b) {
  uint64_t l = sim_link(w, a, b)->latency;
  return l ? l : a == b ? w->local_latency : w->latency;
}

bool sim_cut(nr_sim_t *w, const nr_sim_host_t *a, const nr_sim_host_t *b) {
  return a != b && sim_link(w, a, b)->cut;
}

void nr_sim_latency(nr_sim_t *w, nr_sim_host_t *a, nr_sim_host_t *b,
                    uint64_t ns) {
  sim_link(w, a, b)->latency = ns ? ns : 1;
}

static double prob(double p) { return p < 0 ? 0 : p > 1 ? 1 : p; }
void nr_sim_loss(nr_sim_t *w, double p) { w->loss = prob(p); }
void nr_sim_duplicate(nr_sim_t *w, double p) { w->dup = prob(p); }
void nr_sim_reorder(nr_sim_t *w, double p) { w->reorder = prob(p); }

void nr_sim_partition(nr_sim_t *w, nr_sim_host_t *a, nr_sim_host_t *b) {
  for (int i = 0; i < w->nhosts; i++)
    for (int j = 0; j < w->nhosts; j++) {
      nr_sim_host_t *x = w->hosts[i], *y = w->hosts[j];
      if (x != y && (a == NULL || x == a) && (b == NULL || y == b))
        sim_link(w, x, y)->cut = true;
    }
  sim_trace(w, 0x70, a ? (uint64_t)a->idx : ~0ull, b ? (uint64_t)b->idx : ~0ull);
}

void nr_sim_heal(nr_sim_t *w) {
  for (size_t i = 0; i < (size_t)w->hcap * (size_t)w->hcap; i++)
    w->links[i].cut = false;
  sim_trace(w, 0x71, 0, 0);
  sim_tcp_healed(w);
}

int nr_sim_reset(nr_sim_t *w, nr_sim_host_t *a, nr_sim_host_t *b) {
  sim_trace(w, 0x72, a ? (uint64_t)a->idx : ~0ull, b ? (uint64_t)b->idx : ~0ull);
  return sim_tcp_reset(w, a, b);
}

/* ---- names ----------------------------------------------------------------------------- */

int nr__sim_lookup(const char *name, int family, nr_addrs_t *out) {
  nr_sim_t *w = here;
  unsigned char buf[sizeof(struct in6_addr)];
  if (w == NULL || inet_pton(AF_INET, name, buf) == 1 ||
      inet_pton(AF_INET6, name, buf) == 1)
    return 0;
  nr_sim_host_t *h = find_host(w, name);
  if (h == NULL || family == AF_INET6)
    return -ENOENT;
  out->n = 1;
  out->ttl = 0;
  snprintf(out->addr[0], sizeof out->addr[0], "%s", h->addr);
  return 1;
}

int nr_sim_namespace(char *buf, size_t n) {
  nr_sim_t *w = here;
  if (w == NULL) {
    if (n)
      buf[0] = '\0';
    return 0;
  }
  nr_loop_t *l = nr_loop_current();
  nr_sim_host_t *h = l && l->sim && !l->sim->main ? l->sim->host
                     : w->creating ? w->creating : w->hosts[0];
  return snprintf(buf, n, "sim%llu/%s/", (unsigned long long)w->id, h->name);
}

/* ---- the event queue (a binary heap by time, then order) --------------------------------- */

static bool before(const sim_event_t *a, const sim_event_t *b) {
  return a->at < b->at || (a->at == b->at && a->seq < b->seq);
}

void sim_at(nr_sim_t *w, uint64_t at, sim_event_fn fn, sim_event_fn drop,
            void *obj, uint64_t arg) {
  if (w->nev == w->evcap) {
    size_t cap = w->evcap ? w->evcap * 2 : 256;
    sim_event_t *v = realloc(w->evq, cap * sizeof *v);
    if (v == NULL) {
      nr_log(NR_LOG_ERROR, "sim: out of memory queueing an event (lost)");
      return;
    }
    w->evq = v;
    w->evcap = cap;
  }
  sim_event_t e = {at < w->now ? w->now : at, w->evseq++, fn, drop, obj, arg};
  size_t i = w->nev++;
  while (i > 0 && before(&e, &w->evq[(i - 1) / 2])) {
    w->evq[i] = w->evq[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  w->evq[i] = e;
}

static sim_event_t pop_event(nr_sim_t *w) {
  sim_event_t top = w->evq[0], last = w->evq[--w->nev];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= w->nev)
      break;
    if (c + 1 < w->nev && before(&w->evq[c + 1], &w->evq[c]))
      c++;
    if (!before(&w->evq[c], &last))
      break;
    w->evq[i] = w->evq[c];
    i = c;
  }
  if (w->nev > 0)
    w->evq[i] = last;
  return top;
}

uint64_t sim_next_event(const nr_sim_t *w) {
  return w->nev ? w->evq[0].at : NR_NONE;
}

bool sim_run_due(nr_sim_t *w) {
  bool ran = false;
  while (w->nev > 0 && w->evq[0].at <= w->now) {
    sim_event_t e = pop_event(w);
    e.fn(w, e.obj, e.arg);
    w->stats.events++;
    ran = true;
  }
  return ran;
}

/* ---- addresses ------------------------------------------------------------------------- */

void sim_sockaddr(struct sockaddr_in *sa, uint32_t ip, uint16_t port) {
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_addr.s_addr = htonl(ip);
  sa->sin_port = htons(port);
}

void sim_addr_out(const struct sockaddr_in *in, struct sockaddr *sa,
                  socklen_t *len) {
  socklen_t n = *len < sizeof *in ? *len : (socklen_t)sizeof *in;
  memcpy(sa, in, n);
  *len = sizeof *in;
}
