/*
 * http_encode.c -- the HTTP/1.1 response encoder: reason phrases, the
 * Date header (formatted once a second per thread), the output buffer
 * responses are built in (out_t, http_encode.h), status lines and header
 * blocks, and prepared responses (nr_http_prepare: a response's bytes made
 * once, sent by each write with the date filled in). Pure functions over
 * bytes but for the per-thread caches: loop thread only (any thread that
 * encodes gets its own).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/http.h"
#include "codec/http_encode.h"
#include "codec/http_parse.h"

#define ieq_lit(a, n, lit) nr__http_ieq((a), (n), lit, sizeof lit - 1)

const char *nr_http_reason(int status) {
  switch (status) {
  case 100: return "Continue";
  case 101: return "Switching Protocols";
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 206: return "Partial Content";
  case 301: return "Moved Permanently";
  case 302: return "Found";
  case 303: return "See Other";
  case 304: return "Not Modified";
  case 307: return "Temporary Redirect";
  case 308: return "Permanent Redirect";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 410: return "Gone";
  case 411: return "Length Required";
  case 413: return "Content Too Large";
  case 414: return "URI Too Long";
  case 415: return "Unsupported Media Type";
  case 417: return "Expectation Failed";
  case 422: return "Unprocessable Content";
  case 426: return "Upgrade Required";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  case 505: return "HTTP Version Not Supported";
  default: return "Unknown";
  }
}

/* The second nr_http_date last formatted, and its text (per thread). */
static _Thread_local time_t date_sec = -1;
static _Thread_local char date_buf[40];

/* Once a second: kept out of line so that nr_http_date is a compare. */
static NOINLINE void format_date(time_t now) {
  static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri",
                                  "Sat"};
  static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  struct tm tm;
  gmtime_r(&now, &tm);
  snprintf(date_buf, sizeof date_buf, "%s, %02d %s %04d %02d:%02d:%02d GMT",
           days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12],
           tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
  date_sec = now;
}

const char *nr_http_date(void) {
  time_t now = (time_t)nr_wall_sec();
  if (now != date_sec)
    format_date(now);
  return date_buf;
}

/* The thread's scratch output buffer (see out_t). */
static _Thread_local char scratch[8192];
static _Thread_local bool scratch_busy;

void nr__http_out_init(out_t *o) {
  *o = (out_t){0};
  if (!scratch_busy) {
    scratch_busy = o->scratch = true;
    o->p = scratch;
    o->cap = sizeof scratch;
  }
}

void nr__http_out_grow(out_t *o, size_t n) {
  size_t cap = o->cap * 2 > o->len + n + 256 ? o->cap * 2 : o->len + n + 256;
  char *q = o->scratch || o->p == NULL ? malloc(cap) : realloc(o->p, cap);
  if (q == NULL) {
    o->failed = true;
    return;
  }
  if (o->scratch) {
    memcpy(q, o->p, o->len);
    scratch_busy = o->scratch = false;
  }
  o->p = q;
  o->cap = cap;
}

void nr__http_out_str(out_t *o, const char *s) { out_put(o, s, strlen(s)); }

void nr__http_out_uint(out_t *o, uint64_t v, unsigned base) {
  char *w = out_reserve(o, 20);
  if (w != NULL)
    o->len = (size_t)(put_uint(w, v, base) - o->p);
}

void nr__http_out_done(out_t *o) {
  if (o->scratch)
    scratch_busy = false;
  else
    free(o->p);
}

/* ---- status lines and headers ------------------------------------------------------ */


/* The status line, and Server unless the user gives it. */
static char *put_line(char *w, int status, const char *reason, unsigned user) {
  w = PUT_LIT(w, "HTTP/1.1 ");
  *w++ = (char)('0' + status / 100 % 10);
  *w++ = (char)('0' + status / 10 % 10);
  *w++ = (char)('0' + status % 10);
  *w++ = ' ';
  reason = reason ? reason : nr_http_reason(status);
  w = put(w, reason, strlen(reason));
  w = PUT_LIT(w, "\r\n");
  if (!(user & U_SERVER))
    w = PUT_LIT(w, "Server: netrun\r\n");
  return w;
}

static char *put_date(char *w, const char *date) {
  w = PUT_LIT(w, "Date: ");
  w = put(w, date, 29);
  return PUT_LIT(w, "\r\n");
}

/* The usual case -- a standard reason, both headers -- is copied from a
 * per-thread prefix rebuilt when the second or the status changes. */
char *nr__http_put_status(char *w, int status, const char *reason,
                          unsigned user) {
  static _Thread_local char prefix[160];
  static _Thread_local size_t prefix_len;
  static _Thread_local int prefix_status;
  static _Thread_local const char *prefix_date;
  static _Thread_local time_t prefix_sec = -1;
  const char *date = nr_http_date();
  bool plain = reason == NULL && !(user & (U_SERVER | U_DATE));
  if (plain && status == prefix_status && date == prefix_date &&
      date_sec == prefix_sec)
    return put(w, prefix, prefix_len);
  char *start = w;
  w = put_line(w, status, reason, user);
  if (!(user & U_DATE))
    w = put_date(w, date);
  if (plain && (size_t)(w - start) <= sizeof prefix) {
    prefix_len = (size_t)(w - start);
    memcpy(prefix, start, prefix_len);
    prefix_status = status;
    prefix_date = date;
    prefix_sec = date_sec;
  }
  return w;
}

unsigned nr__http_user_flags(const nr_http_response_t *r, size_t *room) {
  unsigned u = 0;
  *room = 0;
  for (size_t i = 0; i < r->nheaders; i++) {
    const nr_http_header_t *h = &r->headers[i];
    *room += h->name_len + h->value_len + 4;
    switch (h->name_len) {
    case 4: u |= ieq_lit(h->name, 4, "date") ? U_DATE : 0; break;
    case 6: u |= ieq_lit(h->name, 6, "server") ? U_SERVER : 0; break;
    case 14: u |= ieq_lit(h->name, 14, "content-length") ? U_LENGTH : 0; break;
    case 10:
      if (ieq_lit(h->name, 10, "connection"))
        u |= U_CONN | (nr__http_has_token(h->value, h->value_len, "close", 5) ? U_CLOSE : 0);
      break;
    }
  }
  return u;
}

char *nr__http_put_headers(char *w, const nr_http_response_t *r) {
  for (size_t i = 0; i < r->nheaders; i++) {
    const nr_http_header_t *h = &r->headers[i];
    w = put(w, h->name, h->name_len);
    w = PUT_LIT(w, ": ");
    w = put(w, h->value, h->value_len);
    w = PUT_LIT(w, "\r\n");
  }
  return w;
}

/* ---- prepared responses ------------------------------------------------------------ */

/* A prepared response's bytes are what most writes send as they are: the
 * status line, Server, a Date line (its value is filled in per write,
 * unless the user's headers have a Date), Content-Length, the user's
 * headers, the blank line and the body. Only a Connection line, when one
 * is needed, goes in between (before the blank line); HEAD stops at the
 * blank line. */

/* Room for what nr_http_prepare writes besides the reason, the user's
 * headers and the body: "HTTP/1.1 NNN " and CRLF, Server (16), Date (37),
 * Content-Length (38 at most), the blank line. */
#define PREP_FIXED 112

size_t nr_http_prepared_size(const nr_http_response_t *r) {
  size_t room;
  nr__http_user_flags(r, &room);
  return sizeof(nr_http_prepared_t) + PREP_FIXED +
         strlen(r->reason ? r->reason : nr_http_reason(r->status)) + room +
         r->body_len;
}

void nr_http_prepare(const nr_http_response_t *r, nr_http_prepared_t *out) {
  size_t room;
  unsigned user = nr__http_user_flags(r, &room);
  char *w = out->bytes;
  w = put_line(w, r->status, r->reason, user);
  out->date_at = 0;
  if (!(user & U_DATE)) {
    out->date_at = (uint32_t)(w - out->bytes) + 6;
    w = put_date(w, nr_http_date());
  }
  if (!bodyless_status(r->status) && !(user & U_LENGTH)) {
    w = PUT_LIT(w, "Content-Length: ");
    w = put_uint(w, r->body_len, 10);
    w = PUT_LIT(w, "\r\n");
  }
  w = nr__http_put_headers(w, r);
  out->head_len = (uint32_t)(w - out->bytes);
  w = PUT_LIT(w, "\r\n");
  if (r->body_len > 0)
    memcpy(w, r->body, r->body_len);
  out->body_len = (uint32_t)r->body_len;
  /* what a keep-alive HTTP/1.1 GET gets: every byte but a big body's */
  bool bodyless = bodyless_status(r->status);
  out->plain_len = (user & U_CLOSE) || (!bodyless && r->body_len > SMALL_BODY) ? 0
                   : out->head_len + 2 + (bodyless ? 0 : out->body_len);
  out->type = NR_MSG_HTTP_PREPARED;
  out->status = r->status;
  out->user = user;
}
