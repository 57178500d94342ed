/*
 * fuzz_http.c -- libFuzzer target for the HTTP/1.1 request parser
 * (runtime/codec/http_parse.c). The input is fed in pieces whose sizes come from
 * its first byte, once whole, and in those pieces again with the parser
 * paused after every request (NR_HTTP_PAUSE) and resumed by empty feeds:
 * every run must deliver the same requests (a digest of every field) and
 * end the same way, whatever the split.
 * Every request is checked for the invariants the handler relies on (its
 * bytes readable, lengths within limits).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iruntime \
 *     fuzz/fuzz_http.c runtime/codec/http_parse.c runtime/codec/buf.c
 *     (the parser needs nothing else; scripts/fuzz.sh links them all)
 *   ./fuzz_http fuzz/corpus/http
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http.h"
#include "common.h"

#define MAX_HEADER 2048
#define MAX_BODY 4096

static void check(int ok) {
  if (!ok)
    abort();
}

typedef struct run_s {
  size_t count;
  uint64_t digest;
  int pause;                   /* answer each request with NR_HTTP_PAUSE */
  int paused;                  /* it did, in the last feed */
} run_t;

static void mix(run_t *r, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    r->digest = (r->digest ^ (unsigned char)p[i]) * 1099511628211ull;
  r->digest = (r->digest ^ n) * 1099511628211ull;
}

static int on_request(void *arg, int ev, nr_http_request_t *r) {
  run_t *run = arg;
  check(r->type == NR_MSG_HTTP_REQUEST);
  check(r->method_len > 0 && r->path_len > 0);
  check(r->minor == 0 || r->minor == 1);
  check(r->nheaders + r->ntrailers <= NR_HTTP_DEFAULT_MAX_HEADERS);
  check(r->trailers == r->headers + r->nheaders);
  check(r->target_len > 0 && r->target_len <= MAX_HEADER);
  check(r->path_len <= r->target_len || r->rewritten);
  volatile char sink = 0;
  for (size_t j = 0; j < r->target_len; j++)
    sink ^= r->target[j];
  for (size_t j = 0; j < r->path_len; j++)
    sink ^= r->path[j];
  for (size_t i = 0; i < r->nheaders + r->ntrailers; i++) {   /* touch every
                                                               byte: ASan */
    const nr_http_header_t *h = &r->headers[i];
    check(h->name_len > 0);
    for (size_t j = 0; j < h->name_len; j++)
      sink ^= h->name[j];
    for (size_t j = 0; j < h->value_len; j++)
      sink ^= h->value[j];
  }
  if (ev == NR_HTTP_EV_REQUEST) {
    check(r->body != NULL && r->body_len <= MAX_BODY);
    run->count++;
    mix(run, r->method, r->method_len);
    mix(run, r->path, r->path_len);
    mix(run, r->target, r->target_len);
    mix(run, r->query ? r->query : "-", r->query ? r->query_len : 1);
    mix(run, r->body, r->body_len);
    for (size_t i = 0; i < r->nheaders + r->ntrailers; i++) {
      mix(run, i < r->nheaders ? "h" : "t", 1);
      mix(run, r->headers[i].name, r->headers[i].name_len);
      mix(run, r->headers[i].value, r->headers[i].value_len);
    }
    char flags[2] = {(char)(r->keep_alive | r->chunked << 1 | r->head << 2),
                     (char)r->minor};
    mix(run, flags, 2);
    if (run->pause) {
      run->paused = 1;
      return NR_HTTP_PAUSE;
    }
  }
  (void)sink;
  return 0;
}

static int feed_all(const uint8_t *data, size_t size, size_t step,
                    run_t *run) {
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, MAX_BODY, NR_HTTP_DEFAULT_MAX_HEADERS);
  size_t off = 0;
  int rc = 0;
  while (off < size && rc == 0) {
    size_t k = step < size - off ? step : size - off;
    /* feed from a copy of exactly k bytes so ASan sees any overread */
    char *piece = malloc(k);
    check(piece != NULL);
    memcpy(piece, data + off, k);
    run->paused = 0;
    rc = nr_http_feed(&p, piece, k, on_request, run);
    free(piece);
    while (rc == 0 && run->paused) {        /* resume what it held */
      run->paused = 0;
      rc = nr_http_feed(&p, NULL, 0, on_request, run);
    }
    off += k;
    check(nr_buf_len(&p.in) <= MAX_HEADER + 2 * MAX_BODY + 65536 + step);
  }
  check(rc == 0 || rc == 400 || rc == 413 || rc == 431 || rc == 501 ||
        rc == 505);
  if (rc == 0)                 /* an unfinished request: its length */
    mix(run, "", nr_buf_len(&p.in) > 0);
  nr_http_parser_free(&p);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  size_t step = (size_t)data[0] % 64 + 1;   /* 1..64 bytes per feed */
  run_t whole = {0, 14695981039346656037ull, 0, 0}, split = whole, paused = whole;
  paused.pause = 1;
  int a = feed_all(data + 1, size - 1, size, &whole);
  int b = feed_all(data + 1, size - 1, step, &split);
  int c = feed_all(data + 1, size - 1, step, &paused);
  check(a == b && a == c);
  check(whole.count == split.count && whole.count == paused.count);
  check(whole.digest == split.digest && whole.digest == paused.digest);
  return 0;
}
