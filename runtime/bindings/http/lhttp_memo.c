/*
 * lhttp_memo.c -- the response memo: a response table written again and
 * again (the same status and header strings) is sent from a prepared
 * response, with no conversion, check or encoding of its head per write.
 * Loop thread only, one memo per state (lnr_http_part_t.memo).
 *
 * Every write still reads the table's five fields and walks its headers
 * table: a table may change between writes, and nothing but reading it
 * tells. What the memo saves is the rest: no header string is converted
 * or checked, and the head's bytes are copied as they were encoded once.
 *
 * A response matches the memo when its status and headers are the very
 * strings the memo was made from, compared by address (lua_topointer),
 * and its headers walk in the same order. The memo anchors those strings
 * (in a table, its user value) for as long as it holds them: while
 * anchored no other string can have their addresses, so an equal address
 * is that string, immutable, checked when the memo was made. A number, an
 * array of values, a reason or a stream never match (the memo holds none).
 *
 * Its body too, when it is the memo's string: then the prepared response
 * is sent as it is. Another body (a string up to SMALL_BODY, or none) is
 * sent with the memo's head: the head's bytes with its Content-Length
 * line made for that body, then the body, assembled in the memo's second
 * buffer (with_body) -- what write_response would encode, as the prepared
 * form is. A head is kept for other bodies only when netrun frames its
 * body: none whose user headers have a Content-Length (the user's, sent
 * as given: never taken for netrun's line and rewritten for another body)
 * or a Transfer-Encoding; a bodyless status (1xx, 204, 304) sends no body
 * and no length, so any body gets its prepared response as it is.
 *
 * The memo is filled from a response that passed the write's checks, on
 * the second write in a row of the same head: a cheap hint by address
 * alone (lnr_http_part_t.memo_hint, lhttp.h) remembers the first, so
 * responses that differ every time pay only the hint and never fill it; one it cannot hold (a number among its values, say) is not
 * tried twice for the same hint. (A state's first such write makes the
 * memo, allocating; the next fills it, which allocates nothing, so no
 * finalizer can change the table while it is walked.) Its bytes are
 * those write_response would encode (http_server.c puts a Connection line
 * in the same place in both), and a hit is written as any prepared
 * response: in place for a keep-alive GET, through write_prepared else.
 */
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "codec/http_encode.h"
#include "lhttp.h"

/* What a memo holds at most: header fields, and the bytes of its prepared
 * response (head and body). A head sent with another body has room for
 * the head, a Content-Length of 20 digits and SMALL_BODY bytes of body. */
#define MEMO_FIELDS 8
#define MEMO_BYTES 2048
#define OTHER_BYTES (MEMO_BYTES + 24 + SMALL_BODY)

struct lnr_http_memo_s {
  bool valid;
  uint64_t refused;           /* the hint of a response it cannot hold */
  uint64_t hint;              /* the hint of the response it holds */
  int status;
  const void *body;           /* the body string; NULL: no body */
  unsigned n;                 /* header fields */
  const void *id[2 * MEMO_FIELDS];  /* name, value strings */
  bool heads;                 /* its head may go with another body */
  uint32_t length_at;         /* its Content-Length line, in its bytes */
  uint32_t length_end;        /* where that line's CRLF is */
  _Alignas(nr_http_prepared_t)  /* (a userdata is aligned as a pointer) */
  char room[sizeof(nr_http_prepared_t) + MEMO_BYTES];
  _Alignas(nr_http_prepared_t)  /* its head with another body */
  char other[sizeof(nr_http_prepared_t) + OTHER_BYTES];
};

static const nr_http_prepared_t *prepared(const lnr_http_memo_t *m) {
  return (const nr_http_prepared_t *)m->room;
}

/* The memo's head with the body at i (a string, or none), assembled in
 * m->other; NULL when the body is too long for it. */
static const nr_http_prepared_t *with_body(lua_State *L, lnr_http_memo_t *m,
                                           int i) {
  const nr_http_prepared_t *pr = prepared(m);
  if (bodyless_status(pr->status))
    return pr;                  /* neither body nor length is sent */
  size_t blen = 0;
  const char *body = lua_isnil(L, i) ? NULL : lua_tolstring(L, i, &blen);
  if (blen > SMALL_BODY)
    return NULL;
  nr_http_prepared_t *o = (nr_http_prepared_t *)m->other;
  memcpy(o, pr, sizeof *o);     /* type, status, user, date_at */
  char *w = put(o->bytes, pr->bytes, m->length_at);
  w = PUT_LIT(w, "Content-Length: ");
  w = put_uint(w, blen, 10);
  w = put(w, pr->bytes + m->length_end, pr->head_len + 2 - m->length_end);
  o->head_len = (uint32_t)(w - o->bytes) - 2;
  if (blen > 0)
    w = put(w, body, blen);
  o->body_len = (uint32_t)blen;
  o->plain_len = o->user & U_CLOSE ? 0 : (uint32_t)(w - o->bytes);
  return o;
}

const nr_http_prepared_t *lnr_http_memo_hit(lua_State *L, lnr_http_memo_t *m,
                                            int base, const int *t) {
  if (!m->valid || t[LNR_RF_REASON] != LUA_TNIL ||
      t[LNR_RF_STREAM] != LUA_TNIL)
    return NULL;
  if (t[LNR_RF_STATUS] == LUA_TNIL ? m->status != 200
      : !lua_isinteger(L, base + LNR_RF_STATUS) ||
        lua_tointeger(L, base + LNR_RF_STATUS) != m->status)
    return NULL;
  bool same;                    /* the memo's body, or another */
  if (t[LNR_RF_BODY] == LUA_TNIL)
    same = m->body == NULL;
  else if (t[LNR_RF_BODY] == LUA_TSTRING)
    same = lua_topointer(L, base + LNR_RF_BODY) == m->body;
  else
    return NULL;
  if (!same && !m->heads)
    return NULL;
  if (t[LNR_RF_HEADERS] != LUA_TTABLE) {
    if (t[LNR_RF_HEADERS] != LUA_TNIL || m->n != 0)
      return NULL;
  } else {
    int hidx = base + LNR_RF_HEADERS;
    unsigned i = 0;
    lua_pushnil(L);
    while (lua_next(L, hidx)) {                /* name, value */
      if (i == m->n || lua_topointer(L, -2) != m->id[2 * i] ||
          lua_topointer(L, -1) != m->id[2 * i + 1]) {
        lua_settop(L, hidx);
        return NULL;
      }
      lua_pop(L, 1);
      i++;
    }
    if (i != m->n)
      return NULL;
  }
  return same ? prepared(m) : with_body(L, m, base + LNR_RF_BODY);
}

/* Made once per state, protected (an allocation may fail): the memo, its
 * anchor table, its slot. */
static int make_memo(lua_State *L) {
  lnr_http_memo_t *m = lua_newuserdatauv(L, sizeof *m, 1);
  memset(m, 0, sizeof *m);
  lua_createtable(L, 1 + 2 * MEMO_FIELDS, 0);  /* filled in place: no
                                                  allocation later */
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, -1);
  lnr_set_ref(L, &lnr_http_part(L)->memo_ref);
  return 1;
}

/* The strings of the headers table at hidx, in walk order, into id (and
 * anchored in the table at anchors from index 2 on, when anchors is not
 * 0): their number, or -1 when one is not a string or not the one r was
 * converted from (nothing here allocates, so no finalizer runs; a
 * conversion's allocation before may have run one). */
static int header_ids(lua_State *L, int hidx, const nr_http_response_t *r,
                      const void **id, int anchors) {
  int n = 0;
  lua_pushnil(L);
  while (lua_next(L, hidx)) {                  /* name, value */
    if ((size_t)n == r->nheaders || lua_type(L, -2) != LUA_TSTRING ||
        lua_type(L, -1) != LUA_TSTRING ||
        lua_tostring(L, -2) != r->headers[n].name ||
        lua_tostring(L, -1) != r->headers[n].value) {
      lua_pop(L, 2);
      return -1;
    }
    id[2 * n] = lua_topointer(L, -2);
    id[2 * n + 1] = lua_topointer(L, -1);
    if (anchors != 0) {
      lua_rawseti(L, anchors, 2 * n + 3);
      lua_pushvalue(L, -1);
      lua_rawseti(L, anchors, 2 * n + 2);
    } else {
      lua_pop(L, 1);
    }
    n++;
  }
  return n;
}

/* Where m's prepared response has its Content-Length line, and whether
 * its head may go with another body (see the header comment). */
static void find_length(lnr_http_memo_t *m, const nr_http_response_t *r) {
  static const char line[] = "\r\nContent-Length: ";
  const nr_http_prepared_t *pr = prepared(m);
  m->heads = !(pr->user & U_LENGTH);
  for (size_t i = 0; i < r->nheaders; i++)
    if (r->headers[i].name_len == 17 &&
        strncasecmp(r->headers[i].name, "transfer-encoding", 17) == 0)
      m->heads = false;
  if (!m->heads || bodyless_status(pr->status))
    return;
  /* the first such line: the status line and Server come before it, and
   * no field value holds a CR */
  m->heads = false;
  for (uint32_t at = 0; at + sizeof line - 1 <= pr->head_len; at++)
    if (memcmp(pr->bytes + at, line, sizeof line - 1) == 0) {
      const char *end = memchr(pr->bytes + at + 2, '\r', pr->head_len - at - 2);
      if (end == NULL)
        return;
      m->length_at = at + 2;
      m->length_end = (uint32_t)(end - pr->bytes);
      m->heads = true;
      return;
    }
}

/* Remake m, at mi, from the response r whose fields are at base (types
 * t): its strings, anchored, and its bytes. false, m left as it was,
 * when r holds what a memo does not (a number or an array of values) or
 * is not what its table holds now. */
static bool remake(lua_State *L, lnr_http_memo_t *m, int mi, int base,
                   const int *t, const nr_http_response_t *r, uint64_t hint) {
  const void *id[2 * MEMO_FIELDS];
  int hidx = base + LNR_RF_HEADERS, n = 0;
  if (t[LNR_RF_BODY] == LUA_TSTRING &&
      lua_tostring(L, base + LNR_RF_BODY) != r->body)
    return false;
  if (t[LNR_RF_HEADERS] == LUA_TTABLE &&
      (n = header_ids(L, hidx, r, id, 0)) != (int)r->nheaders)
    return false;
  /* it holds: the old strings let go, the new ones anchored */
  m->valid = false;
  lua_getiuservalue(L, mi, 1);
  int anchors = lua_gettop(L);
  if (n > 0)
    header_ids(L, hidx, r, m->id, anchors);
  for (int i = 2 * n + 2; i <= 1 + 2 * MEMO_FIELDS; i++) {
    lua_pushnil(L);
    lua_rawseti(L, anchors, i);
  }
  m->body = NULL;
  if (t[LNR_RF_BODY] == LUA_TSTRING) {
    lua_pushvalue(L, base + LNR_RF_BODY);
    m->body = lua_topointer(L, -1);
  } else {
    lua_pushnil(L);
  }
  lua_rawseti(L, anchors, 1);
  lua_pop(L, 1);
  m->n = (unsigned)n;
  m->status = r->status;
  m->hint = hint;
  nr_http_prepare(r, (nr_http_prepared_t *)m->room);
  find_length(m, r);
  m->valid = true;
  return true;
}

void lnr_http_memo_offer(lua_State *L, lnr_http_part_t *P, int base,
                         const int *t, const nr_http_response_t *r) {
  lnr_http_memo_t *m = P->memo;
  /* what lnr_http_memo_hit can match: no reason, no stream (not even
   * false), a body that is a string or none */
  if (t[LNR_RF_REASON] != LUA_TNIL || t[LNR_RF_STREAM] != LUA_TNIL ||
      (t[LNR_RF_BODY] != LUA_TNIL && t[LNR_RF_BODY] != LUA_TSTRING) ||
      r->status < 100 || r->status > 999 || r->nheaders > MEMO_FIELDS ||
      r->body_len > MEMO_BYTES || (m != NULL && m->refused == P->memo_hint))
    return;
  /* its head already, kept for its own body only (a Content-Length or
   * Transfer-Encoding of the user's): another body is not remade for,
   * write after write */
  if (m != NULL && m->valid && !m->heads && m->hint == P->memo_hint)
    return;
  /* too many bytes with this body, not refused: the hint leaves it out */
  if (nr_http_prepared_size(r) > sizeof m->room)
    return;
  if (!lua_checkstack(L, 6))                  /* remake's 5 at most */
    return;
  if (m == NULL) {          /* the first: made, filled by the next offer */
    lua_pushcfunction(L, make_memo);
    if (lua_pcall(L, 0, 1, 0) == LUA_OK)
      P->memo = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return;
  }
  lnr_push_ref(L, &P->memo_ref);
  if (!remake(L, m, lua_gettop(L), base, t, r, P->memo_hint))
    m->refused = P->memo_hint;        /* not again for the same hint */
  lua_pop(L, 1);
}
