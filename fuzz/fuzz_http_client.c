/*
 * fuzz_http_client.c -- libFuzzer target for the HTTP/1.1 response parser
 * (runtime/codec/http_client.c). The input's first byte chooses the feed
 * size and which of the expected responses answer HEAD; the rest is fed
 * once whole and once in pieces, then the input is ended: both runs must
 * deliver the same responses (a digest of every field) and end the same
 * way. Every response is checked for the invariants the handler relies on
 * (its bytes readable, lengths within limits).
 *
 *   bash scripts/fuzz.sh   (links the runtime sources)
 *   ./fuzz_http_client fuzz/corpus/http_client
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http_client.h"

#define MAX_HEADER 2048
#define MAX_BODY 4096

static void check(int ok) {
  if (!ok)
    abort();
}

typedef struct run_s {
  size_t count;
  uint64_t digest;
} run_t;

static void mix(run_t *r, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    r->digest = (r->digest ^ (unsigned char)p[i]) * 1099511628211ull;
  r->digest = (r->digest ^ n) * 1099511628211ull;
}

static int on_reply(void *arg, nr_http_reply_t *r) {
  run_t *run = arg;
  check(r->type == NR_MSG_HTTP_REPLY);
  check(r->status >= 100 && r->status <= 999);
  check(r->status >= 200 || r->status == 101);
  check(r->nheaders + r->ntrailers <= NR_HTTP_DEFAULT_MAX_HEADERS);
  check(r->trailers == r->headers + r->nheaders);
  check(r->body != NULL && r->body_len <= MAX_BODY);
  run->count++;
  char st[3] = {(char)(r->status >> 8), (char)r->status,
                (char)(r->keep_alive | r->chunked << 1 | r->minor << 2)};
  mix(run, st, 3);
  mix(run, r->reason, r->reason_len);
  mix(run, r->body, r->body_len);
  for (size_t i = 0; i < r->nheaders + r->ntrailers; i++) {   /* ASan */
    check(r->headers[i].name_len > 0);
    mix(run, r->headers[i].name, r->headers[i].name_len);
    mix(run, r->headers[i].value, r->headers[i].value_len);
  }
  return 0;
}

static int feed_all(const uint8_t *data, size_t size, size_t step,
                    unsigned heads, run_t *run) {
  nr_http_client_parser_t p;
  nr_http_client_parser_init(&p, MAX_HEADER, MAX_BODY,
                             NR_HTTP_DEFAULT_MAX_HEADERS);
  for (unsigned i = 0; i < 8; i++)
    check(nr_http_client_expect(&p, heads >> i & 1 ? NR_HTTPC_HEAD : 0) == 0);
  size_t off = 0;
  int rc = 0;
  while (off < size && rc == 0) {
    size_t k = step < size - off ? step : size - off;
    char *piece = malloc(k);   /* exactly k bytes, so ASan sees overreads */
    check(piece != NULL);
    memcpy(piece, data + off, k);
    rc = nr_http_client_feed(&p, piece, k, on_reply, run);
    free(piece);
    off += k;
    check(nr_buf_len(&p.base.in) <= MAX_HEADER + 2 * MAX_BODY + 65536 + step);
  }
  if (rc == 0)
    rc = nr_http_client_end(&p, on_reply, run);
  check(rc >= 0 && rc <= NR_HTTPC_NOMEM);
  nr_http_client_parser_free(&p);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  size_t step = (size_t)data[0] % 64 + 1;   /* 1..64 bytes per feed */
  unsigned heads = data[1];
  run_t whole = {0, 14695981039346656037ull}, split = whole;
  int a = feed_all(data + 2, size - 2, size, heads, &whole);
  int b = feed_all(data + 2, size - 2, step, heads, &split);
  check(a == b);
  check(whole.count == split.count && whole.digest == split.digest);
  return 0;
}
