/*
 * accept_load.c -- the accept load generator: C connections at a time,
 * each one connect, one byte sent, its echo read, then a close with RST
 * (SO_LINGER 0: no TIME_WAIT, so the ephemeral ports never run out), and
 * at once a new connection in its place. A single thread with one epoll
 * set drives them all. Counts the connections completed in the measured
 * window.
 *
 * With -p PID the server's user+system CPU time (/proc/PID/stat fields 14
 * and 15) is read at the start and the end of the measured window, giving
 * connections per server CPU-second.
 *
 * Usage: accept_load [-H host] -P port [-c conns=64] [-w warmup_s=1]
 *                    [-d duration_s=5] [-p pid]
 * Prints one line:
 *   RESULT conns=N secs=T rate=R server_cpu_s=C per_cpu_s=D errors=E
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static struct sockaddr_in addr;
static int ep;
static uint64_t done, errors;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double server_cpu(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');        /* the name may hold spaces */
  unsigned long ut = 0, st = 0;
  if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u "
                                 "%*u %lu %lu", &ut, &st) != 2)
    return 0;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* A new connection in flight: connecting, then waiting for its echo. */
static void start_one(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    perror("socket");
    exit(1);
  }
  struct linger lg = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0 &&
      errno != EINPROGRESS) {
    perror("connect");
    exit(1);
  }
  struct epoll_event ev = {.events = EPOLLOUT, .data.fd = fd};
  epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

static void on_event(int fd, uint32_t events) {
  char c = 'x';
  if (events & EPOLLOUT) {               /* connected (or failed) */
    if (!(events & (EPOLLERR | EPOLLHUP)) && write(fd, &c, 1) == 1) {
      struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
      epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
      return;
    }
    errors++;
  } else if (read(fd, &c, 1) == 1) {
    done++;
  } else {
    errors++;
  }
  close(fd);                              /* RST: SO_LINGER 0 */
  start_one();
}

int main(int argc, char **argv) {
  const char *host = "127.0.0.1";
  int port = 0, conns = 64, pid = 0;
  double warmup = 1, duration = 5;
  for (int o; (o = getopt(argc, argv, "H:P:c:w:d:p:")) != -1;) {
    switch (o) {
    case 'H': host = optarg; break;
    case 'P': port = atoi(optarg); break;
    case 'c': conns = atoi(optarg); break;
    case 'w': warmup = atof(optarg); break;
    case 'd': duration = atof(optarg); break;
    case 'p': pid = atoi(optarg); break;
    default:
      fprintf(stderr, "usage: accept_load [-H host] -P port [-c conns] "
                      "[-w warmup] [-d duration] [-p pid]\n");
      return 2;
    }
  }
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)port);
  if (port <= 0 || inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
    fprintf(stderr, "accept_load: need -P port and a numeric IPv4 -H\n");
    return 2;
  }
  ep = epoll_create1(0);
  for (int i = 0; i < conns; i++)
    start_one();
  double t0 = now(), start = t0 + warmup, end = start + duration;
  double cpu0 = 0;
  uint64_t done0 = 0;
  bool measuring = false;
  struct epoll_event evs[256];
  for (double t = t0; t < end; t = now()) {
    if (!measuring && t >= start) {
      measuring = true;
      done0 = done;
      cpu0 = pid ? server_cpu(pid) : 0;
    }
    int n = epoll_wait(ep, evs, 256, 100);
    for (int i = 0; i < n; i++)
      on_event(evs[i].data.fd, evs[i].events);
  }
  double cpu = pid ? server_cpu(pid) - cpu0 : 0;
  uint64_t count = done - done0;
  printf("RESULT conns=%llu secs=%.3f rate=%.0f server_cpu_s=%.3f "
         "per_cpu_s=%.0f errors=%llu\n", (unsigned long long)count, duration,
         (double)count / duration, cpu, cpu > 0 ? (double)count / cpu : 0,
         (unsigned long long)errors);
  return 0;
}
