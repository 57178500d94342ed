/*
 * static_cache.c -- the static handler's open file cache, per loop (see
 * static_internal.h; nginx's open_file_cache). Loop thread only: a
 * thread's caches are in a thread-local list, found by configuration.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "handler/static_internal.h"

struct nr__scache_s {
  nr_static_cfg_t cfg;
  nr_loop_t *loop;
  int rootfd;
  unsigned refs;
  bool dead;                  /* its loop shut down: caches nothing more */
  uint32_t count, mask;       /* entries; buckets - 1 */
  nr__sfile_t **table;
  nr__sfile_t *head, *tail;   /* LRU */
  nr__scache_t *next;         /* the thread's list */
  char *buf;                  /* the loop's piece buffer (made on use) */
};

char *nr__scache_buf(nr__scache_t *k) {
  if (k->buf == NULL)
    k->buf = malloc(NR__SCACHE_BUF);
  return k->buf;
}

static _Thread_local nr__scache_t *caches;

const nr_static_cfg_t *nr__scache_cfg(const nr__scache_t *k) { return &k->cfg; }

static bool same_cfg(const nr_static_cfg_t *a, const nr_static_cfg_t *b) {
  return strcmp(a->root, b->root) == 0 &&
         a->follow_symlinks == b->follow_symlinks &&
         a->cache_max == b->cache_max && a->cache_valid == b->cache_valid;
}

void nr__sfile_release(nr__sfile_t *f) {
  if (f == NULL || --f->refs > 0)
    return;
  if (f->fd >= 0)
    close(f->fd);
  free(f);
}

static void unlink_entry(nr__scache_t *k, nr__sfile_t *f) {
  nr__sfile_t **pp = &k->table[f->hash & k->mask];
  while (*pp != f)
    pp = &(*pp)->hnext;
  *pp = f->hnext;
  *(f->prev ? &f->prev->next : &k->head) = f->next;
  *(f->next ? &f->next->prev : &k->tail) = f->prev;
  f->cached = false;
  k->count--;
  nr__sfile_release(f);       /* the cache's reference */
}

void nr__scache_forget(nr__scache_t *k, nr__sfile_t *f) {
  if (f->cached)
    unlink_entry(k, f);
}

static void empty(nr__scache_t *k) {
  while (k->head != NULL)
    unlink_entry(k, k->head);
}

void nr__scache_release(nr__scache_t *k) {
  if (k == NULL || --k->refs > 0)
    return;
  empty(k);
  if (!k->dead) {
    nr__scache_t **pp = &caches;
    while (*pp != k)
      pp = &(*pp)->next;
    *pp = k->next;
  }
  close(k->rootfd);
  free(k->table);
  free(k->buf);
  free(k);
}

/* The loop shuts down: close every cached descriptor now; connections
 * still answering keep what they use, and the cache itself. */
static int on_shutdown(void *arg) {
  nr__scache_t *k = arg;
  empty(k);
  nr__scache_t **pp = &caches;
  while (*pp != NULL && *pp != k)
    pp = &(*pp)->next;
  if (*pp == k)
    *pp = k->next;
  k->dead = true;
  nr__scache_release(k);      /* the list's reference */
  return 0;
}

static nr__scache_t *make(const nr_static_cfg_t *c, int *err) {
  nr__scache_t *k = calloc(1, sizeof *k);
  uint32_t buckets = 16;
  while (buckets < c->cache_max && buckets < (1u << 16))
    buckets <<= 1;
  if (k == NULL || (k->table = calloc(buckets, sizeof *k->table)) == NULL) {
    free(k);
    *err = -ENOMEM;
    return NULL;
  }
  k->rootfd = open(c->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (k->rootfd < 0) {
    *err = -errno;
    free(k->table);
    free(k);
    return NULL;
  }
  k->cfg = *c;
  k->mask = buckets - 1;
  k->loop = nr_loop_current();
  k->refs = 1;                /* the list's */
  if (k->loop == NULL ||
      nr_loop_add_shutdown_hook(k->loop, on_shutdown, k) < 0)
    k->refs = 0, k->dead = true;    /* (released by its last user) */
  else {
    k->next = caches;
    caches = k;
  }
  return k;
}

nr__scache_t *nr__scache_get(const nr_static_cfg_t *c, int *err) {
  nr_loop_t *l = nr_loop_current();
  for (nr__scache_t *k = caches; k != NULL; k = k->next)
    if (k->loop == l && same_cfg(&k->cfg, c)) {
      k->refs++;
      return k;
    }
  nr__scache_t *k = make(c, err);
  if (k != NULL)
    k->refs++;
  return k;
}

static uint32_t hash(const char *s, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 16777619u;
  return h;
}

/* Open rel now: what it is, into a new entry (one reference). */
static nr__sfile_t *open_entry(nr__scache_t *k, const char *rel, size_t len,
                               uint32_t h) {
  nr__sfile_t *f = malloc(sizeof *f + len + 1);
  if (f == NULL)
    return NULL;
  memset(f, 0, sizeof *f);
  memcpy(f->key, rel, len);
  f->key[len] = '\0';
  f->klen = len;
  f->hash = h;
  f->refs = 1;
  f->born = nr_now();
  f->fd = nr_static_open(k->rootfd, f->key, k->cfg.follow_symlinks);
  struct stat st;
  if (f->fd < 0) {
    f->err = f->fd;
    f->fd = -1;
  } else if (fstat(f->fd, &st) < 0) {
    f->err = -errno;
  } else if (S_ISDIR(st.st_mode)) {
    f->dir = true;
  } else if (!S_ISREG(st.st_mode)) {
    f->err = -EACCES;         /* a device, a FIFO, a socket: never served */
  } else {
    f->size = (uint64_t)st.st_size;
    f->mtime = (int64_t)st.st_mtim.tv_sec;
    snprintf(f->etag, sizeof f->etag, "\"%llx.%lx-%llx\"",
             (unsigned long long)st.st_mtim.tv_sec,
             (unsigned long)st.st_mtim.tv_nsec,
             (unsigned long long)st.st_size);
    nr_static_format_date(f->mtime, f->lastmod);
    return f;
  }
  if (f->fd >= 0) {           /* only a regular file keeps its descriptor */
    close(f->fd);
    f->fd = -1;
  }
  return f;
}

nr__sfile_t *nr__scache_open(nr__scache_t *k, const char *rel, size_t len) {
  uint32_t h = hash(rel, len);
  nr__sfile_t *f = k->table[h & k->mask];
  while (f != NULL && !(f->hash == h && f->klen == len &&
                        memcmp(f->key, rel, len) == 0))
    f = f->hnext;
  if (f != NULL && nr_now() - f->born <= k->cfg.cache_valid) {
    if (f != k->head) {       /* most recent first */
      f->prev->next = f->next;
      *(f->next ? &f->next->prev : &k->tail) = f->prev;
      f->prev = NULL;
      f->next = k->head;
      k->head->prev = f;
      k->head = f;
    }
    f->refs++;
    return f;
  }
  if (f != NULL)
    unlink_entry(k, f);       /* too old: opened afresh */
  if ((f = open_entry(k, rel, len, h)) == NULL)
    return NULL;
  if (k->dead || k->cfg.cache_max == 0)
    return f;
  if (k->count >= k->cfg.cache_max)
    unlink_entry(k, k->tail);
  f->refs++;                  /* the cache's */
  f->cached = true;
  f->hnext = k->table[h & k->mask];
  k->table[h & k->mask] = f;
  f->next = k->head;
  *(k->head ? &k->head->prev : &k->tail) = f;
  k->head = f;
  k->count++;
  return f;
}
