/*
 * bootstrap.c -- creating channels (Netty's ServerBootstrap and Bootstrap)
 * and the acceptor of server channels.
 *
 * The socket is created and its address resolved on the calling thread, so
 * bad input fails the returned future before any loop is involved. The
 * channel is then registered on its loop by a task, its init runs there,
 * and bind/connect enter its pipeline at the tail, as in Netty.
 */
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
  nr_promise_t *p = ch->reg_promise;
  ch->reg_promise = NULL;
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
  if (p == NULL || b == NULL) {
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
  ch->reg_promise = nr_promise_retain(p);
  if (nr_loop_execute(l, boot_task, b) < 0) {
    nr_promise_release(ch->reg_promise);
    ch->reg_promise = NULL;
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

nr_promise_t *nr_server_bind(const nr_server_opts_t *o) {
  struct sockaddr_storage ss;
  socklen_t len;
  if (o->group == NULL && o->loop == NULL)
    return nr__promise_failed(-EINVAL, "a server needs a group or a loop");
  int rc = address(o->unix_path, o->host ? o->host : "0.0.0.0", o->port,
                   SOCK_STREAM, true, &ss, &len);
  if (rc < 0)
    return fail_with_raised(rc);
  if (ss.ss_family == AF_UNIX && (rc = nr__unix_prepare(&ss, len)) < 0)
    return fail_with_raised(rc);
  int fd = nr__socket(ss.ss_family, SOCK_STREAM);
  if (fd < 0)
    return fail_with_raised(fd);
  int on = 1;
  if (ss.ss_family != AF_UNIX)
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  else if (o->unix_mode && fchmod(fd, (mode_t)(o->unix_mode & 0777)) < 0) {
    /* bind(2) gives the file the socket's own mode less the umask (Linux
     * af_unix), so the file is born with it: no chmod after, no window. */
    rc = -errno;
    close(fd);
    return fail_with_raised(nr_raise(rc, "%s: fchmod: %s", o->unix_path,
                                     nr__errname(rc)));
  }
  if (o->reuseport)
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
  nr_channel_t *ch = nr__channel_new(NR__LISTEN, ss.ss_family, fd, NULL);
  nr_server_t *srv = calloc(1, sizeof *srv);
  if (ch == NULL || srv == NULL) {
    free(srv);
    if (ch)
      nr_channel_release(ch);
    else
      close(fd);
    return nr__promise_failed(-ENOMEM, "out of memory");
  }
  srv->child_group = o->child_group ? o->child_group : o->group;
  srv->child_loop = o->child_loop ? o->child_loop
                    : o->child_group || o->group ? NULL : o->loop;
  nr_channel_opts_t dflt;
  nr_channel_opts_init(&dflt);
  static const nr_channel_opts_t zero;
  srv->child = memcmp(&o->child, &zero, sizeof zero) ? o->child : dflt;
  srv->child_init = o->child_init;
  srv->arg = o->arg;
  srv->backoff = o->accept_backoff ? o->accept_backoff : NR_SEC(1);
  ch->srv = srv;
  ch->backlog = o->backlog > 0 ? o->backlog : 1024;
  ch->init = o->init;
  ch->init_arg = o->arg;
  return boot(ch, o->loop ? o->loop : nr_group_next(o->group), &ss, len, true);
}

nr_promise_t *nr_connect(const nr_connect_opts_t *o) {
  struct sockaddr_storage ss;
  socklen_t len;
  if (o->group == NULL && o->loop == NULL)
    return nr__promise_failed(-EINVAL, "connect needs a group or a loop");
  int rc = address(o->unix_path, o->host ? o->host : "127.0.0.1", o->port,
                   SOCK_STREAM, false, &ss, &len);
  if (rc < 0)
    return fail_with_raised(rc);
  int fd = nr__socket(ss.ss_family, SOCK_STREAM);
  if (fd < 0)
    return fail_with_raised(fd);
  nr_channel_t *ch = nr__channel_new(NR__STREAM, ss.ss_family, fd, &o->opts);
  if (ch == NULL) {
    close(fd);
    return nr__promise_failed(-ENOMEM, "out of memory");
  }
  static const nr_channel_opts_t zero;
  if (memcmp(&o->opts, &zero, sizeof zero) == 0)
    ch->opts.send_timeout = 0;   /* a client picked its peer: no send timeout */
  nr__apply_opts(fd, ss.ss_family, &ch->opts);
  ch->init = o->init;
  ch->init_arg = o->arg;
  ch->connect_timeout = o->timeout ? o->timeout : NR_SEC(30);
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
  nr__apply_opts(fd, srv_ch->family, &ch->opts);
  if (nr__channel_set_raddr(ch, ss, len) < 0) {
    nr_channel_release(ch);                   /* closes the fd */
    return;
  }
  ch->init = srv->child_init;
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

/* Out of descriptors: stop accepting for a while instead of spinning on a
 * listener that stays readable (Netty's ServerBootstrapAcceptor pauses
 * auto-read for a second). */
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
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
        errno == ENOMEM) {
      pause_accept(ch, err);
      break;
    }
    char msg[160];
    snprintf(msg, sizeof msg, "accept: %s", nr__errname(err));
    nr_pipeline_fire_exception(&ch->pipe, &(nr_err_t){err, msg});
    break;
  }
}
