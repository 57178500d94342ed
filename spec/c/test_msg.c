/*
 * test_msg.c -- message types (runtime/msg.c, netrun.h): the core's tags
 * and netrun's handlers' tags each have a name, registered as the program
 * loads; a tag or name taken twice, or one type too many, is refused, and
 * a handler's declaration that clashes aborts the program, naming both.
 * Then the Lua bindings' converter table (runtime/bindings/lmsg.c), which fails
 * as loudly: a second converter for a type, one more type than it holds,
 * a converter for a type no handler registered.
 */
#include <lua.h>

#include "codec/http.h"
#include "codec/http_client.h"
#include "codec/resp.h"
#include "codec/ws.h"
#include "handler/handler.h"
#include "bindings/lnr.h"
#include "test.h"
#include "tls/tls.h"

/* Link the handlers whose messages are checked (their registration is a
 * constructor in their object files, which a static library links only
 * when something refers to them). */
extern const void *const test_msg_linked[];
const void *const test_msg_linked[] = {
    &nr_http_server_handler, &nr_http_client_handler, &nr_resp_handler,
    &nr_ws_handler, &nr_idle_handler, &nr_tls_handler};

TEST(the_core_types_and_the_handlers_types_are_named) {
  static const struct { int type; const char *name; } want[] = {
      {NR_MSG_BYTES, "bytes"}, {NR_MSG_SLICES, "slices"},
      {NR_MSG_DATAGRAM, "datagram"}, {NR_MSG_LUA, "lua"},
      {NR_MSG_EVENT, "event"}, {NR_MSG_HTTP_REQUEST, "http_request"},
      {NR_MSG_HTTP_RESPONSE, "http_response"},
      {NR_MSG_HTTP_PREPARED, "http_prepared"},
      {NR_MSG_HTTP_CALL, "http_call"}, {NR_MSG_HTTP_REPLY, "http_reply"},
      {NR_MSG_RESP, "resp"}, {NR_MSG_WEBSOCKET, "websocket"},
      {NR_MSG_IDLE, "idle"}, {NR_MSG_TLS_EVENT, "tls_event"}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    CHECK_STR(nr_msg_name(want[i].type), want[i].name);
    if (i >= 5)                     /* a handler's: in netrun's own range */
      CHECK(want[i].type >= NR_MSG_NATIVE && want[i].type < NR_MSG_USER);
  }
  CHECK(nr_msg_name(NR_MSG_USER) == NULL);
  char buf[64];
  nr_msg_describe(NR_MSG_HTTP_RESPONSE, buf, sizeof buf);
  CHECK_STR(buf, "a message of type http_response");
  nr_msg_describe(NR_MSG_USER + 7, buf, sizeof buf);
  CHECK_STR(buf, "a message of type 1007 (unregistered)");
}

TEST(a_type_registered_twice_keeps_its_first_name) {
  CHECK_EQ(nr_msg_register(NR_MSG_USER, "app_event"), 0);
  CHECK_EQ(nr_msg_register(NR_MSG_USER, "app_event"), 0);   /* the same */
  CHECK_EQ(nr_msg_register(NR_MSG_USER, "other"), -EEXIST);
  CHECK_EQ(nr_msg_register(NR_MSG_USER + 1, "app_event"), -EEXIST);
  CHECK_EQ(nr_msg_register(NR_MSG_HTTP_REQUEST, "mine"), -EEXIST);
  CHECK_EQ(nr_msg_register(NR_MSG_BYTES, "raw"), -EEXIST);
  CHECK_EQ(nr_msg_register(0, "zero"), -EINVAL);
  CHECK_EQ(nr_msg_register(NR_MSG_USER + 2, ""), -EINVAL);
  CHECK_STR(nr_msg_name(NR_MSG_USER), "app_event");
  CHECK(nr_msg_name(NR_MSG_USER + 1) == NULL);
}

TEST(one_type_more_than_the_registry_holds_is_refused) {
  static char names[NR_MSG_TYPES][16];
  int i = 0, rc = 0;
  for (; i < NR_MSG_TYPES && rc == 0; i++) {
    snprintf(names[i], sizeof names[i], "app%d", i);
    rc = nr_msg_register(NR_MSG_USER + i, names[i]);
  }
  CHECK_EQ(rc, -ENOSPC);
  /* the core's and the handlers' were there first: 14 of them at least */
  CHECK_LE(i, NR_MSG_TYPES - 14 + 1);
  CHECK_STR(nr_msg_name(NR_MSG_USER), "app0");
  CHECK(nr_msg_name(NR_MSG_USER + i - 1) == NULL);
  CHECK_STR(nr_msg_name(NR_MSG_HTTP_REQUEST), "http_request");
}

/* Run fn in a child with stderr to a pipe: true if it aborted; its
 * stderr in err. */
static bool aborts(void (*fn)(void), char *err, size_t size) {
  int fds[2];
  CHECK_EQ(pipe(fds), 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    fn();
    _exit(0);
  }
  close(fds[1]);
  size_t n = 0;
  ssize_t r;
  while (n + 1 < size && (r = read(fds[0], err + n, size - 1 - n)) > 0)
    n += (size_t)r;
  err[n] = '\0';
  close(fds[0]);
  int st;
  CHECK_EQ(waitpid(pid, &st, 0), pid);
  return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void declare_clash(void) { nr_msg_declare(NR_MSG_HTTP_REQUEST, "mine"); }
static void declare_again(void) {
  nr_msg_declare(NR_MSG_HTTP_REQUEST, "http_request");
}

TEST(a_handler_declaring_a_taken_tag_aborts_naming_both) {
  char err[512];
  CHECK(aborts(declare_clash, err, sizeof err));
  CHECK_CONTAINS(err, "message type 17 (mine): already registered as http_request");
  CHECK(!aborts(declare_again, err, sizeof err));
  CHECK_STR(err, "");
}

/* ---- the Lua bindings' converter table ---- */

static void push_a(lua_State *L, void *msg) { (void)L; (void)msg; }
static void push_b(lua_State *L, void *msg) { (void)L; (void)msg; }

static void convert_twice(void) {
  lnr_register_msg(NR_MSG_USER, push_a);
  lnr_register_msg(NR_MSG_USER, push_a);      /* the same: no change */
  lnr_register_msg(NR_MSG_USER, push_b);
}

static void convert_unregistered(void) {
  lnr_register_msg(NR_MSG_USER + 500, push_a);
}

static void convert_too_many(void) {
  static char names[NR_MSG_TYPES][16];
  for (int i = 0; i < NR_MSG_TYPES; i++) {
    snprintf(names[i], sizeof names[i], "app%d", i);
    if (nr_msg_register(NR_MSG_USER + 1 + i, names[i]) < 0)
      break;
    lnr_register_msg(NR_MSG_USER + 1 + i, push_a);
  }
}

TEST(the_lua_converter_table_aborts_on_a_clash_an_overflow_or_a_stranger) {
  char err[512];
  CHECK_EQ(nr_msg_register(NR_MSG_USER, "app_event"), 0);
  CHECK(aborts(convert_twice, err, sizeof err));
  CHECK_CONTAINS(err, "message type 1000: two converters");
  CHECK(aborts(convert_unregistered, err, sizeof err));
  CHECK_CONTAINS(err, "message type 1500: a converter for a type no handler registered");
  CHECK(aborts(convert_too_many, err, sizeof err));
  CHECK_CONTAINS(err, "no room for its converter");
}
