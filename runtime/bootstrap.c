/*
 * bootstrap.c -- creating channels (Netty's ServerBootstrap and Bootstrap)
 * and the acceptor of server channels.
 *
 * The socket is created and its address resolved on the calling thread, so
 * bad input fails the returned future before any loop is involved. The
 * channel is then registered on its loop by a task, its init runs there,
 * and bind/connect enter its pipeline at the tail, as in Netty. A
 * reuseport server binds one listener per child loop (see "reuseport"
 * below): the first as above, the others from the first one's loop.
 */
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"

typedef struct boot_s {
  nr_channel_t *ch;
  struct sockaddr_storage addr;
  socklen_t len;
  bool bind;
} boot_t;

static int boot_task(void *arg) {
  boot_t *b = arg;
  nr_channel_t *ch = b->ch;
  nr_promise_t *p = ch->setup->reg_promise;
  ch->setup->reg_promise = NULL;
  int rc = nr__channel_register(ch, 0);
  if (rc < 0) {
    nr_promise_set_failure(p, rc, nr__errname(rc));
    nr_channel_release(ch);
  } else if (ch->st & NR__CLOSED) {
    nr_promise_set_failure(p, NR_ECLOSED, "channel closed by its init");
  } else if (b->bind) {
    nr__pipeline_bind(&ch->pipe, (struct sockaddr *)&b->addr, b->len, p);
  } else {
    nr__pipeline_connect(&ch->pipe, (struct sockaddr *)&b->addr, b->len, p);
  }
  nr_promise_release(p);
  free(b);
  return 0;
}

/* Hand a fresh channel to its loop; returns the caller's future. */
static nr_promise_t *boot(nr_channel_t *ch, nr_loop_t *l,
                          const struct sockaddr_storage *ss, socklen_t len,
                          bool bind) {
  nr_promise_t *p = nr_promise_new();
  boot_t *b = malloc(sizeof *b);
  nr_setup_t *su = nr__channel_setup(ch);
  if (p == NULL || b == NULL || su == NULL) {
    free(b);
    nr_channel_release(ch);
    if (p)
      nr_promise_set_failure(p, -ENOMEM, "out of memory");
    return p;
  }
  b->ch = ch;
  b->addr = *ss;
  b->len = len;
  b->bind = bind;
  ch->loop = l;
  su->reg_promise = nr_promise_retain(p);
  if (nr_loop_execute(l, boot_task, b) < 0) {
    nr_promise_release(su->reg_promise);
    su->reg_promise = NULL;
    nr_channel_release(ch);
    free(b);
    nr_promise_set_failure(p, NR_EREJECTED, "event loop is shut down");
  }
  return p;
}

static int address(const char *unix_path, const char *host, int port,
                   int type, bool passive, struct sockaddr_storage *ss,
                   socklen_t *len) {
  if (unix_path)
    return nr__unix_addr(unix_path, ss, len);
  return nr__resolve(host, port, type, passive, ss, len);
}

static nr_promise_t *fail_with_raised(int rc) {
  return nr__promise_failed(rc, "%s", nr__raised(rc));
}

/* A listening channel on fd, not yet registered; NULL when out of memory
 * (the fd is closed then). */
/* Linux's accept(2) gives a connection its listener's TCP_NODELAY and
 * SO_KEEPALIVE: set once on the listener, they cost no setsockopt per
 * connection (nginx sets neither per connection). Whether both took. */
static bool set_inherited(int fd, const nr_channel_opts_t *child) {
  int on = 1;
  return (!child->tcp_nodelay ||
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on) == 0) &&
         (!child->keepalive ||
          setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) == 0);
}

static void reserve_open(void);

static nr_channel_t *listener_new(const nr_server_opts_t *o, int family,
                                  int fd) {
  nr_channel_t *ch = nr__channel_new(NR__LISTEN, family, fd, NULL);
  nr_server_t *srv = calloc(1, sizeof *srv);
  nr_setup_t *su = ch ? nr__channel_setup(ch) : NULL;
  if (su == NULL || srv == NULL) {
    free(srv);
    if (ch)
      nr_channel_release(ch);
    else
      close(fd);
    return NULL;
  }
  srv->child_group = o->child_group ? o->child_group : o->group;
  srv->child_loop = o->child_loop ? o->child_loop
                    : o->child_group || o->group ? NULL : o->loop;
  nr_channel_opts_t dflt;
  nr_channel_opts_init(&dflt);
  static const nr_channel_opts_t zero;
  srv->child = memcmp(&o->child, &zero, sizeof zero) ? o->child : dflt;
  srv->child_init = o->child_init;
  srv->child_closed = o->child_closed;
  srv->child_inherits = family != AF_UNIX && set_inherited(fd, &srv->child);
  srv->arg = o->arg;
  srv->backoff = o->accept_backoff ? o->accept_backoff : NR_SEC(1);
  ch->srv = srv;
  reserve_open();              /* (for when the descriptors run out) */
  su->backlog = o->backlog > 0 ? o->backlog : 1024;
  ch->init = o->init;
  ch->init_arg = o->arg;
  return ch;
}

/* A TCP socket for a listener; with reuseport, one the kernel lets share
 * its address with the other listeners (of this process or another). */
static int listen_socket(int family, bool reuseport) {
  int fd = nr__socket(family, SOCK_STREAM);
  if (fd < 0)
    return fd;
  int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) < 0) {
    int rc = -errno;
    close(fd);
    return nr_raise(rc, "reuseport: SO_REUSEPORT refused: %s", nr__errname(rc));
  }
  return fd;
}

static nr_promise_t *reuseport_bind(const nr_server_opts_t *o,
                                    struct sockaddr_storage *ss, socklen_t len);

nr_promise_t *nr_server_bind(const nr_server_opts_t *o) {
  struct sockaddr_storage ss;
  socklen_t len;
  if (o->group == NULL && o->loop == NULL)
    return nr__promise_failed(-EINVAL, "a server needs a group or a loop");
  if (o->reuseport && o->unix_path)
    return nr__promise_failed(-EINVAL, "reuseport needs a TCP address, "
                              "not a unix socket");
  int rc = address(o->unix_path, o->host ? o->host : "0.0.0.0", o->port,
                   SOCK_STREAM, true, &ss, &len);
  if (rc < 0)
    return fail_with_raised(rc);
  if (o->reuseport && o->child_group && !o->child_loop)
    return reuseport_bind(o, &ss, len);
  if (ss.ss_family == AF_UNIX && (rc = nr__unix_prepare(&ss, len)) < 0)
    return fail_with_raised(rc);
  int fd = ss.ss_family == AF_UNIX ? nr__socket(AF_UNIX, SOCK_STREAM)
                                   : listen_socket(ss.ss_family, o->reuseport);
  if (fd < 0)
    return fail_with_raised(fd);
  if (ss.ss_family == AF_UNIX && o->unix_mode &&
      fchmod(fd, (mode_t)(o->unix_mode & 0777)) < 0) {
    /* bind(2) gives the file the socket's own mode less the umask (Linux
     * af_unix), so the file is born with it: no chmod after, no window. */
    rc = -errno;
    close(fd);
    return fail_with_raised(nr_raise(rc, "%s: fchmod: %s", o->unix_path,
                                     nr__errname(rc)));
  }
  nr_channel_t *ch = listener_new(o, ss.ss_family, fd);
  if (ch == NULL)
    return nr__promise_failed(-ENOMEM, "out of memory");
  return boot(ch, o->loop ? o->loop : nr_group_next(o->group), &ss, len, true);
}

/* ---- reuseport: one listener per child loop ----------------------------------
 *
 * Each loop of the child group accepts on a listener of its own, all bound
 * to one address with SO_REUSEPORT: the kernel spreads new connections
 * over them and no accepted channel changes threads. The listener on the
 * first loop (the primary) is the server channel users hold; it binds
 * first, so that port 0 is resolved once and the others bind the port it
 * got. The others (siblings) hang off the primary's nr_server_t; the
 * primary's close closes them. The sibling array is written and read on
 * the primary's loop only (its bind listener, its close). */

typedef struct rp_s {
  nr_server_opts_t o;        /* the caller's options (strings unused) */
  struct sockaddr_storage ss;
  socklen_t len;
  nr_promise_t *result;      /* the caller's future */
  nr_channel_t *primary;     /* retained until the result is set */
  _Atomic int pending;       /* sibling binds not yet completed */
  _Atomic int failed;        /* a sibling's error code, first one wins */
  char msg[200];
} rp_t;

static void rp_finish(rp_t *rp, int code, const char *msg) {
  if (code == 0) {
    nr_promise_set_success(rp->result, nr_channel_retain(rp->primary),
                           (void (*)(void *))nr_channel_release);
  } else {
    nr_channel_close(rp->primary, NULL);       /* and every sibling */
    nr_promise_set_failure(rp->result, code, msg);
  }
  nr_promise_release(rp->result);
  nr_channel_release(rp->primary);
  free(rp);
}

/* On a sibling's loop: its bind completed. The last one sets the result. */
static void rp_sibling_bound(nr_promise_t *p, void *arg) {
  rp_t *rp = arg;
  int code = nr_promise_code(p);
  int none = 0;
  if (code != 0 && atomic_compare_exchange_strong(&rp->failed, &none, code))
    snprintf(rp->msg, sizeof rp->msg, "reuseport: %s", nr_promise_message(p));
  if (atomic_fetch_sub(&rp->pending, 1) == 1)
    rp_finish(rp, atomic_load(&rp->failed), rp->msg);
}

/* A sibling listener on loop l, booted; its bind reports to rp. */
static int rp_boot_sibling(rp_t *rp, nr_loop_t *l, nr_channel_t **out) {
  int fd = listen_socket(rp->ss.ss_family, true);
  if (fd < 0)
    return fd;
  rp->o.child_loop = l;
  nr_channel_t *ch = listener_new(&rp->o, rp->ss.ss_family, fd);
  if (ch == NULL)
    return -ENOMEM;
  *out = nr_channel_retain(ch);
  nr_promise_t *p = boot(ch, l, &rp->ss, rp->len, true);
  nr_promise_add_listener(p, NULL, rp_sibling_bound, rp);
  nr_promise_release(p);
  return 0;
}

/* On the primary's loop: it is bound. Bind the others to its address. */
static void rp_primary_bound(nr_promise_t *p, void *arg) {
  rp_t *rp = arg;
  nr_channel_t *pr = rp->primary;
  if (nr_promise_code(p) != 0) {
    rp_finish(rp, nr_promise_code(p), nr_promise_message(p));
    return;
  }
  if (pr->st & NR__CLOSED) {
    rp_finish(rp, NR_ECLOSED, "server closed while binding");
    return;
  }
  rp->len = sizeof rp->ss;                   /* the port it got, if 0 */
  getsockname(nr_channel_fd(pr), (struct sockaddr *)&rp->ss, &rp->len);
  int n = nr_group_size(rp->o.child_group);
  pr->srv->siblings = calloc((size_t)n, sizeof *pr->srv->siblings);
  if (pr->srv->siblings == NULL) {
    rp_finish(rp, -ENOMEM, "out of memory");
    return;
  }
  atomic_store(&rp->pending, n);             /* n - 1 siblings, + this one */
  for (int i = 1; i < n; i++) {
    nr_channel_t **slot = &pr->srv->siblings[pr->srv->nsiblings];
    int rc = rp_boot_sibling(rp, nr_group_loop(rp->o.child_group, i), slot);
    if (rc == 0) {
      pr->srv->nsiblings++;
      continue;
    }
    int none = 0;
    if (atomic_compare_exchange_strong(&rp->failed, &none, rc))
      snprintf(rp->msg, sizeof rp->msg, "%s", nr__raised(rc));
    atomic_fetch_sub(&rp->pending, 1);
  }
  if (atomic_fetch_sub(&rp->pending, 1) == 1)
    rp_finish(rp, atomic_load(&rp->failed), rp->msg);
}

static nr_promise_t *reuseport_bind(const nr_server_opts_t *o,
                                    struct sockaddr_storage *ss, socklen_t len) {
  int fd = listen_socket(ss->ss_family, true);
  if (fd < 0)
    return fail_with_raised(fd);
  rp_t *rp = calloc(1, sizeof *rp);
  nr_promise_t *result = nr_promise_new();
  nr_loop_t *first = nr_group_loop(o->child_group, 0);
  nr_server_opts_t po = *o;
  po.child_loop = first;
  nr_channel_t *ch = listener_new(&po, ss->ss_family, fd);
  if (rp == NULL || result == NULL || ch == NULL) {
    free(rp);
    if (ch)
      nr_channel_release(ch);
    if (result)
      nr_promise_release(result);
    return nr__promise_failed(-ENOMEM, "out of memory");
  }
  rp->o = *o;
  rp->o.host = rp->o.unix_path = NULL;       /* the caller's strings go */
  rp->ss = *ss;
  rp->len = len;
  rp->result = nr_promise_retain(result);
  rp->primary = nr_channel_retain(ch);
  nr_promise_t *p = boot(ch, first, ss, len, true);
  nr_promise_add_listener(p, NULL, rp_primary_bound, rp);
  nr_promise_release(p);
  return result;
}

typedef struct rp_close_s {
  nr_channel_t *primary;
  _Atomic int left;          /* siblings not yet closed */
} rp_close_t;

static void rp_sibling_closed(nr_promise_t *p, void *arg) {
  (void)p;
  rp_close_t *c = arg;
  if (atomic_fetch_sub(&c->left, 1) != 1)
    return;
  nr__channel_closed(c->primary);            /* its close future completes */
  nr_channel_release(c->primary);
  free(c);
}

/* The primary's loop, as it closes: a reuseport server closes its other
 * listeners with it, each on its own loop. True when the primary's close
 * future is to complete once they all have (rp_sibling_closed), so that
 * server:close():sync() returns with no listener left. */
bool nr__server_closed(nr_channel_t *ch) {
  nr_server_t *srv = ch->srv;
  if (srv->nsiblings == 0)
    return false;
  rp_close_t *c = malloc(sizeof *c);
  if (c == NULL) {
    for (int i = 0; i < srv->nsiblings; i++)
      nr_channel_close(srv->siblings[i], NULL);
    return false;                            /* no waiting, but closed */
  }
  c->primary = nr_channel_retain(ch);
  atomic_init(&c->left, srv->nsiblings);
  for (int i = 0; i < srv->nsiblings; i++) {
    nr_promise_t *p = nr_promise_new();
    if (p != NULL && nr_channel_close(srv->siblings[i], p) == 0) {
      nr_promise_add_listener(p, NULL, rp_sibling_closed, c);
    } else {                                 /* out of memory: don't wait */
      nr_channel_close(srv->siblings[i], NULL);
      rp_sibling_closed(NULL, c);
    }
    nr_promise_release(p);
  }
  return true;
}

/* The sibling references go with the primary's server state. */
void nr__server_free(nr_server_t *srv) {
  if (srv == NULL)
    return;
  for (int i = 0; i < srv->nsiblings; i++)
    nr_channel_release(srv->siblings[i]);
  free(srv->siblings);
  free(srv);
}

/* The first address of a connect to several (o->hosts) whose socket can
 * be made, in *ss and *fd; the list in *out. 0 or an error (raised). */
static int first_attempt(const nr_connect_opts_t *o, nr_attempts_t **out,
                         struct sockaddr_storage *ss, socklen_t *len, int *fd) {
  int rc = nr__attempts_new(o->hosts, o->nhosts, o->port, out);
  if (rc < 0)
    return rc;
  for (;;) {
    const struct sockaddr_storage *first = nr__attempts_first(*out, len);
    memcpy(ss, first, *len);
    if ((*fd = nr__socket(ss->ss_family, SOCK_STREAM)) >= 0)
      return 0;
    if (!nr__attempts_skip_first(*out, *fd)) {
      int code;
      rc = nr_raise(*fd, "%s", nr__attempts_message(*out, &code));
      nr__attempts_free_list(*out);
      *out = NULL;
      return rc;
    }
  }
}

nr_promise_t *nr_connect(const nr_connect_opts_t *o) {
  struct sockaddr_storage ss;
  socklen_t len;
  nr_attempts_t *attempts = NULL;
  int fd;
  if (o->group == NULL && o->loop == NULL)
    return nr__promise_failed(-EINVAL, "connect needs a group or a loop");
  if (o->nhosts > 1 && o->unix_path == NULL) {
    int rc = first_attempt(o, &attempts, &ss, &len, &fd);
    if (rc < 0)
      return fail_with_raised(rc);
  } else {
    const char *host = o->nhosts == 1 ? o->hosts[0] : o->host;
    int rc = address(o->unix_path, host ? host : "127.0.0.1", o->port,
                     SOCK_STREAM, false, &ss, &len);
    if (rc < 0)
      return fail_with_raised(rc);
    if ((fd = nr__socket(ss.ss_family, SOCK_STREAM)) < 0)
      return fail_with_raised(fd);
  }
  nr_channel_t *ch = nr__channel_new(NR__STREAM, ss.ss_family, fd, &o->opts);
  if (ch == NULL) {
    close(fd);
    nr__attempts_free_list(attempts);
    return nr__promise_failed(-ENOMEM, "out of memory");
  }
  static const nr_channel_opts_t zero;
  if (memcmp(&o->opts, &zero, sizeof zero) == 0)
    ch->opts.send_timeout = 0;   /* a client picked its peer: no send timeout */
  nr__apply_opts(fd, ss.ss_family, &ch->opts);
  nr_setup_t *su = nr__channel_setup(ch);
  if (su == NULL) {
    nr__attempts_free_list(attempts);
    nr_channel_release(ch);                   /* closes the fd */
    return nr__promise_failed(-ENOMEM, "out of memory");
  }
  su->attempts = attempts;
  ch->init = o->init;
  ch->init_arg = o->arg;
  su->connect_timeout = o->timeout ? o->timeout : NR_SEC(30);
  return boot(ch, o->loop ? o->loop : nr_group_next(o->group), &ss, len,
              false);
}

nr_promise_t *nr_udp_bind(const nr_udp_opts_t *o) {
  struct sockaddr_storage ss;
  socklen_t len;
  if (o->group == NULL && o->loop == NULL)
    return nr__promise_failed(-EINVAL, "udp needs a group or a loop");
  int rc = address(NULL, o->host ? o->host : "0.0.0.0", o->port, SOCK_DGRAM,
                   true, &ss, &len);
  if (rc < 0)
    return fail_with_raised(rc);
  int fd = nr__socket(ss.ss_family, SOCK_DGRAM);
  if (fd < 0)
    return fail_with_raised(fd);
  nr_channel_t *ch = nr__channel_new(NR__DGRAM, ss.ss_family, fd, &o->opts);
  if (ch == NULL) {
    close(fd);
    return nr__promise_failed(-ENOMEM, "out of memory");
  }
  nr__apply_opts(fd, ss.ss_family, &ch->opts);
  ch->init = o->init;
  ch->init_arg = o->arg;
  return boot(ch, o->loop ? o->loop : nr_group_next(o->group), &ss, len, true);
}

/* ---- the acceptor ----------------------------------------------------------- */

static int register_child(void *arg) {
  nr_channel_t *ch = arg;
  uint32_t ev = ch->opts.auto_read ? EPOLLIN : 0;
  atomic_fetch_or(&ch->pub, NR__ACTIVE);     /* accepted: already connected */
  ch->st |= NR__FRESH;                       /* (before init: its codecs may
                                                say what ends it) */
  int rc = nr__channel_register(ch, ev);
  if (rc < 0) {
    nr_log(NR_LOG_WARN, "cannot register an accepted channel: %s",
           nr_strerror(rc));
    nr_channel_release(ch);
    return 0;
  }
  if (!(ch->st & NR__CLOSED)) {
    atomic_fetch_and(&ch->pub, ~NR__ACTIVE); /* set_active fires the event */
    nr__channel_set_active(ch);
  }
  return 0;
}

static void spawn_child(nr_channel_t *srv_ch, int fd,
                        const struct sockaddr_storage *ss, socklen_t len) {
  nr_server_t *srv = srv_ch->srv;
  nr_channel_t *ch = nr__channel_new(NR__STREAM, srv_ch->family, fd,
                                     &srv->child);
  if (ch == NULL) {
    close(fd);
    return;
  }
  nr_channel_opts_t opts = ch->opts;
  if (srv->child_inherits)
    opts.tcp_nodelay = opts.keepalive = false;     /* the listener's */
  nr__apply_opts(fd, srv_ch->family, &opts);
  if (nr__channel_set_raddr(ch, ss, len) < 0) {
    nr_channel_release(ch);                   /* closes the fd */
    return;
  }
  ch->init = srv->child_init;
  ch->closed_hook = srv->child_closed;
  ch->init_arg = srv->arg;
  ch->loop = srv->child_loop ? srv->child_loop : nr_group_next(srv->child_group);
  if (nr__in_loop(ch->loop)) {
    register_child(ch);
  } else if (nr_loop_execute(ch->loop, register_child, ch) < 0) {
    nr_channel_release(ch);                   /* closes the fd */
  }
}

static int resume_accept(void *arg) {
  nr_channel_t *ch = arg;
  nr_timer_release(ch->srv->backoff_timer);
  ch->srv->backoff_timer = NULL;
  ch->st &= ~NR__ACCEPT_PAUSED;
  nr__channel_update_interest(ch);
  return 0;
}

/* Out of memory, or of descriptors with none to free: stop accepting for a
 * while instead of spinning on a listener that stays readable (Netty's
 * ServerBootstrapAcceptor pauses auto-read for a second). */
static void pause_accept(nr_channel_t *ch, int err) {
  char msg[200];
  snprintf(msg, sizeof msg, "accept: %s; pausing accepts for %.3g s",
           nr__errname(err), (double)ch->srv->backoff / 1e9);
  nr_log(NR_LOG_WARN, "channel %llu: %s", (unsigned long long)ch->id, msg);
  ch->st |= NR__ACCEPT_PAUSED;
  nr__channel_update_interest(ch);
  ch->srv->backoff_timer = nr_loop_schedule(ch->loop, ch->srv->backoff, 0,
                                            resume_accept, NULL, ch);
  nr_pipeline_fire_exception(&ch->pipe, &(nr_err_t){err, msg});
}

/* ---- shedding: out of descriptors ------------------------------------------
 *
 * A full descriptor table (EMFILE, ENFILE) is what a slowloris aims at:
 * connections that send a request head a byte a second hold every
 * descriptor, and no other client gets in until their header timeout.
 * So accept asks each loop it serves for its oldest fresh connections
 * (channel.c: accepted, and nothing complete came from them -- no byte, or
 * for the HTTP server codec no whole request head --, or idle between
 * requests, or in a TLS handshake), as many as wait in the
 * listen queue (a listening socket's tcpi_unacked), SHED_BATCH at most,
 * shared among the loops of its child group, and stops accepting until
 * every loop has answered. Then, if any were closed, it accepts again at
 * once: the connections waiting in the listen queue, oldest first, get
 * their descriptors. If none could be
 * closed, the reserve descriptor (one per process, opened with the first
 * listener) is closed to accept and close at once what waits, so that
 * clients learn the server is full rather than hang in the queue, and the
 * listener does not spin; without a reserve, accepts pause for the
 * backoff as on ENOMEM. The loops are asked with tasks (a loop's channels
 * are its own); the listener's loop counts the answers. */

#define SHED_BATCH 16
#define SHED_LOG_EVERY NR_SEC(1)

static _Atomic int reserve_fd = -1;

void nr__accept_reserve_drop(void) {
  int fd = atomic_exchange(&reserve_fd, -1);
  if (fd >= 0)
    close(fd);
}

/* The reserve, if there is none (a free descriptor becomes it). */
static void reserve_open(void) {
  if (atomic_load(&reserve_fd) >= 0)
    return;
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int none = -1;
  if (fd >= 0 && !atomic_compare_exchange_strong(&reserve_fd, &none, fd))
    close(fd);                     /* another listener's thread made one */
}

/* Accept and close what waits (max_reads at most) with the reserve's
 * descriptor; how many, or -1 when there is no reserve. */
static int refuse_waiting(nr_channel_t *ch) {
  int fd = atomic_exchange(&reserve_fd, -1), n = 0;
  if (fd < 0)
    return -1;
  close(fd);
  for (int c; n < ch->opts.max_reads &&
              (c = accept4(ch->io.fd, NULL, NULL, SOCK_CLOEXEC)) >= 0; n++)
    close(c);
  reserve_open();
  return n;
}

static void shed_log(nr_channel_t *ch, const char *fmt, int n) {
  nr_server_t *srv = ch->srv;
  uint64_t now = nr_now();
  if (srv->shed_logged != 0 && now - srv->shed_logged < SHED_LOG_EVERY)
    return;
  srv->shed_logged = now;
  nr_log(NR_LOG_WARN, fmt, (unsigned long long)ch->id, n, n == 1 ? "" : "s");
}

static void resume_now(nr_channel_t *ch) {
  ch->st &= ~NR__ACCEPT_PAUSED;
  nr__channel_update_interest(ch);
}

/* Every loop answered: accept again, refuse what waits, or back off. */
static void shed_over(nr_channel_t *ch, int err) {
  nr_server_t *srv = ch->srv;
  if (ch->st & NR__CLOSED)
    return;
  if (srv->shed_closed > 0) {
    shed_log(ch, "channel %llu: accept: out of descriptors: closed %d "
             "connection%s that had sent nothing whole since accept, waited "
             "idle or in a TLS handshake, oldest first", srv->shed_closed);
    reserve_open();
    resume_now(ch);
    return;
  }
  int n = refuse_waiting(ch);
  if (n < 0) {
    pause_accept(ch, err);
    return;
  }
  shed_log(ch, "channel %llu: accept: out of descriptors, none to close "
           "(each connection has sent something whole): refused %d waiting "
           "connection%s", n);
  resume_now(ch);
}

typedef struct shed_s {
  nr_channel_t *listener;      /* retained */
  nr_loop_t *loop;             /* whose fresh channels are closed */
  int max, closed, err;
} shed_t;

static int shed_answered(void *arg) {
  shed_t *t = arg;
  nr_server_t *srv = t->listener->srv;
  srv->shed_closed += t->closed;
  if (--srv->shed_waiting == 0)
    shed_over(t->listener, t->err);
  nr_channel_release(t->listener);
  free(t);
  return 0;
}

static int shed_on_loop(void *arg) {
  shed_t *t = arg;
  t->closed = nr__loop_shed_fresh(t->loop, t->max);
  nr_loop_t *home = t->listener->loop;
  if (nr__in_loop(home))
    return shed_answered(t);
  if (nr_loop_execute(home, shed_answered, t) < 0) {
    nr_channel_release(t->listener);         /* its loop is going */
    free(t);
  }
  return 0;
}

/* Ask loop l for up to max fresh channels; false if it cannot be asked. */
static bool shed_ask(nr_channel_t *ch, nr_loop_t *l, int max, int err) {
  shed_t *t = malloc(sizeof *t);
  if (t == NULL)
    return false;
  *t = (shed_t){nr_channel_retain(ch), l, max, 0, err};
  ch->srv->shed_waiting++;
  if (nr__in_loop(l))
    return shed_on_loop(t), true;
  if (nr_loop_execute(l, shed_on_loop, t) == 0)
    return true;
  ch->srv->shed_waiting--;
  nr_channel_release(ch);
  free(t);
  return false;
}

/* How many connections wait in the listener's accept queue (Linux tells
 * a listening socket's queue length as its tcpi_unacked), or -1. */
static int accept_queue(nr_channel_t *ch) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  if (ch->family == AF_UNIX ||
      getsockopt(ch->io.fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
    return -1;
  return (int)ti.tcpi_unacked;
}

static void out_of_descriptors(nr_channel_t *ch, int err) {
  nr_server_t *srv = ch->srv;
  if (srv->shed_waiting > 0)
    return;                                  /* (paused: asked already) */
  int want = accept_queue(ch);
  want = want < 0 ? 4 : want > SHED_BATCH ? SHED_BATCH : want;
  if (want == 0)
    return;                                  /* (it left: nothing waits) */
  ch->st |= NR__ACCEPT_PAUSED;               /* until the loops answer */
  nr__channel_update_interest(ch);
  srv->shed_closed = 0;
  srv->shed_waiting = 1;                     /* held while asking: a loop
                                                that answers at once must
                                                not end the round early */
  nr_group_t *g = srv->child_group;
  int n = g ? nr_group_size(g) : 1;
  for (int i = 0; i < n; i++)
    shed_ask(ch, g ? nr_group_loop(g, i) : srv->child_loop,
             (want + n - 1) / n, err);
  if (--srv->shed_waiting == 0)
    shed_over(ch, err);
}

void nr__accept_ready(nr_channel_t *ch) {
  for (int i = 0; i < ch->opts.max_reads && !(ch->st & NR__CLOSED); i++) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int fd = accept4(ch->io.fd, (struct sockaddr *)&ss, &len,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      spawn_child(ch, fd, &ss, len);
      continue;
    }
    int err = -errno;
    if (errno == EINTR || errno == ECONNABORTED)
      continue;
    if (errno == EAGAIN)
      break;
    if (errno == EMFILE || errno == ENFILE) {
      out_of_descriptors(ch, err);
      break;
    }
    if (errno == ENOBUFS || errno == ENOMEM) {
      pause_accept(ch, err);
      break;
    }
    char msg[160];
    snprintf(msg, sizeof msg, "accept: %s", nr__errname(err));
    nr_pipeline_fire_exception(&ch->pipe, &(nr_err_t){err, msg});
    break;
  }
}
