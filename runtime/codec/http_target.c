/*
 * http_target.c -- the request-target forms other than a plain path
 * (RFC 9112 3.2): a path normalized (dot segments, "//", %XX), "*" for
 * OPTIONS, authority-form for CONNECT, absolute-form whose authority
 * becomes the Host. http_parse.c calls here only for a target that is not
 * a plain path ("odd": never on the usual request). Loop thread only, on
 * the parser it is given.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "codec/http.h"
#include "codec/http_parse.h"

/* ---- the request-target ------------------------------------------------------- */

static int hexval(int c) {
  return c >= '0' && c <= '9' ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* RFC 3986 unreserved: ALPHA DIGIT - . _ ~ (what percent-encoding never
 * changes the meaning of, 6.2.2.2). */
static bool unreserved(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
}

/* Is the segment s[0 .. n) "." or ".."? */
static bool dot_segment(const char *s, size_t n) {
  return (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.');
}

/* Does the segment s[0 .. n) (its %XX in upper case) hold a dot segment
 * once its encoded slashes (%2F, and %5C, a slash to some backends) are
 * decoded? */
static bool hides_dots(const char *s, size_t n) {
  size_t from = 0;
  bool slashed = false;
  for (size_t i = 0; i + 3 <= n; i++) {
    if (s[i] != '%' || s[i + 1] != (s[i + 2] == 'F' ? '2' : '5') ||
        (s[i + 2] != 'F' && s[i + 2] != 'C'))
      continue;
    if (dot_segment(s + from, i - from))
      return true;
    slashed = true;
    from = i + 3;
    i += 2;
  }
  return slashed && dot_segment(s + from, n - from);
}

/* The path s[0 .. n) (it begins with '/') normalized into out (room for n
 * bytes), as nginx does before matching locations (ngx_http_parse_complex_uri)
 * but without decoding what would change the path's meaning: %XX of an
 * unreserved byte decoded (so "%2e%2E" is ".."), other %XX kept with
 * upper-case digits (%2F stays an encoded slash, not a separator);
 * then dot segments resolved (RFC 3986 5.2.4: "/a/./b/../c" is "/a/c",
 * "/a/.." is "/a/") and empty segments merged ("//" is "/", nginx's
 * merge_slashes). Its length, or -400: '#' (no fragment in a request),
 * a '%' without two hex digits, %00 (nginx refuses these three too), a
 * path that climbs above the root (as nginx), or a segment that holds a
 * dot segment behind an encoded slash ("/public/..%2Fadmin": a backend
 * that decodes %2F, nginx among them, would resolve it, past a rule that
 * saw "/public/..."). */
static long normalize_path(const char *s, size_t n, char *out) {
  static const char hex[] = "0123456789ABCDEF";
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    int c = (unsigned char)s[i], hi, lo;
    if (c == '#')
      return -400;
    if (c != '%') {
      out[m++] = (char)c;
      continue;
    }
    if (n - i < 3 || (hi = hexval((unsigned char)s[i + 1])) < 0 ||
        (lo = hexval((unsigned char)s[i + 2])) < 0 || (hi | lo) == 0)
      return -400;
    i += 2;
    if (unreserved(hi << 4 | lo)) {
      out[m++] = (char)(hi << 4 | lo);
    } else {
      out[m++] = '%';
      out[m++] = hex[hi];
      out[m++] = hex[lo];
    }
  }
  /* segments, in place: w <= r, and out[0 .. w) ends with '/' but after
   * the last segment */
  size_t w = 1, r = 1;
  while (r <= m) {
    const char *e = memchr(out + r, '/', m - r);
    size_t end = e ? (size_t)(e - out) : m, len = end - r;
    if (len == 2 && out[r] == '.' && out[r + 1] == '.') {
      if (w == 1)
        return -400;          /* above the root */
      for (w--; out[w - 1] != '/'; w--)
        ;                     /* drop the last segment, keep its '/' */
    } else if (len > 0 && !(len == 1 && out[r] == '.')) {
      if (hides_dots(out + r, len))
        return -400;
      memmove(out + w, out + r, len);
      w += len;
      if (end < m)
        out[w++] = '/';
    }                         /* ("" and "." leave nothing) */
    r = end + 1;
  }
  return (long)w;
}

long nr__http_normalize_path(const char *s, size_t n, char *out) {
  return normalize_path(s, n, out);
}

/* Room for n bytes of normalized path: 0 or -500. */
static int norm_room(nr_http_parser_t *p, size_t n) {
  if (p->norm_cap >= n)
    return 0;
  char *b = realloc(p->norm, n);
  if (b == NULL)
    return -500;
  p->norm = b;
  p->norm_cap = n;
  return 0;
}

/* r's path from the origin-form path t[0 .. n): t itself when it is
 * normal already, else its normalized form (p->norm). 0 or a status. */
static int origin_path(nr_http_parser_t *p, nr_http_request_t *r,
                       const char *t, size_t n) {
  if (norm_room(p, n) < 0)
    return 500;
  long m = normalize_path(t, n, p->norm);
  if (m < 0)
    return (int)-m;
  if ((size_t)m == n && memcmp(p->norm, t, n) == 0) {
    r->path = t;
    r->path_len = n;
  } else {
    r->path = p->norm;
    r->path_len = (size_t)m;
    r->rewritten = true;
  }
  return 0;
}

static bool method_is(const nr_http_request_t *r, const char *m, size_t n) {
  return r->method_len == n && memcmp(r->method, m, n) == 0;
}


/* The length of an RFC 3986 scheme at t[0 .. n) followed by "://" (the
 * form an absolute http(s) URI has), or 0. */
static size_t scheme_len(const char *t, size_t n) {
  size_t k = 0;
  if (n == 0 || !((t[0] | 0x20) >= 'a' && (t[0] | 0x20) <= 'z'))
    return 0;
  while (k < n && (((t[k] | 0x20) >= 'a' && (t[k] | 0x20) <= 'z') ||
                   (t[k] >= '0' && t[k] <= '9') || t[k] == '+' ||
                   t[k] == '-' || t[k] == '.'))
    k++;
  return n - k >= 3 && memcmp(t + k, "://", 3) == 0 ? k : 0;
}

/* Where an absolute-form target's authority lies in its part before '?'
 * (t[0 .. n)): *a0 .. *a1 (the path follows at *a1); false if t is not
 * one: scheme "://" authority, with no userinfo (RFC 9110 4.2.4) and a
 * valid host. */
static bool absolute_form(const char *t, size_t n, size_t *a0, size_t *a1) {
  size_t k = scheme_len(t, n);
  if (k == 0)
    return false;
  *a0 = k + 3;
  const char *slash = memchr(t + *a0, '/', n - *a0);
  *a1 = slash ? (size_t)(slash - t) : n;
  return *a1 > *a0 && memchr(t + *a0, '@', *a1 - *a0) == NULL &&
         nr__http_valid_host(t + *a0, *a1 - *a0);
}

/* A target that is not a plain path (parse_request_line said ODD; r->path
 * holds its part before any '?'): origin-form with a path to normalize;
 * "*" (asterisk-form: OPTIONS only); authority-form (CONNECT only, as it
 * came); else absolute-form, whose path becomes r->path ("/" when empty;
 * its authority becomes the Host once the fields are parsed:
 * authority_host). 0 or a status. */
int nr__http_target_form(nr_http_parser_t *p, nr_http_request_t *r) {
  const char *t = r->path;
  size_t n = r->path_len, a0, a1;
  if (n > 0 && t[0] == '/')
    return origin_path(p, r, t, n);
  if (n == 1 && t[0] == '*')
    return method_is(r, "OPTIONS", 7) && r->query == NULL ? 0 : 400;
  if (method_is(r, "CONNECT", 7))
    return r->query == NULL && nr__http_valid_host(t, n) ? 0 : 400;
  if (!absolute_form(t, n, &a0, &a1))
    return 400;
  if (a1 == n) {
    r->path = "/";
    r->path_len = 1;
    r->rewritten = true;
    return 0;
  }
  return origin_path(p, r, t + a1, n - a1);
}

/* An absolute-form target's authority is the request's Host (RFC 9112
 * 3.2.2: the Host field sent beside it is ignored): it replaces that
 * field's value, or is added for an HTTP/1.0 request that sent none. 0
 * (and nothing done for another form) or 431 (no room for the field). */

int nr__http_authority_host(nr_http_parser_t *p, nr_http_request_t *r) {
  size_t a0, a1, tn = r->query ? (size_t)(r->query - 1 - r->target)
                               : r->target_len;
  if (r->target[0] == '/' || method_is(r, "CONNECT", 7) ||
      !absolute_form(r->target, tn, &a0, &a1))
    return 0;
  const char *a = r->target + a0;
  size_t n = a1 - a0;
  r->rewritten = true;         /* (a field out of its line's order) */
  for (size_t i = 0; i < r->nheaders; i++)
    if (r->headers[i].name_len == 4 && nr__http_named_host(&r->headers[i])) {
      r->headers[i].value = a;
      r->headers[i].value_len = n;
      return 0;
    }
  if (r->nheaders == p->max_headers)
    return 431;
  r->headers[r->nheaders++] = (nr_http_header_t){"Host", a, 4, n};
  r->trailers = r->headers + r->nheaders;
  return 0;
}
