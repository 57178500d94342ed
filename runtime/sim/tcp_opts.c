/*
 * sim/tcp_opts.c -- the simulated TCP socket's options (SO_ERROR, buffer
 * sizes, SO_LINGER 0, SO_REUSEPORT; the rest accepted with no effect),
 * its names, and the ioctls the runtime asks (SIOCOUTQ, FIONREAD), as
 * tcp.c's transport uses them. The world's thread only.
 */
#include <linux/sockios.h>
#include <sys/ioctl.h>

#include "tcp.h"

/* ---- options and names ------------------------------------------------------------------------------ */

int sim_tcp_getsockopt(int fd, int level, int name, void *v, socklen_t *len) {
  sim_tcp_t *t = sim_tcp_get(fd);
  if (t == NULL)
    return -1;
  int out = 0;
  if (level == SOL_SOCKET && name == SO_ERROR) {
    out = t->err;
    t->err = 0;
  } else if (level == SOL_SOCKET && name == SO_SNDBUF) {
    out = (int)t->sndbuf;
  } else if (level == SOL_SOCKET && name == SO_RCVBUF) {
    out = (int)t->rcvbuf;
  }
  if (*len >= sizeof out) {
    memcpy(v, &out, sizeof out);
    *len = sizeof out;
  }
  return 0;
}

int sim_tcp_setsockopt(int fd, int level, int name, const void *v,
                       socklen_t len) {
  sim_tcp_t *t = sim_tcp_get(fd);
  if (t == NULL)
    return -1;
  int i = 0;
  if (len >= sizeof i)
    memcpy(&i, v, sizeof i);
  if (level == SOL_SOCKET && name == SO_LINGER && len >= sizeof(struct linger)) {
    const struct linger *lg = v;
    t->linger0 = lg->l_onoff && lg->l_linger == 0;
  } else if (level == SOL_SOCKET && name == SO_REUSEPORT) {
    t->reuseport = i != 0;
  } else if (level == SOL_SOCKET && name == SO_SNDBUF && i > 0) {
    t->sndbuf = (size_t)i * 2;             /* as Linux doubles it */
  } else if (level == SOL_SOCKET && name == SO_RCVBUF && i > 0) {
    t->rcvbuf = (size_t)i * 2;
  }
  return 0;                                /* the rest: accepted, no effect */
}

int sim_tcp_getsockname(int fd, struct sockaddr *sa, socklen_t *len) {
  sim_tcp_t *t = sim_tcp_get(fd);
  if (t == NULL)
    return -1;
  sim_addr_out(&t->local, sa, len);
  return 0;
}

int sim_tcp_getpeername(int fd, struct sockaddr *sa, socklen_t *len) {
  sim_tcp_t *t = sim_tcp_get(fd);
  if (t == NULL)
    return -1;
  if (t->state != T_EST)
    return sim_tcp_fail(ENOTCONN);
  sim_addr_out(&t->conn->addr[1 - t->side], sa, len);
  return 0;
}

int sim_tcp_ioctl(int fd, unsigned long req, int *arg) {
  sim_tcp_t *t = sim_tcp_get(fd);
  if (t == NULL)
    return -1;
  sim_conn_t *c = t->conn;
  if (req == SIOCOUTQ)
    *arg = c ? (int)c->p[t->side].sendq : 0;
  else if (req == FIONREAD)
    *arg = c ? (int)c->p[1 - t->side].recvq : 0;
  else
    return sim_tcp_fail(ENOTTY);
  return 0;
}
