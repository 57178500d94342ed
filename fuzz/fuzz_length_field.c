/*
 * fuzz_length_field.c -- libFuzzer target for the length-field decoder
 * (see harness.h). Config bytes: offset, length, adjustment, strip,
 * max_frame.
 */
#include "codec/codec.h"

struct fuzz_cfg_s {
  nr_lenfield_t f;
};

#include "harness.h"


static size_t fuzz_config(fuzz_cfg_t *c, const uint8_t *d, size_t n) {
  static const size_t lengths[] = {1, 2, 3, 4, 8};
  if (n < 4)
    return 4;
  memset(c, 0, sizeof *c);
  c->f.offset = d[0] & 3;
  c->f.length = lengths[(d[0] >> 2) % 5];
  c->f.adjustment = (int8_t)d[1] % 9;
  size_t hdr = c->f.offset + c->f.length;
  c->f.strip = d[2] % (hdr + 3);
  c->f.max_frame = hdr + d[3];
  return 4;
}

static const nr_handler_t *fuzz_handler(const fuzz_cfg_t *c, void **st) {
  *st = nr_lenfield_new(&c->f);
  return &nr_lenfield_handler;
}

static void check_frame(const fuzz_cfg_t *c, const char *f, size_t len) {
  (void)f;
  FUZZ_ASSERT(len + c->f.strip <= c->f.max_frame);
}

static size_t max_held(const fuzz_cfg_t *c, size_t chunk) {
  (void)chunk;
  return c->f.max_frame;
}
