/*
 * h2_scan.c -- what the HTTP/2 server checks about frames beside nghttp2
 * (h2_server.c): the session keeps no closed streams and no RFC 7540
 * priority tree (SETTINGS_NO_RFC7540_PRIORITIES = 1, RFC 9218), which
 * together cost ~510 instructions a request (bench/RESULTS.md, "HTTP/2
 * per CPU-second, the levers"). So what nghttp2 told from them is told
 * here. Loop thread only, like the session.
 *
 * The scan walks a read's frame headers before nghttp2_session_mem_recv
 * gets it (a frame header split across reads is carried), because
 * nghttp2 gives no callback for the frames it then ignores: DATA on a
 * stream it no longer has, and every PRIORITY. What it judges from the
 * session -- the highest stream processed, whether nghttp2 has a stream
 * -- is what nghttp2 processed before this read; a stream, once closed,
 * stays closed, so a frame found on a closed stream is one, and one on a
 * stream closed later in the same read is only missed (ignored by
 * nghttp2, as a frame on a closed stream may be).
 *
 * RFC 9113: 5.1, DATA on a closed stream is STREAM_CLOSED; 5.1.1, a
 * HEADERS below the highest stream opened, on a stream nghttp2 does not
 * have, opens one out of order or comes after the close (PROTOCOL_ERROR,
 * in on_begin_frame, which nghttp2 calls for HEADERS); 5.3.1, a PRIORITY
 * that depends on its own stream, and 6.3, one on stream 0, are
 * PROTOCOL_ERROR. Frames on a stream the server reset lately are late,
 * not wrong: nghttp2 ignores them, their window counted. PRIORITY frames
 * drain the flood bucket here (on_frame_recv no longer sees them).
 *
 * And the token buckets the server's limits drain (h2_server.c says
 * which frames): resets either way, frames that do no work.
 */
#include <string.h>

#include "codec/h2_internal.h"

/* ---- token buckets -------------------------------------------------------------- */

bool nr__h2_take(bucket_t *b, uint32_t burst, uint32_t rate) {
  uint64_t now = nr_now();
  b->tokens += (double)(now - b->at) * rate / 1e9;
  if (b->tokens > burst)
    b->tokens = burst;
  b->at = now;
  if (b->tokens < 1)
    return false;
  b->tokens -= 1;
  return true;
}

void nr__h2_earn(nr_h2_server_t *h) {
  if (h->flood.tokens < h->o.flood_burst)
    h->flood.tokens += 1;
}

void nr__h2_flood(nr_h2_server_t *h) {
  if (!nr__h2_take(&h->flood, h->o.flood_burst, h->o.flood_rate))
    h->calm = true;
}

void nr__h2_reset_sent(nr_h2_server_t *h, int32_t id) {
  h->reset[h->nreset++ % RESET_RING] = id;
}

static bool reset_lately(const nr_h2_server_t *h, int32_t id) {
  for (unsigned i = 0; i < RESET_RING && i < h->nreset; i++)
    if (h->reset[i] == id)
      return true;
  return false;
}

/* A stream below the highest processed that nghttp2 does not have. */
static bool closed(nr_h2_server_t *h, int32_t id) {
  return id != 0 && id <= h->max_id && (id & 1) &&
         nghttp2_session_find_stream(h->ng, id) == NULL &&
         !reset_lately(h, id);
}

int nr__h2_on_begin_frame(nghttp2_session *ng, const nghttp2_frame_hd *hd,
                          void *ud) {
  (void)ng;
  nr_h2_server_t *h = ud;
  if (hd->type != NGHTTP2_HEADERS || hd->stream_id == 0)
    return 0;
  if (hd->stream_id > h->max_id) {
    h->max_id = hd->stream_id;
  } else if (closed(h, hd->stream_id)) {
    h->die_code = NGHTTP2_PROTOCOL_ERROR;
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  return 0;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* One frame's header (and a PRIORITY's 5 bytes): 0 or the error. */
static uint32_t judge(nr_h2_server_t *h, const uint8_t *f) {
  uint32_t len = be32(f) >> 8;
  int32_t id = (int32_t)(be32(f + 5) & 0x7fffffff);
  switch (f[3]) {
  case NGHTTP2_DATA:
    return closed(h, id) ? NGHTTP2_STREAM_CLOSED : 0;
  case NGHTTP2_PRIORITY:
    nr__h2_flood(h);
    if (id == 0 || (len == 5 && (int32_t)(be32(f + 9) & 0x7fffffff) == id))
      return NGHTTP2_PROTOCOL_ERROR;
    return 0;
  }
  return 0;
}

/* How many bytes of what a frame's header is read with. */
static size_t need(const h2scan_t *sc) {
  return sc->n >= 9 && sc->b[3] == NGHTTP2_PRIORITY && (be32(sc->b) >> 8) == 5
             ? 14 : 9;
}

size_t nr__h2_scan(nr_h2_server_t *h, const uint8_t *p, size_t n,
                   uint32_t *code) {
  h2scan_t *sc = &h->scan;
  size_t i = 0;
  *code = 0;
  while (i < n) {
    if (sc->skip > 0) {        /* a payload (or a header's rest) */
      size_t k = n - i < sc->skip ? n - i : sc->skip;
      sc->skip -= (uint32_t)k;
      i += k;
      continue;
    }
    size_t start = i;
    if (sc->n == 0 && n - i >= 14) {   /* the usual case: all here */
      uint8_t t = p[i + 3];
      if ((t == NGHTTP2_DATA || t == NGHTTP2_PRIORITY) &&
          (*code = judge(h, p + i)) != 0)
        return start;
      sc->skip = be32(p + i) >> 8;
      i += 9;
      continue;
    }
    while (i < n && sc->n < need(sc))  /* carried across reads */
      sc->b[sc->n++] = p[i++];
    if (sc->n < need(sc))
      return n;
    if ((*code = judge(h, sc->b)) != 0)
      return start;
    sc->skip = (be32(sc->b) >> 8) + 9 - sc->n;
    sc->n = 0;
  }
  return n;
}
