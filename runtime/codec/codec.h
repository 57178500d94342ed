/*
 * codec.h -- frame codecs (Netty's handler.codec): a generic decoder base
 * (ByteToMessageDecoder) and the core frame decoders built on it, each a
 * pure step function over bytes so that tests and fuzzers can drive it
 * without a pipeline. Loop thread only: a decoder belongs to one context.
 *
 * Writing a decoder on the base:
 *
 *   typedef struct my_s { nr_decoder_t base; ...my state... } my_t;
 *   static int my_step(nr_decoder_t *d, nr_ctx_t *ctx, const char *data,
 *                      size_t len, size_t *consumed) { ... }
 *   static const nr_handler_t my_vt = NR_DECODER_HANDLER("my");
 *   my_t *s = calloc(1, sizeof *s); nr_decoder_init(&s->base, "my", my_step);
 *   nr_pipeline_add_last(p, "my", &my_vt, s);    // the base frees s
 *
 * The step contract:
 *  - `data` always starts at the first byte not yet consumed, so a step that
 *    returned "need more" (0 consumed) is called again with the same bytes
 *    and then some: it may remember how far it already scanned.
 *  - It fires what it decoded with nr_ctx_fire_read(ctx, msg) (a frame is
 *    usually an nr_bytes_t pointing into `data`: borrowed, valid only during
 *    that call) and sets *consumed to the bytes it used. Consuming nothing
 *    means "need more input" and ends the loop until the next read.
 *  - It returns 0, or a negative code with a message given to nr_raise()
 *    (NR_ETOOLONG, -EBADMSG): the base then drops *consumed bytes, delivers
 *    the error to exception_caught of the following handlers in stream
 *    order, and keeps decoding what follows. A step must never keep memory
 *    growing: when a frame exceeds its limit it consumes (discards) bytes.
 *  - At end of input (channel_inactive, or the input_shutdown event) it is
 *    called with d->eof set; bytes still unconsumed afterwards are
 *    reported as an incomplete frame and dropped.
 *
 * Memory: the cumulation (nr_buf_t) holds only the unconsumed tail of a
 * read that ended mid-frame, and is freed as soon as it empties, so an idle
 * connection holds no read memory.
 */
#ifndef NR_CODEC_H
#define NR_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/buf.h"
#include "codec/inbound.h"
#include "netrun.h"

/* ---- the decoder base ------------------------------------------------------ */

typedef struct nr_decoder_s nr_decoder_t;
typedef int (*nr_decode_step_fn)(nr_decoder_t *d, nr_ctx_t *ctx,
                                 const char *data, size_t len,
                                 size_t *consumed);

struct nr_decoder_s {
  nr_decode_step_fn step;
  void (*destroy)(nr_decoder_t *d);  /* optional: free the subclass's extras */
  const char *name;                  /* prefix of error messages ("line") */
  nr_buf_t cum;                      /* bytes of an incomplete frame */
  nr_buf_t pending;                  /* reads that arrived during a decode */
  nr_inbound_t in;                   /* re-entrancy, backpressure */
  bool eof;                          /* input ended: last call(s) */
};

/* Prepare the base (the rest of the subclass is the caller's). */
void nr_decoder_init(nr_decoder_t *d, const char *name, nr_decode_step_fn step);

/* Feed bytes (e.g. a read) through the decode loop; frames go to the handler
 * after ctx. Returns 0 or -ENOMEM (the bytes could not be kept). */
int nr_decoder_feed(nr_decoder_t *d, nr_ctx_t *ctx, const char *data,
                    size_t len);
/* End of input: last decode, then report and drop an incomplete frame. */
void nr_decoder_end(nr_decoder_t *d, nr_ctx_t *ctx);
/* Bytes held in the cumulation (0 when idle: no memory is held then). */
size_t nr_decoder_buffered(const nr_decoder_t *d);

/* Handler callbacks of the base; a decoder's state must be a malloc'd
 * struct starting with nr_decoder_t (it is freed by nr_decoder_removed,
 * which first hands any unconsumed bytes to the next handler, as Netty
 * does when a decoder leaves the pipeline). nr_decoder_channel_read decodes
 * nr_bytes_t and nr_slices_t; other messages pass through. While the
 * channel is unwritable (a peer that does not read what the handlers
 * answer) the decoder stops reading and decoding after the frame just
 * delivered; nr_decoder_writability goes on once the channel drains. */
int nr_decoder_channel_read(nr_ctx_t *ctx, void *msg);
int nr_decoder_inactive(nr_ctx_t *ctx);
int nr_decoder_user_event(nr_ctx_t *ctx, void *evt);
int nr_decoder_writability(nr_ctx_t *ctx);
void nr_decoder_removed(nr_ctx_t *ctx);

#define NR_DECODER_HANDLER(type_)                                            \
  {.type = (type_), .removed = nr_decoder_removed,                           \
   .channel_read = nr_decoder_channel_read,                                  \
   .inactive = nr_decoder_inactive,                                          \
   .user_event = nr_decoder_user_event,                                      \
   .writability_changed = nr_decoder_writability}

/* ---- frame finders: pure functions over bytes ------------------------------ */

/* What a finder found in data[0 .. len). */
typedef struct nr_frame_s {
  size_t off, len;           /* the frame: data[off .. off + len) */
  size_t consumed;           /* bytes to drop: the frame and its framing, or
                                bytes discarded after an error */
} nr_frame_t;

/* Results of a finder (errors are negative). */
enum { NR_FRAME_MORE = 0, NR_FRAME_OK = 1 };

/* line: "\n" or "\r\n"; max_length bounds the line without its delimiter. */
typedef struct nr_line_s {
  size_t max_length;
  bool strip;                /* drop the delimiter from the frame */
  bool discarding;           /* skipping the rest of a too-long line */
  size_t scanned;            /* bytes known to hold no delimiter */
} nr_line_t;

/* delimiter: the frame ends at the delimiter giving the shortest frame. */
#define NR_MAX_DELIMITERS 8
typedef struct nr_delim_s {
  size_t max_length;
  bool strip;
  bool discarding;
  int ndelims;
  const char *delims[NR_MAX_DELIMITERS];   /* borrowed (the codec owns them) */
  size_t delim_lens[NR_MAX_DELIMITERS];
  size_t longest, scanned;
} nr_delim_t;

/* length_field: a big-endian length of `length` bytes at `offset`; the
 * frame is offset + length + value + adjustment bytes long and `strip`
 * bytes are dropped from its start (Netty's LengthFieldBasedFrameDecoder). */
typedef struct nr_lenfield_s {
  size_t offset, length, strip, max_frame;
  int64_t adjustment;
  uint64_t discard;          /* bytes of a too-long frame still to skip */
} nr_lenfield_t;

typedef struct nr_fixed_s {
  size_t length;
} nr_fixed_t;

/* Each returns NR_FRAME_OK (a frame in *f), NR_FRAME_MORE (f->consumed may
 * be > 0: bytes discarded), or a negative code after nr_raise():
 * NR_ETOOLONG (the too-long bytes seen so far are in f->consumed and the
 * finder skips the rest of that frame on later calls) or -EBADMSG. Data
 * must start at the first unconsumed byte (see the step contract above). */
int nr_line_find(nr_line_t *st, const char *data, size_t len, nr_frame_t *f);
int nr_delim_find(nr_delim_t *st, const char *data, size_t len,
                  nr_frame_t *f);
int nr_lenfield_find(nr_lenfield_t *st, const char *data, size_t len,
                     nr_frame_t *f);
int nr_fixed_find(nr_fixed_t *st, const char *data, size_t len,
                  nr_frame_t *f);

/* ---- handlers --------------------------------------------------------------- */

/* Handlers and states for a pipeline (the state is the handler's: created
 * here, freed when it is removed). NULL with errno on failure. The
 * delimiter codec copies its delimiters. */
extern const nr_handler_t nr_line_handler, nr_delim_handler,
    nr_lenfield_handler, nr_fixed_handler, nr_prepender_handler;
void *nr_line_new(size_t max_length, bool strip);
void *nr_delim_new(const char *const *delims, const size_t *lens, int n,
                   size_t max_length, bool strip);
void *nr_lenfield_new(const nr_lenfield_t *cfg);
void *nr_fixed_new(size_t length);

/* length_prepender: prefixes each outbound nr_bytes_t / nr_slices_t with
 * its big-endian length (1, 2, 3, 4 or 8 bytes; + adjustment, + the field
 * itself when includes_length), as one gathered write. */
typedef struct nr_prepender_s {
  size_t length;
  int64_t adjustment;
  bool includes_length;
} nr_prepender_t;
void *nr_prepender_new(const nr_prepender_t *cfg);

/* Big-endian helpers, n = 1..8. */
uint64_t nr_get_be(const char *p, size_t n);
void nr_put_be(char *p, size_t n, uint64_t v);

#endif /* NR_CODEC_H */
