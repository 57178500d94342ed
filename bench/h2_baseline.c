/*
 * h2_baseline.c -- the C reference for the HTTP/2 hello benchmark: a
 * minimal single-threaded epoll h2c server (prior knowledge) on libnghttp2
 * answering every request with "Hello, World!" (status, content-type,
 * content-length, server, date). It is what a server built on nghttp2 must
 * do per request and no more: feed each read to nghttp2_session_mem_recv,
 * submit a response when a request's headers (and body) have arrived, and
 * gather every frame nghttp2_session_mem_send produces for that read into
 * one write. It was the spike of issue 29: how many instructions nghttp2
 * costs per request against nginx and h2o (bench/instr_h2.sh).
 *
 *   cc -O2 -o h2_baseline bench/h2_baseline.c -lnghttp2 && ./h2_baseline 8080
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
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
  nghttp2_session *s;
  char *out;                 /* frames not yet written */
  size_t out_len, out_cap;
  int want_out;
} conn_t;

static char date[64];
static time_t date_sec;

static void refresh_date(void) {
  time_t now = time(NULL);
  if (now == date_sec)
    return;
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  date_sec = now;
}

static int out_append(conn_t *c, const uint8_t *p, size_t n) {
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

static ssize_t body_read(nghttp2_session *s, int32_t id, uint8_t *buf,
                         size_t len, uint32_t *flags, nghttp2_data_source *src,
                         void *arg) {
  (void)s, (void)id, (void)src, (void)arg;
  size_t n = sizeof BODY - 1;
  if (n > len)
    n = len;
  memcpy(buf, BODY, n);
  *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, \
                  NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE}

static int respond(nghttp2_session *s, int32_t id) {
  nghttp2_nv nv[] = {NV(":status", "200"), NV("server", "baseline"),
                     NV("content-type", "text/plain"),
                     NV("content-length", "13"), NV("date", "")};
  nv[4].value = (uint8_t *)date;
  nv[4].valuelen = strlen(date);
  nghttp2_data_provider dp = {.read_callback = body_read};
  return nghttp2_submit_response(s, id, nv, sizeof nv / sizeof nv[0], &dp);
}

/* A request is whole once its stream's input ended (END_STREAM on its
 * HEADERS or its last DATA). */
static int on_frame_recv(nghttp2_session *s, const nghttp2_frame *f,
                         void *arg) {
  (void)arg;
  if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
      (f->hd.flags & NGHTTP2_FLAG_END_STREAM))
    return respond(s, f->hd.stream_id);
  return 0;
}

static nghttp2_session_callbacks *callbacks;
static nghttp2_option *options;

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
  int want = c->out_len != 0;
  if (want == c->want_out)
    return 0;
  c->want_out = want;
  struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0),
                           .data.ptr = c};
  return epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Everything nghttp2 has to send, gathered. */
static int produce(conn_t *c) {
  const uint8_t *p;
  ssize_t n;
  while ((n = nghttp2_session_mem_send(c->s, &p)) > 0)
    if (out_append(c, p, (size_t)n) < 0)
      return -1;
  return n < 0 ? -1 : 0;
}

static void close_conn(conn_t *c) {
  close(c->fd);
  nghttp2_session_del(c->s);
  free(c->out);
  free(c);
}

static int on_readable(int ep, conn_t *c) {
  uint8_t in[16384];
  for (;;) {
    ssize_t n = read(c->fd, in, sizeof in);
    if (n == 0)
      return -1;
    if (n < 0)
      return errno == EAGAIN ? 0 : errno == EINTR ? on_readable(ep, c) : -1;
    refresh_date();
    if (nghttp2_session_mem_recv(c->s, in, (size_t)n) < 0 || produce(c) < 0)
      return -1;
    if (c->out_len && flush_out(ep, c) < 0)
      return -1;
    if (!nghttp2_session_want_read(c->s) && !nghttp2_session_want_write(c->s))
      return -1;
    if ((size_t)n < sizeof in)
      return 0;
  }
}

static conn_t *new_conn(int fd) {
  conn_t *c = calloc(1, sizeof *c);
  c->fd = fd;
  nghttp2_session_server_new2(&c->s, callbacks, c, options);
  nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 128}};
  nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, iv, 1);
  return c;
}

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 8080;
  signal(SIGPIPE, SIG_IGN);
  nghttp2_session_callbacks_new(&callbacks);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, on_frame_recv);
  nghttp2_option_new(&options);
  nghttp2_option_set_no_closed_streams(options, 1);
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(ls, 1024) < 0) {
    perror("h2_baseline: bind/listen");
    return 1;
  }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  fprintf(stderr, "h2_baseline listening on 127.0.0.1:%d\n", port);
  struct epoll_event evs[256];
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      conn_t *c = evs[i].data.ptr;
      if (c == NULL) {
        int fd;
        while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conn_t *nc = new_conn(fd);
          struct epoll_event cev = {.events = EPOLLIN, .data.ptr = nc};
          epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
          if (produce(nc) < 0 || flush_out(ep, nc) < 0)
            close_conn(nc);
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
