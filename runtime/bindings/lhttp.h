/*
 * lhttp.h -- what the HTTP server and client bindings (lhttp.c,
 * lhttp_client.c) share: a Lua headers table read into the codecs' header
 * array (lhttp_fields.c). Loop thread only, on the state that owns the
 * table.
 */
#ifndef LNR_HTTP_H
#define LNR_HTTP_H

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

#endif /* LNR_HTTP_H */
