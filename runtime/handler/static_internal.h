/*
 * static_internal.h -- what the static handler's files share: the open
 * file cache (static_cache.c). Loop thread only.
 *
 * A cache is per loop and per configuration (root, symlink rule, size,
 * validity): the handlers of a loop's connections share it, each holding
 * a reference. An entry is a path relative to the root and what opening
 * it gave: an open descriptor and its fstat (a regular file), a directory
 * (no descriptor), or an error (ENOENT ...: negative entries spare the
 * .br / .gz lookups of every request). Entries are trusted for `valid`
 * ns, then opened afresh; the least recently used goes past `max`. An
 * entry is reference counted: a response being sent keeps its descriptor
 * open after eviction. The loop's shutdown empties the cache (its
 * descriptors close as the last response using each ends).
 */
#ifndef NR_HANDLER_STATIC_INTERNAL_H
#define NR_HANDLER_STATIC_INTERNAL_H

#include "handler/static.h"

typedef struct nr__sfile_s nr__sfile_t;
struct nr__sfile_s {
  int fd;                     /* a regular file's, else -1 */
  int err;                    /* 0, or the open's / fstat's -errno */
  bool dir;
  uint64_t size;
  int64_t mtime;              /* seconds */
  char etag[48];              /* strong: "mtime.ns-size" in hex, quoted */
  char lastmod[30];
  uint64_t born;              /* nr_now() at the open */
  unsigned refs;
  bool cached;                /* in the cache's table (holds a reference) */
  nr__sfile_t *hnext;         /* hash chain */
  nr__sfile_t *prev, *next;   /* LRU list: most recent first */
  uint32_t hash;
  size_t klen;
  char key[];
};

typedef struct nr__scache_s nr__scache_t;

/* The cache of the calling loop for c, made on first use (retained);
 * NULL when out of memory or the root cannot be opened (*err). */
nr__scache_t *nr__scache_get(const nr_static_cfg_t *c, int *err);
void nr__scache_release(nr__scache_t *k);
/* A buffer of NR__SCACHE_BUF bytes of the cache's (so of its loop), for
 * reading pieces of files into; NULL when out of memory. */
#define NR__SCACHE_BUF 65536
char *nr__scache_buf(nr__scache_t *k);
const nr_static_cfg_t *nr__scache_cfg(const nr__scache_t *k);

/* The entry for rel (len bytes, no NUL needed), opened now if the cache
 * has none that is valid; retained for the caller. NULL: out of memory. */
nr__sfile_t *nr__scache_open(nr__scache_t *k, const char *rel, size_t len);
/* Forget the entry (its file changed under a response). */
void nr__scache_forget(nr__scache_t *k, nr__sfile_t *f);
void nr__sfile_release(nr__sfile_t *f);

#endif /* NR_HANDLER_STATIC_INTERNAL_H */
