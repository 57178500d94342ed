/*
 * conn_hold.c -- opens N TCP connections to 127.0.0.1:PORT and holds them
 * idle until stdin closes; prints "held N" once all are connected. Used to
 * measure a server's memory per idle connection.
 *
 * Usage: conn_hold PORT N
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: conn_hold PORT N\n");
    return 2;
  }
  int port = atoi(argv[1]), n = atoi(argv[2]);
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < n; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
      perror("conn_hold: connect");
      return 1;
    }
  }
  printf("held %d\n", n);
  fflush(stdout);
  char buf[64];
  while (read(0, buf, sizeof buf) > 0)
    ;
  return 0;
}
