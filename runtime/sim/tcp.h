/*
 * sim/tcp.h -- what the files of the simulated TCP share (tcp.c: the
 * connections, their pipes, the handshake, data and closing; tcp_opts.c:
 * socket options, names and ioctls): the endpoint and connection records
 * and the lookup of an endpoint by descriptor. The world's thread only.
 */
#ifndef NR_SIM_TCP_H
#define NR_SIM_TCP_H

#include "world.h"

enum { T_NEW, T_LISTEN, T_SYN_SENT, T_EST, T_CLOSED };

typedef struct seg_s {
  struct seg_s *next;
  uint64_t at;                         /* when it arrives */
  size_t len, off;
  char data[];
} seg_t;

typedef struct pipe_s {
  seg_t *head, *tail;                  /* sent, not yet arrived */
  size_t sendq;
  seg_t *rhead, *rtail;                /* arrived, not yet read */
  size_t recvq;
  bool fin, eof;                       /* FIN sent (after the data), arrived */
  uint64_t fin_at;
  bool scheduled;                      /* a delivery event is queued */
  bool full;                           /* held back: the receiver is full */
  uint64_t cut_since;                  /* held back by a partition: since */
} pipe_t;

typedef struct sim_conn_s {
  uint64_t id;
  int refs;                            /* open endpoints + queued events */
  struct sim_tcp_s *ep[2];
  nr_sim_host_t *host[2];
  struct sockaddr_in addr[2];
  bool nowhere;                        /* no host has the address */
  pipe_t p[2];                         /* p[i]: from side i */
  struct sim_conn_s *prev, *next;      /* the world's list */
} sim_conn_t;

typedef struct sim_tcp_s {
  sim_fd_t base;
  int state, side;
  bool bound, rd_shut, wr_shut, linger0, reuseport, reset;
  int err;                             /* SO_ERROR */
  struct sockaddr_in local;
  sim_conn_t *conn;
  size_t sndbuf, rcvbuf;
  struct sim_tcp_s *hnext;             /* the host's bound sockets */
  struct sim_tcp_s *qhead, *qtail, *qnext;   /* accept queue */
  int nq, backlog;
  int syn_tries;
  uint64_t syn_start;
} sim_tcp_t;

static inline sim_tcp_t *sim_tcp_get(int fd) {
  return (sim_tcp_t *)sim_fd_get(fd, SFD_TCP);
}

static inline int sim_tcp_fail(int err) {
  errno = err;
  return -1;
}

static inline nr_sim_host_t *sim_tcp_host(const sim_tcp_t *t) { return t->base.host; }

/* tcp_opts.c */
int sim_tcp_getsockopt(int fd, int level, int name, void *v, socklen_t *len);
int sim_tcp_setsockopt(int fd, int level, int name, const void *v,
                       socklen_t len);
int sim_tcp_getsockname(int fd, struct sockaddr *sa, socklen_t *len);
int sim_tcp_getpeername(int fd, struct sockaddr *sa, socklen_t *len);
int sim_tcp_ioctl(int fd, unsigned long req, int *arg);

#endif /* NR_SIM_TCP_H */
