/*
 * lopts.h -- reading a constructor's table of options: the luaL_opt*
 * family of lauxlib, for fields of a table, shared by every constructor in
 * C (netrun.server, netrun.tls.*, the codecs, the handlers, groups, dicts)
 * and, through core.options (lopts.c), by those written in Lua (netrun.http,
 * netrun.websocket, netrun.tcp, netrun.redis, ...), so that each says the
 * same things the same way:
 *
 *   <file>:<line>: netrun.tls.server: verify must be "none", "optional" or
 *     "required", got "yes"
 *   <file>:<line>: netrun.tls.client: unknown option 'apln' (did you mean
 *     'alpn'?)
 *
 * What a reader accepts is what lauxlib accepts for an argument of the
 * same kind: an integer option takes what luaL_checkinteger takes ("8080"
 * from arg or os.getenv, 8080.0), a number option what luaL_checknumber
 * takes ("2.5"); a boolean, a string, an enum or a table takes only its
 * own type. A value is shown as Lua would write it: a string quoted
 * ("8080"), a number as is, a table or function by its type, a handle by
 * its __tostring.
 *
 * <file>:<line> is the caller's: the first frame, from the raising one
 * out, that is Lua code outside netrun's own modules (lua/netrun/) -- so
 * an option given to netrun.http.request, checked three calls deep,
 * names the line that called netrun.http.request, through pcall, in a
 * coroutine or on a loop alike (lnr_push_where).
 *
 * A reader is given an lnr_opts_t: the table being read, the
 * constructor's name and, in a nested table (child_options), the path
 * that prefixes its fields in messages. A string a reader returns is
 * anchored by the options table, as long as that stays on the stack.
 * Readers leave the stack as they found it. Every failure raises (a
 * programmer's mistake: DESIGN.md §9.7); none returns.
 *
 * Cost: a reader is a lua_getfield and a type test; messages are made
 * only when raising. Constructors run once per server, connection or
 * configuration, never per message.
 */
#ifndef LOPTS_H
#define LOPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lua.h>

typedef struct lnr_opts_s {
  lua_State *L;
  int t;                  /* the table (an absolute index); 0: none given */
  const char *what;       /* the constructor: "netrun.server" */
  char prefix[48];        /* "" or the nested table's path: "child_options." */
} lnr_opts_t;

/* The largest byte size an option takes (1 TiB). */
#define LNR_OPT_SIZE_MAX ((lua_Integer)1 << 40)

/* ---- tables -------------------------------------------------------------- */

/* Begin reading the options at idx for the constructor `what`: nil or none
 * reads every option as absent, unless `required`; another non-table
 * raises "<what>: expected a table of options, got <value>". A key that
 * is not a string of known (NULL-terminated; NULL: not checked) raises
 * "<what>: unknown option 'k' (did you mean 'x'?)": a typo would silently
 * keep the default. */
void lnr_opts_open(lnr_opts_t *o, lua_State *L, int idx, const char *what,
                   const char *const *known, bool required);
/* The table at field k of o, read as options of its own (its fields named
 * "k.field" in messages, its keys checked against known): pushed, or nil
 * pushed when absent (then sub reads every option as absent). The caller
 * pops it when done with what it lent. */
void lnr_opts_sub(lnr_opts_t *sub, const lnr_opts_t *o, const char *k,
                  const char *const *known);
/* The same for the table at idx, a part of o named name (its fields
 * "name.field"): a sni entry, say. Nothing is pushed. */
void lnr_opts_at(lnr_opts_t *sub, const lnr_opts_t *o, int idx,
                 const char *name, const char *const *known);

/* ---- readers: field k of o, def when absent ------------------------------- */

lua_Integer lnr_opt_integer(const lnr_opts_t *o, const char *k,
                            lua_Integer def, lua_Integer min, lua_Integer max);
lua_Number lnr_opt_number(const lnr_opts_t *o, const char *k, lua_Number def,
                          lua_Number min, lua_Number max);
/* A duration in seconds, 0 to 1e9 (a number as lnr_opt_number takes it),
 * returned in nanoseconds; a positive one is at least 1 ns. def is in ns. */
uint64_t lnr_opt_seconds(const lnr_opts_t *o, const char *k, uint64_t def);
bool lnr_opt_boolean(const lnr_opts_t *o, const char *k, bool def);
/* A string (not a number: Lua would convert it only on the stack, where
 * nothing anchors it); *len its length when len is not NULL. */
const char *lnr_opt_string(const lnr_opts_t *o, const char *k, const char *def,
                           size_t *len);
/* One of names (NULL-terminated): its index; def (an index) when absent. */
int lnr_opt_enum(const lnr_opts_t *o, const char *k, int def,
                 const char *const *names);
/* A size in bytes: an integer as lnr_opt_integer takes it, or a string of
 * digits with a suffix k, m or g (KiB, MiB, GiB: "64k"), as nginx reads
 * sizes. */
size_t lnr_opt_size(const lnr_opts_t *o, const char *k, size_t def,
                    size_t min, size_t max);
/* An array of 1 to max strings: pushed (anchoring its strings), or nothing
 * pushed and 0 returned when absent; its length otherwise. */
int lnr_opt_strings(const lnr_opts_t *o, const char *k, int max);
/* A netrun handle of `kind` (LNR_GROUP, LNR_TLS, ...), or NULL when absent;
 * another value raises "... must be <expect>, got ...". */
void *lnr_opt_handle(const lnr_opts_t *o, const char *k, int kind,
                     const char *expect);
/* A function: pushed and true, or nothing pushed and false when absent. */
bool lnr_opt_function(const lnr_opts_t *o, const char *k);

/* ---- the same checks of a value already on the stack (at idx) ------------- */

lua_Integer lnr_optv_integer(const lnr_opts_t *o, const char *k, int idx,
                             lua_Integer min, lua_Integer max);
lua_Number lnr_optv_number(const lnr_opts_t *o, const char *k, int idx,
                           lua_Number min, lua_Number max);
uint64_t lnr_optv_seconds(const lnr_opts_t *o, const char *k, int idx);
size_t lnr_optv_size(const lnr_opts_t *o, const char *k, int idx, size_t min,
                     size_t max);
int lnr_optv_enum(const lnr_opts_t *o, const char *k, int idx,
                  const char *const *names);
int lnr_optv_strings(const lnr_opts_t *o, const char *k, int idx, int max);
/* A netrun.tls config of the side asked (ltls.c): a client's config where
 * a server's belongs is refused, and the reverse. */
void *lnr_optv_tls(const lnr_opts_t *o, const char *k, int idx, bool server);

/* Push a shallow copy of the table at idx (options given with numeric
 * strings are copied with their numbers: the caller's table is theirs). */
void lnr_push_copy(lua_State *L, int idx);

/* ---- raising ----------------------------------------------------------------- */

/* "<where><what>: <prefix>k must be <expect>, got <the value at idx>". */
_Noreturn void lnr_opt_bad(const lnr_opts_t *o, const char *k, int idx,
                           const char *expect);
/* "<where><what>: <formatted>" (lua_pushfstring's formats). */
_Noreturn void lnr_opts_error(const lnr_opts_t *o, const char *fmt, ...);
/* "<where><formatted>": luaL_error at the caller's line rather than at
 * the C function's caller, which may be one of netrun's Lua modules. */
_Noreturn void lnr_raise(lua_State *L, const char *fmt, ...);
/* Push "<file>:<line>: " of the first frame outside netrun (the C
 * functions and lua/netrun/), or luaL_where(L, 1) when every frame is
 * netrun's. */
void lnr_push_where(lua_State *L);
/* Push the value at idx as a message shows it: "8080" quoted, 2.5, true,
 * nil, a table, netrun.tls.client (generation 1). */
void lnr_push_shown(lua_State *L, int idx);

/* ---- keys -------------------------------------------------------------------- */

/* Optimal string alignment distance of two names: insertions, deletions,
 * substitutions and transpositions of neighbours (raed -> read) cost one
 * each (64 or more: "far", for long names). */
int lnr_edit_distance(const char *a, const char *b);
/* The name of known (NULL-terminated) closest to k, if close enough to be
 * a typo of it (at most 2 edits, and at most half its length), or NULL. */
const char *lnr_closest(const char *k, const char *const *known);

/* Fill core.options (the checker maker for Lua modules), core.raise and
 * core.option_error (called with the core table on top of the stack). */
void lnr_open_opts(lua_State *L);

#endif /* LOPTS_H */
