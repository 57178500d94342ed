/*
 * tsan_longjmp.c -- ThreadSanitizer builds only (NETRUN_TSAN): Lua's
 * longjmps made visible to TSan.
 *
 * A coroutine that yields from a C function (future:await, netrun.sleep,
 * core.park: lua_yieldk) leaves it by a longjmp back to lua_resume's
 * setjmp, past the instrumented frames in between. TSan keeps a shadow
 * call stack and pops such frames when it sees the longjmp -- but Debian's
 * Lua is built with _FORTIFY_SOURCE, so its longjmp is __longjmp_chk,
 * which gcc 12's libtsan does not intercept. Every such yield then left a
 * frame or two on the shadow stack for good, and TSan copies that stack
 * whole into its stack depot at every allocation: after n awaits each
 * malloc cost O(n), a thread's awaits O(n^2) in all (2,000 awaits took
 * 0.6 s, the sixth 2,000 5.1 s), and a spec awaiting thousands of times
 * (stream_spec's one-byte chunks) timed out under TSan only.
 *
 * Defined here, in the executable, __longjmp_chk takes the place of
 * glibc's for Lua (the static archive binds to it at link time; a shared
 * liblua through -E) and jumps with longjmp, which TSan intercepts and
 * unwinds its shadow stack for. What is lost is glibc's check that the
 * jump goes up the stack, which Lua's jumps always do.
 */
#include <setjmp.h>

void __longjmp_chk(jmp_buf env, int val) __attribute__((noreturn));

void __longjmp_chk(jmp_buf env, int val) {
  longjmp(env, val);
}
