/*
 * fuzz_nats.c -- libFuzzer target for the NATS protocol reader
 * (runtime/codec/nats.c).
 *
 * Config bytes 0..1: max_control_line (8..71) and max_message (1..256);
 * the rest is what a server sends, fed once whole and once in chunks
 * whose sizes come from a generator seeded by the input. Invariants:
 *  - both feeds yield the same operations and end the same way (the
 *    result never depends on how the input was split);
 *  - every message's headers and payload are within max_message, its
 *    header block within the message, and its slices within the input;
 *  - what the reader keeps never passes max_control_line + max_message
 *    + 2 bytes, and nothing is kept after an error;
 *  - the parser alone agrees: the operations are those nr_nats_parse
 *    finds walking the whole input, up to the same error.
 */
#include "codec/nats.h"
#include "common.h"

#define CHECK FUZZ_ASSERT

typedef struct out_s {
  char *bytes;                 /* each op: kind, sid, then 4 length+data */
  size_t len, cap;
  const uint8_t *lo, *hi;      /* the input slices must lie in (whole) */
} out_t;

static nr_nats_limits_t lim;

static void add_slice(out_t *o, nr_slice_t s) {
  uint64_t n = s.len;
  fuzz_append(&o->bytes, &o->len, &o->cap, &n, sizeof n);
  if (s.len > 0)
    fuzz_append(&o->bytes, &o->len, &o->cap, s.data, s.len);
}

static void add_op(out_t *o, const nr_nats_op_t *op) {
  CHECK(op->kind >= NR_NATS_MSG && op->kind <= NR_NATS_INFO);
  if (op->kind == NR_NATS_MSG || op->kind == NR_NATS_HMSG) {
    CHECK(op->hdr.len + op->data.len <= lim.max_message);
    CHECK(op->subject.len > 0 && op->subject.len < lim.max_control_line);
    CHECK(op->kind == NR_NATS_HMSG || op->hdr.len == 0);
    CHECK(op->data.data == op->hdr.data + op->hdr.len || op->data.len == 0 ||
          op->hdr.len == 0);
  }
  if (o->lo != NULL && op->data.len > 0)
    CHECK((const uint8_t *)op->data.data >= o->lo &&
          (const uint8_t *)op->data.data + op->data.len <= o->hi);
  int64_t head[2] = {op->kind, (int64_t)op->sid};
  fuzz_append(&o->bytes, &o->len, &o->cap, head, sizeof head);
  add_slice(o, op->subject);
  add_slice(o, op->reply);
  add_slice(o, op->hdr);
  add_slice(o, op->data);
}

static int on_op(void *ud, const nr_nats_op_t *op) {
  add_op(ud, op);
  return 0;
}

/* Feed the input in chunks (seed 0: whole); returns the end code. */
static int run(const uint8_t *data, size_t size, uint32_t seed, out_t *o) {
  nr_nats_reader_t r;
  nr_nats_reader_init(&r, &lim);
  size_t off = 0;
  int rc = 0;
  const char *why;
  while (off < size && rc == 0) {
    size_t n = fuzz_chunk(&seed, size - off);
    rc = nr_nats_reader_feed(&r, (const char *)data + off, n, on_op, o, &why);
    CHECK(rc <= 0);
    CHECK(rc == 0 || why != NULL);
    CHECK(nr_buf_len(&r.acc) <= lim.max_control_line + lim.max_message + 2);
    CHECK(rc == 0 || r.acc.data == NULL);
    off += n;
  }
  nr_nats_reader_reset(&r);
  return rc;
}

/* The operations nr_nats_parse finds on its own; returns the end code
 * (0: the input ended, complete or not). */
static int parse_alone(const uint8_t *data, size_t size, out_t *o) {
  size_t off = 0;
  while (off < size) {
    nr_nats_op_t op;
    size_t need;
    const char *why;
    long r = nr_nats_parse((const char *)data + off, size - off, &lim, &op,
                           &need, &why);
    if (r < 0) {
      CHECK(why != NULL);
      return (int)r;
    }
    if (r == 0) {
      CHECK(need == 0 || need > size - off);
      return 0;
    }
    CHECK((size_t)r <= size - off);
    add_op(o, &op);
    off += (size_t)r;
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  lim.max_control_line = 8 + (data[0] & 63);
  lim.max_message = 1 + (size_t)data[1];
  data += 2;
  size -= 2;
  out_t whole = {.lo = data, .hi = data + size}, split = {0}, alone = {0};
  int a = run(data, size, 0, &whole);
  int b = run(data, size, fuzz_seed(data, size), &split);
  int c = parse_alone(data, size, &alone);
  CHECK(a == b && a == c);
  CHECK(whole.len == split.len && whole.len == alone.len);
  CHECK(whole.len == 0 || memcmp(whole.bytes, split.bytes, whole.len) == 0);
  CHECK(whole.len == 0 || memcmp(whole.bytes, alone.bytes, whole.len) == 0);
  free(whole.bytes);
  free(split.bytes);
  free(alone.bytes);
  return 0;
}
