/*
 * ws.h -- WebSocket (RFC 6455): a frame decoder that is a pure function
 * over bytes (the fuzzer and the C tests drive it without a pipeline), the
 * frame encoder, and the pipeline handler built from them.
 *
 * The decoder (nr_ws_decode) takes one frame at a time from the front of
 * its input and says what it means: a whole message (text or binary,
 * fragments reassembled, text checked as UTF-8 across fragments), a
 * control frame (ping, pong, close with its status and reason), nothing
 * yet (a fragment kept), or a protocol error with the close status RFC
 * 6455 gives it (1002 framing, 1007 bad UTF-8, 1009 too big). A server
 * requires masked frames, a client unmasked ones. Reserved opcodes and
 * bits are errors, but for RSV1 on the first frame of a message once
 * permessage-deflate was agreed (ws_deflate.c): that message is inflated,
 * within max_message.
 *
 * The handler (nr_ws_handler) is loop thread only. It sits where the HTTP
 * codec was after an upgrade (lws.c swaps them) or, on a client, after
 * the socket, and runs its own opening handshake first. Inbound it fires
 * NR_MSG_WEBSOCKET messages (text, binary) to channel_read and the peer's
 * close as a user event carrying the same message type (opcode close);
 * pings are answered with pongs by itself. Outbound it frames bytes as
 * text and NR_MSG_WEBSOCKET messages as their opcode (masking them on a
 * client). A close (the channel's, or a close message) sends a close frame
 * and waits close_timeout for the peer's before the socket is closed; the
 * peer's close is answered and the socket closed once that has gone out.
 * A graceful shutdown of the loop (NR_EVT_SHUTDOWN) sends a close 1001
 * "going away" and waits for the answer the same way.
 */
#ifndef NR_CODEC_WS_H
#define NR_CODEC_WS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct z_stream_s;

#include "codec/buf.h"
#include "netrun.h"

/* Messages of the handler (netrun.h's NR_MSG_NATIVE range; registered by
 * ws.c as the program loads). */
#define NR_MSG_WEBSOCKET (NR_MSG_NATIVE + 7)

enum {
  NR_WS_CONT = 0, NR_WS_TEXT = 1, NR_WS_BINARY = 2,
  NR_WS_CLOSE = 8, NR_WS_PING = 9, NR_WS_PONG = 10
};

/* Close statuses the codec itself uses. */
enum {
  NR_WS_NORMAL = 1000, NR_WS_GOING_AWAY = 1001, NR_WS_PROTOCOL = 1002,
  NR_WS_NO_STATUS = 1005, NR_WS_ABNORMAL = 1006, NR_WS_BAD_DATA = 1007,
  NR_WS_POLICY = 1008, NR_WS_TOO_BIG = 1009
};

/* A message through the pipeline: data is borrowed (valid during the call
 * that passes it). code is a close's status (NR_WS_NO_STATUS when its
 * frame had none); data is then its reason. */
typedef struct nr_ws_msg_s {
  int type;                  /* NR_MSG_WEBSOCKET */
  int opcode;                /* NR_WS_TEXT .. NR_WS_PONG */
  int code;
  const char *data;
  size_t len;
} nr_ws_msg_t;

/* ---- decoder --------------------------------------------------------------- */

typedef struct nr_ws_parser_s {
  size_t max_message;        /* a message's bytes, fragments summed */
  size_t max_frame;          /* one frame's payload */
  bool server;               /* frames must come masked */
  bool closed;               /* a close or an error was decoded: the rest
                                of the input is ignored */
  int fragmented;            /* opcode of the message being reassembled, 0 */
  uint32_t utf8;             /* UTF-8 checker state of that message */
  bool reset;                /* msg was delivered: empty it on the next call */
  nr_buf_t msg;              /* its fragments so far (unmasked) */
  /* permessage-deflate (ws_deflate.c), when agreed: */
  bool deflate;              /* RSV1 marks a compressed message */
  bool compressed;           /* the message being reassembled is */
  bool peer_context;         /* the peer keeps its window between messages */
  bool inflater_ok;
  struct z_stream_s *inflater;  /* then: this connection's own stream */
  char *inflated;            /* a large inflated message, freed on reset */
  /* The connection's inflate budget: what it inflates is at most
   * inflate_ratio times the compressed bytes it sent, plus
   * NR_WS_INFLATE_ALLOWANCE (0: no budget, max_message alone). */
  uint32_t inflate_ratio;
  uint64_t zin, zout;        /* compressed bytes taken, inflated bytes made */
} nr_ws_parser_t;

/* What one call decoded. opcode 0: nothing to deliver (a fragment kept).
 * On an error, code is the close status and why says what was wrong. */
typedef struct nr_ws_event_s {
  int opcode;
  int code;                  /* close: its status; error: the one to send */
  const char *data;          /* payload (a close's reason); borrowed until
                                the next call */
  size_t len;
  const char *why;           /* error only: static text */
} nr_ws_event_t;

void nr_ws_parser_init(nr_ws_parser_t *p, bool server, size_t max_message,
                       size_t max_frame);
void nr_ws_parser_free(nr_ws_parser_t *p);
/* Decode the frame at the front of data[0 .. len): returns the bytes it
 * took (> 0) with *ev filled, 0 when the frame is not all there yet (the
 * caller keeps the bytes and calls again with more), or -1 on a protocol
 * error (*ev: code and why; the parser is closed and takes no more). Once
 * closed it returns len (everything ignored) with ev->opcode 0. */
long nr_ws_decode(nr_ws_parser_t *p, const char *data, size_t len,
                  nr_ws_event_t *ev);

/* Agree permessage-deflate on p (peer_context: the peer compresses with
 * context takeover). */
void nr_ws_parser_deflate(nr_ws_parser_t *p, bool peer_context);

/* ---- encoder ---------------------------------------------------------------- */

#define NR_WS_MAX_HEAD 14
/* A final frame's head for a payload of len bytes, masked with mask (4
 * bytes) unless NULL; returns its length (2 .. 14). */
size_t nr_ws_put_head(char *out, int opcode, uint64_t len,
                      const uint8_t *mask);
/* dst[i] = src[i] ^ mask[(i + phase) % 4]; dst may be src. */
void nr_ws_mask(char *dst, const char *src, size_t n, const uint8_t mask[4],
                size_t phase);
/* Incremental UTF-8 check: feed each piece with the state the previous
 * returned (0 to start). 0: valid and complete so far; NR_UTF8_BAD
 * (sticky): invalid; anything else: valid but inside a sequence. */
#define NR_UTF8_BAD 1u
uint32_t nr_utf8_check(uint32_t state, const char *s, size_t n);
/* Whether a close status may be sent in a close frame (RFC 6455 7.4). */
bool nr_ws_valid_code(int code);

/* ---- permessage-deflate (RFC 7692, ws_deflate.c) ---------------------------- */

#define NR_WS_RSV1 0x40      /* or'ed into an opcode: a compressed message */

/* What was agreed: our window bits (9 .. 15) and whether the peer keeps
 * its context between messages (we never do). */
typedef struct nr_ws_pmd_s {
  int bits;
  bool peer_context;
} nr_ws_pmd_t;

/* The client's offer (two: without context takeover both ways, or only
 * ours, if the server cannot keep its own context apart). */
#define NR_WS_PMD_OFFER "permessage-deflate; server_no_context_takeover; " \
  "client_no_context_takeover, permessage-deflate; client_no_context_takeover"
/* Server: the first acceptable permessage-deflate offer of a
 * Sec-WebSocket-Extensions value: 1 with the response's value in resp and
 * *agreed, 0 when none is (then the extension is not used). */
int nr_ws_pmd_accept(const char *offer, size_t n, char *resp, size_t cap,
                     nr_ws_pmd_t *agreed);
/* Client: the server's Sec-WebSocket-Extensions answer to NR_WS_PMD_OFFER:
 * NULL with *agreed, or why it is refused. */
const char *nr_ws_pmd_check(const char *v, size_t n, nr_ws_pmd_t *agreed);
/* Compress one message (its n slices) with a window of `bits`: *out is
 * the frame's payload, valid until the thread's next call. 0 or -ENOMEM. */
int nr_ws_deflate(int bits, const nr_slice_t *v, size_t n, const char **out,
                  size_t *len);
/* Inflate one message into a per-thread buffer (valid until the thread's
 * next call; one past 64 KiB moves to p->inflated, freed when the parser
 * is next called, so that a thread keeps no large buffer): 0,
 * NR_WS_TOO_BIG past p->max_message or NR_WS_POLICY past the connection's
 * inflate budget (p->inflate_ratio; having allocated and inflated no more
 * than either), NR_WS_BAD_DATA, or -ENOMEM. */
int nr_ws_inflate(nr_ws_parser_t *p, const char *in, size_t n,
                  const char **out, size_t *len);
/* Free what a parser keeps for the extension. */
void nr_ws_pmd_parser_free(nr_ws_parser_t *p);

/* ---- the handler -------------------------------------------------------------- */

typedef struct nr_ws_opts_s {
  bool client;
  size_t max_message, max_frame;
  uint64_t close_timeout;    /* ns to wait for the peer's close (0: none) */
  uint64_t handshake_timeout;   /* client: ns to wait for the 101 (0: none) */
  uint64_t frame_timeout;    /* ns from a frame's first byte to its last (0:
                                none): closed with 1008 past it */
  /* client: the opening handshake request to send, and the
   * Sec-WebSocket-Accept its answer must carry */
  const char *request;
  size_t request_len;
  const char *accept;
  /* permessage-deflate: a server's agreement (bits 0: none); a client
   * sent NR_WS_PMD_OFFER in its request (deflate_offered) */
  nr_ws_pmd_t deflate;
  bool deflate_offered;
  /* permessage-deflate: the inflate budget's ratio (nr_ws_parser_t);
   * 0: NR_WS_INFLATE_RATIO; NR_WS_NO_RATIO: none */
  uint32_t inflate_ratio;
} nr_ws_opts_t;

#define NR_WS_MAX_MESSAGE (1u << 20)
/* Inflating costs CPU in proportion to what comes out (~2 ms a MiB), and
 * a deflate bomb makes 1 MiB of ~1 KiB: without a bound, each MiB an
 * attacker sends costs seconds of CPU. A connection may inflate 64 times
 * what it sent compressed (JSON and text compress 3-15 times), plus
 * 64 KiB to start with; past it the message is refused with 1008. */
#define NR_WS_INFLATE_RATIO 64u
#define NR_WS_INFLATE_ALLOWANCE (64u << 10)
#define NR_WS_NO_RATIO UINT32_MAX
#define NR_WS_CLOSE_TIMEOUT NR_SEC(5)
#define NR_WS_FRAME_TIMEOUT NR_SEC(60)
/* The longest response head a client takes for its handshake. */
#define NR_WS_MAX_RESPONSE_HEAD 8192

/* A handler state for nr_ws_handler (copies what opts points to); NULL
 * with errno on failure. Freed by the handler's removed(). */
void *nr_ws_new(const nr_ws_opts_t *o);
extern const nr_handler_t nr_ws_handler;

/* The handler's members, for a binding that puts a Lua-aware write in
 * front of nr_ws_write (lws.c). */
int nr_ws_active(nr_ctx_t *ctx);
int nr_ws_inactive(nr_ctx_t *ctx);
int nr_ws_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p);
int nr_ws_close(nr_ctx_t *ctx, nr_promise_t *p);
int nr_ws_user_event(nr_ctx_t *ctx, void *evt);
void nr_ws_handler_added(nr_ctx_t *ctx);

#endif /* NR_CODEC_WS_H */
