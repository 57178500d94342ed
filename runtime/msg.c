/*
 * msg.c -- the registry of message types (netrun.h): a name per tag, so
 * that the handlers' tags, declared in their own headers rather than in
 * the core's enum, cannot clash unnoticed, and so that error text can name
 * a message ("an http_response") instead of a number.
 *
 * Invariants: a tag has at most one name and a name at most one tag;
 * entries are never removed, and the core's are there from the start.
 * Threads: any; one mutex guards the table (registration happens at
 * start-up, lookups on error paths only).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static struct {
  int type;
  const char *name;
} types[NR_MSG_TYPES] = {
    {NR_MSG_BYTES, "bytes"},     {NR_MSG_SLICES, "slices"},
    {NR_MSG_DATAGRAM, "datagram"}, {NR_MSG_LUA, "lua"},
    {NR_MSG_EVENT, "event"},     {NR_MSG_FILE, "file_region"},
};
static int ntypes = 6;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int find_locked(int type, const char *name) {
  for (int i = 0; i < ntypes; i++)
    if (types[i].type == type || strcmp(types[i].name, name) == 0)
      return i;
  return -1;
}

int nr_msg_register(int type, const char *name) {
  if (type <= 0 || name == NULL || name[0] == '\0')
    return -EINVAL;
  pthread_mutex_lock(&lock);
  int rc = 0, i = find_locked(type, name);
  if (i >= 0) {
    if (types[i].type != type || strcmp(types[i].name, name) != 0)
      rc = -EEXIST;           /* (the same pair again is no change) */
  } else if (ntypes == NR_MSG_TYPES) {
    rc = -ENOSPC;
  } else {
    types[ntypes].type = type;
    types[ntypes].name = name;
    ntypes++;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

const char *nr_msg_name(int type) {
  const char *name = NULL;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < ntypes && name == NULL; i++)
    if (types[i].type == type)
      name = types[i].name;
  pthread_mutex_unlock(&lock);
  return name;
}

void nr_msg_declare(int type, const char *name) {
  int rc = nr_msg_register(type, name);
  if (rc == 0)
    return;
  /* Two handlers linked into one program gave their messages one tag (or
   * one name): each would take the other's messages for its own. */
  const char *held = nr_msg_name(type);
  fprintf(stderr, "netrun: message type %d (%s): %s%s%s\n", type, name,
          rc == -EEXIST ? "already registered" : nr_strerror(rc),
          held ? " as " : "", held ? held : "");
  abort();
}

void nr_msg_describe(int type, char *buf, size_t size) {
  const char *name = nr_msg_name(type);
  if (name != NULL)
    snprintf(buf, size, "a message of type %s", name);
  else
    snprintf(buf, size, "a message of type %d (unregistered)", type);
}
