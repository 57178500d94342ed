/*
 * lspawn.c -- os.execute and io.popen for netrun's Lua states (the main
 * one and every loop's), behaving as Lua 5.4's own except for the signals
 * the started program gets.
 *
 * The `netrun` executable blocks SIGINT, SIGTERM and SIGHUP in every
 * thread and takes them with sigwait (bin/netrun.c). A blocked mask
 * survives fork and exec, and glibc's system() and popen() spawn with the
 * caller's mask (posix_spawn: no pthread_atfork handler runs), so a program
 * a script started ignored `kill -TERM` and Ctrl-C. Here both spawn
 * `/bin/sh -c CMD` with posix_spawn, an empty signal mask, and SIGINT,
 * SIGTERM, SIGHUP and SIGPIPE at their default action -- except one of the
 * first three that was already ignored when netrun started (nohup's
 * SIGHUP): that stays ignored, as it would under the stock `lua`.
 *
 * Results are Lua's: os.execute returns luaL_execresult's triple (true or
 * nil, "exit"|"signal", code; a shell that could not be started is exit
 * 127, as system() says), os.execute() true when there is a shell;
 * io.popen(cmd [, "r"|"w"]) a real file handle (LUA_FILEHANDLE: every file
 * method works on it) whose close waits for the command and returns the
 * same triple, or nil, message, errno. Pipes are O_CLOEXEC: a program
 * another thread starts at the same time does not inherit them.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lualib.h>

#include "lmain.h"
#include "lnr.h"

#define SHELL "/bin/sh"

/* A popen'd file: liolib sees the luaL_Stream at its start. */
typedef struct {
  luaL_Stream s;
  pid_t pid;
} pstream_t;

/* The signals a started program gets at their default action. */
static void default_signals(sigset_t *set) {
  static const int taken[] = {SIGINT, SIGTERM, SIGHUP};
  sigemptyset(set);
  sigaddset(set, SIGPIPE);           /* netrun's no-op handler: default */
  for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
    struct sigaction sa;
    if (sigaction(taken[i], NULL, &sa) == 0 && sa.sa_handler != SIG_IGN)
      sigaddset(set, taken[i]);
  }
}

/* Start `sh -c cmd`, with fd `from` as its fd `to` if from >= 0.
 * 0 or -errno. */
static int spawn_shell(const char *cmd, int from, int to, pid_t *pid) {
  posix_spawnattr_t attr;
  posix_spawn_file_actions_t fa;
  sigset_t none, dfl;
  sigemptyset(&none);
  default_signals(&dfl);
  int rc = posix_spawnattr_init(&attr);
  if (rc != 0)
    return -rc;
  rc = posix_spawn_file_actions_init(&fa);
  if (rc != 0) {
    posix_spawnattr_destroy(&attr);
    return -rc;
  }
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &dfl);
  if (from >= 0)        /* from == to: glibc clears its FD_CLOEXEC */
    rc = posix_spawn_file_actions_adddup2(&fa, from, to);
  char *argv[] = {(char *)"sh", (char *)"-c", (char *)cmd, NULL};  /* as glibc */
  if (rc == 0)
    rc = posix_spawn(pid, SHELL, &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return -rc;
}

/* waitpid through EINTR: the wait status, or -1 with errno. */
static int wait_child(pid_t pid) {
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return -1;
  return status;
}

/* os.execute([cmd]) */
static int l_execute(lua_State *L) {
  const char *cmd = luaL_optstring(L, 1, NULL);
  if (cmd == NULL) {
    lua_pushboolean(L, access(SHELL, X_OK) == 0);  /* is there a shell? */
    return 1;
  }
  pid_t pid;
  errno = 0;
  int rc = spawn_shell(cmd, -1, -1, &pid);
  int status = rc == 0 ? wait_child(pid) : 127 << 8;   /* as system() */
  return luaL_execresult(L, status);
}

/* The closef of a popen'd file: close it, wait for the command. */
static int p_close(lua_State *L) {
  pstream_t *p = (pstream_t *)luaL_checkudata(L, 1, LUA_FILEHANDLE);
  fclose(p->s.f);
  errno = 0;
  return luaL_execresult(L, wait_child(p->pid));
}

/* Open p on a pipe to (reading) or from the command. 0, or -1 with errno. */
static int p_open(pstream_t *p, const char *cmd, bool reading) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return -1;
  int mine = reading ? fds[0] : fds[1];
  int theirs = reading ? fds[1] : fds[0];
  int rc = spawn_shell(cmd, theirs, reading ? STDOUT_FILENO : STDIN_FILENO,
                       &p->pid);
  close(theirs);
  if (rc == 0 && (p->s.f = fdopen(mine, reading ? "r" : "w")) != NULL)
    return 0;
  int err = rc ? -rc : errno;
  close(mine);                      /* the command sees EOF or EPIPE */
  if (rc == 0)
    wait_child(p->pid);
  errno = err;
  return -1;
}

/* io.popen(cmd [, mode]) */
static int l_popen(lua_State *L) {
  const char *cmd = luaL_checkstring(L, 1);
  const char *mode = luaL_optstring(L, 2, "r");
  pstream_t *p = lua_newuserdatauv(L, sizeof *p, 0);
  p->s.f = NULL;
  p->s.closef = NULL;               /* closed until the command runs */
  p->pid = -1;
  luaL_setmetatable(L, LUA_FILEHANDLE);
  luaL_argcheck(L, (mode[0] == 'r' || mode[0] == 'w') && mode[1] == '\0', 2,
                "invalid mode");
  errno = 0;
  if (p_open(p, cmd, mode[0] == 'r') != 0)
    return luaL_fileresult(L, 0, cmd);
  p->s.closef = p_close;
  return 1;
}

static void replace(lua_State *L, const char *lib, const char *name,
                    lua_CFunction f) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  if (lua_getfield(L, -1, lib) == LUA_TTABLE) {
    lua_pushcfunction(L, f);
    lua_setfield(L, -2, name);
  }
  lua_pop(L, 2);                    /* lib, LOADED */
}

void lnr_open_spawn(lua_State *L) {
  replace(L, LUA_OSLIBNAME, "execute", l_execute);
  replace(L, LUA_IOLIBNAME, "popen", l_popen);
}

lnr_module_t lnr_spawn_module = {.name = "spawn", .libs = lnr_open_spawn};
