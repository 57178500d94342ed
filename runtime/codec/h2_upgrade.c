/*
 * h2_upgrade.c -- HTTP/1.1's `Upgrade: h2c` (RFC 7540 3.2) for the HTTP/2
 * server session (h2.h): the HTTP2-Settings the request carried are
 * applied, and the request that asked becomes stream 1, half-closed by
 * the client, owed an answer like any stream h2_server.c delivers. Loop
 * thread only, like the session. (Apart from h2_server.c, which it would
 * take past 900 lines.)
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "codec/h2_internal.h"

static int b64url(int c) {
  return c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26
         : c >= '0' && c <= '9' ? c - '0' + 52 : c == '-' || c == '+' ? 62
         : c == '_' || c == '/' ? 63 : -1;
}

int nr_h2_server_upgrade(nr_h2_server_t *h, const char *v, size_t n,
                         bool head) {
  uint8_t out[256];            /* 6 bytes a setting; 42 settings at most */
  size_t o = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n && v[i] != '='; i++) {
    int d = b64url((unsigned char)v[i]);
    if (d < 0 || o == sizeof out)
      return -EINVAL;
    acc = acc << 6 | (uint32_t)d;
    if ((bits += 6) >= 8) {
      bits -= 8;
      out[o++] = (uint8_t)(acc >> bits);
    }
  }
  if (nghttp2_session_upgrade2(h->ng, out, o, head, NULL) != 0)
    return -EINVAL;
  h2s_t *s = nr_h2_alloc(sizeof *s);
  if (s == NULL)
    return -ENOMEM;
  memset(s, 0, offsetof(h2s_t, f));
  nr__h2_fields_init(&s->f);
  s->id = 1;
  s->head = head;
  s->st = S_OWED;
  nghttp2_session_set_stream_user_data(h->ng, 1, s);
  h->records++;
  return 0;
}

void nr_h2_server_deliver_upgraded(nr_h2_server_t *h, void *msg) {
  nr_http_request_t *req = msg;
  h2s_t *s = nghttp2_session_get_stream_user_data(h->ng, 1);
  if (s == NULL)
    return;
  nr__h2_list_push(&h->owed, s);
  if (h->owing++ == 0)
    nr_channel_hold(nr_ctx_channel(h->ctx));
  s->counted = true;
  s->token = ++h->delivered;
  req->stream = 1;
  req->token = s->token;
  req->pipeline = nr_ctx_pipeline(h->ctx);
  h->cur = s;
  nr_ctx_fire_read_tokened(h->ctx, req, s->token, false);
  if (h->cur == s)
    h->cur = NULL;
}
