/*
 * echo_load.c -- the echo load generator: N connections, each keeping K
 * messages of S bytes in flight (K = 1 is ping-pong). A single thread with
 * one epoll set drives them all: every reply byte is checked against the
 * deterministic stream that was sent, and each complete message is
 * replaced by a new one at once. Latency is the time from a message's send
 * to the arrival of its last byte, kept in a log-linear histogram (1/64
 * resolution), for messages completed in the measured window only.
 *
 * With -p PID the server's user+system CPU time (/proc/PID/stat fields 14
 * and 15) is read at the start and the end of the measured window, giving
 * messages per server CPU-second.
 *
 * Usage: echo_load [-H host] -P port [-c conns=64] [-k inflight=1]
 *                  [-s size=64] [-w warmup_s=2] [-d duration_s=10] [-p pid]
 * Prints one line:
 *   RESULT msgs=N secs=T rate=R p50_us=A p99_us=B server_cpu_s=C per_cpu_s=D
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

typedef struct conn_s {
  int fd, index;
  uint64_t sent, recv_msg;     /* messages sent / fully received */
  size_t recv_off;             /* bytes of message recv_msg received */
  uint64_t *stamps;            /* send times, ring of K (FIFO like the stream) */
  char *out;                   /* bytes not yet taken by the socket */
  size_t out_len;
  bool blocked;                /* waiting for EPOLLOUT */
} conn_t;

static int K = 1, S = 64;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Byte k of message m on connection c: cheap, and differs between
 * neighbouring connections, messages and offsets. */
static inline unsigned char expected(const conn_t *c, uint64_t m, size_t k) {
  return (unsigned char)((uint64_t)c->index * 131u + m * 31u + k * 7u);
}

/* ---- latency histogram ------------------------------------------------------ */

#define SUB 64
static uint64_t hist[64 * SUB];
static uint64_t hist_n;

static int bucket(uint64_t v) {
  if (v < SUB)
    return (int)v;
  int msb = 63 - __builtin_clzll(v);
  int shift = msb - 6;                            /* keep 7 significant bits */
  return (shift + 1) * SUB + (int)((v >> shift) & (SUB - 1));
}

static uint64_t bucket_value(int b) {
  if (b < SUB)
    return (uint64_t)b;
  int shift = b / SUB - 1;
  return ((uint64_t)(SUB + b % SUB) << shift) + ((1ull << shift) >> 1);
}

static double percentile(double q) {
  uint64_t want = (uint64_t)ceil(q * (double)hist_n), seen = 0;
  for (int b = 0; b < 64 * SUB; b++)
    if ((seen += hist[b]) >= want && hist[b] > 0)
      return (double)bucket_value(b) / 1000.0;
  return 0;
}

/* ---- server CPU time -------------------------------------------------------- */

static double cpu_seconds(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');            /* the command may hold spaces */
  unsigned long long ut = 0, st = 0;
  if (p == NULL ||
      sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
             &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* ---- the load ---------------------------------------------------------------- */

static void die(const char *what) {
  perror(what);
  exit(1);
}

/* Queue `count` new messages on c and try to send everything queued. */
static void send_messages(int ep, conn_t *c, int count) {
  uint64_t t = now_ns();
  for (int i = 0; i < count; i++, c->sent++) {
    char *p = c->out + c->out_len;
    for (size_t k = 0; k < (size_t)S; k++)
      p[k] = (char)expected(c, c->sent, k);
    c->out_len += (size_t)S;
    c->stamps[c->sent % (uint64_t)K] = t;
  }
  ssize_t w = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL);
  if (w < 0 && errno != EAGAIN)
    die("echo_load: send");
  size_t done = w > 0 ? (size_t)w : 0;
  memmove(c->out, c->out + done, c->out_len - done);
  c->out_len -= done;
  bool blocked = c->out_len > 0;
  if (blocked != c->blocked) {           /* only on a change: no syscall per message */
    c->blocked = blocked;
    struct epoll_event e = {.events = EPOLLIN | (blocked ? EPOLLOUT : 0u),
                            .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
  }
}

/* Check what arrived; returns the messages it completed. */
static int consume(conn_t *c, const char *buf, size_t n, bool measure,
                   uint64_t t) {
  int completed = 0;
  for (size_t i = 0; i < n; i++) {
    if ((unsigned char)buf[i] != expected(c, c->recv_msg, c->recv_off)) {
      fprintf(stderr, "echo_load: connection %d, message %llu, byte %zu: "
              "wrong byte\n", c->index, (unsigned long long)c->recv_msg,
              c->recv_off);
      exit(1);
    }
    if (++c->recv_off == (size_t)S) {
      if (measure) {
        hist[bucket(t - c->stamps[c->recv_msg % (uint64_t)K])]++;
        hist_n++;
      }
      c->recv_off = 0;
      c->recv_msg++;
      completed++;
    }
  }
  return completed;
}

static int dial(const char *host, int port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    fprintf(stderr, "echo_load: bad IPv4 address %s\n", host);
    exit(2);
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
    die("echo_load: connect");
  int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

int main(int argc, char **argv) {
  const char *host = "127.0.0.1";
  int port = 0, n = 64, pid = 0;
  double warm = 2, dur = 10;
  for (int o; (o = getopt(argc, argv, "H:P:c:k:s:w:d:p:")) != -1;) {
    switch (o) {
    case 'H': host = optarg; break;
    case 'P': port = atoi(optarg); break;
    case 'c': n = atoi(optarg); break;
    case 'k': K = atoi(optarg); break;
    case 's': S = atoi(optarg); break;
    case 'w': warm = atof(optarg); break;
    case 'd': dur = atof(optarg); break;
    case 'p': pid = atoi(optarg); break;
    default:
      fprintf(stderr, "usage: echo_load [-H host] -P port [-c conns] [-k inflight] "
              "[-s size] [-w warmup_s] [-d duration_s] [-p server_pid]\n");
      return 2;
    }
  }
  if (port <= 0 || n <= 0 || K <= 0 || S <= 0 || dur <= 0) {
    fprintf(stderr, "echo_load: -P port is required; counts must be positive\n");
    return 2;
  }
  int ep = epoll_create1(EPOLL_CLOEXEC);
  conn_t *conns = calloc((size_t)n, sizeof *conns);
  for (int i = 0; i < n; i++) {
    conn_t *c = &conns[i];
    c->index = i;
    c->fd = dial(host, port);
    c->stamps = calloc((size_t)K, sizeof *c->stamps);
    c->out = malloc((size_t)K * (size_t)S * 2);
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &e);
  }
  for (int i = 0; i < n; i++)
    send_messages(ep, &conns[i], K);

  uint64_t t0 = now_ns(), start = t0 + (uint64_t)(warm * 1e9),
           end = start + (uint64_t)(dur * 1e9), msgs = 0;
  double cpu0 = 0;
  bool measuring = false;
  static char buf[1 << 16];
  struct epoll_event evs[256];
  for (;;) {
    uint64_t t = now_ns();
    if (!measuring && t >= start) {
      measuring = true;
      start = t;
      cpu0 = pid ? cpu_seconds(pid) : 0;
    }
    if (t >= end)
      break;
    int ne = epoll_wait(ep, evs, 256, 10);
    t = now_ns();
    for (int i = 0; i < ne; i++) {
      conn_t *c = evs[i].data.ptr;
      if ((evs[i].events & EPOLLOUT) && c->out_len > 0) {
        send_messages(ep, c, 0);
        continue;
      }
      ssize_t r = read(c->fd, buf, sizeof buf);
      if (r == 0) {
        fprintf(stderr, "echo_load: connection %d closed by the server\n", c->index);
        return 1;
      }
      if (r < 0) {
        if (errno == EAGAIN || errno == EINTR)
          continue;
        die("echo_load: read");
      }
      int done = consume(c, buf, (size_t)r, measuring, t);
      if (measuring)
        msgs += (uint64_t)done;
      if (done > 0)
        send_messages(ep, c, done);
    }
  }
  uint64_t t_end = now_ns();
  double cpu = pid ? cpu_seconds(pid) - cpu0 : 0;
  /* Say goodbye with FIN, not RST: half-close, then drain the replies still
   * in flight until each server side closes (bounded to 2 s). */
  int open = n;
  for (int i = 0; i < n; i++) {
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &conns[i]};
    epoll_ctl(ep, EPOLL_CTL_MOD, conns[i].fd, &e);
    shutdown(conns[i].fd, SHUT_WR);
  }
  for (uint64_t until = now_ns() + 2000000000ull; open > 0 && now_ns() < until;) {
    int ne = epoll_wait(ep, evs, 256, 10);
    for (int i = 0; i < ne; i++) {
      conn_t *c = evs[i].data.ptr;
      ssize_t r = read(c->fd, buf, sizeof buf);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        open--;
      }
    }
  }
  double secs = (double)(t_end - start) / 1e9;
  printf("RESULT msgs=%llu secs=%.3f rate=%.0f p50_us=%.1f p99_us=%.1f "
         "server_cpu_s=%.2f per_cpu_s=%.0f\n",
         (unsigned long long)msgs, secs, (double)msgs / secs, percentile(0.50),
         percentile(0.99), cpu, cpu > 0 ? (double)msgs / cpu : 0.0);
  return 0;
}
