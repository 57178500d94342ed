/*
 * fuzz_delimiter.c -- libFuzzer target for the delimiter decoder (see
 * harness.h). Config byte 0: max_length (1..64) and strip; byte 1 picks a
 * delimiter set, overlapping ones included.
 */
#include "codec/codec.h"

struct fuzz_cfg_s {
  size_t max, longest;
  bool strip;
  int set;
};

#include "harness.h"

static const struct {
  int n;
  const char *d[3];
} sets[] = {
    {1, {"\n"}},           {1, {"\r\n"}},         {2, {"\r\n", "\n"}},
    {2, {"ab", "b"}},      {3, {"abc", "b", "bc"}}, {2, {"\n\n", "\n"}},
    {2, {"aab", "ab"}},    {1, {"abab"}},
};
#define NSETS ((int)(sizeof sets / sizeof sets[0]))


static size_t fuzz_config(fuzz_cfg_t *c, const uint8_t *d, size_t n) {
  if (n < 2)
    return 2;
  c->max = 1 + (d[0] & 63);
  c->strip = d[0] & 64;
  c->set = d[1] % NSETS;
  c->longest = 0;
  for (int i = 0; i < sets[c->set].n; i++)
    if (strlen(sets[c->set].d[i]) > c->longest)
      c->longest = strlen(sets[c->set].d[i]);
  return 2;
}

static const nr_handler_t *fuzz_handler(const fuzz_cfg_t *c, void **st) {
  size_t lens[3];
  for (int i = 0; i < sets[c->set].n; i++)
    lens[i] = strlen(sets[c->set].d[i]);
  *st = nr_delim_new(sets[c->set].d, lens, sets[c->set].n, c->max, c->strip);
  return &nr_delim_handler;
}

static void check_frame(const fuzz_cfg_t *c, const char *f, size_t len) {
  (void)f;
  FUZZ_ASSERT(len <= c->max + (c->strip ? 0 : c->longest));
}

/* A frame within the limit plus a partial delimiter, or one read held
 * while a longer delimiter may still complete. */
static size_t max_held(const fuzz_cfg_t *c, size_t chunk) {
  return c->max + 2 * c->longest + (chunk > 64 ? chunk : 64);
}
