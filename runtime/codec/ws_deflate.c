/*
 * ws_deflate.c -- permessage-deflate (RFC 7692) for the WebSocket codec
 * (ws.c): the negotiation of its parameters, and zlib's raw deflate and
 * inflate of one message. Loop thread only, like the codec.
 *
 * Memory. A zlib deflate stream costs ~270 KiB (window 15, memLevel 8), an
 * inflate stream ~44 KiB once used: far too much to keep per connection.
 * So netrun agrees to no context takeover both ways (the server always
 * answers server_no_context_takeover and client_no_context_takeover; the
 * client offers both), each message is compressed on its own, and the
 * streams are per thread, reset after each message: an idle deflate
 * connection holds nothing. The one exception is a client whose server
 * kept its context (declined server_no_context_takeover): that connection
 * inflates with a stream of its own (nr_ws_parser_t.inflater).
 *
 * Bounds. An inflated message lands in a per-thread buffer that grows
 * only up to max_message + 1 bytes: a message that inflates past
 * max_message is refused (1009) when that byte is reached, so a zip bomb
 * never allocates more than the limit. A buffer grown past 64 KiB goes to
 * the parser, which frees it on its next call (as it does a reassembled
 * message): a thread keeps at most 64 KiB. And the CPU a peer can make us
 * spend inflating is bounded by what it sends: a connection's inflated
 * bytes stay within inflate_ratio times its compressed bytes, plus an
 * allowance (a budget, not a per-message ratio: a message of zeros now
 * and then passes among ordinary ones, while a stream of bombs cannot
 * make more than the ratio of what it costs the peer to send); a message
 * that would pass it is refused (1008) as it reaches it, inflated no
 * further.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#define ZLIB_CONST
#include <zlib.h>

#include "codec/ws.h"

/* ---- negotiation ---------------------------------------------------------- */

/* Trim spaces and tabs around s[0 .. *n). */
static const char *trim(const char *s, size_t *n) {
  while (*n > 0 && (*s == ' ' || *s == '\t')) {
    s++;
    (*n)--;
  }
  while (*n > 0 && (s[*n - 1] == ' ' || s[*n - 1] == '\t'))
    (*n)--;
  return s;
}

static bool is(const char *s, size_t n, const char *lit) {
  return strlen(lit) == n && strncasecmp(s, lit, n) == 0;
}

/* A window size parameter's value: 8 .. 15, or -1. */
static int window_bits(const char *v, size_t n) {
  if (n >= 2 && v[0] == '"' && v[n - 1] == '"') {
    v++;
    n -= 2;
  }
  if (n == 1 && v[0] == '8')
    return 8;
  if (n == 1 && v[0] == '9')
    return 9;
  if (n == 2 && v[0] == '1' && v[1] >= '0' && v[1] <= '5')
    return 10 + (v[1] - '0');
  return -1;
}

enum { P_SNCT = 1, P_CNCT = 2, P_SMWB = 4, P_CMWB = 8 };

/* The parameters of one permessage-deflate element e[0 .. n) (after its
 * name): which were there (P_*), and the window sizes given. 0, or -1
 * for an unknown or repeated parameter or a bad value. */
static int parse_params(const char *e, size_t n, unsigned *seen, int *smwb,
                        int *cmwb) {
  *seen = 0;
  *smwb = *cmwb = 0;
  while (n > 0) {
    const char *semi = memchr(e, ';', n);
    size_t pl = semi ? (size_t)(semi - e) : n;
    const char *eq = memchr(e, '=', pl);
    size_t kl = eq ? (size_t)(eq - e) : pl, vl = eq ? pl - kl - 1 : 0;
    const char *k = trim(e, &kl), *v = eq ? trim(eq + 1, &vl) : NULL;
    if (kl == 0 && v == NULL)
      goto next;            /* the ';' after the name, or an empty one */
    unsigned bit = is(k, kl, "server_no_context_takeover") ? P_SNCT
                 : is(k, kl, "client_no_context_takeover") ? P_CNCT
                 : is(k, kl, "server_max_window_bits")     ? P_SMWB
                 : is(k, kl, "client_max_window_bits")     ? P_CMWB : 0;
    if (bit == 0 || (*seen & bit) || ((bit & (P_SNCT | P_CNCT)) && v))
      return -1;
    *seen |= bit;
    if (bit == P_SMWB && (v == NULL || (*smwb = window_bits(v, vl)) < 0))
      return -1;
    if (bit == P_CMWB && v != NULL && (*cmwb = window_bits(v, vl)) < 0)
      return -1;
  next:
    if (semi == NULL)
      break;
    n -= pl + 1;
    e = semi + 1;
  }
  return 0;
}

/* The next comma-separated element of *s[0 .. *n), trimmed; NULL at the
 * end. Its name is written to *name (the part before the first ';'). */
static const char *next_element(const char **s, size_t *n, size_t *len,
                                size_t *name) {
  while (*n > 0) {
    const char *comma = memchr(*s, ',', *n);
    size_t el = comma ? (size_t)(comma - *s) : *n;
    const char *e = trim(*s, &el);
    *n -= comma ? (size_t)(comma - *s) + 1 : *n;
    *s = comma ? comma + 1 : *s + el;
    if (el == 0)
      continue;
    const char *semi = memchr(e, ';', el);
    *name = semi ? (size_t)(semi - e) : el;
    trim(e, name);
    *len = el;
    return e;
  }
  return NULL;
}

int nr_ws_pmd_accept(const char *offer, size_t n, char *resp, size_t cap,
                     nr_ws_pmd_t *agreed) {
  size_t el, nl;
  const char *e;
  while ((e = next_element(&offer, &n, &el, &nl)) != NULL) {
    unsigned seen;
    int smwb, cmwb;
    if (!is(e, nl, "permessage-deflate") ||
        parse_params(e + nl, el - nl, &seen, &smwb, &cmwb) < 0)
      continue;
    if (smwb == 8)
      continue;           /* zlib's raw deflate has no 256-byte window */
    /* Both ways without context takeover, whatever was offered (RFC
     * 7692 7.1.1: a server may include both parameters). */
    int len = smwb ? snprintf(resp, cap, "permessage-deflate; "
                              "server_no_context_takeover; "
                              "client_no_context_takeover; "
                              "server_max_window_bits=%d", smwb)
                   : snprintf(resp, cap, "permessage-deflate; "
                              "server_no_context_takeover; "
                              "client_no_context_takeover");
    if (len < 0 || (size_t)len >= cap)
      return 0;
    *agreed = (nr_ws_pmd_t){smwb ? smwb : 15, false};
    return 1;
  }
  return 0;
}

const char *nr_ws_pmd_check(const char *v, size_t n, nr_ws_pmd_t *agreed) {
  size_t el, nl;
  const char *e = next_element(&v, &n, &el, &nl);
  unsigned seen;
  int smwb, cmwb;
  if (e == NULL || !is(e, nl, "permessage-deflate"))
    return "an extension that was not offered";
  if (next_element(&v, &n, &el, &nl) != NULL)
    return "more than one extension";
  if (parse_params(e + nl, el - nl, &seen, &smwb, &cmwb) < 0)
    return "bad permessage-deflate parameters";
  if (seen & P_CMWB)
    return "client_max_window_bits, which was not offered";
  *agreed = (nr_ws_pmd_t){15, !(seen & P_SNCT)};
  return NULL;
}

/* ---- the per-thread streams --------------------------------------------------- */

#define KEEP 65536              /* a buffer's bytes kept past a call */

typedef struct zthread_s {
  z_stream def[16];             /* by window bits (9 .. 15), made on use */
  bool def_ok[16];
  z_stream inf;
  bool inf_ok;
  char *out, *plain;            /* deflated, inflated */
  size_t out_cap, plain_cap;
} zthread_t;

static _Thread_local zthread_t *zt;
static pthread_key_t zt_key;
static pthread_once_t zt_once = PTHREAD_ONCE_INIT;

static void zt_free(void *arg) {
  zthread_t *t = arg;
  for (int i = 0; i < 16; i++)
    if (t->def_ok[i])
      deflateEnd(&t->def[i]);
  if (t->inf_ok)
    inflateEnd(&t->inf);
  free(t->out);
  free(t->plain);
  free(t);
}

static void zt_key_make(void) { pthread_key_create(&zt_key, zt_free); }

static zthread_t *zt_get(void) {
  if (zt == NULL) {
    pthread_once(&zt_once, zt_key_make);
    if ((zt = calloc(1, sizeof *zt)) == NULL)
      return NULL;
    pthread_setspecific(zt_key, zt);
  }
  return zt;
}

/* Grow *b to at least `need` bytes (keeping its content). */
static int grow(char **b, size_t *cap, size_t need) {
  if (need <= *cap)
    return 0;
  size_t c = *cap < 4096 ? 4096 : *cap;
  while (c < need)
    c *= 2;
  char *nb = realloc(*b, c);
  if (nb == NULL)
    return -ENOMEM;
  *b = nb;
  *cap = c;
  return 0;
}

/* ---- deflate ------------------------------------------------------------------ */

int nr_ws_deflate(int bits, const nr_slice_t *v, size_t n, const char **out,
                  size_t *len) {
  zthread_t *t = zt_get();
  if (t == NULL || bits < 9 || bits > 15)
    return -ENOMEM;
  z_stream *z = &t->def[bits];
  if (!t->def_ok[bits]) {
    memset(z, 0, sizeof *z);
    if (deflateInit2(z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -bits, 8,
                     Z_DEFAULT_STRATEGY) != Z_OK)
      return -ENOMEM;
    t->def_ok[bits] = true;
  }
  size_t total = 0, have = 0;
  for (size_t i = 0; i < n; i++)
    total += v[i].len;
  if (t->out_cap > KEEP && total < KEEP / 2) {   /* a big one went out */
    free(t->out);
    t->out = NULL;
    t->out_cap = 0;
  }
  for (size_t i = 0; i < n || i == 0; i++) {
    bool last = i + 1 >= n;
    z->next_in = (const Bytef *)(n ? v[i].data : "");
    z->avail_in = n ? (uInt)v[i].len : 0;
    do {
      if (grow(&t->out, &t->out_cap, have + deflateBound(z, total) + 16) < 0)
        goto nomem;
      z->next_out = (Bytef *)t->out + have;
      z->avail_out = (uInt)(t->out_cap - have);
      deflate(z, last ? Z_SYNC_FLUSH : Z_NO_FLUSH);
      have = t->out_cap - z->avail_out;
    } while (z->avail_out == 0);
  }
  deflateReset(z);
  /* A sync flush ends with an empty stored block, 00 00 FF FF, which the
   * frame leaves out (RFC 7692 7.2.1). */
  if (have >= 4 && memcmp(t->out + have - 4, "\0\0\xff\xff", 4) == 0)
    have -= 4;
  *out = t->out;
  *len = have;
  return 0;
nomem:
  deflateReset(z);
  return -ENOMEM;
}

/* ---- inflate ------------------------------------------------------------------- */

/* Feed in[0 .. n) to z, appending to the thread's plain buffer up to
 * max + 1 bytes: 0, 1 (the stream's final block ended), NR_WS_TOO_BIG,
 * NR_WS_BAD_DATA or -ENOMEM. */
static int feed(zthread_t *t, z_stream *z, const char *in, size_t n,
                size_t *have, size_t max) {
  z->next_in = (const Bytef *)in;
  z->avail_in = (uInt)n;
  for (;;) {
    if (*have == t->plain_cap) {
      if (t->plain_cap > max)
        return NR_WS_TOO_BIG;
      size_t want = t->plain_cap ? t->plain_cap * 2 : (n < 1024 ? 4096 : 4 * n);
      if (want > max + 1)
        want = max + 1;
      char *b = realloc(t->plain, want);
      if (b == NULL)
        return -ENOMEM;
      t->plain = b;
      t->plain_cap = want;
    }
    z->next_out = (Bytef *)t->plain + *have;
    z->avail_out = (uInt)(t->plain_cap - *have);
    int rc = inflate(z, Z_SYNC_FLUSH);
    *have = t->plain_cap - z->avail_out;
    if (*have > max)
      return NR_WS_TOO_BIG;
    if (rc == Z_STREAM_END)
      return 1;           /* a final block: the rest of the input is moot */
    if (rc != Z_OK && rc != Z_BUF_ERROR)
      return rc == Z_MEM_ERROR ? -ENOMEM : NR_WS_BAD_DATA;
    if (z->avail_out > 0 && (z->avail_in == 0 || rc == Z_BUF_ERROR))
      return 0;           /* all taken (or no progress: more is needed) */
  }
}

static z_stream *inflater(nr_ws_parser_t *p, zthread_t *t) {
  z_stream *z = p->inflater != NULL ? p->inflater : &t->inf;
  bool *ok = p->inflater != NULL ? &p->inflater_ok : &t->inf_ok;
  if (!*ok) {
    memset(z, 0, sizeof *z);
    if (inflateInit2(z, -15) != Z_OK)
      return NULL;
    *ok = true;
  }
  return z;
}

/* What a message of n compressed bytes may inflate to: max_message, or
 * less -- what is left of the connection's budget (*budget set then). A
 * peer that keeps its context (a server a client chose, that declined
 * server_no_context_takeover) has none: each of its messages may refer to
 * the last, so similar ones compress far past any ratio. */
static size_t inflate_room(const nr_ws_parser_t *p, size_t n, bool *budget) {
  *budget = false;
  if (p->inflate_ratio == 0 || p->peer_context)
    return p->max_message;
  uint64_t in = p->zin + n, r = p->inflate_ratio;
  uint64_t allowed = in > (UINT64_MAX - NR_WS_INFLATE_ALLOWANCE) / r
                         ? UINT64_MAX
                         : in * r + NR_WS_INFLATE_ALLOWANCE;
  uint64_t left = allowed > p->zout ? allowed - p->zout : 0;
  if (left >= p->max_message)
    return p->max_message;
  *budget = true;
  return (size_t)left;
}

int nr_ws_inflate(nr_ws_parser_t *p, const char *in, size_t n,
                  const char **out, size_t *len) {
  zthread_t *t = zt_get();
  if (t == NULL)
    return -ENOMEM;
  if (p->peer_context && p->inflater == NULL &&
      (p->inflater = calloc(1, sizeof(z_stream))) == NULL)
    return -ENOMEM;
  z_stream *z = inflater(p, t);
  if (z == NULL)
    return -ENOMEM;
  size_t have = 0;
  bool budget;
  size_t max = inflate_room(p, n, &budget);
  int rc = feed(t, z, in, n, &have, max);
  if (rc == 0)
    rc = feed(t, z, "\0\0\xff\xff", 4, &have, max);
  if (p->inflater == NULL || rc != 0)
    inflateReset(z);      /* no context kept (or none left to keep) */
  if (rc == 1)
    rc = 0;
  if (rc == NR_WS_TOO_BIG && budget)
    rc = NR_WS_POLICY;
  p->zin += n;
  p->zout += have;
  *out = have > 0 ? t->plain : "";
  *len = have;
  if (t->plain_cap > KEEP) {      /* the parser frees it on its next call */
    free(p->inflated);
    p->inflated = t->plain;
    p->reset = true;
    t->plain = NULL;
    t->plain_cap = 0;
  }
  return rc;
}

void nr_ws_pmd_parser_free(nr_ws_parser_t *p) {
  free(p->inflated);
  p->inflated = NULL;
  if (p->inflater != NULL) {
    if (p->inflater_ok)
      inflateEnd(p->inflater);
    free(p->inflater);
    p->inflater = NULL;
    p->inflater_ok = false;
  }
}
