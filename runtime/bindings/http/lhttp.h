/*
 * lhttp.h -- what the HTTP server and client bindings (lhttp.c,
 * lhttp_client.c) share: a Lua headers table read into the codecs' header
 * array (lhttp_fields.c); and the server's response memo (lhttp_memo.c).
 * Loop thread only, on the state that owns the table.
 */
#ifndef LNR_HTTP_H
#define LNR_HTTP_H

#include <stdlib.h>

#include "codec/http.h"
#include "lnr.h"

/* Header strings of responses remembered as checked (lhttp_fields.c):
 * names and values, half each. */
#define LNR_HTTP_CHECKED 64

typedef struct lnr_http_memo_s lnr_http_memo_t;

/* The HTTP module's part of a state: registry references it reads per
 * message (lnr_push_ref), the checked header strings and the response
 * memo. */
typedef struct lnr_http_part_s {
  int request_mt_ref;          /* lhttp_request.c: the request metatable */
  int key_refs[5];             /* lhttp.c: a response table's field names */
  int checked_ref;             /* lhttp_fields.c: anchors `checked` */
  int raw_mt_ref;              /* lhttp_client.c: raw responses' metatable */
  int memo_ref;                /* lhttp_memo.c: anchors `memo` */
  /* Header strings that passed their check, by address; each is
   * anchored in checked_ref's table while it is here. */
  const char *checked[LNR_HTTP_CHECKED];
  /* The response memo (lhttp_memo.c), NULL until made; its hint: the
   * last response table converted. */
  lnr_http_memo_t *memo;
  uint64_t memo_hint;
} lnr_http_part_t;

extern lnr_module_t lnr_http_module;

static inline lnr_http_part_t *lnr_http_part(lua_State *L) {
  return lnr_part(lnr_state(L), &lnr_http_module);
}

/* Header fields being collected: 32 inline, more on the heap. */
typedef struct lnr_hdrs_s {
  nr_http_header_t small[32], *v;
  size_t n, cap;
  lnr_http_part_t *P;          /* its checked strings; NULL: none kept */
} lnr_hdrs_t;

/* Start h for the part P (NULL: none, no checked strings kept). */
static inline void lnr_hdrs_start(lnr_hdrs_t *h, lnr_http_part_t *P) {
  h->v = h->small;
  h->n = 0;
  h->cap = sizeof h->small / sizeof h->small[0];
  h->P = P;
}

static inline void lnr_hdrs_init(lnr_hdrs_t *h, lua_State *L) {
  lnr_hdrs_start(h, lnr_http_part(L));
}

static inline void lnr_hdrs_free(lnr_hdrs_t *h) {
  if (h->v != h->small)
    free(h->v);
}

/* Append the fields of the headers table at idx ({ name = value }, a value
 * a string, a number or an array of them for a repeated field) to h,
 * checked: names are tokens, values hold no control character (a string
 * that passed is remembered, lhttp_fields.c). Strings stay anchored by the
 * table; a number is converted on a copy left on the stack, so the caller
 * restores the stack once done with h. Besides those copies (which make
 * their own room) it pushes 5 values at most: the caller has room for
 * them. 0, or -EINVAL / -ENOMEM with the reason ("header name 'a b' is not
 * a token") in err[0 .. el). */
int lnr_collect_headers(lua_State *L, int idx, lnr_hdrs_t *h, char *err,
                        size_t el);
/* Append one field, checked as lnr_collect_headers checks it (its strings
 * must outlive h). */
int lnr_hdrs_add(lnr_hdrs_t *h, const char *name, size_t nl, const char *val,
                 size_t vl, char *err, size_t el);

/* The fields of a response table, read in this order onto the stack: the
 * value of field k at base + k (base: the top before the reads). */
enum { LNR_RF_STATUS = 1, LNR_RF_REASON, LNR_RF_BODY, LNR_RF_STREAM,
       LNR_RF_HEADERS, LNR_RF_N };

/* The response memo: the response table written last and again, as a
 * prepared response, its head also for other bodies (see lhttp_memo.c). */

/* The prepared form of the response whose fields are at base (types t),
 * when its head is the memo's, or NULL: the memo's own, or its head with
 * this body (valid until the next call). Pushes nothing (the stack is as
 * found). */
const nr_http_prepared_t *lnr_http_memo_hit(lua_State *L, lnr_http_memo_t *m,
                                            int base, const int *t);
/* The response r, converted from the fields at base (types t) and checked,
 * is about to be written, and its hint is that of the one written before:
 * it is remembered. Pushes nothing. */
void lnr_http_memo_offer(lua_State *L, lnr_http_part_t *P, int base,
                         const int *t, const nr_http_response_t *r);

/* A response's head by its status and the addresses of its values: a
 * hint only (an address may be another string's by the next write), cheap
 * to take on every write that is not the memo's (a few instructions a
 * field). The body is left out: a head is memoised for whatever body
 * follows it. */
static inline uint64_t lnr_http_memo_hint(const nr_http_response_t *r) {
  uint64_t h = (uint64_t)r->status << 20 ^ (uint64_t)r->nheaders << 32;
  for (size_t i = 0; i < r->nheaders; i++)
    h = (h << 7 | h >> 57) ^ (uintptr_t)r->headers[i].value;
  return h;
}

/* lnr_http_memo_offer when r looks like the response converted before
 * it (P->memo_hint), else r's hint kept for the next. */
static inline void lnr_http_memo_note(lua_State *L, lnr_http_part_t *P,
                                      int base, const int *t,
                                      const nr_http_response_t *r) {
  uint64_t hint = lnr_http_memo_hint(r);
  if (hint != P->memo_hint)
    P->memo_hint = hint;
  else
    lnr_http_memo_offer(L, P, base, t, r);
}

#endif /* LNR_HTTP_H */
