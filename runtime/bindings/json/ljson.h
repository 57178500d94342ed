/*
 * ljson.h -- what ljson.c (encoding, settings, the codec table) and
 * ljson_decode.c (decoding) share: the process-wide settings and the
 * per-state scratch buffer. Private to the json module.
 */
#ifndef LJSON_H
#define LJSON_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "lnr.h"

/* ---- settings ------------------------------------------------------ */

enum { INVALID_RAISE, INVALID_ALLOW, INVALID_NULL };

struct lnr_json_cfg {
  atomic_int encode_max_depth, decode_max_depth;
  atomic_int encode_invalid;          /* INVALID_* */
  atomic_bool decode_invalid;         /* NaN, Infinity, -Infinity accepted */
  atomic_bool sparse_convert;         /* excessively sparse: an object */
  atomic_int sparse_ratio, sparse_safe;
  atomic_int precision;               /* 0: shortest that round-trips */
  atomic_bool empty_table_as_object;
  atomic_bool array_mt;               /* decoded arrays get array_mt */
};
extern struct lnr_json_cfg lnr_json_cfg;

#define GET(f) atomic_load_explicit(&lnr_json_cfg.f, memory_order_relaxed)
#define SET(f, v) atomic_store_explicit(&lnr_json_cfg.f, (v), memory_order_relaxed)

/* The empty_array sentinel: a light userdata that is the same value in
 * every state (as null is), so it crosses states by name. */
extern const char lnr_json_empty_array;
#define EMPTY_ARRAY lnr_json_empty_array

/* ---- the scratch buffer --------------------------------------------- */

#define SCRATCH_KEEP (64 * 1024)

typedef struct jbuf_s {
  char *p;
  size_t len, cap;
  lua_Alloc alloc;
  void *ud;
} jbuf_t;

/* Room for n more bytes, or false (out of memory, or past SIZE_MAX/2). */
bool lnr_jbuf_reserve_slow(jbuf_t *b, size_t n);

static inline bool reserve(jbuf_t *b, size_t n) {
  return b->cap - b->len >= n || lnr_jbuf_reserve_slow(b, n);
}

/* After a call: a buffer grown past SCRATCH_KEEP is given back. */
static inline void jbuf_reset(jbuf_t *b) {
  b->len = 0;
  if (b->cap > SCRATCH_KEEP) {
    b->alloc(b->ud, b->p, b->cap, 0);
    b->p = NULL;
    b->cap = 0;
  }
}

/* The powers of ten a double holds exactly (numbers to text and back). */
static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
                               1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
                               1e20, 1e21, 1e22};

/* The upvalues of encode and decode. */
#define SCRATCH lua_upvalueindex(1)
#define ARRAY_MT lua_upvalueindex(2)

/* json.decode(text), a closure over the scratch buffer and array_mt. */
int lnr_json_decode(lua_State *L);

#endif
