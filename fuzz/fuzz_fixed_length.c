/*
 * fuzz_fixed_length.c -- libFuzzer target for the fixed-length decoder
 * (see harness.h). Config byte 0: the length (1..64).
 */
#include "codec/codec.h"

struct fuzz_cfg_s {
  size_t length;
};

#include "harness.h"


static size_t fuzz_config(fuzz_cfg_t *c, const uint8_t *d, size_t n) {
  if (n < 1)
    return 1;
  c->length = 1 + (d[0] & 63);
  return 1;
}

static const nr_handler_t *fuzz_handler(const fuzz_cfg_t *c, void **st) {
  *st = nr_fixed_new(c->length);
  return &nr_fixed_handler;
}

static void check_frame(const fuzz_cfg_t *c, const char *f, size_t len) {
  (void)f;
  FUZZ_ASSERT(len == c->length);
}

static size_t max_held(const fuzz_cfg_t *c, size_t chunk) {
  (void)chunk;
  return c->length - 1;
}
