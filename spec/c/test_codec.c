/*
 * test_codec.c -- the frame codecs: the pure finders (line, delimiter,
 * length_field, fixed_length) on byte strings, and the decoder base and
 * length_prepender in a pipeline, driven through an embedded channel on
 * the test's own external loop (no sockets).
 */
#include "codec/codec.h"
#include "test.h"

/* Run a finder over a whole string the way the decoder base does: returns
 * the frames joined by '|' and the errors counted. */
typedef int (*finder_fn)(void *st, const char *d, size_t n, nr_frame_t *f);

static int find_line(void *st, const char *d, size_t n, nr_frame_t *f) {
  return nr_line_find(st, d, n, f);
}
static int find_delim(void *st, const char *d, size_t n, nr_frame_t *f) {
  return nr_delim_find(st, d, n, f);
}
static int find_lenfield(void *st, const char *d, size_t n, nr_frame_t *f) {
  return nr_lenfield_find(st, d, n, f);
}

static int scan(finder_fn find, void *st, const char *d, size_t n, char *out,
                size_t *left) {
  int errors = 0;
  size_t off = 0;
  out[0] = 0;
  while (off < n) {
    nr_frame_t f;
    int rc = find(st, d + off, n - off, &f);
    if (rc == NR_FRAME_OK) {
      strcat(out, out[0] ? "|" : "");
      strncat(out, d + off + f.off, f.len);
    }
    errors += rc < 0;
    if (f.consumed == 0)
      break;
    off += f.consumed;
  }
  *left = n - off;
  return errors;
}

TEST(line_finds_lines_and_strips_either_delimiter) {
  nr_line_t st = {.max_length = 16, .strip = true};
  char out[256];
  size_t left;
  CHECK_EQ(scan(find_line, &st, "ab\r\ncd\n\nxy", 10, out, &left), 0);
  CHECK_STR(out, "ab|cd|");
  CHECK_EQ(left, 2);                        /* "xy" waits for its "\n" */
  nr_line_t keep = {.max_length = 16, .strip = false};
  CHECK_EQ(scan(find_line, &keep, "ab\r\ncd\n", 7, out, &left), 0);
  CHECK_STR(out, "ab\r\n|cd\n");
}

TEST(line_too_long_is_reported_and_skipped_to_the_next_line) {
  nr_line_t st = {.max_length = 4, .strip = true};
  char out[256];
  size_t left;
  /* A line of exactly max_length passes, "\r\n" included. */
  CHECK_EQ(scan(find_line, &st, "abcd\r\nabcdefgh\nok\n", 19, out, &left), 1);
  CHECK_STR(out, "abcd|ok");
  /* Without a newline in sight, the bytes are dropped at once (fail fast)
   * and the rest of that line is skipped when it comes. */
  nr_line_t s2 = {.max_length = 4, .strip = true};
  nr_frame_t f;
  CHECK_EQ(nr_line_find(&s2, "abcdefg", 7, &f), NR_ETOOLONG);
  CHECK_EQ(f.consumed, 7);
  CHECK_EQ(nr_line_find(&s2, "hij\nnext\n", 9, &f), NR_FRAME_MORE);
  CHECK_EQ(f.consumed, 4);
  CHECK_EQ(nr_line_find(&s2, "next\n", 5, &f), NR_FRAME_OK);
  CHECK_EQ(f.len, 4);
}

TEST(delimiter_picks_the_shortest_frame_whatever_the_split) {
  nr_delim_t st = {.max_length = 16, .strip = true, .ndelims = 2,
                   .delims = {"abc", "b"}, .delim_lens = {3, 1}, .longest = 3};
  char out[256];
  size_t left;
  CHECK_EQ(scan(find_delim, &st, "xabcyby", 7, out, &left), 0);
  CHECK_STR(out, "x|y");
  CHECK_EQ(left, 1);
  /* "xa" then "b": "abc" may still complete, so nothing is decided. */
  nr_delim_t s2 = st;
  s2.scanned = 0;
  nr_frame_t f;
  CHECK_EQ(nr_delim_find(&s2, "xab", 3, &f), NR_FRAME_MORE);
  CHECK_EQ(f.consumed, 0);
  CHECK_EQ(nr_delim_find(&s2, "xabc", 4, &f), NR_FRAME_OK);
  CHECK_EQ(f.len, 1);
  CHECK_EQ(f.consumed, 4);
}

TEST(delimiter_too_long_discards_to_the_next_delimiter) {
  nr_delim_t st = {.max_length = 3, .strip = true, .ndelims = 1,
                   .delims = {"\r\n"}, .delim_lens = {2}, .longest = 2};
  char out[256];
  size_t left;
  CHECK_EQ(scan(find_delim, &st, "abcdefgh\r\nok\r\n", 14, out, &left), 1);
  CHECK_STR(out, "ok");
  CHECK_EQ(left, 0);
}

TEST(length_field_frames_with_offset_adjustment_and_strip) {
  /* 1 byte of type, 2-byte length counting the whole frame (adjustment
   * -3), strip nothing. */
  nr_lenfield_t st = {.offset = 1, .length = 2, .adjustment = -3,
                      .strip = 0, .max_frame = 64};
  nr_frame_t f;
  CHECK_EQ(nr_lenfield_find(&st, "T\0\5hiU\0\3", 9, &f), NR_FRAME_OK);
  CHECK_EQ(f.off, 0);
  CHECK_EQ(f.len, 5);
  CHECK_EQ(f.consumed, 5);
  CHECK_EQ(nr_lenfield_find(&st, "U\0\3", 3, &f), NR_FRAME_OK);
  CHECK_EQ(f.len, 3);                       /* a frame of its header alone */
  char out[256];
  size_t left;
  nr_lenfield_t s4 = {.length = 4, .strip = 4, .max_frame = 64};
  CHECK_EQ(scan(find_lenfield, &s4, "\0\0\0\5hello\0\0\0\0\0\0\0\2x", 18, out,
                &left), 0);
  CHECK_STR(out, "hello|");
  CHECK_EQ(left, 5);                        /* waits for its second byte */
}

TEST(length_field_too_long_and_corrupt) {
  nr_lenfield_t st = {.length = 2, .strip = 2, .max_frame = 8};
  nr_frame_t f;
  /* A 100-byte frame is skipped by count, across calls, then decoding
   * goes on. */
  CHECK_EQ(nr_lenfield_find(&st, "\0\x62xxxx", 6, &f), NR_ETOOLONG);
  CHECK_EQ(f.consumed, 6);
  CHECK_EQ(st.discard, 94);
  char junk[96];
  memset(junk, 'j', sizeof junk);
  CHECK_EQ(nr_lenfield_find(&st, junk, 50, &f), NR_FRAME_MORE);
  CHECK_EQ(f.consumed, 50);
  CHECK_EQ(nr_lenfield_find(&st, junk, 60, &f), NR_FRAME_MORE);
  CHECK_EQ(f.consumed, 44);
  CHECK_EQ(st.discard, 0);
  CHECK_EQ(nr_lenfield_find(&st, "\0\1z", 3, &f), NR_FRAME_OK);
  CHECK_EQ(f.off, 2);
  CHECK_EQ(f.len, 1);
  /* A length smaller than the header is corrupt. */
  nr_lenfield_t neg = {.length = 1, .adjustment = -5, .max_frame = 8};
  CHECK_EQ(nr_lenfield_find(&neg, "\2ab", 3, &f), -EBADMSG);
  CHECK_EQ(f.consumed, 1);
  /* 8-byte lengths near 2^64 do not overflow. */
  nr_lenfield_t big = {.length = 8, .max_frame = 1 << 20};
  CHECK_EQ(nr_lenfield_find(&big, "\xff\xff\xff\xff\xff\xff\xff\xff", 8, &f),
           NR_ETOOLONG);
}

/* A cumulation keeps no more room than four times what it holds once it
 * is consumed down (a codec holding the small rest of a large read, for
 * as long as its peer reads no answers, must not keep the read's room),
 * and none when it is empty; what it holds is untouched. */
TEST(a_cumulation_consumed_down_gives_its_room_back) {
  static char big[65536];
  for (size_t i = 0; i < sizeof big; i++)
    big[i] = (char)(i * 7);
  nr_buf_t b = NR_BUF_INIT;
  CHECK_EQ(nr_buf_append(&b, big, sizeof big), 0);
  CHECK_GE(b.cap, sizeof big);
  nr_buf_consume(&b, sizeof big - 1000);
  CHECK_EQ(nr_buf_len(&b), 1000);
  CHECK_LE(b.cap, 4096);
  CHECK_EQ(memcmp(nr_buf_peek(&b), big + sizeof big - 1000, 1000), 0);
  CHECK_EQ(nr_buf_append(&b, big, 3000), 0);      /* and it grows again */
  CHECK_EQ(nr_buf_len(&b), 4000);
  CHECK_EQ(memcmp(nr_buf_peek(&b) + 1000, big, 3000), 0);
  nr_buf_consume(&b, 4000);
  CHECK(b.data == NULL);
  CHECK_EQ(b.cap, 0);
  nr_buf_free(&b);
}

TEST(big_endian_helpers) {
  char b[8];
  nr_put_be(b, 3, 0x010203);
  CHECK_EQ(memcmp(b, "\1\2\3", 3), 0);
  CHECK_EQ(nr_get_be(b, 3), 0x010203);
  nr_put_be(b, 8, 0x0102030405060708ull);
  CHECK_EQ(nr_get_be(b, 8), 0x0102030405060708ll);
}

/* ---- in a pipeline ---------------------------------------------------------- */

typedef struct capture_s {
  char frames[4096];
  int nframes, errors;
  char last_error[256];
} capture_t;

static void cap_in(void *ud, void *msg) {
  capture_t *c = ud;
  CHECK_EQ(nr_msg_type(msg), NR_MSG_BYTES);
  const nr_bytes_t *b = msg;
  strcat(c->frames, c->nframes++ ? "|" : "");
  strncat(c->frames, b->data, b->len);
}

static void cap_err(void *ud, const nr_err_t *err) {
  capture_t *c = ud;
  c->errors++;
  snprintf(c->last_error, sizeof c->last_error, "%s", err->msg);
}

static nr_embedded_t *embed(capture_t *c, const nr_handler_t *h, void *st) {
  memset(c, 0, sizeof *c);
  nr_embedded_sink_t sink = {cap_in, NULL, cap_err, c};
  nr_embedded_t *e = nr_embedded_new(nr_loop_current(), &sink);
  CHECK(e != NULL);
  CHECK_EQ(nr_pipeline_add_last(nr_channel_pipeline(nr_embedded_channel(e)),
                                "dec", h, st), 0);
  nr_embedded_start(e);
  return e;
}

static void feed(nr_embedded_t *e, const char *d, size_t n) {
  nr_bytes_t b = NR_BYTES(d, n);
  nr_embedded_write_inbound(e, &b, true);
}

static nr_decoder_t *decoder_of(nr_embedded_t *e) {
  nr_pipeline_t *p = nr_channel_pipeline(nr_embedded_channel(e));
  return nr_ctx_state(nr_pipeline_context(p, "dec"));
}

/* Every split of the stream into two reads gives the same frames, and a
 * connection between frames holds no cumulation. */
TEST(decoders_give_the_same_frames_at_every_split) {
  nr_loop_t *loop = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  static const char stream[] = "one\r\ntwo\nthree\r\n";
  size_t n = sizeof stream - 1;
  for (size_t cut = 0; cut <= n; cut++) {
    capture_t c;
    nr_embedded_t *e = embed(&c, &nr_line_handler, nr_line_new(64, true));
    feed(e, stream, cut);
    feed(e, stream + cut, n - cut);
    CHECK_STR(c.frames, "one|two|three");
    CHECK_EQ(nr_decoder_buffered(decoder_of(e)), 0);
    CHECK(decoder_of(e)->cum.data == NULL);  /* idle: no memory held */
    nr_embedded_free(e);
    CHECK_EQ(c.errors, 0);
  }
  /* Byte by byte through a length field. */
  capture_t c;
  nr_lenfield_t cfg = {.length = 2, .strip = 2, .max_frame = 64};
  nr_embedded_t *e = embed(&c, &nr_lenfield_handler, nr_lenfield_new(&cfg));
  static const char lf[] = "\0\3abc\0\0\0\2de";
  for (size_t i = 0; i < sizeof lf - 1; i++)
    feed(e, lf + i, 1);
  CHECK_STR(c.frames, "abc||de");
  CHECK_EQ(c.nframes, 3);
  nr_embedded_free(e);
  nr_loop_free(loop);
}

TEST(too_long_frames_reach_exception_caught_and_decoding_goes_on) {
  nr_loop_t *loop = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  capture_t c;
  nr_embedded_t *e = embed(&c, &nr_line_handler, nr_line_new(8, true));
  char big[100000];
  memset(big, 'x', sizeof big);
  feed(e, "ok1\nxxxx", 8);
  for (int i = 0; i < 10; i++) {             /* a megabyte without "\n" */
    feed(e, big, sizeof big);
    CHECK_LE(nr_decoder_buffered(decoder_of(e)), 9);
  }
  feed(e, "xx\nok2\n", 7);
  CHECK_STR(c.frames, "ok1|ok2");
  CHECK_EQ(c.errors, 1);
  CHECK_STR(c.last_error, "line: frame of more than 8 bytes");
  nr_embedded_free(e);
  nr_loop_free(loop);
}

TEST(an_incomplete_frame_at_close_is_reported) {
  nr_loop_t *loop = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  capture_t c;
  nr_embedded_t *e = embed(&c, &nr_fixed_handler, nr_fixed_new(4));
  feed(e, "abcdefg", 7);
  CHECK_STR(c.frames, "abcd");
  nr_embedded_close(e);
  CHECK_EQ(c.errors, 1);
  CHECK_STR(c.last_error, "fixed_length: input ended inside a frame "
                          "(3 bytes discarded)");
  nr_embedded_free(e);
  nr_loop_free(loop);
}

TEST(length_prepender_writes_length_and_payload_in_one_gathered_write) {
  nr_loop_t *loop = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  nr_prepender_t cfg = {.length = 2};
  CHECK_EQ(nr_pipeline_add_last(nr_channel_pipeline(nr_embedded_channel(e)),
                                "len", &nr_prepender_handler,
                                nr_prepender_new(&cfg)), 0);
  nr_embedded_start(e);
  nr_bytes_t b = NR_BYTES("hello", 5);
  CHECK_EQ(nr_embedded_write_outbound(e, &b), 0);
  nr_slice_t v[] = {{"ab", 2}, {"c", 1}};
  nr_slices_t s = {NR_MSG_SLICES, v, 2};
  CHECK_EQ(nr_embedded_write_outbound(e, &s), 0);
  size_t n;
  char *m = nr_embedded_read_outbound(e, &n);
  CHECK_EQ(n, 7);
  CHECK_EQ(memcmp(m, "\0\5hello", 7), 0);
  free(m);
  m = nr_embedded_read_outbound(e, &n);
  CHECK_EQ(n, 5);
  CHECK_EQ(memcmp(m, "\0\3abc", 5), 0);
  free(m);
  CHECK(nr_embedded_read_outbound(e, &n) == NULL);
  /* 70000 bytes do not fit 2 bytes of length: the write fails. */
  static char big[70000];
  nr_bytes_t bb = NR_BYTES(big, sizeof big);
  CHECK_EQ(nr_embedded_write_outbound(e, &bb), NR_ETOOLONG);
  nr_err_t err = nr_embedded_error(e);
  CHECK_EQ(err.code, NR_ETOOLONG);
  CHECK_STR(err.msg, "length_prepender: a message of 70000 bytes does not "
                     "fit a 2-byte length field");
  CHECK(nr_embedded_read_outbound(e, &n) == NULL);
  nr_embedded_free(e);
  nr_loop_free(loop);
}

TEST(removing_a_decoder_hands_its_bytes_to_the_next_handler) {
  nr_loop_t *loop = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  capture_t c;
  nr_embedded_t *e = embed(&c, &nr_line_handler, nr_line_new(64, true));
  feed(e, "a\npartial", 9);
  CHECK_EQ(nr_pipeline_remove(nr_channel_pipeline(nr_embedded_channel(e)),
                              "dec"), 0);
  CHECK_STR(c.frames, "a|partial");
  nr_embedded_free(e);
  nr_loop_free(loop);
}
