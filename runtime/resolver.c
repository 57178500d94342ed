/*
 * resolver.c -- host names to addresses without blocking any loop: c-ares
 * driven by a loop of its own (nr_resolve and friends, netrun.h).
 *
 * Why one thread of its own rather than each loop's selector: one place
 * sees every lookup of the process, so identical names in flight are
 * looked up once whichever loop (or the main thread, which is not a loop)
 * asks, and one bound on lookups in flight holds for the process; no loop
 * ever runs c-ares code or carries its sockets; and a lookup is a task
 * there and a promise back, so callers need nothing but promises. The
 * cost is one thread hop each way per lookup that the callers' caches
 * did not answer.
 *
 * The thread is an ordinary netrun loop ("dns", made on first use, no Lua
 * state): c-ares's sockets are watchers on its selector, c-ares's retry
 * deadlines and each caller's timeout are its timers, requests reach it
 * as tasks. Each name being looked up is a query with a c-ares channel of
 * its own: a fresh UDP socket (and source port) per lookup rather than one
 * port shared by all, and a lookup whose callers have all gone (timed out)
 * is cancelled by destroying its channel, freeing its slot at once.
 *
 * Limits: at most max_inflight queries have a channel; further names wait
 * in line (max_waiting), beyond which a lookup fails at once. A query
 * serves every caller asking for the same (family, name) meanwhile; each
 * caller has its own promise and its own timeout.
 *
 * Never sent to a server: numeric addresses, "localhost" and names under
 * it (RFC 6761 §6.3: loopback, whatever /etc/hosts says, even with none),
 * and names under "invalid" (§6.4: fail at once). Inside a simulation
 * (runtime/sim/), a name is a host's and answers at once with its
 * address, or fails as not found.
 *
 * Threads: `R` (config, the loop pointer) is shared under R.lock; every
 * query, waiter and watcher belongs to the resolver's thread.
 */
#include <arpa/inet.h>
#include <ares.h>
#include <ctype.h>
#include <stdio.h>
#include <sys/time.h>

#include "internal.h"
#include "sim/sim.h"

#define BUCKETS 256
#define DEFAULT_INFLIGHT 256
#define DEFAULT_WAITING 4096
#define MAX_NAME 253

typedef struct query_s query_t;

typedef struct waiter_s {          /* one caller's promise */
  nr_promise_t *p;
  nr_timer_t *timer;               /* its timeout */
  query_t *q;
  uint64_t timeout;
  struct waiter_s *prev, *next;
} waiter_t;

typedef struct sock_s {            /* a c-ares socket watched on the loop */
  nr_io_t io;                      /* first: the loop hands it back */
  query_t *q;
  struct sock_s *next;
} sock_t;

struct query_s {
  char *key;                       /* family digit, then the lowercased name */
  int family;
  ares_channel ch;                 /* NULL until it has a slot */
  bool active, answered, destroying;
  waiter_t *waiters;
  sock_t *socks;
  nr_timer_t *tick;                /* c-ares's next deadline */
  query_t *hnext;                  /* hash chain */
  query_t *prev, *next;            /* the active or the waiting list */
};

typedef struct list_s {
  query_t *head, *tail;
  int n;
} list_t;

static struct {
  pthread_mutex_t lock;            /* guards the fields up to `loop` */
  char *servers;                   /* NULL: NETRUN_DNS_SERVERS or the system's */
  int max_inflight, max_waiting;
  nr_loop_t *loop;
  bool lib_ready, stopping;
  /* the resolver thread's */
  query_t *table[BUCKETS];
  list_t active, waiting;
  sock_t *graveyard;               /* watchers stopped during this pass */
  bool closed, starting;
} R = {.lock = PTHREAD_MUTEX_INITIALIZER, .max_inflight = DEFAULT_INFLIGHT,
       .max_waiting = DEFAULT_WAITING};

/* ---- answers that need no server ---------------------------------------------- */

/* Whether name is label or ends with "." label (a final dot allowed),
 * ignoring case. */
static bool under(const char *name, const char *label) {
  size_t n = strlen(name), k = strlen(label);
  if (n > 0 && name[n - 1] == '.')
    n--;
  if (n < k || strncasecmp(name + n - k, label, k) != 0)
    return false;
  return n == k || name[n - k - 1] == '.';
}

static void add_addr(nr_addrs_t *a, const char *text) {
  for (int i = 0; i < a->n; i++)
    if (strcmp(a->addr[i], text) == 0)
      return;
  size_t n = strlen(text);
  if (a->n < NR_MAX_ADDRS && n < sizeof a->addr[0])
    memcpy(a->addr[a->n++], text, n + 1);
}

int nr_resolve_local(const char *name, int family, nr_addrs_t *out) {
  unsigned char buf[sizeof(struct in6_addr)];
  out->n = 0;
  out->ttl = 0;
  int numeric = inet_pton(AF_INET, name, buf) == 1    ? AF_INET
                : inet_pton(AF_INET6, name, buf) == 1 ? AF_INET6
                                                      : 0;
  if (numeric) {
    if (family != AF_UNSPEC && family != numeric)
      return -EAFNOSUPPORT;
    add_addr(out, name);
    return 1;
  }
  if (!under(name, "localhost"))
    return 0;
  /* RFC 6724's order, as a stock /etc/hosts gives it: connects try both */
  if (family != AF_INET)
    add_addr(out, "::1");
  if (family != AF_INET6)
    add_addr(out, "127.0.0.1");
  return 1;
}

bool nr__is_localhost(const char *name) { return under(name, "localhost"); }

void nr_addrs_free(void *a) { free(a); }

/* ---- configuration ---------------------------------------------------------------- */

int nr_resolver_set_servers(const char *csv, char *err, size_t errlen) {
  char *copy = NULL;
  if (csv != NULL && *csv != '\0') {
    ares_channel ch;
    struct ares_options o = {.lookups = (char *)"b"};
    int rc = ares_init_options(&ch, &o, ARES_OPT_LOOKUPS);
    if (rc == ARES_SUCCESS) {
      rc = ares_set_servers_ports_csv(ch, csv);
      ares_destroy(ch);
    }
    if (rc != ARES_SUCCESS) {
      snprintf(err, errlen, "servers \"%s\": %s", csv, ares_strerror(rc));
      return rc == ARES_ENOMEM ? -ENOMEM : -EINVAL;
    }
    if ((copy = strdup(csv)) == NULL) {
      snprintf(err, errlen, "out of memory");
      return -ENOMEM;
    }
  }
  pthread_mutex_lock(&R.lock);
  free(R.servers);
  R.servers = copy;
  pthread_mutex_unlock(&R.lock);
  return 0;
}

void nr_resolver_set_limits(int max_inflight, int max_waiting) {
  pthread_mutex_lock(&R.lock);
  if (max_inflight > 0)
    R.max_inflight = max_inflight;
  if (max_waiting >= 0)
    R.max_waiting = max_waiting;
  pthread_mutex_unlock(&R.lock);
}

/* The servers a new query uses (a copy, or NULL for the system's). */
static char *servers_now(void) {
  pthread_mutex_lock(&R.lock);
  const char *s = R.servers ? R.servers : getenv("NETRUN_DNS_SERVERS");
  char *copy = s && *s ? strdup(s) : NULL;
  pthread_mutex_unlock(&R.lock);
  return copy;
}

/* ---- the table of queries ------------------------------------------------------- */

static unsigned bucket(const char *key) {
  unsigned h = 2166136261u;                  /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)key; *p; p++)
    h = (h ^ *p) * 16777619u;
  return h % BUCKETS;
}

static query_t *find(const char *key) {
  for (query_t *q = R.table[bucket(key)]; q; q = q->hnext)
    if (strcmp(q->key, key) == 0)
      return q;
  return NULL;
}

static void unhash(query_t *q) {
  for (query_t **pp = &R.table[bucket(q->key)]; *pp; pp = &(*pp)->hnext)
    if (*pp == q) {
      *pp = q->hnext;
      return;
    }
}

static void list_push(list_t *l, query_t *q) {
  q->next = NULL;
  q->prev = l->tail;
  if (l->tail)
    l->tail->next = q;
  else
    l->head = q;
  l->tail = q;
  l->n++;
}

static void list_remove(list_t *l, query_t *q) {
  if (q->prev)
    q->prev->next = q->next;
  else
    l->head = q->next;
  if (q->next)
    q->next->prev = q->prev;
  else
    l->tail = q->prev;
  q->prev = q->next = NULL;
  l->n--;
}

/* ---- completing callers ---------------------------------------------------------- */

static void waiter_unlink(waiter_t *w) {
  query_t *q = w->q;
  if (w->prev)
    w->prev->next = w->next;
  else
    q->waiters = w->next;
  if (w->next)
    w->next->prev = w->prev;
  nr__timer_drop(&w->timer);
  nr_promise_release(w->p);
  free(w);
}

static void fail_all(query_t *q, int code, const char *msg) {
  while (q->waiters) {
    nr_promise_set_failure(q->waiters->p, code, msg);
    waiter_unlink(q->waiters);
  }
}

static void succeed_all(query_t *q, const nr_addrs_t *a) {
  while (q->waiters) {
    nr_addrs_t *copy = malloc(sizeof *copy);
    if (copy == NULL) {
      nr_promise_set_failure(q->waiters->p, -ENOMEM, "out of memory");
    } else {
      *copy = *a;
      nr_promise_set_success(q->waiters->p, copy, nr_addrs_free);
    }
    waiter_unlink(q->waiters);
  }
}

/* ---- a query's life --------------------------------------------------------------- */

static void start_next(void);

/* Forget q: its channel destroyed (c-ares closes its sockets, which
 * sock_state stops watching), its callers failed with msg if any are
 * left, its slot given to the next name in line. */
static void release(query_t *q, int code, const char *msg) {
  unhash(q);
  bool active = q->active;
  list_remove(active ? &R.active : &R.waiting, q);
  if (q->ch) {
    q->destroying = true;
    ares_destroy(q->ch);
    q->ch = NULL;
  }
  nr__timer_drop(&q->tick);
  fail_all(q, code, msg);
  assert(q->socks == NULL);
  free(q->key);
  free(q);
  if (active)
    start_next();
}

static int tick(void *arg);

/* After c-ares ran for q: forget it if it answered, else wake up at
 * c-ares's next deadline (a retry, another server). */
static void settle(query_t *q) {
  if (q->answered) {
    release(q, 0, NULL);
    return;
  }
  struct timeval tv, *t = ares_timeout(q->ch, NULL, &tv);
  nr__timer_drop(&q->tick);
  if (t != NULL) {
    uint64_t ns = (uint64_t)t->tv_sec * 1000000000ull + (uint64_t)t->tv_usec * 1000u;
    q->tick = nr_loop_schedule(nr_loop_current(), ns, 0, tick, NULL, q);
  }
}

static int tick(void *arg) {
  query_t *q = arg;
  nr_timer_release(q->tick);
  q->tick = NULL;
  ares_process_fd(q->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
  settle(q);
  return 0;
}

static int on_sock(nr_loop_t *l, nr_io_t *io, uint32_t events) {
  (void)l;
  sock_t *s = (sock_t *)io;
  query_t *q = s->q;                 /* s may be stopped once c-ares ran */
  int fd = io->fd;
  if (q == NULL)
    return 0;                        /* stopped earlier in this pass */
  ares_process_fd(q->ch,
                  events & (EPOLLIN | EPOLLERR | EPOLLHUP) ? fd : ARES_SOCKET_BAD,
                  events & EPOLLOUT ? fd : ARES_SOCKET_BAD);
  settle(q);
  return 1;
}

/* Stopped watchers are freed after the loop's pass: an event fetched for
 * one in the same epoll_wait batch still finds its memory (q NULL). */
static int bury(void *arg) {
  (void)arg;
  while (R.graveyard) {
    sock_t *s = R.graveyard;
    R.graveyard = s->next;
    free(s);
  }
  return 0;
}

/* c-ares opens, closes or changes interest in one of q's sockets. */
static void sock_state(void *data, ares_socket_t fd, int readable, int writable) {
  nr_loop_t *l = nr_loop_current();
  query_t *q = data;
  sock_t **pp = &q->socks;
  while (*pp && (*pp)->io.fd != fd)
    pp = &(*pp)->next;
  uint32_t ev = (readable ? EPOLLIN : 0) | (writable ? EPOLLOUT : 0);
  sock_t *s = *pp;
  if (s == NULL) {
    if (ev == 0 || (s = calloc(1, sizeof *s)) == NULL)
      return;             /* unwatched: the caller's timeout ends the query */
    s->io.fd = fd;
    s->io.cb = on_sock;
    s->q = q;
    if (nr__io_start(l, &s->io, ev) < 0) {
      free(s);
      return;
    }
    s->next = q->socks;
    q->socks = s;
  } else if (ev == 0) {
    nr__io_stop(l, &s->io);
    *pp = s->next;
    s->q = NULL;
    if (R.graveyard == NULL && nr_loop_after_iteration(l, bury, NULL) < 0) {
      free(s);                       /* (out of memory: no pass can use it) */
      return;
    }
    s->next = R.graveyard;
    R.graveyard = s;
  } else {
    nr__io_modify(l, &s->io, ev);
  }
}

static int status_code(int status) {
  switch (status) {
  case ARES_ENOTFOUND: case ARES_ENODATA: case ARES_ENONAME:
    return -ENOENT;
  case ARES_ETIMEOUT:
    return NR_ETIMEDOUT;
  case ARES_ECONNREFUSED:
    return -ECONNREFUSED;
  case ARES_ENOMEM:
    return -ENOMEM;
  default:
    return -EIO;
  }
}

/* The answer (or c-ares's failure) for q; called from inside c-ares, so
 * q is only marked here and released by settle. */
static void on_answer(void *arg, int status, int timeouts,
                      struct ares_addrinfo *ai) {
  (void)timeouts;
  query_t *q = arg;
  if (q->destroying || q->answered) {
    ares_freeaddrinfo(ai);
    return;
  }
  q->answered = true;
  nr_addrs_t a = {0};
  bool first = true;
  for (struct ares_addrinfo_node *n = ai ? ai->nodes : NULL; n; n = n->ai_next) {
    char text[INET6_ADDRSTRLEN];
    const void *bin = n->ai_family == AF_INET
        ? (const void *)&((struct sockaddr_in *)n->ai_addr)->sin_addr
        : (const void *)&((struct sockaddr_in6 *)n->ai_addr)->sin6_addr;
    if ((n->ai_family != AF_INET && n->ai_family != AF_INET6) ||
        inet_ntop(n->ai_family, bin, text, sizeof text) == NULL)
      continue;
    add_addr(&a, text);
    uint32_t ttl = n->ai_ttl > 0 ? (uint32_t)n->ai_ttl : 0;
    if (first || ttl < a.ttl)
      a.ttl = ttl;
    first = false;
  }
  ares_freeaddrinfo(ai);
  if (status == ARES_SUCCESS && a.n > 0)
    succeed_all(q, &a);
  else if (status == ARES_SUCCESS)
    fail_all(q, -ENOENT, "no address of the asked family");
  else
    fail_all(q, status_code(status), ares_strerror(status));
}

/* Give q a channel and send its questions. */
static void start(query_t *q) {
  q->active = true;
  list_push(&R.active, q);
  const char *name = strchr(q->key, ' ') + 1;
  if (under(name, "invalid")) {      /* RFC 6761 §6.4: never asked */
    q->answered = true;
    fail_all(q, -ENOENT, ares_strerror(ARES_ENOTFOUND));
    release(q, 0, NULL);
    return;
  }
  struct ares_options o = {.sock_state_cb = sock_state, .sock_state_cb_data = q,
                           .lookups = (char *)"fb"};
  char *servers = servers_now();
  int rc = ares_init_options(&q->ch, &o, ARES_OPT_SOCK_STATE_CB | ARES_OPT_LOOKUPS);
  if (rc == ARES_SUCCESS && servers)
    rc = ares_set_servers_ports_csv(q->ch, servers);
  free(servers);
  if (rc != ARES_SUCCESS) {
    release(q, status_code(rc), ares_strerror(rc));
    return;
  }
  struct ares_addrinfo_hints h = {.ai_family = q->family,
                                  .ai_socktype = SOCK_STREAM};
  ares_getaddrinfo(q->ch, name, NULL, &h, on_answer, q);   /* may answer now */
  settle(q);
}

/* Slots freed: the names in line start, first come first. Not nested (a
 * query that ends as it starts frees its slot for this same loop). */
static void start_next(void) {
  if (R.starting)
    return;
  R.starting = true;
  int max;
  pthread_mutex_lock(&R.lock);
  max = R.max_inflight;
  pthread_mutex_unlock(&R.lock);
  while (R.waiting.head && R.active.n < max && !R.closed) {
    query_t *q = R.waiting.head;
    list_remove(&R.waiting, q);
    start(q);
  }
  R.starting = false;
}

/* ---- requests ---------------------------------------------------------------------- */

typedef struct request_s {
  nr_promise_t *p;
  int family;
  uint64_t timeout;
  char key[];                        /* as query_t's */
} request_t;

static int waiter_expired(void *arg) {
  waiter_t *w = arg;
  query_t *q = w->q;
  char msg[64];
  snprintf(msg, sizeof msg, "timed out after %.3g s", (double)w->timeout / 1e9);
  nr_timer_release(w->timer);
  w->timer = NULL;
  nr_promise_set_failure(w->p, NR_ETIMEDOUT, msg);
  waiter_unlink(w);
  if (q->waiters == NULL)           /* nobody wants the answer: cancel it */
    release(q, 0, NULL);
  return 0;
}

/* A new query for r's name, in the table and (unless it may start now)
 * in line; NULL if refused (r's promise is failed then). */
static query_t *new_query(request_t *r, bool *now) {
  int max_inflight, max_waiting;
  pthread_mutex_lock(&R.lock);
  max_inflight = R.max_inflight;
  max_waiting = R.max_waiting;
  pthread_mutex_unlock(&R.lock);
  *now = R.active.n < max_inflight;
  if (!*now && R.waiting.n >= max_waiting) {
    char msg[96];
    snprintf(msg, sizeof msg, "%d lookups in flight and %d waiting "
             "(max_inflight, max_waiting)", R.active.n, R.waiting.n);
    nr_promise_set_failure(r->p, -EAGAIN, msg);
    return NULL;
  }
  query_t *q = calloc(1, sizeof *q);
  if (q == NULL || (q->key = strdup(r->key)) == NULL) {
    free(q);
    nr_promise_set_failure(r->p, -ENOMEM, "out of memory");
    return NULL;
  }
  q->family = r->family;
  unsigned b = bucket(q->key);
  q->hnext = R.table[b];
  R.table[b] = q;
  if (!*now)
    list_push(&R.waiting, q);
  return q;
}

/* r's promise joins the query for its name, made if there is none. */
static void join(request_t *r) {
  bool now = false;
  query_t *q = find(r->key);
  waiter_t *w = calloc(1, sizeof *w);
  if (w == NULL) {
    nr_promise_set_failure(r->p, -ENOMEM, "out of memory");
    return;
  }
  if (q == NULL && (q = new_query(r, &now)) == NULL) {
    free(w);
    return;
  }
  w->p = nr_promise_retain(r->p);
  w->q = q;
  w->timeout = r->timeout;
  w->next = q->waiters;
  if (q->waiters)
    q->waiters->prev = w;
  q->waiters = w;
  w->timer = nr_loop_schedule(nr_loop_current(), r->timeout, 0,
                              waiter_expired, NULL, w);
  if (now)
    start(q);
}

static int on_request(void *arg) {
  request_t *r = arg;
  if (R.closed)
    nr_promise_set_failure(r->p, NR_ECANCELLED, "the resolver has shut down");
  else
    join(r);
  nr_promise_release(r->p);
  free(r);
  return 0;
}

/* The resolver's loop, made (and c-ares readied) on first use. Under R.lock. */
static nr_loop_t *loop_locked(void) {
  if (R.loop || R.stopping)
    return R.loop;
  if (!R.lib_ready) {
    if (ares_library_init(ARES_LIB_INIT_ALL) != ARES_SUCCESS)
      return NULL;
    R.lib_ready = true;
  }
  R.closed = false;
  R.loop = nr_loop_new(&(nr_loop_opts_t){.name = "dns"});
  return R.loop;
}

/* What makes a name unfit to ask for: empty, too long, or holding bytes
 * no host name has (spaces, controls). NULL if fit. */
static const char *unfit(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > MAX_NAME + (name[n - 1] == '.'))
    return "not a host name (empty, or longer than 253 bytes)";
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    if (*p <= ' ' || *p == 0x7f)
      return "not a host name (a space or control byte in it)";
  return NULL;
}

nr_promise_t *nr_resolve(const char *name, int family, uint64_t timeout) {
  nr_addrs_t local;
  const char *bad = unfit(name);
  if (bad)
    return nr__promise_failed(-EINVAL, "%s", bad);
  int rc = nr_resolve_local(name, family, &local);
  if (rc < 0)
    return nr__promise_failed(rc, "a numeric address of another family");
  if (rc == 0)
    rc = nr__sim_lookup(name, family, &local);   /* a simulation's host */
  if (rc == -ENOENT)
    return nr__promise_failed(rc, "Domain name not found");
  nr_promise_t *p = nr_promise_new();
  if (p == NULL)
    return NULL;
  if (rc > 0) {
    nr_addrs_t *a = malloc(sizeof *a);
    if (a == NULL)
      nr_promise_set_failure(p, -ENOMEM, "out of memory");
    else
      *a = local, nr_promise_set_success(p, a, nr_addrs_free);
    return p;
  }
  size_t n = strlen(name);
  request_t *r = malloc(sizeof *r + n + 3);
  if (r == NULL) {
    nr_promise_set_failure(p, -ENOMEM, "out of memory");
    return p;
  }
  r->p = nr_promise_retain(p);
  r->family = family;
  r->timeout = timeout ? timeout : NR_SEC(10);
  r->key[0] = family == AF_INET ? '4' : family == AF_INET6 ? '6' : '0';
  r->key[1] = ' ';
  for (size_t i = 0; i <= n; i++)
    r->key[2 + i] = (char)tolower((unsigned char)name[i]);
  pthread_mutex_lock(&R.lock);
  nr_loop_t *l = loop_locked();
  rc = l ? nr_loop_execute(l, on_request, r) : -ENOMEM;
  pthread_mutex_unlock(&R.lock);
  if (rc < 0) {
    nr_promise_set_failure(p, rc, "the resolver is not running");
    nr_promise_release(r->p);
    free(r);
  }
  return p;
}

/* ---- shutdown ------------------------------------------------------------------------ */

static void release_all(const char *why) {
  while (R.waiting.head)
    release(R.waiting.head, NR_ECANCELLED, why);
  while (R.active.head)
    release(R.active.head, NR_ECANCELLED, why);
}

static int cancel_task(void *arg) {
  release_all("cancelled: netrun is shutting down");
  (void)arg;
  return 0;
}

void nr_resolver_cancel_all(void) {
  pthread_mutex_lock(&R.lock);
  if (R.loop)
    nr_loop_execute(R.loop, cancel_task, NULL);
  pthread_mutex_unlock(&R.lock);
}

static int teardown(void *arg) {
  (void)arg;
  R.closed = true;
  release_all("the resolver has shut down");
  return 0;
}

void nr_resolver_shutdown(void) {
  pthread_mutex_lock(&R.lock);
  nr_loop_t *l = R.loop;
  R.loop = NULL;
  R.stopping = l != NULL;            /* no new resolver until this one is gone */
  pthread_mutex_unlock(&R.lock);
  if (l == NULL)
    return;
  if (nr_loop_execute(l, teardown, NULL) == 0) {
    nr_promise_t *done = nr_loop_shutdown_gracefully(l, 0, NR_SEC(2));
    nr_promise_wait(done, NR_SEC(5));
  }
  if (!nr_loop_is_terminated(l)) {
    nr_log(NR_LOG_WARN, "dns: the resolver thread did not stop; left running");
    return;                          /* (and no other is made) */
  }
  nr_loop_free(l);
  pthread_mutex_lock(&R.lock);
  R.stopping = false;
  pthread_mutex_unlock(&R.lock);
}
