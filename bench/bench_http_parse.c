/*
 * bench_http_parse.c -- the HTTP/1.1 request parser alone (nr_http_feed),
 * for instruction counts (bench/instr_parse.sh runs it under callgrind):
 * batches of 16 pipelined requests fed in one call each, as wrk's
 * pipelining script sends them. Two requests: "wrk", the GET wrk sends
 * (41 bytes, the one of bench/instr.sh), and "browser", a browser-like GET
 * (568 bytes, 13 header lines). Single-threaded; no sockets.
 *
 * Usage: bench_http_parse wrk|browser [batches, default 2000]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http.h"

static const char wrk_req[] =
    "GET / HTTP/1.1\r\nHost: 127.0.0.1:23456\r\n\r\n";
static const char browser_req[] =
    "GET /articles/2026/11/netrun-pipelining?utm_source=feed&page=2 HTTP/1.1\r\n"
    "Host: www.example.com\r\n"
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:132.0) Gecko/20100101 "
    "Firefox/132.0\r\n"
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
    "Accept-Language: en-US,en;q=0.5\r\n"
    "Accept-Encoding: gzip, deflate, br, zstd\r\n"
    "Referer: https://www.example.com/articles/2026/11/\r\n"
    "Connection: keep-alive\r\n"
    "Cookie: session=4f2a9c1e7b3d8a6f0e5c2b9d1a7f3e8c; theme=dark\r\n"
    "Upgrade-Insecure-Requests: 1\r\n"
    "Sec-Fetch-Dest: document\r\n"
    "Sec-Fetch-Mode: navigate\r\n"
    "Priority: u=0, i\r\n"
    "\r\n";

#define PIPELINED 16

static size_t requests;

static int on_request(void *arg, int ev, nr_http_request_t *r) {
  (void)arg;
  (void)r;
  requests += ev == NR_HTTP_EV_REQUEST;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2 ||
      (strcmp(argv[1], "wrk") != 0 && strcmp(argv[1], "browser") != 0)) {
    fprintf(stderr, "usage: bench_http_parse wrk|browser [batches]\n");
    return 2;
  }
  const char *one = strcmp(argv[1], "wrk") == 0 ? wrk_req : browser_req;
  size_t batches = argc > 2 ? strtoul(argv[2], NULL, 10) : 2000;
  size_t len = strlen(one);
  char *batch = malloc(PIPELINED * len);
  if (batch == NULL)
    return 1;
  for (int i = 0; i < PIPELINED; i++)
    memcpy(batch + i * len, one, len);
  nr_http_parser_t p;
  nr_http_parser_init(&p, 8192, 1 << 20, NR_HTTP_DEFAULT_MAX_HEADERS);
  for (size_t k = 0; k < batches; k++)
    if (nr_http_feed(&p, batch, PIPELINED * len, on_request, NULL) != 0) {
      fprintf(stderr, "bench_http_parse: the parser refused the batch\n");
      return 1;
    }
  nr_http_parser_free(&p);
  free(batch);
  printf("%zu requests of %zu bytes\n", requests, len);
  return requests == batches * PIPELINED ? 0 : 1;
}
