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

#include <malloc.h>

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

/* ---- permessage-deflate (ws_deflate.c) ------------------------------------------ */

TEST(permessage_deflate_offers_are_accepted_or_declined_by_the_rfc) {
  static const struct { const char *offer; int bits; const char *tail; } c[] = {
      {"permessage-deflate; client_max_window_bits", 15, "takeover"},
      {"permessage-deflate", 15, "takeover"},
      {"PerMessage-Deflate ; server_max_window_bits=10", 10, "bits=10"},
      {"permessage-deflate; server_max_window_bits=\"12\"", 12, "bits=12"},
      /* 8 is declined (zlib has no 256-byte raw window): the next one */
      {"permessage-deflate; server_max_window_bits=8, permessage-deflate; "
       "server_no_context_takeover", 15, "takeover"},
      {"x-webkit-deflate-frame, permessage-deflate", 15, "takeover"},
      {"permessage-deflate; unknown", 0, NULL},
      {"permessage-deflate; server_no_context_takeover; "
       "server_no_context_takeover", 0, NULL},                /* repeated */
      {"permessage-deflate; client_no_context_takeover=1", 0, NULL},
      {"permessage-deflate; server_max_window_bits", 0, NULL}, /* no value */
      {"permessage-deflate; client_max_window_bits=16", 0, NULL},
      {"x-webkit-deflate-frame", 0, NULL},
  };
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    char resp[160];
    nr_ws_pmd_t a = {0, true};
    int ok = nr_ws_pmd_accept(c[i].offer, strlen(c[i].offer), resp,
                              sizeof resp, &a);
    if (ok != (c[i].bits != 0))
      FAIL("offer %zu: accepted %d", i, ok);
    if (!ok)
      continue;
    CHECK_EQ(a.bits, c[i].bits);
    CHECK(!a.peer_context);
    CHECK(strstr(resp, "server_no_context_takeover; "
                       "client_no_context_takeover") != NULL);
    size_t rl = strlen(resp), tl = strlen(c[i].tail);
    CHECK(rl >= tl && strcmp(resp + rl - tl, c[i].tail) == 0);
  }
  static const struct { const char *resp; int ok, ctx; } r[] = {
      {"permessage-deflate; server_no_context_takeover; "
       "client_no_context_takeover", 1, 0},
      {"permessage-deflate; client_no_context_takeover", 1, 1},
      {"permessage-deflate; server_max_window_bits=9", 1, 1},
      {"permessage-deflate; client_max_window_bits=10", 0, 0}, /* not offered */
      {"permessage-deflate, permessage-deflate", 0, 0},
      {"x-webkit-deflate-frame", 0, 0},
      {"permessage-deflate; what", 0, 0},
  };
  for (size_t i = 0; i < sizeof r / sizeof *r; i++) {
    nr_ws_pmd_t a = {0, false};
    const char *why = nr_ws_pmd_check(r[i].resp, strlen(r[i].resp), &a);
    if ((why == NULL) != r[i].ok)
      FAIL("response %zu: %s", i, why ? why : "accepted");
    if (why == NULL)
      CHECK_EQ(a.peer_context, (bool)r[i].ctx);
  }
}

/* A compressed client frame (RSV1 when rsv1) of op. */
static size_t deflated_frame(char *out, int op, bool fin, bool rsv1,
                             const char *z, size_t zn) {
  size_t n = client_frame(out, op, fin, z, zn);
  if (rsv1)
    out[0] = (char)(out[0] | NR_WS_RSV1);
  return n;
}

/* The message the parser decodes from s[0 .. n): its event's result. */
static long decode_all(nr_ws_parser_t *p, const char *s, size_t n,
                       nr_ws_event_t *ev) {
  size_t off = 0;
  long r = 0;
  while (off < n) {
    r = nr_ws_decode(p, s + off, n - off, ev);
    if (r <= 0 || ev->opcode != 0)
      return r;
    off += (size_t)r;
  }
  return r;
}

TEST(compressed_messages_whole_and_fragmented_round_trip_and_rsv1_rules_hold) {
  static char text[20000], frames[40000];
  for (size_t i = 0; i < sizeof text; i++)
    text[i] = "netrun compresses "[i % 18];
  nr_slice_t v[2] = {{text, 7000}, {text + 7000, sizeof text - 7000}};
  const char *z;
  size_t zn;
  CHECK_EQ(nr_ws_deflate(15, v, 2, &z, &zn), 0);
  CHECK(zn < sizeof text / 10);
  static char zc[4096];
  memcpy(zc, z, zn);
  for (int ctx = 0; ctx < 2; ctx++) {         /* per-thread, own stream */
    nr_ws_parser_t p;
    nr_ws_parser_init(&p, true, 1 << 20, 1 << 20);
    nr_ws_parser_deflate(&p, ctx);
    nr_ws_event_t ev;
    size_t n = deflated_frame(frames, NR_WS_TEXT, true, true, zc, zn);
    CHECK_EQ(nr_ws_decode(&p, frames, n, &ev), (long)n);
    CHECK_EQ(ev.opcode, NR_WS_TEXT);
    CHECK_EQ(ev.len, sizeof text);
    CHECK(memcmp(ev.data, text, sizeof text) == 0);
    /* the same in three fragments, RSV1 on the first only */
    n = deflated_frame(frames, NR_WS_TEXT, false, true, zc, 10);
    n += client_frame(frames + n, NR_WS_CONT, false, zc + 10, 20);
    n += client_frame(frames + n, NR_WS_CONT, true, zc + 30, zn - 30);
    CHECK(decode_all(&p, frames, n, &ev) > 0);
    CHECK_EQ(ev.opcode, NR_WS_TEXT);
    CHECK_EQ(ev.len, sizeof text);
    CHECK(memcmp(ev.data, text, sizeof text) == 0);
    nr_ws_parser_free(&p);
  }
  static const struct { int op; bool fin, agreed; int rsv; } bad[] = {
      {NR_WS_TEXT, true, false, NR_WS_RSV1},  /* not agreed */
      {NR_WS_PING, true, true, NR_WS_RSV1},   /* a control frame */
      {NR_WS_TEXT, true, true, 0x20},         /* RSV2 */
      {NR_WS_TEXT, true, true, 0x10},         /* RSV3 */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    nr_ws_parser_t p;
    nr_ws_parser_init(&p, true, 1 << 20, 1 << 20);
    if (bad[i].agreed)
      nr_ws_parser_deflate(&p, false);
    size_t n = client_frame(frames, bad[i].op, bad[i].fin, zc, 5);
    frames[0] = (char)(frames[0] | bad[i].rsv);
    nr_ws_event_t ev;
    CHECK_EQ(nr_ws_decode(&p, frames, n, &ev), -1);
    CHECK_EQ(ev.code, NR_WS_PROTOCOL);
    nr_ws_parser_free(&p);
  }
  /* RSV1 on a continuation */
  nr_ws_parser_t p;
  nr_ws_parser_init(&p, true, 1 << 20, 1 << 20);
  nr_ws_parser_deflate(&p, false);
  size_t n = deflated_frame(frames, NR_WS_TEXT, false, true, zc, 10);
  n += deflated_frame(frames + n, NR_WS_CONT, true, true, zc + 10, zn - 10);
  nr_ws_event_t ev;
  CHECK_EQ(decode_all(&p, frames, n, &ev), -1);
  CHECK_EQ(ev.code, NR_WS_PROTOCOL);
  nr_ws_parser_free(&p);
  /* not deflate data: 1007 */
  nr_ws_parser_init(&p, true, 1 << 20, 1 << 20);
  nr_ws_parser_deflate(&p, false);
  n = deflated_frame(frames, NR_WS_BINARY, true, true, "\xff\xff\xff\xff", 4);
  CHECK_EQ(nr_ws_decode(&p, frames, n, &ev), -1);
  CHECK_EQ(ev.code, NR_WS_BAD_DATA);
  nr_ws_parser_free(&p);
}

TEST(a_zip_bomb_is_refused_with_1009_without_allocating_past_max_message) {
  size_t big = 64u << 20;                    /* 64 MiB of zeros */
  char *zeros = calloc(1, big);
  CHECK(zeros != NULL);
  nr_slice_t v = {zeros, big};
  const char *z;
  size_t zn;
  CHECK_EQ(nr_ws_deflate(15, &v, 1, &z, &zn), 0);
  free(zeros);
  CHECK(zn < 128 * 1024);
  char *frame = malloc(zn + 14);
  CHECK(frame != NULL);
  size_t n = nr_ws_put_head(frame, NR_WS_BINARY | NR_WS_RSV1, zn, NULL);
  memcpy(frame + n, z, zn);
  n += zn;
  nr_ws_event_t ev;
  nr_ws_parser_t p;                          /* a client: unmasked frames */
  nr_ws_parser_init(&p, false, 1 << 20, 1 << 20);
  nr_ws_parser_deflate(&p, false);
  char warm[64];                             /* the thread's streams made */
  size_t wn = nr_ws_put_head(warm, NR_WS_BINARY | NR_WS_RSV1, 7, NULL);
  memcpy(warm + wn, "\xf2\x48\xcd\xc9\xc9\x07\x00", 7); /* RFC 7692 "Hello" */
  CHECK_EQ(nr_ws_decode(&p, warm, wn + 7, &ev), (long)(wn + 7));
  CHECK_EQ(ev.len, 5);
  CHECK(memcmp(ev.data, "Hello", 5) == 0);
  size_t max = 100000;
  p.max_message = max;
#if !defined(__SANITIZE_ADDRESS__)
  struct mallinfo2 before = mallinfo2();
#endif
  CHECK_EQ(nr_ws_decode(&p, frame, n, &ev), -1);
  CHECK_EQ(ev.code, NR_WS_TOO_BIG);
#if !defined(__SANITIZE_ADDRESS__)
  struct mallinfo2 after = mallinfo2();
  /* (the inflated buffer is kept until the next call: it is counted) */
  CHECK(after.uordblks + after.hblkhd <
        before.uordblks + before.hblkhd + max + 16384);
#endif
  nr_ws_parser_free(&p);
  free(frame);
}

/* One compressed client frame of n bytes of `fill` (random when fill <
 * 0) into *frame (malloc'd); returns its length. */
static size_t compressed(char **frame, int fill, size_t n) {
  char *plain = malloc(n);
  CHECK(plain != NULL);
  uint32_t x = 12345;
  for (size_t i = 0; i < n; i++)
    plain[i] = fill >= 0 ? (char)fill : (char)((x = x * 1103515245 + 12345) >> 16);
  nr_slice_t v = {plain, n};
  const char *z;
  size_t zn;
  CHECK_EQ(nr_ws_deflate(15, &v, 1, &z, &zn), 0);
  free(plain);
  *frame = malloc(zn + 14);
  CHECK(*frame != NULL);
  return deflated_frame(*frame, NR_WS_BINARY, true, true, z, zn);
}

TEST(a_connection_inflates_at_most_inflate_ratio_times_what_it_sent_compressed) {
  char *bomb, *noise;
  size_t bn = compressed(&bomb, 0, 1000000);     /* ~1 KB: ratio ~1000 */
  size_t nn = compressed(&noise, -1, 20000);     /* incompressible: ~1 */
  CHECK(bn < 2000);
  nr_ws_event_t ev;
  /* A fresh connection: 64 x ~1 KB + 64 KiB is far from 1 MB; refused
   * with 1008, having inflated no more than the budget. */
  nr_ws_parser_t p;
  nr_ws_parser_init(&p, true, 2 << 20, 2 << 20);
  nr_ws_parser_deflate(&p, false);
  CHECK_EQ(p.inflate_ratio, NR_WS_INFLATE_RATIO);
  CHECK_EQ(nr_ws_decode(&p, bomb, bn, &ev), -1);
  CHECK_EQ(ev.code, NR_WS_POLICY);
  CHECK(p.zout <= NR_WS_INFLATE_RATIO * (uint64_t)bn + NR_WS_INFLATE_ALLOWANCE);
  nr_ws_parser_free(&p);
  /* A budget, not a per-message ratio: after 20 KB of noise (which
   * earned 64 times as much), the same message goes through -- once. */
  nr_ws_parser_init(&p, true, 2 << 20, 2 << 20);
  nr_ws_parser_deflate(&p, false);
  CHECK_EQ(nr_ws_decode(&p, noise, nn, &ev), (long)nn);
  CHECK_EQ(ev.len, 20000);
  CHECK_EQ(nr_ws_decode(&p, bomb, bn, &ev), (long)bn);
  CHECK_EQ(ev.len, 1000000);
  CHECK_EQ(nr_ws_decode(&p, bomb, bn, &ev), -1);
  CHECK_EQ(ev.code, NR_WS_POLICY);
  nr_ws_parser_free(&p);
  /* No budget: inflate_ratio 0, or a peer that keeps its context */
  for (int k = 0; k < 2; k++) {
    nr_ws_parser_init(&p, true, 2 << 20, 2 << 20);
    nr_ws_parser_deflate(&p, k == 1);
    if (k == 0)
      p.inflate_ratio = 0;
    for (int i = 0; i < 3; i++) {
      CHECK_EQ(nr_ws_decode(&p, bomb, bn, &ev), (long)bn);
      CHECK_EQ(ev.len, 1000000);
    }
    nr_ws_parser_free(&p);
  }
  free(bomb);
  free(noise);
}
