/*
 * fuzz_resp.c -- libFuzzer target for the RESP request decoder
 * (runtime/codec/resp.c), in a real pipeline on an embedded channel.
 *
 * Config bytes 0..2: max_bulk (1..64), max_args (1..16), max_inline
 * (1..64); the rest is the request stream, fed once whole and once in
 * chunks whose sizes come from a generator seeded by the input.
 * Invariants:
 *  - both runs yield the same requests, the same error replies and the same
 *    number of errors (the result never depends on how input was split);
 *  - every request has 1..max_args arguments, each within max_bulk (or
 *    max_inline for an inline request);
 *  - the parser alone agrees: the requests are exactly those that
 *    nr_resp_parse finds walking the whole input.
 */
#include "codec/resp.h"
#include "common.h"

#define CHECK FUZZ_ASSERT

typedef struct out_s {
  char *bytes;                 /* requests: argc, then each arg as len+data */
  size_t len, cap;
  char *replies;               /* what the decoder wrote (error replies) */
  size_t rlen, rcap;
  int errors;
} out_t;

static nr_resp_limits_t lim;

static void add_cmd(out_t *o, const nr_slice_t *v, size_t argc) {
  uint64_t n = argc;
  fuzz_append(&o->bytes, &o->len, &o->cap, &n, sizeof n);
  for (size_t i = 0; i < argc; i++) {
    n = v[i].len;
    fuzz_append(&o->bytes, &o->len, &o->cap, &n, sizeof n);
    fuzz_append(&o->bytes, &o->len, &o->cap, v[i].data, v[i].len);
  }
}

static void on_inbound(void *ud, void *msg) {
  CHECK(nr_msg_type(msg) == NR_MSG_RESP);
  const nr_resp_cmd_t *c = msg;
  CHECK(c->argc >= 1 && c->argc <= lim.max_args);
  /* Bulk arguments are bounded by max_bulk, inline ones by max_inline. */
  size_t max = lim.max_bulk > lim.max_inline ? lim.max_bulk : lim.max_inline;
  for (size_t i = 0; i < c->argc; i++)
    CHECK(c->argv[i].len <= max);
  add_cmd(ud, c->argv, c->argc);
}

static void on_outbound(void *ud, void *msg) {
  out_t *o = ud;
  CHECK(nr_msg_type(msg) == NR_MSG_BYTES);
  const nr_bytes_t *b = msg;
  CHECK(b->len > 22 && memcmp(b->data, "-ERR Protocol error: ", 21) == 0);
  fuzz_append(&o->replies, &o->rlen, &o->rcap, b->data, b->len);
}

static void on_exception(void *ud, const nr_err_t *err) {
  out_t *o = ud;
  CHECK(err->code != 0 && err->msg != NULL);
  o->errors++;
}

static void run(const uint8_t *data, size_t size, uint32_t seed, out_t *o) {
  nr_embedded_sink_t sink = {on_inbound, on_outbound, on_exception, o};
  nr_embedded_t *e = nr_embedded_new(fuzz_loop(), &sink);
  CHECK(e != NULL);
  nr_pipeline_t *p = nr_channel_pipeline(nr_embedded_channel(e));
  CHECK(nr_pipeline_add_last(p, "resp", &nr_resp_handler, nr_resp_new(&lim)) == 0);
  nr_embedded_start(e);
  size_t off = 0;
  while (off < size) {
    size_t n = fuzz_chunk(&seed, size - off);
    nr_bytes_t b = NR_BYTES((const char *)data + off, n);
    nr_embedded_write_inbound(e, &b, true);
    off += n;
  }
  nr_embedded_free(e);
}

/* The requests nr_resp_parse finds on its own, up to the first error. */
static void parse_alone(const uint8_t *data, size_t size, out_t *o) {
  nr_slice_t v[16];
  size_t off = 0, argc;
  const char *why;
  while (off < size) {
    long r = nr_resp_parse((const char *)data + off, size - off, &lim, v, 16,
                           &argc, &why);
    if (r < 0) {
      CHECK(why != NULL);
      o->errors++;
    }
    if (r <= 0)
      break;
    CHECK((size_t)r <= size - off);
    CHECK(argc <= lim.max_args);
    if (argc > 0)
      add_cmd(o, v, argc);
    off += (size_t)r;
  }
}

static void same(const out_t *a, const out_t *b) {
  CHECK(a->len == b->len);
  CHECK(a->len == 0 || memcmp(a->bytes, b->bytes, a->len) == 0);
  CHECK(a->errors == b->errors);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3)
    return 0;
  lim.max_bulk = 1 + (data[0] & 63);
  lim.max_args = 1 + (data[1] & 15);
  lim.max_inline = 1 + (data[2] & 63);
  data += 3;
  size -= 3;
  out_t whole = {0}, split = {0}, alone = {0};
  run(data, size, 0, &whole);
  run(data, size, fuzz_seed(data, size), &split);
  parse_alone(data, size, &alone);
  same(&whole, &split);
  same(&whole, &alone);
  CHECK(whole.rlen == split.rlen);
  CHECK(whole.rlen == 0 || memcmp(whole.replies, split.replies, whole.rlen) == 0);
  free(whole.bytes);
  free(split.bytes);
  free(alone.bytes);
  free(whole.replies);
  free(split.replies);
  return 0;
}
