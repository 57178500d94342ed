/*
 * fuzz_line.c -- libFuzzer target for the line decoder (see harness.h).
 * Config byte 0: max_length (1..64) and strip.
 */
#include "codec/codec.h"

struct fuzz_cfg_s {
  size_t max;
  bool strip;
};

#include "harness.h"


static size_t fuzz_config(fuzz_cfg_t *c, const uint8_t *d, size_t n) {
  if (n < 1)
    return 1;
  c->max = 1 + (d[0] & 63);
  c->strip = d[0] & 64;
  return 1;
}

static const nr_handler_t *fuzz_handler(const fuzz_cfg_t *c, void **st) {
  *st = nr_line_new(c->max, c->strip);
  return &nr_line_handler;
}

static void check_frame(const fuzz_cfg_t *c, const char *f, size_t len) {
  if (c->strip) {
    FUZZ_ASSERT(len <= c->max);
    FUZZ_ASSERT(memchr(f, '\n', len) == NULL);
  } else {
    FUZZ_ASSERT(len >= 1 && f[len - 1] == '\n');
    FUZZ_ASSERT(len <= c->max + 2);
    FUZZ_ASSERT(memchr(f, '\n', len - 1) == NULL);
  }
}

/* A partial line is kept only while it is within the limit ("\r" aside). */
static size_t max_held(const fuzz_cfg_t *c, size_t chunk) {
  (void)chunk;
  return c->max + 1;
}
