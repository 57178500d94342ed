/*
 * fuzz_json.c -- netrun.json's decoder and encoder (runtime/bindings/
 * json/) on arbitrary text, in a Lua state of their own.
 *
 * The input is decoded (protected call). Invariants: a refusal is a string
 * that starts "netrun.json.decode: " (never a crash, never another
 * error); a document that decoded encodes (unless it holds a number JSON
 * cannot: 1e999 reads as an infinity), and that text decodes again and
 * encodes to text of the same length (key order may differ, the bytes
 * of each value may not); the Lua stack is balanced after each call.
 * Nesting is kept to the default limit (1000) by the codec itself.
 */
#include "../runtime/bindings/json/ljson.c"
#include "../runtime/bindings/json/ljson_decode.c"

#include "common.h"

/* The option readers (lopts.c, the bindings' kernel) serve only
 * json.configure and json.new's options, which this target never calls:
 * they stand in here rather than pulling the kernel in. */
void lnr_opts_open(lnr_opts_t *o, lua_State *Ls, int idx, const char *what,
                   const char *const *known, bool required) {
  (void)o, (void)Ls, (void)idx, (void)what, (void)known, (void)required;
  abort();
}
lua_Integer lnr_optv_integer(const lnr_opts_t *o, const char *k, int idx,
                             lua_Integer min, lua_Integer max) {
  (void)o, (void)k, (void)idx, (void)min, (void)max;
  abort();
}
_Noreturn void lnr_opt_bad(const lnr_opts_t *o, const char *k, int idx,
                           const char *expect) {
  (void)o, (void)k, (void)idx, (void)expect;
  abort();
}

static lua_State *L;

static void setup(void) {
  L = luaL_newstate();
  luaL_openlibs(L);
  lua_pushcfunction(L, l_new);
  lua_call(L, 0, 1);
  lua_setglobal(L, "json");
}

/* json[fn](value at top), protected: true and the result on top, or
 * false and the error on top. */
static bool call(const char *fn) {
  lua_getglobal(L, "json");
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_insert(L, -2);
  return lua_pcall(L, 1, 1, 0) == LUA_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (L == NULL)
    setup();
  int top = lua_gettop(L);
  lua_pushlstring(L, (const char *)data, size);
  if (!call("decode")) {
    FUZZ_ASSERT(lua_type(L, -1) == LUA_TSTRING);
    FUZZ_ASSERT(strncmp(lua_tostring(L, -1), "netrun.json.decode: ", 20) == 0);
  } else if (call("encode")) {
    size_t n1 = lua_rawlen(L, -1);
    FUZZ_ASSERT(call("decode"));
    FUZZ_ASSERT(call("encode"));
    FUZZ_ASSERT(lua_rawlen(L, -1) == n1);
  } else {
    FUZZ_ASSERT(strstr(lua_tostring(L, -1), "Infinity") != NULL ||
                strstr(lua_tostring(L, -1), "NaN") != NULL);
  }
  lua_settop(L, top);
  FUZZ_ASSERT(lua_gettop(L) == 0);
  return 0;
}
