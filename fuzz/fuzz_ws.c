/*
 * fuzz_ws.c -- libFuzzer target for the WebSocket codec (runtime/codec/
 * ws.c), in a real pipeline on an embedded channel.
 *
 * Config byte 0: role (bit 0: client, whose input starts with the
 * server's handshake answer), max_message (bits 1-4: 1..16 x 16 bytes),
 * max_frame (bits 5-6: 8..32 bytes, or max_message when 0),
 * permessage-deflate (bit 7: agreed on a server with window bits 15; a
 * client offers it, and the answer in the input may agree it); the rest is
 * the byte stream from the peer, fed once whole and once in chunks whose
 * sizes come from a generator seeded by the input. Invariants:
 *  - both runs deliver the same messages and write the same frames back
 *    (pongs, closes): nothing depends on how the input was split;
 *  - every message is within max_message, inflated ones too (a zip
 *    bomb is refused at the limit); every text message is UTF-8,
 *    and the checker agrees with itself when fed the message in two parts;
 *  - a server alone agrees: the messages are those nr_ws_decode finds
 *    walking the whole input.
 */
#include "codec/codec.h"
#include "codec/ws.h"
#include "common.h"

#define CHECK FUZZ_ASSERT

typedef struct out_s {
  char *bytes;                 /* messages: opcode, length, data */
  size_t len, cap;
  char *wrote;                 /* what the codec wrote to the peer */
  size_t wlen, wcap;
} out_t;

static nr_ws_opts_t opts;

static void add_msg(out_t *o, int op, const char *d, size_t n) {
  CHECK(n <= opts.max_message);
  if (op == NR_WS_TEXT) {
    CHECK(nr_utf8_check(0, d, n) == 0);
    size_t half = n / 2;
    CHECK(nr_utf8_check(nr_utf8_check(0, d, half), d + half, n - half) == 0);
  }
  uint64_t h[2] = {(uint64_t)op, n};
  fuzz_append(&o->bytes, &o->len, &o->cap, h, sizeof h);
  fuzz_append(&o->bytes, &o->len, &o->cap, d, n);
}

static void on_inbound(void *ud, void *msg) {
  CHECK(nr_msg_type(msg) == NR_MSG_WEBSOCKET);
  const nr_ws_msg_t *m = msg;
  CHECK(m->opcode == NR_WS_TEXT || m->opcode == NR_WS_BINARY);
  add_msg(ud, m->opcode, m->data, m->len);
}

static void on_outbound(void *ud, void *msg) {
  out_t *o = ud;
  if (nr_msg_type(msg) == NR_MSG_BYTES) {
    const nr_bytes_t *b = msg;
    fuzz_append(&o->wrote, &o->wlen, &o->wcap, b->data, b->len);
    return;
  }
  CHECK(nr_msg_type(msg) == NR_MSG_SLICES);
  const nr_slices_t *s = msg;
  for (size_t i = 0; i < s->n; i++)
    fuzz_append(&o->wrote, &o->wlen, &o->wcap, s->v[i].data, s->v[i].len);
}

static void on_exception(void *ud, const nr_err_t *err) {
  (void)ud;
  CHECK(err->code != 0 && err->msg != NULL);
}

static void run(const uint8_t *data, size_t size, uint32_t seed, out_t *o) {
  nr_embedded_sink_t sink = {on_inbound, on_outbound, on_exception, o};
  nr_embedded_t *e = nr_embedded_new(fuzz_loop(), &sink);
  CHECK(e != NULL);
  nr_pipeline_t *p = nr_channel_pipeline(nr_embedded_channel(e));
  void *st = nr_ws_new(&opts);
  CHECK(st != NULL);
  CHECK(nr_pipeline_add_last(p, "ws", &nr_ws_handler, st) == 0);
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

/* The messages nr_ws_decode finds on its own (a server), up to a close or
 * an error. */
static void decode_alone(const uint8_t *data, size_t size, out_t *o) {
  nr_ws_parser_t p;
  nr_ws_parser_init(&p, true, opts.max_message, opts.max_frame);
  if (opts.deflate.bits != 0)
    nr_ws_parser_deflate(&p, false);
  size_t off = 0;
  while (off < size && !p.closed) {
    nr_ws_event_t ev;
    long r = nr_ws_decode(&p, (const char *)data + off, size - off, &ev);
    if (r < 0)
      CHECK(ev.why != NULL && ev.code >= 1000);
    if (r <= 0)
      break;
    CHECK((size_t)r <= size - off);
    if (ev.opcode == NR_WS_TEXT || ev.opcode == NR_WS_BINARY)
      add_msg(o, ev.opcode, ev.data, ev.len);
    off += (size_t)r;
  }
  nr_ws_parser_free(&p);
}

static void same(const char *a, size_t al, const char *b, size_t bl) {
  CHECK(al == bl);
  CHECK(al == 0 || memcmp(a, b, al) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  opts = (nr_ws_opts_t){0};
  opts.client = data[0] & 1;
  opts.max_message = 16 * (1 + ((data[0] >> 1) & 15));
  unsigned mf = (data[0] >> 5) & 3;
  opts.max_frame = mf ? 8u * mf + 8 : opts.max_message;
  if (data[0] & 0x80) {
    opts.deflate_offered = opts.client;
    opts.deflate = (nr_ws_pmd_t){opts.client ? 0 : 15, false};
  }
  opts.request = "GET / HTTP/1.1\r\n\r\n";
  opts.request_len = strlen(opts.request);
  opts.accept = "acc";
  data++;
  size--;
  out_t whole = {0}, split = {0}, alone = {0};
  run(data, size, 0, &whole);
  run(data, size, fuzz_seed(data, size), &split);
  same(whole.bytes, whole.len, split.bytes, split.len);
  if (!opts.client) {
    same(whole.wrote, whole.wlen, split.wrote, split.wlen);
    decode_alone(data, size, &alone);
    same(whole.bytes, whole.len, alone.bytes, alone.len);
  }
  free(whole.bytes);
  free(split.bytes);
  free(alone.bytes);
  free(whole.wrote);
  free(split.wrote);
  return 0;
}
