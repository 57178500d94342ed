/*
 * harness.h -- shared driver of the frame-decoder fuzz targets.
 *
 * Each target turns the first bytes of the input into a codec
 * configuration and feeds the rest through that codec in a real pipeline
 * (an embedded channel on an external loop): once in one piece and once in
 * chunks whose sizes come from a generator seeded by the input. Invariants:
 *  - both runs yield the same frames and the same number of errors (the
 *    result never depends on how the stream was split);
 *  - every frame is within the codec's limit (target's check_frame);
 *  - the bytes a decoder keeps stay bounded after every read (max_held).
 * A violation aborts, which libFuzzer reports with the input.
 */
#ifndef NR_FUZZ_HARNESS_H
#define NR_FUZZ_HARNESS_H

#include "codec/codec.h"
#include "common.h"

typedef struct fuzz_out_s {
  char *bytes;               /* frames, each as 8-byte length + data */
  size_t len, cap, frames;
  int errors;
} fuzz_out_t;

/* Provided by each target, which defines struct fuzz_cfg_s before
 * including this file. The config consumes bytes from the front. */
typedef struct fuzz_cfg_s fuzz_cfg_t;
static size_t fuzz_config(fuzz_cfg_t *cfg, const uint8_t *data, size_t size);
static const nr_handler_t *fuzz_handler(const fuzz_cfg_t *cfg, void **state);
static void check_frame(const fuzz_cfg_t *cfg, const char *f, size_t len);
static size_t max_held(const fuzz_cfg_t *cfg, size_t chunk);

static void out_add(fuzz_out_t *o, const void *p, size_t n) {
  fuzz_append(&o->bytes, &o->len, &o->cap, p, n);
}

static const fuzz_cfg_t *cur_cfg;

static void on_inbound(void *ud, void *msg) {
  fuzz_out_t *o = ud;
  FUZZ_ASSERT(nr_msg_type(msg) == NR_MSG_BYTES);
  const nr_bytes_t *b = msg;
  check_frame(cur_cfg, b->data, b->len);
  uint64_t n = b->len;
  out_add(o, &n, sizeof n);
  out_add(o, b->data, b->len);
  o->frames++;
}

static void on_exception(void *ud, const nr_err_t *err) {
  fuzz_out_t *o = ud;
  FUZZ_ASSERT(err->code != 0 && err->msg != NULL);
  o->errors++;
}

/* Feed data in chunks (chunk sizes from seed; seed 0: one piece). */
static void run(const fuzz_cfg_t *cfg, const uint8_t *data, size_t size,
                uint32_t seed, fuzz_out_t *o) {
  nr_embedded_sink_t sink = {on_inbound, NULL, on_exception, o};
  nr_embedded_t *e = nr_embedded_new(fuzz_loop(), &sink);
  FUZZ_ASSERT(e != NULL);
  void *state = NULL;
  const nr_handler_t *h = fuzz_handler(cfg, &state);
  nr_pipeline_t *p = nr_channel_pipeline(nr_embedded_channel(e));
  FUZZ_ASSERT(nr_pipeline_add_last(p, "dec", h, state) == 0);
  nr_embedded_start(e);
  nr_decoder_t *d = nr_ctx_state(nr_pipeline_context(p, "dec"));
  size_t off = 0;
  while (off < size) {
    size_t n = fuzz_chunk(&seed, size - off);
    nr_bytes_t b = NR_BYTES((const char *)data + off, n);
    nr_embedded_write_inbound(e, &b, true);
    FUZZ_ASSERT(nr_decoder_buffered(d) <= max_held(cfg, n));
    off += n;
  }
  nr_embedded_free(e);          /* channel_inactive: the end of input */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_cfg_t cfg;
  size_t used = fuzz_config(&cfg, data, size);
  if (used > size)
    return 0;
  data += used;
  size -= used;
  cur_cfg = &cfg;
  fuzz_out_t whole = {0}, split = {0};
  run(&cfg, data, size, 0, &whole);
  run(&cfg, data, size, fuzz_seed(data, size), &split);
  FUZZ_ASSERT(whole.frames == split.frames);
  FUZZ_ASSERT(whole.len == split.len);
  FUZZ_ASSERT(whole.len == 0 || memcmp(whole.bytes, split.bytes, whole.len) == 0);
  FUZZ_ASSERT(whole.errors == split.errors);
  free(whole.bytes);
  free(split.bytes);
  return 0;
}

#endif /* NR_FUZZ_HARNESS_H */
