/*
 * connect.c -- a connect with several addresses (RFC 8305, "happy
 * eyeballs"): the addresses a name resolved to, IPv6 and IPv4
 * interleaved, tried on one channel until one answers.
 *
 * The channel's own socket is always one attempt (the first address at
 * first, as nr_connect made it). When it fails, the next address is tried
 * on a fresh socket of the channel at once; when it has not answered
 * within ATTEMPT_DELAY, the next address starts beside it as a racer (a
 * socket watched on its own). The first socket to connect becomes the
 * channel's and the others are closed; only then does the channel become
 * active, so handlers -- TLS among them, whose handshake starts there --
 * see one connection, to the address that answered. A connect that fails
 * on every address fails with the first one's code and every address's
 * reason. The connect timeout bounds the whole.
 *
 * Invariant: while the channel is connecting, its own socket is an
 * attempt in flight (when it fails with racers left, the oldest racer's
 * socket becomes the channel's). Racers stopped during a pass of the loop
 * are freed after it, as events for them may still be in hand.
 * Loop thread only, all of it; nothing here exists for a connect to one
 * address.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <unistd.h>

#include "internal.h"

#define ATTEMPT_DELAY NR_MS(250)   /* RFC 8305 §5's recommended delay */
#define MSG_MAX 1024

typedef struct racer_s {
  nr_io_t io;                      /* first: the loop hands it back */
  nr_channel_t *ch;                /* NULL once stopped */
  int idx;
  struct racer_s *next;
} racer_t;

struct nr_attempts_s {
  struct sockaddr_storage *addrs;  /* interleaved; [0] the first tried */
  int n, next;                     /* next: the next address to try */
  racer_t *racers;                 /* oldest first */
  nr_timer_t *delay;
  int first_err;
  size_t mlen;
  bool cut;                        /* msg is full: later failures left out */
  char msg[MSG_MAX];               /* every failure so far, "; " between */
};

static socklen_t addr_len(const struct sockaddr_storage *ss) {
  return ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                   : sizeof(struct sockaddr_in);
}

/* ---- the list -------------------------------------------------------------------- */

/* RFC 8305 §4: the first address's family first, then the families
 * alternate, each in its own order. */
static void interleave(struct sockaddr_storage *v, int n) {
  struct sockaddr_storage tmp[NR_MAX_ADDRS];
  int fam = v[0].ss_family, a = 0, b = 0, k = 0;
  int ia[NR_MAX_ADDRS], ib[NR_MAX_ADDRS];
  for (int i = 0; i < n; i++) {
    if (v[i].ss_family == fam)
      ia[a++] = i;
    else
      ib[b++] = i;
  }
  for (int i = 0, j = 0; i < a || j < b;) {
    if (i < a)
      tmp[k++] = v[ia[i++]];
    if (j < b)
      tmp[k++] = v[ib[j++]];
  }
  memcpy(v, tmp, (size_t)n * sizeof *v);
}

int nr__attempts_new(const char *const *hosts, int nhosts, int port,
                     nr_attempts_t **out) {
  *out = NULL;
  if (nhosts > NR_MAX_ADDRS)
    nhosts = NR_MAX_ADDRS;
  nr_attempts_t *a = calloc(1, sizeof *a);
  if (a == NULL || (a->addrs = calloc((size_t)nhosts, sizeof *a->addrs)) == NULL) {
    free(a);
    return -ENOMEM;
  }
  for (int i = 0; i < nhosts; i++) {
    struct sockaddr_in *in = (struct sockaddr_in *)&a->addrs[i];
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&a->addrs[i];
    if (inet_pton(AF_INET, hosts[i], &in->sin_addr) == 1) {
      in->sin_family = AF_INET;
      in->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, hosts[i], &in6->sin6_addr) == 1) {
      in6->sin6_family = AF_INET6;
      in6->sin6_port = htons((uint16_t)port);
    } else {
      nr__attempts_free_list(a);
      return nr_raise(-EINVAL, "%s: not a numeric address", hosts[i]);
    }
  }
  a->n = nhosts;
  a->next = 1;
  interleave(a->addrs, nhosts);
  *out = a;
  return 0;
}

const struct sockaddr_storage *nr__attempts_first(const nr_attempts_t *a,
                                                  socklen_t *len) {
  *len = addr_len(&a->addrs[0]);
  return &a->addrs[0];
}

/* ---- failures --------------------------------------------------------------------- */

static void record(nr_attempts_t *a, const struct sockaddr_storage *ss, int err) {
  char host[INET6_ADDRSTRLEN], line[256];
  int port = 0;
  if (nr_format_addr(ss, addr_len(ss), host, sizeof host, &port) < 0)
    snprintf(host, sizeof host, "?");
  if (a->first_err == 0)
    a->first_err = err;
  int n = snprintf(line, sizeof line, "%s%s:%d: %s", a->mlen ? "; " : "", host,
                   port, nr__errname(err));
  if (a->cut || n < 0)
    return;
  if (a->mlen + (size_t)n + sizeof "; ..." > sizeof a->msg) {
    memcpy(a->msg + a->mlen, "; ...", sizeof "; ...");   /* room kept for it */
    a->cut = true;
    return;
  }
  memcpy(a->msg + a->mlen, line, (size_t)n + 1);
  a->mlen += (size_t)n;
}

bool nr__attempts_skip_first(nr_attempts_t *a, int err) {
  record(a, &a->addrs[0], err);
  if (a->n <= 1)
    return false;
  memmove(a->addrs, a->addrs + 1, (size_t)(a->n - 1) * sizeof *a->addrs);
  a->n--;
  return true;
}

const char *nr__attempts_message(const nr_attempts_t *a, int *code) {
  *code = a->first_err ? a->first_err : -ECONNREFUSED;
  return a->msg;
}

/* ---- racers ----------------------------------------------------------------------- */

static int bury(void *arg) {
  free(arg);
  return 0;
}

/* Stop watching r and close its socket (keep_fd: the socket is the
 * channel's now); r is freed after the loop's pass. */
static void stop_racer(nr_channel_t *ch, racer_t *r, bool keep_fd) {
  nr_attempts_t *a = ch->setup->attempts;
  for (racer_t **pp = &a->racers; *pp; pp = &(*pp)->next)
    if (*pp == r) {
      *pp = r->next;
      break;
    }
  nr__io_stop(ch->loop, &r->io);
  if (!keep_fd)
    nr_sys_close(r->io.fd);
  r->ch = NULL;
  if (nr_loop_after_iteration(ch->loop, bury, r) < 0)
    nr_log(NR_LOG_WARN, "connect: out of memory freeing an attempt (leaked)");
}

/* The channel's socket is about to change: events fetched for the old one
 * in this pass are ignored (channel.c's on_io). */
static void swap_socket(nr_channel_t *ch) {
  nr__io_stop(ch->loop, &ch->io);
  nr_sys_close(ch->io.fd);
  ch->setup->swapped_at = atomic_load_explicit(&ch->loop->iterations,
                                               memory_order_relaxed);
}

/* Make the channel's socket r's: the channel's own attempt is closed. */
static void adopt(nr_channel_t *ch, racer_t *r) {
  nr_attempts_t *a = ch->setup->attempts;
  swap_socket(ch);
  ch->io.fd = r->io.fd;
  ch->family = a->addrs[r->idx].ss_family;
  nr__channel_set_raddr(ch, &a->addrs[r->idx], addr_len(&a->addrs[r->idx]));
  stop_racer(ch, r, true);
  if (nr__io_start(ch->loop, &ch->io, EPOLLOUT) < 0)
    nr_log(NR_LOG_WARN, "channel %llu: epoll_ctl: cannot watch its socket",
           (unsigned long long)ch->id);
}

static bool racer_next(nr_channel_t *ch);

static int on_racer(nr_loop_t *l, nr_io_t *io, uint32_t events) {
  (void)l;
  (void)events;
  racer_t *r = (racer_t *)io;
  nr_channel_t *ch = r->ch;
  if (ch == NULL)
    return 0;                              /* stopped earlier in this pass */
  int err = 0;
  socklen_t len = sizeof err;
  if (nr_sys_getsockopt(io->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
    err = errno;
  if (err == 0) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (nr_sys_getpeername(io->fd, (struct sockaddr *)&ss, &sl) < 0)
      return 1;                            /* not yet */
    adopt(ch, r);
    nr__channel_connect_done(ch);
    return 1;
  }
  nr_attempts_t *a = ch->setup->attempts;
  record(a, &a->addrs[r->idx], -err);
  stop_racer(ch, r, false);
  racer_next(ch);                          /* RFC 8305 §5: next one now */
  return 1;
}

/* Start the next address beside the channel's own attempt. Whether one
 * started (or connected at once: then the connect is done). */
static bool racer_next(nr_channel_t *ch) {
  nr_attempts_t *a = ch->setup->attempts;
  while (a->next < a->n) {
    int idx = a->next++;
    const struct sockaddr_storage *ss = &a->addrs[idx];
    int fd = nr__socket(ch->loop, ss->ss_family, SOCK_STREAM);
    if (fd < 0) {
      record(a, ss, fd);
      continue;
    }
    nr__apply_opts(fd, ss->ss_family, &ch->opts);
    racer_t *r = calloc(1, sizeof *r);
    int rc = r == NULL ? -ENOMEM
             : nr_sys_connect(fd, (const struct sockaddr *)ss, addr_len(ss)) == 0 ? 0
             : errno == EINPROGRESS ? 1 : -errno;
    if (r == NULL || rc < 0) {
      record(a, ss, rc);
      nr_sys_close(fd);
      free(r);
      continue;
    }
    r->io.fd = fd;
    r->io.cb = on_racer;
    r->ch = ch;
    r->idx = idx;
    racer_t **pp = &a->racers;
    while (*pp)
      pp = &(*pp)->next;
    *pp = r;                               /* oldest first */
    if (rc == 0) {
      adopt(ch, r);
      nr__channel_connect_done(ch);
      return true;
    }
    if (nr__io_start(ch->loop, &r->io, EPOLLOUT) < 0) {
      record(a, ss, -ENOMEM);
      stop_racer(ch, r, false);
      continue;
    }
    return true;
  }
  return false;
}

static int delay_expired(void *arg) {
  nr_channel_t *ch = arg;
  nr_attempts_t *a = ch->setup ? ch->setup->attempts : NULL;
  if (a == NULL)
    return 0;
  nr_timer_release(a->delay);
  a->delay = NULL;
  if ((ch->st & NR__CONNECTING) && racer_next(ch))
    nr__attempts_arm(ch);
  return 0;
}

void nr__attempts_arm(nr_channel_t *ch) {
  nr_attempts_t *a = ch->setup ? ch->setup->attempts : NULL;
  if (a == NULL || a->next >= a->n || !(ch->st & NR__CONNECTING))
    return;
  nr__timer_drop(&a->delay);
  a->delay = nr_loop_schedule(ch->loop, ATTEMPT_DELAY, 0, delay_expired, NULL, ch);
}

/* ---- the channel's own attempt ------------------------------------------------- */

/* Try address idx on a fresh socket of the channel's own: 1 in flight,
 * 0 connected, < 0 failed (recorded). */
static int own_try(nr_channel_t *ch, int idx) {
  nr_attempts_t *a = ch->setup->attempts;
  const struct sockaddr_storage *ss = &a->addrs[idx];
  swap_socket(ch);
  int fd = nr__socket(ch->loop, ss->ss_family, SOCK_STREAM);
  ch->io.fd = fd;
  if (fd < 0) {
    record(a, ss, fd);
    return fd;
  }
  nr__apply_opts(fd, ss->ss_family, &ch->opts);
  ch->family = ss->ss_family;
  nr__channel_set_raddr(ch, ss, addr_len(ss));
  int rc = nr__io_start(ch->loop, &ch->io, EPOLLOUT);
  if (rc == 0 && nr_sys_connect(fd, (const struct sockaddr *)ss, addr_len(ss)) == 0)
    return 0;
  if (rc == 0)
    rc = errno == EINPROGRESS ? 1 : -errno;
  if (rc < 0)
    record(a, ss, rc);
  return rc;
}

void nr__attempt_failed(nr_channel_t *ch, int err) {
  nr_attempts_t *a = ch->setup->attempts;
  record(a, (const struct sockaddr_storage *)nr__channel_raddr(ch), err);
  if (a->racers) {                         /* the oldest goes on as the channel's */
    adopt(ch, a->racers);
    return;
  }
  while (a->next < a->n) {
    int rc = own_try(ch, a->next++);
    if (rc == 0) {
      nr__channel_connect_done(ch);
      return;
    }
    if (rc > 0) {
      nr__attempts_arm(ch);
      return;
    }
  }
  int code;
  const char *msg = nr__attempts_message(a, &code);
  char copy[MSG_MAX];
  snprintf(copy, sizeof copy, "%s", msg);
  nr__channel_connect_fail(ch, code, copy);
}

/* ---- the end ----------------------------------------------------------------------- */

void nr__attempts_free_list(nr_attempts_t *a) {
  if (a) {
    free(a->addrs);
    free(a);
  }
}

void nr__attempts_end(nr_channel_t *ch) {
  nr_attempts_t *a = ch->setup ? ch->setup->attempts : NULL;
  if (a == NULL)
    return;
  while (a->racers)
    stop_racer(ch, a->racers, false);
  nr__timer_drop(&a->delay);
  ch->setup->attempts = NULL;
  nr__attempts_free_list(a);
}
