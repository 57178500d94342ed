/*
 * channel_connect.c -- the head handler's bind and connect, and the end
 * of a connect (success, failure, timeout; connect.c tries a name's
 * addresses one after another). Loop thread only.
 */
#include <stdio.h>
#include <sys/un.h>

#include "channel_internal.h"

/* ---- connecting --------------------------------------------------------------- */

static void connected(nr_channel_t *ch, nr_promise_t *p) {
  ch->st &= ~NR__CONNECTING;
  nr__attempts_end(ch);
  if (ch->setup)
    nr__timer_drop(&ch->setup->connect_timer);
  nr__channel_set_active(ch);
  if (p)
    nr_promise_set_success(p, nr_channel_retain(ch),
                           (void (*)(void *))nr_channel_release);
}

static void connect_failed(nr_channel_t *ch, int err, const char *msg) {
  nr_promise_t *p = ch->setup->connect_promise;
  ch->setup->connect_promise = NULL;
  if (p) {
    nr_promise_set_failure(p, err, msg);
    nr_promise_release(p);
  }
  nr__channel_close(ch, true);
}

void nr__channel_connect_fail(nr_channel_t *ch, int err, const char *msg) {
  connect_failed(ch, err, msg);
}

void nr__channel_connect_done(nr_channel_t *ch) {
  nr_promise_t *p = ch->setup->connect_promise;
  ch->setup->connect_promise = NULL;
  connected(ch, p);
  if (p)
    nr_promise_release(p);
}

void nr__channel_finish_connect(nr_channel_t *ch) {
  int err = 0;
  socklen_t len = sizeof err;
  if (nr_sys_getsockopt(ch->io.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
    err = errno;
  if (ch->setup->attempts && err != 0) {
    nr__attempt_failed(ch, -err);
    return;
  }
  if (err != 0) {
    char host[128], msg[256];
    int port = 0;
    nr_format_addr(nr__channel_raddr(ch), ch->rlen, host, sizeof host, &port);
    snprintf(msg, sizeof msg, "%s:%d: %s", host, port, nr__errname(-err));
    connect_failed(ch, -err, msg);
    return;
  }
  nr__channel_connect_done(ch);
}

static int connect_timed_out(void *arg) {
  nr_channel_t *ch = arg;
  if (ch->st & NR__CONNECTING) {
    char host[128], msg[256];
    int port = 0;
    nr_format_addr(nr__channel_raddr(ch), ch->rlen, host, sizeof host, &port);
    int n = snprintf(msg, sizeof msg, "%s:%d: connect timed out after %.3g s",
                     host, port, (double)ch->setup->connect_timeout / 1e9);
    if (ch->setup->attempts) {   /* what the addresses tried before said */
      int code;
      const char *before = nr__attempts_message(ch->setup->attempts, &code);
      if (*before && n > 0 && (size_t)n < sizeof msg)
        snprintf(msg + n, sizeof msg - (size_t)n, "; %s", before);
    }
    connect_failed(ch, NR_ETIMEDOUT, msg);
  }
  return 0;
}

int nr__head_bind(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                  nr_promise_t *p) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  char host[128];
  int port = 0;
  nr_format_addr((const struct sockaddr_storage *)sa, len, host, sizeof host,
                  &port);
  nr_setup_t *su = nr__channel_setup(ch);
  if (su == NULL) {
    nr__channel_close(ch, true);
    return nr_raise(-ENOMEM, "bind: out of memory");
  }
  if (nr_sys_bind(ch->io.fd, sa, len) < 0 ||
      (ch->kind == NR__LISTEN &&
       nr_sys_listen(ch->io.fd, su->backlog > 0 ? su->backlog : 1024) < 0)) {
    int err = -errno;
    nr__channel_close(ch, true);
    return port >= 0 ? nr_raise(err, "%s:%d: %s", host, port, nr__errname(err))
                     : nr_raise(err, "%s: %s", host, nr__errname(err));
  }
  struct stat st;
  if (sa->sa_family == AF_UNIX &&
      (su->unix_path = strdup(((const struct sockaddr_un *)sa)->sun_path)) &&
      lstat(su->unix_path, &st) == 0 && S_ISSOCK(st.st_mode)) {
    su->unix_dev = st.st_dev;
    su->unix_ino = st.st_ino;
    ch->st |= NR__UNLINK_PATH;
  }
  nr__channel_set_active(ch);
  if (p)
    nr_promise_set_success(p, nr_channel_retain(ch),
                           (void (*)(void *))nr_channel_release);
  return 0;
}

int nr__head_connect(nr_ctx_t *ctx, const struct sockaddr *sa,
                     socklen_t len, nr_promise_t *p) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  nr_setup_t *su = nr__channel_setup(ch);
  if (su == NULL || nr__channel_set_raddr(ch, sa, len) < 0) {
    nr__channel_close(ch, true);
    return nr_raise(-ENOMEM, "connect: out of memory");
  }
  socklen_t first_len;
  if (su->attempts && (memcmp(nr__attempts_first(su->attempts, &first_len), sa,
                              len) != 0 || first_len != len))
    nr__attempts_end(ch);        /* a handler changed the address: that one */
  if (nr_sys_connect(ch->io.fd, sa, len) == 0) {
    connected(ch, p);
    return 0;
  }
  int err = -errno;
  if (err != -EINPROGRESS && su->attempts == NULL) {
    int port = 0;
    char host[128];
    nr_format_addr(nr__channel_raddr(ch), len, host, sizeof host, &port);
    nr__channel_close(ch, true);
    return port >= 0 ? nr_raise(err, "%s:%d: %s", host, port, nr__errname(err))
                     : nr_raise(err, "%s: %s", host, nr__errname(err));
  }
  ch->st |= NR__CONNECTING;
  su->connect_promise = p ? nr_promise_retain(p) : NULL;
  nr__channel_update_interest(ch);
  if (su->connect_timeout)
    su->connect_timer = nr_loop_schedule(ch->loop, su->connect_timeout, 0,
                                         connect_timed_out, NULL, ch);
  if (su->attempts && err == -EINPROGRESS)
    nr__attempts_arm(ch);        /* the next address in a while, */
  else if (su->attempts)
    nr__attempt_failed(ch, err); /* or now */
  return 0;
}
