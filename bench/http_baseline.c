/*
 * http_baseline.c -- the C reference for the HTTP hello benchmark: a
 * minimal single-threaded epoll HTTP/1.1 keep-alive server answering every
 * request with "Hello, World!". It does what a server must do per request
 * and no more: find the end of each request ("\r\n\r\n"; no bodies), and
 * answer each with a full response (status, Server, cached Date,
 * Content-Length, Content-Type), all the responses to one read in one
 * write. Pipelined requests are answered in order. System calls per read
 * are a read and a write (epoll_ctl only when the socket fills or drains).
 *
 *   cc -O2 -o http_baseline bench/http_baseline.c && ./http_baseline 8080
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BODY "Hello, World!"

typedef struct conn_s {
  int fd;
  size_t have;               /* bytes of an incomplete request kept */
  char in[8192];
  char *out;                 /* unsent responses (socket full) */
  size_t out_len, out_cap;
  int want_out;              /* EPOLLOUT is in its interest set */
} conn_t;

static char response[256];
static size_t response_len;
static time_t response_sec;

/* The response with the Date of this second (rebuilt once a second). */
static void refresh_response(void) {
  time_t now = time(NULL);
  if (now == response_sec)
    return;
  struct tm tm;
  char date[64];
  gmtime_r(&now, &tm);
  strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  response_len = (size_t)snprintf(
      response, sizeof response,
      "HTTP/1.1 200 OK\r\nServer: baseline\r\nDate: %s\r\n"
      "Content-Type: text/plain\r\nContent-Length: %zu\r\n\r\n" BODY,
      date, sizeof BODY - 1);
  response_sec = now;
}

static int out_append(conn_t *c, const char *p, size_t n) {
  if (c->out_len + n > c->out_cap) {
    size_t cap = (c->out_len + n) * 2;
    char *o = realloc(c->out, cap);
    if (o == NULL)
      return -1;
    c->out = o;
    c->out_cap = cap;
  }
  memcpy(c->out + c->out_len, p, n);
  c->out_len += n;
  return 0;
}

static int flush_out(int ep, conn_t *c) {
  size_t sent = 0;
  while (sent < c->out_len) {
    ssize_t n = write(c->fd, c->out + sent, c->out_len - sent);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      break;
    if (n <= 0)
      return -1;
    sent += (size_t)n;
  }
  memmove(c->out, c->out + sent, c->out_len - sent);
  c->out_len -= sent;
  /* Only a change of interest costs a system call: the usual flush, all
   * sent, leaves it at EPOLLIN and makes none. */
  int want = c->out_len != 0;
  if (want == c->want_out)
    return 0;
  c->want_out = want;
  struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0),
                           .data.ptr = c};
  return epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void close_conn(conn_t *c) {
  close(c->fd);
  free(c->out);
  free(c);
}

/* Read what is there, answer every complete request. -1 closes. */
static int on_readable(int ep, conn_t *c) {
  for (;;) {
    ssize_t n = read(c->fd, c->in + c->have, sizeof c->in - c->have);
    if (n == 0)
      return -1;
    if (n < 0)
      return errno == EAGAIN ? 0 : errno == EINTR ? on_readable(ep, c) : -1;
    size_t len = c->have + (size_t)n, start = 0;
    refresh_response();
    for (;;) {
      char *end = memmem(c->in + start, len - start, "\r\n\r\n", 4);
      if (end == NULL)
        break;
      start = (size_t)(end - c->in) + 4;
      if (out_append(c, response, response_len) < 0)
        return -1;
    }
    c->have = len - start;
    if (c->have == sizeof c->in)
      return -1;             /* a request larger than the buffer */
    memmove(c->in, c->in + start, c->have);
    if (c->out_len && flush_out(ep, c) < 0)
      return -1;
    if ((size_t)n < sizeof c->in - (len - (size_t)n))
      return 0;              /* short read: the socket is drained */
  }
}

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 8080;
  signal(SIGPIPE, SIG_IGN);
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(ls, 1024) < 0) {
    perror("http_baseline: bind/listen");
    return 1;
  }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  fprintf(stderr, "http_baseline listening on 127.0.0.1:%d\n", port);
  struct epoll_event evs[256];
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      conn_t *c = evs[i].data.ptr;
      if (c == NULL) {
        int fd;
        while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conn_t *nc = calloc(1, sizeof *nc);
          nc->fd = fd;
          struct epoll_event cev = {.events = EPOLLIN, .data.ptr = nc};
          epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
        }
        continue;
      }
      int rc = 0;
      if (evs[i].events & EPOLLOUT)
        rc = flush_out(ep, c);
      if (rc == 0 && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        rc = on_readable(ep, c);
      if (rc < 0)
        close_conn(c);
    }
  }
}
