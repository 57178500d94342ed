/*
 * test_outbound.c -- a channel's outbound buffer (runtime/outbound.c)
 * without sockets: the three stream offsets (appended, flushed, written),
 * partial writes as the kernel would take them, the cut fail_unflushed
 * makes at the flushed offset, and write marks watched late, whose
 * promises must complete in stream order among the writes' own.
 *
 * The buffer is driven directly, the socket's part played by nr__out_iov
 * (what a writev would be given) and nr__out_consume (what it took). The
 * chunk cache is the test's external loop's; every test frees the buffer
 * and the loop.
 */
#include <sys/uio.h>

#include "internal.h"
#include "test.h"

/* ---- promises that note the order they complete in ------------------------- */

static char done_log[512];

static void noted(nr_promise_t *p, void *arg) {
  size_t n = strlen(done_log);
  snprintf(done_log + n, sizeof done_log - n, "%s%s%s", n ? " " : "",
           (const char *)arg, nr_promise_is_success(p) ? "" : "!");
}

static nr_promise_t *watched(const char *name) {
  nr_promise_t *p = nr_promise_new();
  CHECK_EQ(nr_promise_add_listener(p, NULL, noted, (void *)name), 0);
  return p;
}

static nr_loop_t *setup(nr_outbound_t *o) {
  done_log[0] = 0;
  nr__out_init(o);
  return nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
}

static void append(nr_loop_t *l, nr_outbound_t *o, const char *s,
                   nr_promise_t *p) {
  CHECK_EQ(nr__out_append(l, o, s, strlen(s), p), 0);
}

/* What a writev of the flushed bytes would send, as one string. */
static const char *flushed_bytes(nr_outbound_t *o) {
  static char buf[1 << 16];
  struct iovec iov[64];
  int n = nr__out_iov(o, iov, 64);
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    CHECK_LE(len + iov[i].iov_len, sizeof buf - 1);
    memcpy(buf + len, iov[i].iov_base, iov[i].iov_len);
    len += iov[i].iov_len;
  }
  buf[len] = 0;
  return buf;
}

static void teardown(nr_loop_t *l, nr_outbound_t *o) {
  nr__out_fail_all(l, o, NR_ECLOSED, NULL);
  nr_loop_free(l);
}

/* ---- offsets -------------------------------------------------------------------- */

/* Offsets only grow; a write's promise completes when `written` reaches
 * its end, not before, in order, however the kernel splits the bytes. */
TEST(offsets_and_partial_writes_complete_writes_in_order) {
  nr_outbound_t o;
  nr_loop_t *l = setup(&o);
  nr_promise_t *a = watched("a"), *b = watched("b"), *c = watched("c");
  append(l, &o, "aaaa", a);                 /* ends at 4 */
  append(l, &o, "bb", b);                   /* 6 */
  append(l, &o, "cccccc", c);               /* 12 */
  CHECK_EQ(o.appended, 12);
  CHECK_EQ(o.flushed, 0);
  CHECK_EQ(o.pending, 12);
  CHECK_STR(flushed_bytes(&o), "");         /* nothing flushed yet */
  nr__out_flush(&o);
  CHECK_EQ(o.flushed, 12);
  CHECK_STR(flushed_bytes(&o), "aaaabbcccccc");
  nr__out_consume(l, &o, 3);                /* a short write */
  CHECK_STR(done_log, "");
  CHECK_STR(flushed_bytes(&o), "abbcccccc");
  nr__out_consume(l, &o, 1);                /* a ends exactly here */
  CHECK_STR(done_log, "a");
  nr__out_consume(l, &o, 7);                /* past b, inside c */
  CHECK_STR(done_log, "a b");
  CHECK_EQ(o.written, 11);
  CHECK_EQ(o.pending, 1);
  nr__out_consume(l, &o, 1);
  CHECK_STR(done_log, "a b c");
  CHECK_EQ(o.pending, 0);
  /* Drained by the write that completed the last promise: an idle
   * connection holds neither chunks nor the promise ring. */
  CHECK(o.head == NULL);
  CHECK(o.ents == NULL);
  CHECK_EQ(o.ecap, 0);
  nr_promise_release(a);
  nr_promise_release(b);
  nr_promise_release(c);
  teardown(l, &o);
}

/* Writes larger than a chunk, and many small ones, cross chunk borders
 * without a byte lost or reordered. */
TEST(bytes_cross_chunk_borders_intact) {
  nr_outbound_t o;
  nr_loop_t *l = setup(&o);
  static char big[NR_CHUNK_SIZE * 2 + 123];
  for (size_t i = 0; i < sizeof big; i++)
    big[i] = (char)('a' + i % 26);
  CHECK_EQ(nr__out_append(l, &o, "<", 1, NULL), 0);
  CHECK_EQ(nr__out_append(l, &o, big, sizeof big, NULL), 0);
  CHECK_EQ(nr__out_append(l, &o, ">", 1, NULL), 0);
  nr__out_flush(&o);
  uint64_t total = sizeof big + 2, seen = 0;
  while (seen < total) {                     /* 1000 bytes a write */
    struct iovec iov[8];
    int n = nr__out_iov(&o, iov, 8);
    CHECK_GT(n, 0);
    const char *first = iov[0].iov_base;
    CHECK_EQ(first[0], seen == 0 ? '<' : seen == total - 1 ? '>'
                                          : big[seen - 1]);
    size_t take = iov[0].iov_len < 1000 ? iov[0].iov_len : 1000;
    nr__out_consume(l, &o, take);
    seen += take;
  }
  CHECK_EQ(o.written, total);
  CHECK_EQ(o.pending, 0);
  CHECK(o.head == NULL && o.tail == NULL);
  teardown(l, &o);
}

/* A buffer whose socket took no more keeps no chunk's room for bytes it
 * wrote already: a head chunk mostly written moves its rest to a chunk of
 * its size, the bytes and their order unchanged; a head mostly unwritten,
 * or an exact one, stays. And near the high water mark a new chunk is
 * sized to its write. */
TEST(a_stalled_buffer_gives_back_the_room_of_what_it_wrote) {
  nr_outbound_t o;
  nr_loop_t *l = setup(&o);
  static char big[NR_CHUNK_SIZE + 100];
  for (size_t i = 0; i < sizeof big; i++)
    big[i] = (char)('a' + i % 26);
  CHECK_EQ(nr__out_append(l, &o, big, NR_CHUNK_SIZE, NULL), 0);  /* a cached */
  CHECK_EQ(nr__out_append(l, &o, big + NR_CHUNK_SIZE, 100, NULL), 0); /* one */
  nr__out_flush(&o);
  nr_chunk_t *first = o.head;
  nr__out_consume(l, &o, 1000);
  nr__out_trim_head(l, &o);
  CHECK(o.head == first);                   /* mostly unwritten: kept */
  nr__out_consume(l, &o, NR_CHUNK_SIZE / 2);
  nr__out_trim_head(l, &o);
  CHECK(o.head != first);
  CHECK_EQ(o.head->cap, o.head->end);       /* exactly its rest */
  CHECK_EQ(o.head->end, NR_CHUNK_SIZE / 2 - 1000);
  CHECK_EQ(memcmp(flushed_bytes(&o), big + 1000 + NR_CHUNK_SIZE / 2,
                  sizeof big - 1000 - NR_CHUNK_SIZE / 2), 0);
  CHECK_EQ(o.pending, sizeof big - 1000 - NR_CHUNK_SIZE / 2);
  teardown(l, &o);

  l = setup(&o);                            /* a high water mark of 20 KiB */
  o.high = 20 * 1024;
  CHECK_EQ(nr__out_append(l, &o, big, NR_CHUNK_SIZE, NULL), 0);
  append(l, &o, "tail", NULL);              /* within 4 KiB of the mark */
  CHECK_EQ(o.tail->cap, 4);
  teardown(l, &o);
}

/* ---- fail_unflushed ------------------------------------------------------------------ */

/* A write error or a close cuts the stream at the flushed offset: writes
 * after it fail and their bytes go, in mid-chunk too; what was flushed
 * stays to be written, and its promises complete; later appends go on
 * from the cut. Bytes from the cut on are known as dropped. */
TEST(fail_unflushed_cuts_at_the_flushed_offset) {
  nr_outbound_t o;
  nr_loop_t *l = setup(&o);
  nr_promise_t *a = watched("a"), *b = watched("b"), *c = watched("c");
  append(l, &o, "aaaa", a);                  /* 0..4, flushed */
  nr__out_flush(&o);
  nr__out_consume(l, &o, 1);                 /* written 1 */
  append(l, &o, "bbb", b);                   /* 4..7, unflushed */
  append(l, &o, "cc", c);                    /* 7..9, unflushed */
  nr__out_fail_unflushed(l, &o, NR_ECLOSED);
  CHECK_STR(done_log, "c! b!");              /* newest first, both failed */
  CHECK_EQ(nr_promise_code(b), NR_ECLOSED);
  CHECK_EQ(o.appended, 4);
  CHECK_EQ(o.flushed, 4);
  CHECK_EQ(o.pending, 3);
  CHECK_EQ(o.dropped_from, 4);
  CHECK_EQ(o.drop_code, NR_ECLOSED);
  CHECK_STR(flushed_bytes(&o), "aaa");       /* the chunk was cut at 4 */
  /* A closing channel appends nothing more; this only shows that the cut
   * left a whole list (its tail where the bytes now end). */
  append(l, &o, "dd", NULL);
  nr__out_flush(&o);
  CHECK_STR(flushed_bytes(&o), "aaadd");
  nr__out_consume(l, &o, 3);
  CHECK_STR(done_log, "c! b! a");
  CHECK_EQ(nr_promise_code(a), 0);
  nr__out_consume(l, &o, 2);
  CHECK_EQ(o.pending, 0);
  /* Nothing unflushed: a second cut changes nothing. */
  nr__out_fail_unflushed(l, &o, -EPIPE);
  CHECK_EQ(o.dropped_from, 4);
  CHECK_EQ(o.drop_code, NR_ECLOSED);
  nr_promise_release(a);
  nr_promise_release(b);
  nr_promise_release(c);
  teardown(l, &o);
}

/* The cut at a chunk border keeps the whole chunk before it and frees
 * the one after. */
TEST(fail_unflushed_at_a_chunk_border) {
  nr_outbound_t o;
  nr_loop_t *l = setup(&o);
  static char full[NR_CHUNK_SIZE];
  memset(full, 'f', sizeof full);
  CHECK_EQ(nr__out_append(l, &o, full, sizeof full, NULL), 0);
  nr__out_flush(&o);                         /* one whole chunk flushed */
  append(l, &o, "xyz", NULL);                /* in a second chunk */
  CHECK(o.head != o.tail);
  nr__out_fail_unflushed(l, &o, -EPIPE);
  CHECK(o.head == o.tail);                   /* the second chunk is gone */
  CHECK_EQ(o.pending, NR_CHUNK_SIZE);
  CHECK_EQ(o.dropped_from, NR_CHUNK_SIZE);
  CHECK_EQ(strlen(flushed_bytes(&o)), NR_CHUNK_SIZE);
  nr__out_consume(l, &o, NR_CHUNK_SIZE);
  CHECK(o.head == NULL && o.tail == NULL);
  CHECK_EQ(o.pending, 0);
  teardown(l, &o);
}

/* With every flushed byte written already, the cut keeps nothing. */
TEST(fail_unflushed_with_nothing_flushed_left_frees_every_chunk) {
  nr_outbound_t o;
  nr_loop_t *l = setup(&o);
  append(l, &o, "sent", NULL);
  nr__out_flush(&o);
  nr__out_consume(l, &o, 4);
  append(l, &o, "gone", NULL);
  nr__out_fail_unflushed(l, &o, -EPIPE);
  CHECK(o.head == NULL && o.tail == NULL);
  CHECK_EQ(o.pending, 0);
  CHECK_EQ(o.appended, 4);
  CHECK_EQ(o.dropped_from, 4);
  CHECK_STR(flushed_bytes(&o), "");
  teardown(l, &o);
}

/* ---- watching write marks ------------------------------------------------------------ */

/* A mark watched after later writes were made with promises completes in
 * its place in the stream: before the writes that end after it. */
TEST(watched_marks_complete_in_stream_order) {
  nr_outbound_t o;
  nr_loop_t *l = setup(&o);
  nr_promise_t *a = watched("a"), *c = watched("c"), *m = watched("m"),
               *m2 = watched("m2"), *now = watched("now");
  append(l, &o, "aaaa", a);                  /* 4 */
  append(l, &o, "bbbb", NULL);               /* 8: no promise, a mark */
  uint64_t mark = o.appended;
  append(l, &o, "cccc", c);                  /* 12 */
  CHECK_EQ(nr__out_watch(&o, mark, m), 0);   /* watched late */
  CHECK_EQ(nr__out_watch(&o, 2, m2), 0);     /* earlier still */
  nr__out_flush(&o);
  nr__out_consume(l, &o, 2);
  CHECK_STR(done_log, "m2");
  nr__out_consume(l, &o, 9);                 /* to 11 */
  CHECK_STR(done_log, "m2 a m");
  nr__out_consume(l, &o, 1);
  CHECK_STR(done_log, "m2 a m c");
  /* A mark already written completes at once. */
  CHECK_EQ(nr__out_watch(&o, mark, now), 0);
  CHECK_STR(done_log, "m2 a m c now");
  nr_promise_t *ps[] = {a, c, m, m2, now};
  for (size_t i = 0; i < 5; i++)
    nr_promise_release(ps[i]);
  teardown(l, &o);
}

/* A mark inside bytes that were dropped fails (at once if watched after
 * the drop); one that ends where the drop begins does not. */
TEST(watched_marks_in_dropped_bytes_fail) {
  nr_outbound_t o;
  nr_loop_t *l = setup(&o);
  nr_promise_t *in = watched("in"), *edge = watched("edge"),
               *late = watched("late");
  nr_promise_t *kept;
  append(l, &o, "aaaa", NULL);
  nr__out_flush(&o);
  uint64_t edge_mark = o.appended;           /* 4: all flushed */
  append(l, &o, "bbbb", NULL);
  uint64_t in_mark = o.appended;             /* 8: unflushed */
  CHECK_EQ(nr__out_watch(&o, in_mark, in), 0);
  CHECK_EQ(nr__out_watch(&o, edge_mark, edge), 0);
  nr__out_fail_unflushed(l, &o, -EPIPE);
  CHECK_STR(done_log, "in!");
  CHECK_EQ(nr_promise_code(in), -EPIPE);
  CHECK_EQ(nr__out_watch(&o, in_mark, late), 0);
  CHECK_STR(done_log, "in! late!");
  nr__out_consume(l, &o, 4);
  CHECK_STR(done_log, "in! late! edge");
  nr_promise_t *ps[] = {in, edge, late};
  for (size_t i = 0; i < 3; i++)
    nr_promise_release(ps[i]);
  teardown(l, &o);

  /* A close fails what is pending, flushed or not, with its message, and
   * keeps the offsets: marks stay meaningful. */
  l = setup(&o);
  kept = watched("kept");
  append(l, &o, "aaaa", NULL);
  nr__out_flush(&o);
  nr__out_consume(l, &o, 1);
  append(l, &o, "bb", NULL);
  CHECK_EQ(nr__out_watch(&o, o.appended, kept), 0);
  nr__out_fail_all(l, &o, NR_ECLOSED, "channel closed");
  CHECK_STR(done_log, "kept!");
  CHECK_STR(nr_promise_message(kept), "channel closed");
  CHECK_EQ(o.appended, 1);
  CHECK_EQ(o.written, 1);
  CHECK_EQ(o.dropped_from, 1);
  CHECK(o.head == NULL && o.ents == NULL);
  nr_promise_release(kept);
  teardown(l, &o);
}

/* Many promises grow the ring while it has wrapped: order survives. */
TEST(the_promise_ring_grows_in_order_while_wrapped) {
  nr_outbound_t o;
  nr_loop_t *l = setup(&o);
  enum { N = 100 };
  nr_promise_t *p[N];
  static char names[N][8];
  for (int i = 0; i < 6; i++) {              /* wrap an 8-entry ring */
    snprintf(names[i], sizeof names[i], "%d", i);
    p[i] = watched(names[i]);
    append(l, &o, "x", p[i]);
  }
  nr__out_flush(&o);
  nr__out_consume(l, &o, 5);
  for (int i = 6; i < N; i++) {
    snprintf(names[i], sizeof names[i], "%d", i);
    p[i] = watched(names[i]);
    append(l, &o, "x", p[i]);
  }
  nr__out_flush(&o);
  done_log[0] = 0;
  nr__out_consume(l, &o, N - 5);
  char want[512] = "";
  for (int i = 5; i < N; i++) {
    size_t n = strlen(want);
    snprintf(want + n, sizeof want - n, "%s%d", i > 5 ? " " : "", i);
  }
  CHECK_STR(done_log, want);
  for (int i = 0; i < N; i++)
    nr_promise_release(p[i]);
  teardown(l, &o);
}
