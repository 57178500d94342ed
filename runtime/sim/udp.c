/*
 * sim/udp.c -- UDP over the simulated network: a datagram sent arrives
 * after the link's latency at the socket bound to its destination, or is
 * lost -- to world:loss, to a partition, to a full receive buffer
 * (rcvbuf bytes queued), to nobody listening there -- and may come twice
 * (world:duplicate) or late, behind datagrams sent after it
 * (world:reorder: up to four latencies more). Nothing tells the sender.
 * Every arrival is traced with its bytes. Threads: the world's thread.
 */
#include <stdio.h>

#include "world.h"

typedef struct dgram_s {
  struct dgram_s *next;
  struct sockaddr_in from;
  size_t len;
  char data[];
} dgram_t;

typedef struct sim_udp_s {
  sim_fd_t base;
  bool bound, reuseport;
  struct sockaddr_in local;
  dgram_t *head, *tail;
  size_t bytes, rcvbuf;
  struct sim_udp_s *hnext;             /* the host's bound sockets */
} sim_udp_t;

/* A datagram on its way. */
typedef struct flight_s {
  nr_sim_host_t *src, *dst;
  uint32_t ip;
  uint16_t port;
  dgram_t *g;
} flight_t;

static sim_udp_t *get(int fd) { return (sim_udp_t *)sim_fd_get(fd, SFD_UDP); }

static int fail(int err) {
  errno = err;
  return -1;
}

uint32_t sim_udp_ready(sim_fd_t *d) {
  return EPOLLOUT | (((sim_udp_t *)d)->head ? EPOLLIN : 0);
}

int sim_udp_socket(nr_sim_t *w, nr_sim_host_t *h) {
  sim_udp_t *u = calloc(1, sizeof *u);
  if (u == NULL)
    return fail(ENOMEM);
  u->base.kind = SFD_UDP;
  u->base.w = w;
  u->base.host = h;
  u->rcvbuf = w->rcvbuf;
  int fd = sim_fd_add(&u->base);
  if (fd < 0)
    free(u);
  return fd;
}

static bool taken(nr_sim_host_t *h, sim_udp_t *u, uint32_t ip, uint16_t port) {
  for (sim_udp_t *o = h->udps; o; o = o->hnext)
    if (o != u && sim_port(&o->local) == port &&
        (sim_ip(&o->local) == 0 || ip == 0 || sim_ip(&o->local) == ip) &&
        !(o->reuseport && u->reuseport))
      return true;
  return false;
}

static int do_bind(sim_udp_t *u, uint32_t ip, uint16_t port) {
  nr_sim_host_t *h = u->base.host;
  if (u->bound)
    return fail(EINVAL);
  if (ip != 0 && (ip >> 24) != 127 && ip != h->ip)
    return fail(EADDRNOTAVAIL);
  for (int i = 0; port == 0 && i < 28232; i++) {
    uint16_t p = h->next_port;
    h->next_port = p >= 60999 ? 32768 : (uint16_t)(p + 1);
    if (!taken(h, u, ip, p))
      port = p;
  }
  if (port == 0 || taken(h, u, ip, port))
    return fail(EADDRINUSE);
  sim_sockaddr(&u->local, ip, port);
  u->bound = true;
  u->hnext = h->udps;
  h->udps = u;
  return 0;
}

static int u_bind(int fd, const struct sockaddr *sa, socklen_t len) {
  sim_udp_t *u = get(fd);
  if (u == NULL)
    return -1;
  if (sa->sa_family != AF_INET || len < sizeof(struct sockaddr_in))
    return fail(EAFNOSUPPORT);
  const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
  return do_bind(u, sim_ip(in), sim_port(in));
}

static void ev_arrive(nr_sim_t *w, void *obj, uint64_t arg) {
  (void)arg;
  flight_t *f = obj;
  sim_udp_t *to = NULL;
  if (!sim_cut(w, f->src, f->dst))
    for (sim_udp_t *u = f->dst->udps; u && to == NULL; u = u->hnext) {
      uint32_t lip = sim_ip(&u->local);
      if (sim_port(&u->local) == f->port &&
          (lip == 0 || lip == f->ip || ((lip >> 24) == 127 && (f->ip >> 24) == 127)))
        to = u;
    }
  if (to != NULL && to->bytes + f->g->len <= to->rcvbuf) {
    sim_trace(w, 0x30, (uint64_t)f->dst->idx, f->g->len);
    sim_trace_bytes(w, f->g->data, f->g->len);
    w->stats.datagrams++;
    f->g->next = NULL;
    *(to->tail ? &to->tail->next : &to->head) = f->g;
    to->tail = f->g;
    to->bytes += f->g->len;
    sim_notify(&to->base);
  } else {
    sim_trace(w, 0x31, (uint64_t)f->dst->idx, f->g->len);
    free(f->g);
  }
  free(f);
}

static void ev_lost(nr_sim_t *w, void *obj, uint64_t arg) {
  (void)w;
  (void)arg;
  flight_t *f = obj;
  free(f->g);
  free(f);
}

/* One copy of the datagram on its way to ip:port of dst. */
static void launch(nr_sim_t *w, sim_udp_t *u, nr_sim_host_t *dst, uint32_t ip,
                   uint16_t port, const struct msghdr *m, size_t n) {
  flight_t *f = malloc(sizeof *f);
  dgram_t *g = malloc(sizeof *g + n);
  if (f == NULL || g == NULL) {
    free(f);
    free(g);
    return;
  }
  for (size_t i = 0, at = 0; i < m->msg_iovlen; i++) {
    memcpy(g->data + at, m->msg_iov[i].iov_base, m->msg_iov[i].iov_len);
    at += m->msg_iov[i].iov_len;
  }
  g->len = n;
  g->from = u->local;
  if (sim_ip(&g->from) == 0)
    sim_sockaddr(&g->from, (ip >> 24) == 127 ? SIM_LOOPBACK : u->base.host->ip,
                 sim_port(&u->local));
  *f = (flight_t){u->base.host, dst, ip, port, g};
  uint64_t lat = sim_latency(w, u->base.host, dst), at = w->now + lat;
  if (w->reorder > 0 && sim_uniform(w) < w->reorder)
    at += (uint64_t)(sim_uniform(w) * 4.0 * (double)lat);
  sim_at(w, at, ev_arrive, ev_lost, f, 0);
}

static ssize_t u_sendmsg(int fd, const struct msghdr *m) {
  sim_udp_t *u = get(fd);
  if (u == NULL)
    return -1;
  const struct sockaddr_in *to = m->msg_name;
  if (to == NULL || m->msg_namelen < sizeof *to || to->sin_family != AF_INET)
    return fail(to == NULL ? EDESTADDRREQ : EAFNOSUPPORT);
  nr_sim_t *w = u->base.w;
  if (!u->bound && do_bind(u, 0, 0) < 0)
    return -1;
  size_t n = 0;
  for (size_t i = 0; i < m->msg_iovlen; i++)
    n += m->msg_iov[i].iov_len;
  if (n > 65507)
    return fail(EMSGSIZE);
  uint32_t ip = sim_ip(to);
  nr_sim_host_t *dst = sim_host_by_ip(w, u->base.host, ip);
  if (dst == NULL || (w->loss > 0 && sim_uniform(w) < w->loss))
    return (ssize_t)n;                    /* gone, and nobody says so */
  int copies = w->dup > 0 && sim_uniform(w) < w->dup ? 2 : 1;
  for (int i = 0; i < copies; i++)
    launch(w, u, dst, ip, sim_port(to), m, n);
  return (ssize_t)n;
}

static ssize_t u_recvfrom(int fd, void *buf, size_t n, struct sockaddr *sa,
                          socklen_t *len) {
  sim_udp_t *u = get(fd);
  if (u == NULL)
    return -1;
  dgram_t *g = u->head;
  if (g == NULL)
    return fail(EAGAIN);
  u->head = g->next;
  if (u->head == NULL)
    u->tail = NULL;
  u->bytes -= g->len;
  size_t k = g->len < n ? g->len : n;      /* the rest is cut, as UDP does */
  memcpy(buf, g->data, k);
  if (sa && len)
    sim_addr_out(&g->from, sa, len);
  free(g);
  return (ssize_t)k;
}

static ssize_t u_read(int fd, void *buf, size_t n) {
  return u_recvfrom(fd, buf, n, NULL, NULL);
}

int sim_udp_close(sim_fd_t *d) {
  sim_udp_t *u = (sim_udp_t *)d;
  if (u->bound)
    for (sim_udp_t **pp = &d->host->udps; *pp; pp = &(*pp)->hnext)
      if (*pp == u) {
        *pp = u->hnext;
        break;
      }
  for (dgram_t *g = u->head, *n; g; g = n) {
    n = g->next;
    free(g);
  }
  sim_fd_remove(d);
  free(u);
  return 0;
}

static int u_getsockopt(int fd, int level, int name, void *v, socklen_t *len) {
  sim_udp_t *u = get(fd);
  if (u == NULL)
    return -1;
  int out = level == SOL_SOCKET && name == SO_RCVBUF ? (int)u->rcvbuf : 0;
  if (*len >= sizeof out) {
    memcpy(v, &out, sizeof out);
    *len = sizeof out;
  }
  return 0;
}

static int u_setsockopt(int fd, int level, int name, const void *v,
                        socklen_t len) {
  sim_udp_t *u = get(fd);
  if (u == NULL)
    return -1;
  int i = 0;
  if (len >= sizeof i)
    memcpy(&i, v, sizeof i);
  if (level == SOL_SOCKET && name == SO_REUSEPORT)
    u->reuseport = i != 0;
  else if (level == SOL_SOCKET && name == SO_RCVBUF && i > 0)
    u->rcvbuf = (size_t)i * 2;
  return 0;
}

static int u_getsockname(int fd, struct sockaddr *sa, socklen_t *len) {
  sim_udp_t *u = get(fd);
  if (u == NULL)
    return -1;
  sim_addr_out(&u->local, sa, len);
  return 0;
}

static int u_ioctl(int fd, unsigned long req, int *arg) {
  sim_udp_t *u = get(fd);
  if (u == NULL)
    return -1;
  if (req != FIONREAD)
    return fail(ENOTTY);
  *arg = u->head ? (int)u->head->len : 0;
  return 0;
}

const nr_transport_t sim_udp_ops = {
    .bind = u_bind, .read = u_read, .sendmsg = u_sendmsg,
    .recvfrom = u_recvfrom, .getsockopt = u_getsockopt,
    .setsockopt = u_setsockopt, .getsockname = u_getsockname,
    .ioctl = u_ioctl};
