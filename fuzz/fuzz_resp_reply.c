/*
 * fuzz_resp_reply.c -- libFuzzer target for the RESP reply scanner and
 * tokenizer (runtime/codec/resp_reply.c), what netrun.redis reads from a
 * server it cannot trust.
 *
 * Config bytes 0..2: max_reply (16..4096), max_depth (1..8), max_line
 * (1..64); the rest is the byte stream a server sent. It is scanned once
 * whole and once grown in chunks whose sizes come from a generator seeded
 * by the input, one scan state carried between calls. Invariants:
 *  - both scans find the same replies (lengths) and end the same way (an
 *    error with the same reason, or needing more bytes): the result never
 *    depends on how the bytes were split;
 *  - a chunked scan that needs more never stands past the bytes it saw;
 *  - every reply found walks as whole tokens to exactly its end, with no
 *    aggregate nested deeper than max_depth and no reply over max_reply;
 *  - the key slot of any input is below 16384.
 */
#include "codec/resp_reply.h"
#include "common.h"

#define CHECK FUZZ_ASSERT

static nr_resp_reply_limits_t lim;

/* Walk one reply's tokens: depth bounded, ends exactly at n. */
static size_t walk(const char *p, size_t n, size_t off, unsigned depth) {
  CHECK(depth <= lim.max_depth);
  for (;;) {
    nr_resp_token_t t;
    size_t len = nr_resp_reply_token(p + off, n - off, &t);
    CHECK(len > 0 && len <= n - off);
    off += len;
    if (!strchr("*~>%|", t.type) || t.null) {
      return off;
    }
    for (int64_t i = 0; i < t.n; i++)
      off = walk(p, n, off, depth + 1);
    if (t.type != '|')
      return off;                          /* an attribute: its value next */
  }
}

typedef struct result_s {
  long lens[4096];
  size_t n;
  long end;                                /* 0: needs more; < 0: error */
  const char *why;
} result_t;

static void scan_all(const char *p, size_t size, uint32_t seed, result_t *r) {
  nr_resp_scan_t st = NR_RESP_SCAN_INIT;
  size_t start = 0, have = 0;
  r->n = 0;
  r->why = NULL;
  for (;;) {
    if (have < size)
      have += fuzz_chunk(&seed, size - have);
    long k = nr_resp_reply_scan(&st, p + start, have - start, &lim, &r->why);
    if (k < 0) {
      r->end = k;
      return;
    }
    if (k == 0) {
      CHECK(st.off <= have - start);
      if (have < size)
        continue;
      r->end = 0;
      return;
    }
    CHECK((size_t)k <= lim.max_reply && (size_t)k <= have - start);
    CHECK(walk(p + start, (size_t)k, 0, 0) == (size_t)k);
    if (r->n < sizeof r->lens / sizeof *r->lens)
      r->lens[r->n++] = k;
    start += (size_t)k;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3)
    return 0;
  lim.max_reply = 16 + (size_t)data[0] * 16;
  lim.max_depth = 1 + data[1] % 8;
  lim.max_line = 1 + data[2] % 64;
  const char *p = (const char *)data + 3;
  size -= 3;
  static result_t whole, split;
  scan_all(p, size, 0, &whole);
  scan_all(p, size, fuzz_seed(data, size + 3), &split);
  CHECK(whole.n == split.n);
  CHECK(memcmp(whole.lens, split.lens, whole.n * sizeof *whole.lens) == 0);
  CHECK(whole.end == split.end);
  if (whole.end < 0)
    CHECK(strcmp(whole.why, split.why) == 0);
  CHECK(nr_resp_key_slot(p, size) < 16384);
  return 0;
}
