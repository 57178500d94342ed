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

/* Header fields being collected: 32 inline, more on the heap. */
typedef struct lnr_hdrs_s {
  nr_http_header_t small[32], *v;
  size_t n, cap;
  lnr_state_t *S;              /* its checked strings; NULL: none kept */
} lnr_hdrs_t;

static inline void lnr_hdrs_init(lnr_hdrs_t *h, lua_State *L) {
  h->v = h->small;
  h->n = 0;
  h->cap = sizeof h->small / sizeof h->small[0];
  h->S = lnr_state(L);
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
 * prepared response (see lhttp_memo.c). */
typedef struct lnr_http_memo_s lnr_http_memo_t;

/* The prepared form of the response whose fields are at base (types t),
 * when it is the memo's, or NULL. Pushes nothing (the stack is as found). */
const nr_http_prepared_t *lnr_http_memo_hit(lua_State *L,
                                            const lnr_http_memo_t *m,
                                            int base, const int *t);
/* The response r, converted from the fields at base (types t) and checked,
 * is about to be written: remembered when it is the one written before
 * it too. Pushes nothing. */
void lnr_http_memo_offer(lua_State *L, lnr_state_t *S, int base,
                         const int *t, const nr_http_response_t *r);

#endif /* LNR_HTTP_H */
