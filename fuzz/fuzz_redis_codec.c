/*
 * fuzz_redis_codec.c -- netrun.redis's codec (runtime/bindings/lredis.c:
 * feed, take, the Lua values it builds) on arbitrary server bytes, in a
 * Lua state of its own.
 *
 * Config bytes 0..1: max_reply (64..16384), max_depth (1..40); the rest is
 * what a server sent. It is fed once whole and once in chunks whose sizes
 * come from a generator seeded by the input, taking replies one at a time
 * (pushes too) after each feed. Invariants: both runs take the same
 * replies -- compared as the text a Lua serializer makes of them -- and
 * end the same way (needing more, or the same protocol error); a codec
 * that failed takes nothing more; the Lua stack is balanced after each
 * call; the values never nest deeper than max_depth.
 */
#include "../runtime/bindings/lredis.c"

#include "common.h"

/* l_send is not called here; the bindings' handle check is not linked. */
void *lnr_check_handle(lua_State *L, int idx, int kind) {
  (void)kind;
  luaL_argerror(L, idx, "no handles in this target");
  return NULL;
}

static lua_State *L;

static const char SERIALIZE[] =
    "local null, E = ... "
    "local function s(v, d) "
    "  assert(d <= 41, 'too deep') "
    "  if v == nil then return 'nil' end "
    "  if v == null then return 'null' end "
    "  local t = type(v) "
    "  if t ~= 'table' then return (math.type(v) or t) .. ':' .. tostring(v) end "
    "  if getmetatable(v) == E then return 'err:' .. v.err end "
    "  local o = {} "
    "  for k, x in pairs(v) do o[#o + 1] = s(k, d + 1) .. '=' .. s(x, d + 1) end "
    "  table.sort(o) "                          /* keys that print alike: by pair */
    "  return '{' .. table.concat(o, ',') .. '}' "
    "end "
    "return s";

static void setup(void) {
  L = luaL_newstate();
  luaL_openlibs(L);
  lua_newtable(L);
  open_redis(L);
  lua_getfield(L, -1, "redis");
  lua_setglobal(L, "redis");
  lua_pop(L, 1);
  lua_newtable(L);
  lua_setglobal(L, "E");                       /* the error metatable */
  FUZZ_ASSERT(luaL_loadstring(L, SERIALIZE) == LUA_OK);
  lua_pushlightuserdata(L, NULL);
  lua_getglobal(L, "E");
  lua_call(L, 2, 1);
  lua_setglobal(L, "serialize");
}

/* Take every reply c (at index 1) holds into out; the error, if any. */
static const char *take_all(char **out, size_t *len, size_t *cap) {
  static char err[128];
  for (;;) {
    int top = lua_gettop(L);
    lua_newtable(L);                           /* top+1: t */
    lua_getfield(L, 1, "take");
    lua_pushvalue(L, 1);
    lua_pushvalue(L, top + 1);
    lua_pushinteger(L, 1);
    lua_pushinteger(L, 1);
    lua_pushboolean(L, 1);                     /* pushes too */
    FUZZ_ASSERT(lua_pcall(L, 5, 2, 0) == LUA_OK);
    lua_Integer k = lua_tointeger(L, top + 2);
    const char *why = lua_tostring(L, top + 3);
    if (k == 1) {
      lua_getglobal(L, "serialize");
      lua_rawgeti(L, top + 1, 1);
      lua_pushinteger(L, 0);
      FUZZ_ASSERT(lua_pcall(L, 2, 1, 0) == LUA_OK);
      size_t n;
      const char *s = lua_tolstring(L, -1, &n);
      fuzz_append(out, len, cap, s, n);
      fuzz_append(out, len, cap, "\n", 1);
    }
    if (why) {
      snprintf(err, sizeof err, "%s", why);
      why = err;
    }
    lua_settop(L, top);
    if (k == 0)
      return why;
    FUZZ_ASSERT(why == NULL);
  }
}

static const char *run(const char *p, size_t n, uint32_t seed, lua_Integer max_reply,
                       lua_Integer max_depth, char **out, size_t *len, size_t *cap) {
  int top = lua_gettop(L);
  lua_getglobal(L, "redis");
  lua_getfield(L, -1, "codec");
  lua_pushinteger(L, max_reply);
  lua_pushinteger(L, max_depth);
  lua_pushinteger(L, 64);
  lua_getglobal(L, "E");
  lua_call(L, 4, 1);
  lua_replace(L, 1);                           /* the codec at 1 */
  lua_settop(L, 1);
  (void)top;
  const char *why = NULL;
  size_t off = 0;
  while (off < n && why == NULL) {
    size_t k = fuzz_chunk(&seed, n - off);
    lua_getfield(L, 1, "feed");
    lua_pushvalue(L, 1);
    lua_pushlstring(L, p + off, k);
    FUZZ_ASSERT(lua_pcall(L, 2, 0, 0) == LUA_OK);
    off += k;
    why = take_all(out, len, cap);
    FUZZ_ASSERT(lua_gettop(L) == 1);
  }
  if (why) {                                   /* a failed codec takes no more */
    size_t before = *len;
    const char *again = take_all(out, len, cap);
    FUZZ_ASSERT(again != NULL && *len == before);
  }
  return why;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  if (L == NULL)
    setup();
  lua_settop(L, 0);
  lua_pushnil(L);                              /* slot 1: the codec */
  lua_Integer max_reply = 64 + (lua_Integer)data[0] * 64;
  lua_Integer max_depth = 1 + data[1] % 40;
  const char *p = (const char *)data + 2;
  size -= 2;
  static char *a, *b;
  static size_t acap, bcap;
  size_t alen = 0, blen = 0;
  static char wa[128], wb[128];
  const char *x = run(p, size, 0, max_reply, max_depth, &a, &alen, &acap);
  snprintf(wa, sizeof wa, "%s", x ? x : "");
  const char *y = run(p, size, fuzz_seed(data, size + 2), max_reply, max_depth, &b, &blen, &bcap);
  snprintf(wb, sizeof wb, "%s", y ? y : "");
  FUZZ_ASSERT(alen == blen && (alen == 0 || memcmp(a, b, alen) == 0));
  FUZZ_ASSERT(strcmp(wa, wb) == 0);
  lua_settop(L, 0);
  lua_gc(L, LUA_GCCOLLECT);
  return 0;
}
