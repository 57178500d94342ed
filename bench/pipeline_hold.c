/*
 * pipeline_hold.c -- N connections to 127.0.0.1:PORT that pipeline GET
 * requests and never read an answer: each sends as fast as its socket
 * takes them, for SECONDS, then holds its connection (still sending when
 * the socket takes more) until stdin closes. Prints "sending N" once all
 * are connected, then "sent B bytes" at the end of the SECONDS. Used to
 * measure what a server holds for a client that does not read
 * (bench/pipeline_rss.sh). Bounded: N connections, SECONDS of sending,
 * and it exits when stdin closes.
 *
 * Usage: pipeline_hold PORT N SECONDS
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: pipeline_hold PORT N SECONDS\n");
    return 2;
  }
  int port = atoi(argv[1]), n = atoi(argv[2]);
  double secs = atof(argv[3]);
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  static const char one[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  static char batch[16384];
  size_t len = 0;
  while (len + sizeof one - 1 <= sizeof batch) {
    memcpy(batch + len, one, sizeof one - 1);
    len += sizeof one - 1;
  }
  struct pollfd *pf = calloc((size_t)n + 1, sizeof *pf);
  size_t *off = calloc((size_t)n, sizeof *off);
  if (pf == NULL || off == NULL)
    return 1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < n; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
      perror("pipeline_hold: connect");
      return 1;
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    pf[i] = (struct pollfd){.fd = fd, .events = POLLOUT};
  }
  pf[n] = (struct pollfd){.fd = 0, .events = POLLIN};
  printf("sending %d\n", n);
  fflush(stdout);
  unsigned long long sent = 0;
  double end = now() + secs;
  bool reported = false;
  for (;;) {
    double left = end - now();
    if (left <= 0 && !reported) {
      printf("sent %llu bytes\n", sent);
      fflush(stdout);
      reported = true;
    }
    if (poll(pf, (nfds_t)n + 1, reported ? -1 : (int)(left * 1000) + 1) < 0 &&
        errno != EINTR)
      return 1;
    if (pf[n].revents) {
      char b[64];
      if (read(0, b, sizeof b) <= 0)
        return 0;
    }
    for (int i = 0; i < n; i++) {
      if (!(pf[i].revents & POLLOUT))
        continue;
      for (int k = 0; k < 64; k++) {          /* bounded per wakeup */
        ssize_t w = send(pf[i].fd, batch + off[i], len - off[i], MSG_NOSIGNAL);
        if (w <= 0) {
          if (w < 0 && errno != EAGAIN)
            pf[i].fd = -1;                    /* the server closed it */
          break;
        }
        sent += (unsigned long long)w;
        off[i] = (off[i] + (size_t)w) % len;
      }
    }
  }
}
