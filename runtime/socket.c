/*
 * socket.c -- socket helpers that know nothing of loops (in the spirit of
 * Redis's anet.c): address resolution, socket creation, options, address
 * formatting and error names. Any thread.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/stat.h>
#include <stdio.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"
#include "sim/sim.h"

/* A name a simulation answers (its hosts'), as getaddrinfo would; 1 if
 * the caller is not in one. */
static int sim_resolve(const char *host, int port, struct sockaddr_storage *ss,
                       socklen_t *len) {
  nr_addrs_t a;
  int rc = nr__sim_lookup(host, AF_INET, &a);
  if (rc <= 0)
    return rc < 0 ? nr_raise(rc, "%s:%d: %s", host, port, nr__errname(rc)) : 1;
  struct sockaddr_in *in = (struct sockaddr_in *)ss;
  memset(in, 0, sizeof *in);
  in->sin_family = AF_INET;
  in->sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, a.addr[0], &in->sin_addr);
  *len = sizeof *in;
  return 0;
}

int nr__resolve(const char *host, int port, int socktype, bool passive,
                struct sockaddr_storage *ss, socklen_t *len) {
  if (port < 0 || port > 65535)
    return nr_raise(-EINVAL, "port %d: out of range", port);
  /* localhost is loopback even with no /etc/hosts (RFC 6761), and one
   * address here: 127.0.0.1, which every client reaches (IPv4 loopback
   * exists everywhere; connects to localhost try ::1, then it). */
  if (host && nr__is_localhost(host))
    host = "127.0.0.1";
  int sim = host ? sim_resolve(host, port, ss, len) : 1;
  if (sim <= 0)
    return sim;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = socktype,
                           .ai_flags = passive ? AI_PASSIVE : 0}, *res;
  char serv[16];
  snprintf(serv, sizeof serv, "%d", port);
  int rc = getaddrinfo(host, serv, &hints, &res);
  if (rc != 0)
    return nr_raise(-EHOSTUNREACH, "%s:%d: %s", host ? host : "*", port,
                    gai_strerror(rc));
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

int nr__unix_addr(const char *path, struct sockaddr_storage *ss,
                  socklen_t *len) {
  struct sockaddr_un *un = (struct sockaddr_un *)ss;
  if (strlen(path) >= sizeof un->sun_path)
    return nr_raise(-ENAMETOOLONG, "%s: path too long for a unix socket",
                    path);
  memset(un, 0, sizeof *un);
  un->sun_family = AF_UNIX;
  strcpy(un->sun_path, path);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path) + 1);
  return 0;
}

/* lstat, not stat: a symbolic link at the path is not a socket, and what
 * it points to is nobody's to remove. connect() to a regular file fails
 * with ECONNREFUSED too, which is why the type is checked first. */
int nr__unix_prepare(const struct sockaddr_storage *ss, socklen_t len) {
  const char *path = ((const struct sockaddr_un *)ss)->sun_path;
  struct stat st;
  if (lstat(path, &st) < 0)
    return 0;                            /* nothing there (or unreachable) */
  if (!S_ISSOCK(st.st_mode))
    return nr_raise(-EEXIST, "%s: exists and is not a socket; not replaced",
                    path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (connect(fd, (const struct sockaddr *)ss, len) < 0 &&
      errno == ECONNREFUSED)
    nr__unlink_socket(path, st.st_dev, st.st_ino);   /* stale */
  close(fd);
  return 0;
}

void nr__unlink_socket(const char *path, dev_t dev, ino_t ino) {
  struct stat st;
  if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == dev &&
      st.st_ino == ino)
    unlink(path);
}

int nr_sys_socket(nr_loop_t *l, int family, int type) {
  if (l != NULL && l->sim != NULL)
    return nr__transport->socket(l, family, type);
  return socket(family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
}

int nr__socket(nr_loop_t *l, int family, int type) {
  int fd = nr_sys_socket(l, family, type);
  return fd < 0 ? -errno : fd;
}

void nr__apply_opts(int fd, int family, const nr_channel_opts_t *o) {
  int on = 1;
  if (family != AF_UNIX && o->tcp_nodelay)
    nr_sys_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  if (family != AF_UNIX && o->keepalive)
    nr_sys_setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  if (o->sndbuf > 0)
    nr_sys_setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o->sndbuf, sizeof o->sndbuf);
  if (o->rcvbuf > 0)
    nr_sys_setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &o->rcvbuf, sizeof o->rcvbuf);
}

int nr_format_addr(const struct sockaddr_storage *ss, socklen_t len,
                   char *host, size_t n, int *port) {
  if (len == 0)
    return -ENOTCONN;
  if (ss->ss_family == AF_UNIX) {
    const struct sockaddr_un *un = (const struct sockaddr_un *)ss;
    snprintf(host, n, "%s", un->sun_path);
    *port = -1;
    return 0;
  }
  char serv[16];
  int rc = getnameinfo((const struct sockaddr *)ss, len, host, (socklen_t)n,
                       serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV);
  if (rc != 0)
    return -EINVAL;
  *port = atoi(serv);
  return 0;
}
