/*
 * ws_load.c -- WebSocket echo load generator for bench/run_ws.sh: CONNS
 * connections to ws://127.0.0.1:PORT/, each upgraded with a blocking
 * handshake, then ping-pong of one masked text message of SIZE bytes at a
 * time for DURATION seconds (one thread, epoll). Prints
 *   messages=N seconds=S rate=R p99_us=P
 * It does not link netrun, so it cannot flatter it.
 *   ws_load PORT [CONNS=64] [DURATION=10] [SIZE=64]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct conn_s {
  int fd;
  size_t got;                  /* bytes of the echo read so far */
  uint64_t sent_at;
} conn_t;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

/* Connect and upgrade, blocking; then non-blocking. */
static int open_conn(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
    die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  static const char req[] =
      "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
      "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
      "Sec-WebSocket-Version: 13\r\n\r\n";
  if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1))
    die("write");
  char buf[1024];
  size_t n = 0;
  while (n < 4 || memcmp(buf + n - 4, "\r\n\r\n", 4) != 0) {
    if (read(fd, buf + n, 1) != 1 || ++n == sizeof buf)
      die("handshake");
  }
  if (memcmp(buf, "HTTP/1.1 101", 12) != 0) {
    fprintf(stderr, "ws_load: the server answered %.40s\n", buf);
    exit(1);
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

static char frame[14 + 65536];
static size_t frame_len, echo_len;

static void make_frame(size_t size) {
  static const unsigned char key[4] = {0x12, 0x34, 0x56, 0x78};
  size_t h = 2;
  frame[0] = (char)0x81;
  if (size < 126) {
    frame[1] = (char)(0x80 | size);
  } else {
    frame[1] = (char)(0x80 | 126);
    frame[2] = (char)(size >> 8);
    frame[3] = (char)size;
    h = 4;
  }
  memcpy(frame + h, key, 4);
  for (size_t i = 0; i < size; i++)
    frame[h + 4 + i] = (char)('a' + i % 26) ^ (char)key[i % 4];
  frame_len = h + 4 + size;
  echo_len = (size < 126 ? 2 : 4) + size;
}

static void send_one(conn_t *c) {
  c->sent_at = now_ns();
  if (write(c->fd, frame, frame_len) != (ssize_t)frame_len)
    die("send");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: ws_load PORT [CONNS] [DURATION] [SIZE]\n");
    return 2;
  }
  int port = atoi(argv[1]);
  int nconns = argc > 2 ? atoi(argv[2]) : 64;
  double dur = argc > 3 ? atof(argv[3]) : 10;
  size_t size = argc > 4 ? (size_t)atol(argv[4]) : 64;
  if (size > 65535)
    size = 65535;
  make_frame(size);
  int ep = epoll_create1(0);
  conn_t *conns = calloc((size_t)nconns, sizeof *conns);
  for (int i = 0; i < nconns; i++) {
    conns[i].fd = open_conn(port);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &conns[i]};
    epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &ev);
  }
  static uint64_t hist[100001];          /* latency in µs, last bucket: more */
  uint64_t msgs = 0, start = now_ns(), end = start + (uint64_t)(dur * 1e9);
  for (int i = 0; i < nconns; i++)
    send_one(&conns[i]);
  struct epoll_event evs[256];
  char buf[65536 + 16];
  while (now_ns() < end) {
    int n = epoll_wait(ep, evs, 256, 100);
    for (int i = 0; i < n; i++) {
      conn_t *c = evs[i].data.ptr;
      ssize_t r = read(c->fd, buf, sizeof buf);
      if (r <= 0) {
        if (r < 0 && errno == EAGAIN)
          continue;
        fprintf(stderr, "ws_load: the server closed a connection\n");
        return 1;
      }
      c->got += (size_t)r;
      while (c->got >= echo_len) {       /* one message in flight: whole */
        c->got -= echo_len;
        uint64_t us = (now_ns() - c->sent_at) / 1000;
        hist[us > 100000 ? 100000 : us]++;
        msgs++;
        send_one(c);
      }
    }
  }
  double secs = (double)(now_ns() - start) / 1e9;
  uint64_t seen = 0, p99 = 0;
  for (uint64_t us = 0; us <= 100000; us++) {
    seen += hist[us];
    if (seen * 100 >= msgs * 99) {
      p99 = us;
      break;
    }
  }
  printf("messages=%llu seconds=%.3f rate=%.0f p99_us=%llu\n",
         (unsigned long long)msgs, secs, (double)msgs / secs,
         (unsigned long long)p99);
  return 0;
}
