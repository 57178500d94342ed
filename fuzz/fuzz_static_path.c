/*
 * fuzz_static_path.c -- the static handler's judges of request bytes
 * (runtime/handler/static_path.c, static_http.c) on arbitrary input.
 *
 * The input is a request path. Invariants of nr_static_path: what it
 * accepts is a relative path with no NUL, no backslash, no empty segment
 * but a trailing one, no "." or ".." segment, of the length it returns
 * -- nothing that could name a file outside the root -- and a refusal is
 * -EPERM or -ENAMETOOLONG. The same bytes as a Range value (against a
 * size drawn from them): every range it gives is inside the file, first
 * <= last, at most max of them, adding up to no more than the file; as
 * Accept-Encoding and entity-tag lists and a date: no crash, q-values in
 * 0..1000.
 */
#include <errno.h>

#include "common.h"
#include "handler/static.h"

static void check_path(const char *d, size_t n) {
  char out[512];
  int k = nr_static_path(d, n, out, sizeof out);
  if (k < 0) {
    FUZZ_ASSERT(k == -EPERM || k == -ENAMETOOLONG);
    return;
  }
  size_t len = (size_t)k;
  FUZZ_ASSERT(len < sizeof out && out[len] == '\0' && strlen(out) == len);
  FUZZ_ASSERT(len == 0 || out[0] != '/');
  FUZZ_ASSERT(strchr(out, '\\') == NULL);
  size_t seg = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && out[i] != '/')
      continue;
    size_t sl = i - seg;
    FUZZ_ASSERT(sl > 0 || i == len);                 /* no "//", no "/" first */
    FUZZ_ASSERT(!(sl == 1 && out[seg] == '.'));
    FUZZ_ASSERT(!(sl == 2 && out[seg] == '.' && out[seg + 1] == '.'));
    seg = i + 1;
  }
}

static void check_ranges(const char *d, size_t n) {
  uint64_t size = n > 0 ? (uint64_t)(unsigned char)d[0] * 37 : 0;
  nr_static_range_t r[8];
  int k = nr_static_ranges(d, n, size, r, 8);
  FUZZ_ASSERT(k >= -1 && k <= 8);
  uint64_t total = 0;
  for (int i = 0; i < k; i++) {
    FUZZ_ASSERT(r[i].first <= r[i].last && r[i].last < size);
    total += r[i].last - r[i].first + 1;
  }
  FUZZ_ASSERT(total <= size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *d = (const char *)data;
  check_path(d, size);
  check_ranges(d, size);
  int q = nr_static_accepts(d, size, "gzip");
  FUZZ_ASSERT(q >= 0 && q <= 1000);
  (void)nr_static_etag_match(d, size, "\"1.2-3\"", true);
  (void)nr_static_parse_date(d, size);
  return 0;
}
