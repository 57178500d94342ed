/*
 * static.h -- the static file handler (DESIGN.md §9.3): files under a root
 * directory answered to the HTTP server codec's requests, after it in a
 * pipeline. Loop thread only, like every handler; the configuration
 * (nr_static_cfg_t) is plain bytes, copied freely between threads.
 *
 * What it serves: GET and HEAD of a regular file beneath the root (or a
 * directory's index), as RFC 9110 says -- strong ETag and Last-Modified,
 * If-Match / If-Unmodified-Since (412), If-None-Match / If-Modified-Since
 * (304), Range with If-Range (206, multipart/byteranges, 416), ".br" /
 * ".gz" siblings by Accept-Encoding (Vary), a MIME type by extension.
 * What it does not serve goes on to the next handler unchanged, as
 * nginx's `try_files $uri $uri/ @app` would: another method, a path that
 * names nothing (or a directory without its index, or something that is
 * not a regular file), a path it refuses (static_path.c). A directory
 * named without its trailing slash is answered 301 to the slash.
 *
 * Bodies: a small one (up to NR_STATIC_SMALL) is read whole and goes with
 * the response; a larger one follows the head as a sized stream, at most
 * max_chunk bytes a connection per loop turn and only while the channel
 * is writable: as file regions (sendfile) on a plain connection, read
 * into a buffer of the loop's (pread) through TLS or HTTP/2. Files are
 * opened through a per-loop cache (static_cache.c).
 */
#ifndef NR_HANDLER_STATIC_H
#define NR_HANDLER_STATIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "netrun.h"

#define NR_STATIC_ROOT_MAX 1024
#define NR_STATIC_INDEX_MAX 128
#define NR_STATIC_SMALL 32768            /* bodies read whole, at once */
#define NR_STATIC_MAX_CHUNK (2u << 20)   /* per connection per loop turn */
#define NR_STATIC_MAX_RANGES 64          /* more: the whole file (nginx's
                                            max_ranges) */
#define NR_STATIC_CACHE_MAX 1000
#define NR_STATIC_CACHE_VALID NR_SEC(60)

typedef struct nr_static_cfg_s {
  char root[NR_STATIC_ROOT_MAX];   /* a directory (made absolute) */
  char index[NR_STATIC_INDEX_MAX]; /* a directory's file ("": none) */
  bool precompressed;              /* look for .br / .gz siblings */
  bool follow_symlinks;            /* false: none may lead out of root */
  uint32_t cache_max;              /* open files kept per loop (0: none) */
  uint64_t cache_valid;            /* ns an entry is trusted */
  size_t max_chunk;                /* bytes per connection per turn */
  uint32_t max_ranges;             /* ranges in one request */
  bool no_sendfile;                /* (tests and benchmarks) pread always */
} nr_static_cfg_t;

/* Fill c with the defaults (root "." and index "index.html"). */
void nr_static_cfg_init(nr_static_cfg_t *c);

/* A handler state for nr_static_handler (freed by its removed()), or
 * NULL (out of memory). */
void *nr_static_new(const nr_static_cfg_t *c);
extern const nr_handler_t nr_static_handler;

/* ---- paths (static_path.c) ------------------------------------------------ */

/* The request path (the codec's normalized one, starting with '/') as a
 * path relative to the root, into out (size n): percent-escapes decoded;
 * refused (-EPERM) when it has NUL, a backslash, an encoded '/', a "." or
 * ".." segment, or an empty one in its middle, or does not start with
 * '/'; -ENAMETOOLONG past n. The length written (0 for the root itself,
 * out then ""), a trailing slash kept. */
int nr_static_path(const char *path, size_t len, char *out, size_t n);

/* Open rel (from nr_static_path) beneath the directory dirfd: read-only,
 * never leaving it -- no "..", no absolute symlink, and with
 * follow_symlinks false no symlink that resolves outside it (openat2's
 * RESOLVE_BENEATH; where the kernel has no openat2, no symlink at all).
 * The descriptor, or -errno (-ENOENT, -EXDEV for a way out, -ELOOP ...). */
int nr_static_open(int dirfd, const char *rel, bool follow_symlinks);

/* The MIME type for a file name, by its extension (case ignored);
 * "application/octet-stream" when unknown. */
const char *nr_static_mime(const char *name, size_t len);

/* ---- the HTTP rules (static_http.c) ----------------------------------------- */

typedef struct nr_static_range_s {
  uint64_t first, last;            /* inclusive */
} nr_static_range_t;

/* Parse a Range value against a representation of `size` bytes into
 * r[0 .. max): the count of satisfiable ranges (> 0), 0 to ignore the
 * header (not "bytes=", bad syntax, more than max ranges, or ranges
 * adding up to more than the file: nginx's answers), or -1 for 416 (none
 * satisfiable, or a number too large to hold). */
int nr_static_ranges(const char *v, size_t n, uint64_t size,
                     nr_static_range_t *r, int max);

/* The q-value the Accept-Encoding value v gives coding (0 .. 1000;
 * "*" counts for codings not named; none: 0). */
int nr_static_accepts(const char *v, size_t n, const char *coding);

/* Whether the entity-tag list v (If-Match / If-None-Match) has etag: "*"
 * matches any; weak compares W/ tags by their opaque part, strong refuses
 * them. */
bool nr_static_etag_match(const char *v, size_t n, const char *etag,
                          bool weak);

/* An HTTP-date (IMF-fixdate, RFC 850 or asctime) as seconds since the
 * epoch, or -1. */
int64_t nr_static_parse_date(const char *v, size_t n);
/* Seconds since the epoch as an IMF-fixdate into out (30 bytes). */
void nr_static_format_date(int64_t t, char *out);

#endif /* NR_HANDLER_STATIC_H */
