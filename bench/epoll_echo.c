/*
 * epoll_echo.c -- the C baseline of the echo benchmarks: a minimal
 * single-threaded, level-triggered epoll echo server. Reads into a stack
 * buffer and writes the bytes straight back; only when the socket will not
 * take them all is the rest kept (per connection) and EPOLLOUT awaited,
 * with reading paused meanwhile, so memory stays bounded.
 *
 * Usage: epoll_echo PORT        (prints "listening on PORT"; SIGINT/SIGTERM stop it)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct conn_s {
  char *rest;                 /* bytes the socket did not take yet */
  size_t len, off;
} conn_t;

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

static conn_t *conns;
static int nconns;

static conn_t *conn_of(int fd) {
  if (fd >= nconns) {
    int n = nconns ? nconns : 1024;
    while (n <= fd)
      n *= 2;
    conns = realloc(conns, sizeof *conns * (size_t)n);
    if (conns == NULL) {
      perror("epoll_echo: realloc");
      exit(1);
    }
    memset(conns + nconns, 0, sizeof *conns * (size_t)(n - nconns));
    nconns = n;
  }
  return &conns[fd];
}

static void drop(int ep, int fd) {
  conn_t *c = conn_of(fd);
  free(c->rest);
  *c = (conn_t){0};
  epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
  close(fd);
}

static void interest(int ep, int fd, uint32_t ev) {
  struct epoll_event e = {.events = ev, .data.fd = fd};
  epoll_ctl(ep, EPOLL_CTL_MOD, fd, &e);
}

/* Write p[0..n) and keep what the socket refuses. 0, or -1 on error. */
static int send_or_keep(int ep, int fd, const char *p, size_t n) {
  ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
  if (w < 0) {
    if (errno != EAGAIN && errno != EINTR)
      return -1;
    w = 0;
  }
  if ((size_t)w == n)
    return 0;
  conn_t *c = conn_of(fd);
  c->rest = malloc(n - (size_t)w);
  if (c->rest == NULL)
    return -1;
  memcpy(c->rest, p + w, n - (size_t)w);
  c->len = n - (size_t)w;
  c->off = 0;
  interest(ep, fd, EPOLLOUT);          /* stop reading until it drained */
  return 0;
}

static int on_writable(int ep, int fd) {
  conn_t *c = conn_of(fd);
  ssize_t w = send(fd, c->rest + c->off, c->len - c->off, MSG_NOSIGNAL);
  if (w < 0)
    return errno == EAGAIN || errno == EINTR ? 0 : -1;
  if ((c->off += (size_t)w) == c->len) {
    free(c->rest);
    c->rest = NULL;
    interest(ep, fd, EPOLLIN);
  }
  return 0;
}

static int on_readable(int ep, int fd) {
  char buf[65536];
  ssize_t n = read(fd, buf, sizeof buf);
  if (n == 0)
    return -1;
  if (n < 0)
    return errno == EAGAIN || errno == EINTR ? 0 : -1;
  return send_or_keep(ep, fd, buf, (size_t)n);
}

static void accept_all(int ep, int lfd) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      return;                          /* EAGAIN, or out of fds: next time */
    int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
    conn_of(fd);
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: epoll_echo PORT\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int on = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)atoi(argv[1]))};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof addr;
  if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 ||
      listen(lfd, 1024) < 0 ||
      getsockname(lfd, (struct sockaddr *)&addr, &alen) < 0) {
    perror("epoll_echo: bind");
    return 1;
  }
  printf("listening on %d\n", ntohs(addr.sin_port));
  fflush(stdout);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event e = {.events = EPOLLIN, .data.fd = lfd};
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &e);
  struct epoll_event evs[1024];
  while (!stop) {
    int n = epoll_wait(ep, evs, 1024, -1);
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == lfd) {
        accept_all(ep, lfd);
        continue;
      }
      int rc = (evs[i].events & EPOLLOUT) ? on_writable(ep, fd)
                                          : on_readable(ep, fd);
      if (rc < 0)
        drop(ep, fd);
    }
  }
  return 0;
}
