/*
 * transfer.h -- what transfer.c (packing, the prototype registry, blobs)
 * and unpack.c (unpacking) share: the blob's tags and an interned
 * prototype. Private to the transfer module.
 */
#ifndef LNR_TRANSFER_H
#define LNR_TRANSFER_H

#include <stdint.h>

#include "lnr.h"

/* A blob's value tags. */
enum {
  T_NIL, T_FALSE, T_TRUE, T_INT, T_FLT, T_STR, T_TABLE, T_TABLE_MT, T_END,
  T_REF, T_FUNC, T_GLOBALS, T_MODULE, T_HANDLE, T_NATIVE,
  T_UPJOIN,            /* only in a function's upvalue list: ref id, index */
  T_TABLE_META         /* a table, then after its T_END its metatable */
};

/* A function's bytecode, interned once per process (transfer.c): blobs
 * carry a reference to it, destinations cache one closure per id. */
typedef struct proto_s {
  struct proto_s *next;
  _Atomic int refs;          /* source caches and blobs; 0: being freed */
  uint64_t id;               /* never reused: the destinations' cache key */
  uint64_t hash;
  size_t len;
  char data[];
} proto_t;

/* An empty blob, or NULL (out of memory). */
lnr_blob_t *lnr_transfer_blob_new(void);

#endif
