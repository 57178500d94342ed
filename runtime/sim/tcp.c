/*
 * sim/tcp.c -- TCP over the simulated network.
 *
 * A connection (sim_conn_t) joins two endpoints (sim_tcp_t: side 0 made
 * by connect, side 1 by the listener) with a pipe each way. A pipe holds
 * what its sender wrote and its receiver has not yet got -- segments,
 * each with the time it arrives (now + the link's one-way latency, plus a
 * retransmission timeout per loss; never before the segment ahead of it)
 * -- and what arrived and waits to be read. Both are bounded: a write
 * takes at most sndbuf minus what is unacknowledged (SIOCOUTQ), and
 * arrival moves at most rcvbuf minus what is unread (FIONREAD); a full
 * receiver holds the rest back until it reads (flow control), and a full
 * sender gets EAGAIN (backpressure). EPOLLOUT comes when the free send
 * space is at least half of what is queued, as Linux's does.
 *
 * The handshake: connect sends a SYN that arrives after the latency; the
 * destination's listener (if any, else a RST: ECONNREFUSED) queues the
 * new endpoint for accept (dropping the SYN when its backlog is full),
 * and the SYN-ACK makes the connecting side established one latency
 * later. A SYN that meets a partition is retried after 1, 2, 4 ... s, and
 * after 6 retries connect fails with ETIMEDOUT, as Linux's does (127 s).
 *
 * Closing: shutdown(SHUT_WR) sends a FIN after the data (EOF on the other
 * side once read); close does the same, unless the socket has unread
 * input or SO_LINGER 0, when it sends a RST: the other side's next read
 * or write fails with ECONNRESET and what it had not read is lost. Data
 * that reaches a closed endpoint is answered with a RST. A partition
 * holds segments back (nothing is lost: TCP retransmits) until it heals;
 * a sender whose data was held for 15 min gives up (ETIMEDOUT), as
 * Linux's does after tcp_retries2. world:reset resets connections at once.
 *
 * Every delivery, handshake step and reset is traced (world.c) with its
 * bytes. The records are tcp.h's; socket options, names and ioctls are
 * tcp_opts.c's. Threads: the world's thread.
 */
#include <linux/sockios.h>
#include <netinet/tcp.h>
#include <stdio.h>

#include "tcp.h"

#define SYN_RETRIES 6
#define RTO_MIN NR_MS(200)
#define GIVE_UP NR_SEC(900)            /* tcp_retries2 = 15: ~924 s */

/* ---- connections ------------------------------------------------------------------ */

static sim_conn_t *conn_new(nr_sim_t *w) {
  sim_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return NULL;
  c->id = ++w->conn_ids;
  c->next = w->conns;
  if (w->conns)
    w->conns->prev = c;
  w->conns = c;
  w->stats.connections++;
  return c;
}

static void segs_free(seg_t *s) {
  for (seg_t *n; s; s = n) {
    n = s->next;
    free(s);
  }
}

static void pipe_purge(pipe_t *p) {
  segs_free(p->head);
  segs_free(p->rhead);
  p->head = p->tail = p->rhead = p->rtail = NULL;
  p->sendq = p->recvq = 0;
  p->full = false;
  p->cut_since = 0;
}

static void conn_unref(nr_sim_t *w, sim_conn_t *c) {
  if (--c->refs > 0)
    return;
  pipe_purge(&c->p[0]);
  pipe_purge(&c->p[1]);
  *(c->prev ? &c->prev->next : &w->conns) = c->next;
  if (c->next)
    c->next->prev = c->prev;
  free(c);
}

static void ev_unref(nr_sim_t *w, void *obj, uint64_t arg) {
  (void)arg;
  conn_unref(w, obj);
}

/* Queue fn(conn, arg) at `at`, the event holding the connection. */
static void conn_at(nr_sim_t *w, sim_conn_t *c, uint64_t at, sim_event_fn fn,
                    uint64_t arg) {
  c->refs++;
  sim_at(w, at, fn, ev_unref, c, arg);
}

static uint64_t lat(nr_sim_t *w, sim_conn_t *c, int from) {
  return sim_latency(w, c->host[from], c->host[1 - from]);
}

/* ---- readiness -------------------------------------------------------------------------- */

static bool writable(const sim_tcp_t *t) {
  const pipe_t *p = &t->conn->p[t->side];
  return t->sndbuf > p->sendq && t->sndbuf - p->sendq >= p->sendq / 2;
}

uint32_t sim_tcp_ready(sim_fd_t *d) {
  sim_tcp_t *t = (sim_tcp_t *)d;
  switch (t->state) {
  case T_LISTEN:
    return t->nq > 0 ? EPOLLIN : 0;
  case T_CLOSED:
    return EPOLLIN | EPOLLOUT | EPOLLHUP | EPOLLRDHUP | (t->err ? EPOLLERR : 0);
  case T_EST: {
    const pipe_t *in = &t->conn->p[1 - t->side];
    uint32_t ev = 0;
    if (in->recvq > 0 || in->eof || t->rd_shut)
      ev |= EPOLLIN;
    if (in->eof)
      ev |= EPOLLRDHUP;
    if (t->wr_shut || writable(t))
      ev |= EPOLLOUT;
    if (in->eof && t->wr_shut)
      ev |= EPOLLHUP;
    return ev;
  }
  default:
    return 0;
  }
}

/* ---- resets ------------------------------------------------------------------------------ */

/* t's connection is reset (a RST arrived, or world:reset): its reads and
 * writes fail with ECONNRESET, what it had not read is gone. */
static void reset_endpoint(nr_sim_t *w, sim_tcp_t *t, int err) {
  if (t == NULL || t->state == T_CLOSED)
    return;
  sim_conn_t *c = t->conn;
  t->state = T_CLOSED;
  t->reset = true;
  t->err = err;
  if (c != NULL) {
    pipe_purge(&c->p[1 - t->side]);
    pipe_purge(&c->p[t->side]);
    sim_trace(w, 0x25, c->id, (uint64_t)t->side);
  }
  w->stats.resets++;
  sim_notify(&t->base);
}

static void ev_rst(nr_sim_t *w, void *obj, uint64_t to) {
  sim_conn_t *c = obj;
  reset_endpoint(w, c->ep[to], ECONNRESET);
  conn_unref(w, c);
}

/* A RST from `from` to the other side, which gets it after the latency. */
static void send_rst(nr_sim_t *w, sim_conn_t *c, int from) {
  pipe_purge(&c->p[from]);
  conn_at(w, c, w->now + lat(w, c, from), ev_rst, (uint64_t)(1 - from));
}

/* ---- delivery ----------------------------------------------------------------------------- */

static void ev_deliver(nr_sim_t *w, void *obj, uint64_t dir);
static void ev_give_up(nr_sim_t *w, void *obj, uint64_t dir);

/* Queue the delivery of pipe `dir`'s head (or its FIN) when it is due. */
static void kick(nr_sim_t *w, sim_conn_t *c, int dir) {
  pipe_t *p = &c->p[dir];
  if (p->scheduled || p->full || p->cut_since)
    return;
  uint64_t at;
  if (p->head)
    at = p->head->at;
  else if (p->fin && !p->eof)
    at = p->fin_at;
  else
    return;
  p->scheduled = true;
  conn_at(w, c, at, ev_deliver, (uint64_t)dir);
}

/* Move what arrived of pipe p into the receiver's buffer, as far as it
 * has room. Bytes moved. */
static size_t arrive(nr_sim_t *w, sim_conn_t *c, pipe_t *p, size_t room) {
  size_t moved = 0;
  while (p->head && p->head->at <= w->now && room > 0) {
    seg_t *s = p->head;
    size_t n = s->len - s->off;
    if (n > room)
      n = room;
    seg_t *r = malloc(sizeof *r + n);
    if (r == NULL)
      break;
    r->next = NULL;
    r->len = n;
    r->off = 0;
    memcpy(r->data, s->data + s->off, n);
    *(p->rtail ? &p->rtail->next : &p->rhead) = r;
    p->rtail = r;
    sim_trace(w, 0x20, c->id, n);
    sim_trace_bytes(w, r->data, n);
    w->stats.bytes += n;
    s->off += n;
    p->sendq -= n;
    p->recvq += n;
    room -= n;
    moved += n;
    if (s->off == s->len) {
      p->head = s->next;
      if (p->head == NULL)
        p->tail = NULL;
      free(s);
    }
  }
  return moved;
}

static void ev_deliver(nr_sim_t *w, void *obj, uint64_t dir) {
  sim_conn_t *c = obj;
  pipe_t *p = &c->p[dir];
  sim_tcp_t *src = c->ep[dir], *dst = c->ep[1 - dir];
  p->scheduled = false;
  if (sim_cut(w, c->host[0], c->host[1])) {
    if (p->cut_since == 0 && (p->head || (p->fin && !p->eof))) {
      p->cut_since = w->now;               /* retransmitted after the heal */
      conn_at(w, c, w->now + GIVE_UP, ev_give_up, dir);
    }
  } else if (dst == NULL || dst->state != T_EST) {
    /* Nobody to read it: data is answered with a RST, a FIN is moot. */
    if (p->head && src && src->state == T_EST)
      send_rst(w, c, 1 - (int)dir);
    pipe_purge(p);
    p->eof = true;
  } else {
    size_t room = dst->rcvbuf > p->recvq ? dst->rcvbuf - p->recvq : 0;
    size_t moved = arrive(w, c, p, room);
    if (p->head == NULL && p->fin && !p->eof && p->fin_at <= w->now) {
      p->eof = true;
      sim_trace(w, 0x21, c->id, dir);
      moved++;
    }
    if (p->head && p->head->at <= w->now)
      p->full = true;                      /* until the receiver reads */
    if (moved) {
      sim_notify(&dst->base);
      if (src)
        sim_notify(&src->base);
    }
    kick(w, c, (int)dir);
  }
  conn_unref(w, c);
}

/* Held back by a partition for GIVE_UP: the sender's TCP gives up. */
static void ev_give_up(nr_sim_t *w, void *obj, uint64_t dir) {
  sim_conn_t *c = obj;
  pipe_t *p = &c->p[dir];
  if (p->cut_since != 0 && w->now - p->cut_since >= GIVE_UP &&
      sim_cut(w, c->host[0], c->host[1]))
    reset_endpoint(w, c->ep[dir], ETIMEDOUT);
  conn_unref(w, c);
}

void sim_tcp_healed(nr_sim_t *w) {
  for (sim_conn_t *c = w->conns; c; c = c->next)
    for (int dir = 0; dir < 2; dir++) {
      pipe_t *p = &c->p[dir];
      if (p->cut_since == 0)
        continue;
      p->cut_since = 0;
      uint64_t at = w->now + lat(w, c, dir);
      for (seg_t *s = p->head; s; s = s->next)
        if (s->at < at)
          s->at = at;                      /* retransmitted now */
      if (p->fin && p->fin_at < at)
        p->fin_at = at;
      kick(w, c, dir);
    }
}

int sim_tcp_reset(nr_sim_t *w, nr_sim_host_t *a, nr_sim_host_t *b) {
  int n = 0;
  for (sim_conn_t *c = w->conns; c; c = c->next) {
    bool match = ((a == NULL || c->host[0] == a) && (b == NULL || c->host[1] == b)) ||
                 ((a == NULL || c->host[1] == a) && (b == NULL || c->host[0] == b));
    if (!match)
      continue;
    for (int i = 0; i < 2; i++)
      if (c->ep[i] && c->ep[i]->state == T_EST) {
        reset_endpoint(w, c->ep[i], ECONNRESET);
        n++;
      }
  }
  return n;
}

/* ---- sockets -------------------------------------------------------------------------------- */

int sim_tcp_socket(nr_sim_t *w, nr_sim_host_t *h) {
  sim_tcp_t *t = calloc(1, sizeof *t);
  if (t == NULL)
    return sim_tcp_fail(ENOMEM);
  t->base.kind = SFD_TCP;
  t->base.w = w;
  t->base.host = h;
  t->state = T_NEW;
  t->sndbuf = w->sndbuf;
  t->rcvbuf = w->rcvbuf;
  int fd = sim_fd_add(&t->base);
  if (fd < 0)
    free(t);
  return fd;
}

/* An address as the simulation keeps it: IPv4, or IPv6's any and
 * loopback (and IPv4-mapped) taken as IPv4's. */
static int take_addr(const struct sockaddr *sa, socklen_t len, uint32_t *ip,
                     uint16_t *port) {
  if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    *ip = sim_ip((const struct sockaddr_in *)sa);
    *port = sim_port((const struct sockaddr_in *)sa);
    return 0;
  }
  if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    const uint8_t *b = s6->sin6_addr.s6_addr;
    static const uint8_t zero[10];
    *port = ntohs(s6->sin6_port);
    if (IN6_IS_ADDR_UNSPECIFIED(&s6->sin6_addr))
      *ip = 0;
    else if (IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr))
      *ip = SIM_LOOPBACK;
    else if (memcmp(b, zero, 10) == 0 && b[10] == 0xff && b[11] == 0xff)
      *ip = (uint32_t)b[12] << 24 | (uint32_t)b[13] << 16 | (uint32_t)b[14] << 8 | b[15];
    else
      return sim_tcp_fail(EADDRNOTAVAIL);
    return 0;
  }
  return sim_tcp_fail(EAFNOSUPPORT);
}

static bool overlap(uint32_t a, uint32_t b) { return a == 0 || b == 0 || a == b; }

/* Whether ip:port on h is taken by a bound socket other than t. */
static bool in_use(nr_sim_host_t *h, sim_tcp_t *t, uint32_t ip, uint16_t port) {
  for (sim_tcp_t *o = h->listeners; o; o = o->hnext)
    if (o != t && sim_port(&o->local) == port && overlap(sim_ip(&o->local), ip) &&
        !(o->reuseport && t->reuseport))
      return true;
  return false;
}

static uint16_t ephemeral(nr_sim_host_t *h, sim_tcp_t *t, uint32_t ip) {
  for (int i = 0; i < 28232; i++) {
    uint16_t p = h->next_port;
    h->next_port = p >= 60999 ? 32768 : (uint16_t)(p + 1);
    if (t == NULL || !in_use(h, t, ip, p))
      return p;
  }
  return 0;
}

static int t_bind(int fd, const struct sockaddr *sa, socklen_t len) {
  sim_tcp_t *t = sim_tcp_get(fd);
  uint32_t ip;
  uint16_t port;
  if (t == NULL || take_addr(sa, len, &ip, &port) < 0)
    return -1;
  if (t->bound || t->state != T_NEW)
    return sim_tcp_fail(EINVAL);
  nr_sim_host_t *h = sim_tcp_host(t);
  if (ip != 0 && (ip >> 24) != 127 && ip != h->ip)
    return sim_tcp_fail(EADDRNOTAVAIL);
  if (port == 0 && (port = ephemeral(h, t, ip)) == 0)
    return sim_tcp_fail(EADDRINUSE);
  if (in_use(h, t, ip, port))
    return sim_tcp_fail(EADDRINUSE);
  sim_sockaddr(&t->local, ip, port);
  t->bound = true;
  t->hnext = h->listeners;
  h->listeners = t;
  return 0;
}

static void unbind(sim_tcp_t *t) {
  if (!t->bound)
    return;
  for (sim_tcp_t **pp = &sim_tcp_host(t)->listeners; *pp; pp = &(*pp)->hnext)
    if (*pp == t) {
      *pp = t->hnext;
      break;
    }
  t->bound = false;
}

static int t_listen(int fd, int backlog) {
  sim_tcp_t *t = sim_tcp_get(fd);
  if (t == NULL)
    return -1;
  if (t->state != T_NEW && t->state != T_LISTEN)
    return sim_tcp_fail(EINVAL);
  if (!t->bound) {
    struct sockaddr_in any;
    sim_sockaddr(&any, 0, 0);
    if (t_bind(fd, (struct sockaddr *)&any, sizeof any) < 0)
      return -1;
  }
  t->state = T_LISTEN;
  t->backlog = backlog > 0 ? backlog : 128;
  return 0;
}

/* The listener of h that takes a connection to ip:port (one of several
 * with reuseport, as the seed picks), or NULL. */
static sim_tcp_t *listener(nr_sim_t *w, nr_sim_host_t *h, uint32_t ip,
                           uint16_t port) {
  sim_tcp_t *v[64];
  int n = 0;
  for (sim_tcp_t *t = h->listeners; t && n < 64; t = t->hnext) {
    uint32_t lip = sim_ip(&t->local);
    if (t->state == T_LISTEN && sim_port(&t->local) == port &&
        (lip == 0 || lip == ip || ((lip >> 24) == 127 && (ip >> 24) == 127)))
      v[n++] = t;
  }
  return n == 0 ? NULL : n == 1 ? v[0] : v[sim_rand(w) % (uint64_t)n];
}

static void ev_syn(nr_sim_t *w, void *obj, uint64_t arg);

/* (Re)send the SYN: it arrives after the latency, if nothing cuts it. */
static void send_syn(nr_sim_t *w, sim_conn_t *c) {
  conn_at(w, c, w->now + lat(w, c, 0), ev_syn, 0);
}

static void ev_syn_retry(nr_sim_t *w, void *obj, uint64_t arg) {
  (void)arg;
  sim_conn_t *c = obj;
  sim_tcp_t *t = c->ep[0];
  if (t != NULL && t->state == T_SYN_SENT)
    send_syn(w, c);
  conn_unref(w, c);
}

/* The SYN was lost: retry after 1, 2, 4 ... s, or time out. */
static void syn_lost(nr_sim_t *w, sim_conn_t *c) {
  sim_tcp_t *t = c->ep[0];
  if (++t->syn_tries > SYN_RETRIES) {
    t->state = T_CLOSED;
    t->err = ETIMEDOUT;
    sim_trace(w, 0x24, c->id, 0);
    sim_notify(&t->base);
    return;
  }
  uint64_t at = t->syn_start + NR_SEC((1ull << t->syn_tries) - 1);
  conn_at(w, c, at, ev_syn_retry, 0);
}

static void ev_synack(nr_sim_t *w, void *obj, uint64_t arg) {
  (void)arg;
  sim_conn_t *c = obj;
  sim_tcp_t *t = c->ep[0];
  if (t != NULL && t->state == T_SYN_SENT) {
    t->state = T_EST;
    sim_trace(w, 0x23, c->id, 0);
    sim_notify(&t->base);
  } else if (c->ep[1] != NULL) {
    send_rst(w, c, 0);                     /* the connector is gone */
  }
  conn_unref(w, c);
}

static void ev_refused(nr_sim_t *w, void *obj, uint64_t arg) {
  (void)arg;
  sim_conn_t *c = obj;
  sim_tcp_t *t = c->ep[0];
  if (t != NULL && t->state == T_SYN_SENT) {
    t->state = T_CLOSED;
    t->err = ECONNREFUSED;
    sim_trace(w, 0x26, c->id, 0);
    sim_notify(&t->base);
  }
  conn_unref(w, c);
}

/* The endpoint a listener makes for a connection, queued for accept. */
static sim_tcp_t *accepted(nr_sim_t *w, sim_tcp_t *l, sim_conn_t *c) {
  sim_tcp_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  s->base.kind = SFD_TCP;
  s->base.w = w;
  s->base.host = c->host[1];
  s->base.fd = -1;
  s->state = T_EST;
  s->side = 1;
  s->local = c->addr[1];
  s->conn = c;
  s->sndbuf = w->sndbuf;
  s->rcvbuf = w->rcvbuf;
  c->ep[1] = s;
  c->refs++;
  *(l->qtail ? &l->qtail->qnext : &l->qhead) = s;
  l->qtail = s;
  l->nq++;
  return s;
}

static void ev_syn(nr_sim_t *w, void *obj, uint64_t arg) {
  (void)arg;
  sim_conn_t *c = obj;
  sim_tcp_t *t = c->ep[0];
  if (t == NULL || t->state != T_SYN_SENT || c->ep[1] != NULL) {
    conn_unref(w, c);                      /* gone, or a late retry */
    return;
  }
  sim_trace(w, 0x22, c->id, (uint64_t)c->host[1]->idx);
  bool lost = c->nowhere || sim_cut(w, c->host[0], c->host[1]);
  sim_tcp_t *l = lost ? NULL : listener(w, c->host[1], sim_ip(&c->addr[1]),
                                        sim_port(&c->addr[1]));
  if (lost || (l != NULL && l->nq >= l->backlog)) {
    syn_lost(w, c);                        /* nowhere, cut, or no room */
  } else if (l == NULL) {
    conn_at(w, c, w->now + lat(w, c, 1), ev_refused, 0);
  } else if (accepted(w, l, c) != NULL) {
    sim_notify(&l->base);
    conn_at(w, c, w->now + lat(w, c, 1), ev_synack, 0);
  }
  conn_unref(w, c);
}

static int t_connect(int fd, const struct sockaddr *sa, socklen_t len) {
  sim_tcp_t *t = sim_tcp_get(fd);
  uint32_t ip;
  uint16_t port;
  if (t == NULL || take_addr(sa, len, &ip, &port) < 0)
    return -1;
  if (t->state == T_SYN_SENT)
    return sim_tcp_fail(EALREADY);
  if (t->state == T_EST)
    return sim_tcp_fail(EISCONN);
  if (t->state != T_NEW)
    return sim_tcp_fail(t->state == T_CLOSED ? ECONNABORTED : EINVAL);
  nr_sim_t *w = t->base.w;
  nr_sim_host_t *h = sim_tcp_host(t);
  if (ip == 0)
    ip = SIM_LOOPBACK;
  if ((ip >> 24) != 10 && (ip >> 24) != 127)
    return sim_tcp_fail(ENETUNREACH);
  sim_conn_t *c = conn_new(w);
  if (c == NULL)
    return sim_tcp_fail(ENOMEM);
  bool chosen = t->bound && sim_port(&t->local) != 0;
  unbind(t);                               /* a connected socket owns no port */
  if (!chosen) {
    uint32_t lip = (ip >> 24) == 127 ? SIM_LOOPBACK : h->ip;
    sim_sockaddr(&t->local, lip, ephemeral(h, NULL, lip));
  }
  c->refs = 1;
  c->ep[0] = t;
  c->host[0] = h;
  c->host[1] = sim_host_by_ip(w, h, ip);
  c->nowhere = c->host[1] == NULL;         /* a black hole: never answers */
  if (c->nowhere)
    c->host[1] = h;                        /* (for latencies) */
  c->addr[0] = t->local;
  sim_sockaddr(&c->addr[1], ip, port);
  t->conn = c;
  t->side = 0;
  t->state = T_SYN_SENT;
  t->syn_start = w->now;
  send_syn(w, c);
  return sim_tcp_fail(EINPROGRESS);
}

static int t_accept(int fd, struct sockaddr *sa, socklen_t *len) {
  sim_tcp_t *l = sim_tcp_get(fd);
  if (l == NULL)
    return -1;
  if (l->state != T_LISTEN)
    return sim_tcp_fail(EINVAL);
  sim_tcp_t *s = l->qhead;
  if (s == NULL)
    return sim_tcp_fail(EAGAIN);
  l->qhead = s->qnext;
  if (l->qhead == NULL)
    l->qtail = NULL;
  l->nq--;
  s->qnext = NULL;
  int nfd = sim_fd_add(&s->base);
  if (nfd < 0) {
    send_rst(s->base.w, s->conn, 1);
    s->conn->ep[1] = NULL;
    conn_unref(s->base.w, s->conn);
    free(s);
    return -1;
  }
  if (sa && len)
    sim_addr_out(&s->conn->addr[0], sa, len);
  return nfd;
}

/* ---- data ------------------------------------------------------------------------------------- */

/* Why t can neither read nor write, as errno; 0 if it can. */
static int unusable(sim_tcp_t *t) {
  if (t->state == T_EST)
    return 0;
  if (t->err) {
    int e = t->err;
    t->err = 0;
    return e;
  }
  return t->state == T_SYN_SENT ? EAGAIN : t->state == T_CLOSED ? EPIPE : ENOTCONN;
}

/* When a segment sent now arrives: the latency, plus a timeout per loss
 * (doubling), never before the one ahead of it. */
static uint64_t arrival(nr_sim_t *w, sim_conn_t *c, int dir) {
  uint64_t l = lat(w, c, dir), at = w->now + l;
  for (uint64_t rto = RTO_MIN > 2 * l ? RTO_MIN : 2 * l;
       w->loss > 0 && sim_uniform(w) < w->loss && rto < NR_SEC(120); rto *= 2)
    at += rto;
  pipe_t *p = &c->p[dir];
  if (p->tail && p->tail->at > at)
    at = p->tail->at;
  return at;
}

static ssize_t t_sendmsg(int fd, const struct msghdr *m) {
  sim_tcp_t *t = sim_tcp_get(fd);
  if (t == NULL)
    return -1;
  int e = unusable(t);
  if (e)
    return sim_tcp_fail(e);
  if (t->wr_shut)
    return sim_tcp_fail(EPIPE);
  nr_sim_t *w = t->base.w;
  sim_conn_t *c = t->conn;
  pipe_t *p = &c->p[t->side];
  size_t room = t->sndbuf > p->sendq ? t->sndbuf - p->sendq : 0, total = 0;
  for (size_t i = 0; i < m->msg_iovlen; i++)
    total += m->msg_iov[i].iov_len;
  if (room == 0 && total > 0)
    return sim_tcp_fail(EAGAIN);
  size_t n = total < room ? total : room;
  seg_t *s = malloc(sizeof *s + n);
  if (s == NULL)
    return sim_tcp_fail(ENOBUFS);
  for (size_t i = 0, at = 0; i < m->msg_iovlen && at < n; i++) {
    size_t k = m->msg_iov[i].iov_len < n - at ? m->msg_iov[i].iov_len : n - at;
    memcpy(s->data + at, m->msg_iov[i].iov_base, k);
    at += k;
  }
  s->next = NULL;
  s->len = n;
  s->off = 0;
  s->at = arrival(w, c, t->side);
  *(p->tail ? &p->tail->next : &p->head) = s;
  p->tail = s;
  p->sendq += n;
  kick(w, c, t->side);
  return (ssize_t)n;
}

static ssize_t t_read(int fd, void *buf, size_t n) {
  sim_tcp_t *t = sim_tcp_get(fd);
  if (t == NULL)
    return -1;
  if (t->state == T_CLOSED && !t->err)
    return 0;                              /* after the reset was told */
  int e = unusable(t);
  if (e)
    return sim_tcp_fail(e);
  if (t->rd_shut)
    return 0;
  nr_sim_t *w = t->base.w;
  sim_conn_t *c = t->conn;
  pipe_t *p = &c->p[1 - t->side];
  if (p->recvq == 0)
    return p->eof ? 0 : sim_tcp_fail(EAGAIN);
  size_t got = 0;
  char *out = buf;
  while (p->rhead && got < n) {
    seg_t *s = p->rhead;
    size_t k = s->len - s->off < n - got ? s->len - s->off : n - got;
    memcpy(out + got, s->data + s->off, k);
    got += k;
    s->off += k;
    if (s->off == s->len) {
      p->rhead = s->next;
      if (p->rhead == NULL)
        p->rtail = NULL;
      free(s);
    }
  }
  p->recvq -= got;
  if (p->full) {                           /* room again: the window opens */
    p->full = false;
    if (!p->scheduled && p->head) {
      p->scheduled = true;
      conn_at(w, c, w->now + lat(w, c, t->side), ev_deliver,
              (uint64_t)(1 - t->side));
    }
  }
  return (ssize_t)got;
}

static int t_shutdown(int fd, int how) {
  sim_tcp_t *t = sim_tcp_get(fd);
  if (t == NULL)
    return -1;
  if (t->state != T_EST)
    return sim_tcp_fail(ENOTCONN);
  nr_sim_t *w = t->base.w;
  if ((how == SHUT_RD || how == SHUT_RDWR) && !t->rd_shut) {
    t->rd_shut = true;
    sim_notify(&t->base);
  }
  if ((how == SHUT_WR || how == SHUT_RDWR) && !t->wr_shut) {
    sim_conn_t *c = t->conn;
    pipe_t *p = &c->p[t->side];
    t->wr_shut = true;
    p->fin = true;
    p->fin_at = w->now + lat(w, c, t->side);
    if (p->tail && p->tail->at > p->fin_at)
      p->fin_at = p->tail->at;
    kick(w, c, t->side);
    sim_notify(&t->base);
  }
  return 0;
}

/* ---- closing ------------------------------------------------------------------------------------- */

/* A queued, never accepted endpoint of a closing listener: reset. */
static void drop_queued(nr_sim_t *w, sim_tcp_t *s) {
  sim_conn_t *c = s->conn;
  c->ep[1] = NULL;
  send_rst(w, c, 1);
  conn_unref(w, c);
  free(s);
}

int sim_tcp_close(sim_fd_t *d) {
  sim_tcp_t *t = (sim_tcp_t *)d;
  nr_sim_t *w = d->w;
  bool live = w->entered;                  /* else nothing is sent */
  unbind(t);
  while (t->qhead) {
    sim_tcp_t *s = t->qhead;
    t->qhead = s->qnext;
    if (live) {
      drop_queued(w, s);
    } else {
      s->conn->ep[1] = NULL;
      conn_unref(w, s->conn);
      free(s);
    }
  }
  sim_conn_t *c = t->conn;
  if (c != NULL) {
    if (live && t->state == T_EST) {
      pipe_t *in = &c->p[1 - t->side], *out = &c->p[t->side];
      if (t->linger0 || in->recvq > 0) {
        send_rst(w, c, t->side);           /* abortive close */
      } else if (!t->wr_shut) {
        out->fin = true;
        out->fin_at = w->now + lat(w, c, t->side);
        if (out->tail && out->tail->at > out->fin_at)
          out->fin_at = out->tail->at;
        kick(w, c, t->side);
      }
      sim_trace(w, 0x27, c->id, (uint64_t)t->side);
    }
    c->ep[t->side] = NULL;
    conn_unref(w, c);
  }
  sim_fd_remove(d);
  free(t);
  return 0;
}

const nr_transport_t sim_tcp_ops = {
    .bind = t_bind, .listen = t_listen, .accept = t_accept,
    .connect = t_connect, .read = t_read, .sendmsg = t_sendmsg,
    .shutdown = t_shutdown, .getsockopt = sim_tcp_getsockopt,
    .setsockopt = sim_tcp_setsockopt, .getsockname = sim_tcp_getsockname,
    .getpeername = sim_tcp_getpeername, .ioctl = sim_tcp_ioctl};
