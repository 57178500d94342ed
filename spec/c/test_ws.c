/*
 * test_ws.c -- the WebSocket codec (runtime/codec/ws.c): the UTF-8 checker
 * (cases and every split point), the encoder against the decoder, and the
 * handler on an embedded channel fed a stream of frames in two reads cut
 * at every byte boundary: the same messages, the same answers (pong,
 * close) and no memory held between frames.
 */
#include "codec/codec.h"
#include "codec/ws.h"
#include "test.h"

/* A client frame of op, masked with a fixed key. */
static size_t client_frame(char *out, int op, bool fin, const char *p,
                           size_t n) {
  static const uint8_t key[4] = {0x37, 0xfa, 0x21, 0x3d};
  size_t h = nr_ws_put_head(out, op, n, key);
  if (!fin)
    out[0] = (char)(out[0] & 0x7f);
  nr_ws_mask(out + h, p, n, key, 0);
  return h + n;
}

TEST(utf8_checker_agrees_with_the_rfc_at_every_split) {
  static const struct { const char *s; bool ok; } cases[] = {
      {"plain ascii, longer than eight bytes", true},
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", true},
      {"\xef\xbf\xbf\xf4\x8f\xbf\xbf", true},       /* U+FFFF, U+10FFFF */
      {"\xc0\xaf", false},                          /* overlong '/' */
      {"\xe0\x80\xaf", false},                      /* overlong, 3 bytes */
      {"\xed\xa0\x80", false},                      /* a surrogate */
      {"\xf4\x90\x80\x80", false},                  /* past U+10FFFF */
      {"\xf5\x80\x80\x80", false},
      {"abc\x80", false},                           /* a stray continuation */
      {"\xe2\x28\xa1", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *s = cases[i].s;
    size_t n = strlen(s);
    for (size_t cut = 0; cut <= n; cut++) {
      uint32_t st = nr_utf8_check(nr_utf8_check(0, s, cut), s + cut, n - cut);
      if ((st == 0) != cases[i].ok)
        FAIL("case %zu cut %zu: state %u", i, cut, (unsigned)st);
    }
  }
  CHECK(nr_utf8_check(0, "\xe2\x82", 2) != 0);          /* incomplete */
  CHECK(nr_utf8_check(0, "\xe2\x82", 2) != NR_UTF8_BAD);
}

TEST(the_decoder_reads_what_the_encoder_writes_at_every_length_form) {
  static const size_t lens[] = {0, 1, 125, 126, 65535, 65536, 70000};
  static char payload[70000], frame[70000 + 14];
  for (size_t i = 0; i < sizeof payload; i++)
    payload[i] = (char)('a' + i % 26);
  for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
    size_t n = lens[k];
    size_t h = nr_ws_put_head(frame, NR_WS_BINARY, n, NULL);
    memcpy(frame + h, payload, n);
    nr_ws_parser_t p;
    nr_ws_parser_init(&p, false, 1 << 20, 1 << 20);     /* a client's */
    nr_ws_event_t ev;
    CHECK_EQ(nr_ws_decode(&p, frame, h + n - 1, &ev), 0);  /* not all here */
    CHECK_EQ(nr_ws_decode(&p, frame, h + n, &ev), (long)(h + n));
    CHECK_EQ(ev.opcode, NR_WS_BINARY);
    CHECK_EQ(ev.len, n);
    CHECK(n == 0 || memcmp(ev.data, payload, n) == 0);
    nr_ws_parser_free(&p);
  }
}

typedef struct capture_s {
  char msgs[512];
  char wrote[512];
  size_t wlen;
} capture_t;

static void cap_in(void *ud, void *msg) {
  capture_t *c = ud;
  CHECK_EQ(nr_msg_type(msg), NR_MSG_WEBSOCKET);
  const nr_ws_msg_t *m = msg;
  size_t o = strlen(c->msgs);
  snprintf(c->msgs + o, sizeof c->msgs - o, "%s%d:%.*s", o ? "|" : "",
           m->opcode, (int)m->len, m->data);
}

static void cap_out(void *ud, void *msg) {
  capture_t *c = ud;
  const nr_slice_t one = {((nr_bytes_t *)msg)->data, ((nr_bytes_t *)msg)->len};
  const nr_slice_t *v = &one;
  size_t n = 1;
  if (nr_msg_type(msg) == NR_MSG_SLICES) {
    v = ((nr_slices_t *)msg)->v;
    n = ((nr_slices_t *)msg)->n;
  }
  for (size_t i = 0; i < n; i++) {
    CHECK(c->wlen + v[i].len <= sizeof c->wrote);
    memcpy(c->wrote + c->wlen, v[i].data, v[i].len);
    c->wlen += v[i].len;
  }
}

static nr_embedded_t *embed(capture_t *c, size_t max_message) {
  memset(c, 0, sizeof *c);
  nr_embedded_sink_t sink = {cap_in, cap_out, NULL, c};
  nr_embedded_t *e = nr_embedded_new(nr_loop_current(), &sink);
  CHECK(e != NULL);
  nr_ws_opts_t o = {.max_message = max_message};
  CHECK_EQ(nr_pipeline_add_last(nr_channel_pipeline(nr_embedded_channel(e)),
                                "ws", &nr_ws_handler, nr_ws_new(&o)), 0);
  nr_embedded_start(e);
  return e;
}

static void feed(nr_embedded_t *e, const char *d, size_t n) {
  nr_bytes_t b = NR_BYTES(d, n);
  nr_embedded_write_inbound(e, &b, true);
}

static nr_decoder_t *decoder_of(nr_embedded_t *e) {
  nr_pipeline_t *p = nr_channel_pipeline(nr_embedded_channel(e));
  return nr_ctx_state(nr_pipeline_context(p, "ws"));
}

TEST(the_handler_gives_the_same_messages_and_answers_at_every_split) {
  nr_loop_t *loop = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  char s[1024];
  size_t n = 0;
  n += client_frame(s + n, NR_WS_TEXT, true, "hello", 5);
  n += client_frame(s + n, NR_WS_TEXT, false, "caf\xc3", 4);   /* split é */
  n += client_frame(s + n, NR_WS_PING, true, "p!", 2);         /* between */
  n += client_frame(s + n, NR_WS_CONT, true, "\xa9", 1);
  n += client_frame(s + n, NR_WS_BINARY, true, "\x01\x7f", 2);
  n += client_frame(s + n, NR_WS_CLOSE, true, "\x03\xe8" "bye", 5);
  n += client_frame(s + n, NR_WS_TEXT, true, "after the close", 15);
  static const char answers[] = "\x8a\x02p!\x88\x02\x03\xe8";   /* pong, close */
  for (size_t cut = 0; cut <= n; cut++) {
    capture_t c;
    nr_embedded_t *e = embed(&c, 1 << 20);
    feed(e, s, cut);
    if (cut < n)
      feed(e, s + cut, n - cut);
    CHECK_STR(c.msgs, "1:hello|1:caf\xc3\xa9|2:\x01\x7f");
    CHECK_EQ(c.wlen, sizeof answers - 1);
    CHECK(memcmp(c.wrote, answers, c.wlen) == 0);
    CHECK(!nr_channel_is_open(nr_embedded_channel(e)));  /* closed after */
    nr_embedded_free(e);
  }
  nr_loop_free(loop);
}

TEST(an_idle_connection_holds_no_memory_and_oversize_is_refused_from_the_head) {
  nr_loop_t *loop = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  capture_t c;
  nr_embedded_t *e = embed(&c, 100);
  char s[256];
  size_t n = client_frame(s, NR_WS_TEXT, false, "part", 4);
  n += client_frame(s + n, NR_WS_CONT, true, " two", 4);
  feed(e, s, n - 3);
  CHECK(nr_decoder_buffered(decoder_of(e)) > 0);        /* mid-frame */
  feed(e, s + n - 3, 3);
  CHECK_STR(c.msgs, "1:part two");
  CHECK_EQ(nr_decoder_buffered(decoder_of(e)), 0);
  CHECK(decoder_of(e)->cum.data == NULL);
  /* a head announcing 101 bytes: closed with 1009 before any payload */
  char head[16];
  static const uint8_t key[4] = {1, 2, 3, 4};
  size_t h = nr_ws_put_head(head, NR_WS_BINARY, 101, key);
  feed(e, head, h);
  CHECK(c.wlen >= 4);
  CHECK_EQ((unsigned char)c.wrote[0], 0x88);
  CHECK_EQ(nr_get_be(c.wrote + 2, 2), 1009);
  CHECK(!nr_channel_is_open(nr_embedded_channel(e)));
  nr_embedded_free(e);
  nr_loop_free(loop);
}
