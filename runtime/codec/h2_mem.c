/*
 * h2_mem.c -- the allocator of netrun's nghttp2 sessions (h2.h): size
 * classes of 32 bytes up to 2 KiB, each with a per-thread free list of at
 * most LIST_MAX blocks, in front of malloc. nghttp2 allocates a stream, its
 * header block buffers and every frame it queues; a request made a dozen
 * malloc/free pairs, 850 instructions of glibc's (bench/RESULTS.md, "The
 * spike"), where a list push or pop is a few.
 *
 * Each block carries its class in a 16-byte header (max_align_t's
 * alignment kept): 0 for a block larger than the classes, which goes to
 * malloc and free as it is. A block freed on another thread joins that
 * thread's list: the lists are only caches. A thread's lists are given
 * back to malloc when it exits.
 */
#include <nghttp2/nghttp2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "codec/h2.h"

#define HDR 16
#define CLASS 32
#define NCLASS 64                /* 32 .. 2048 bytes */
#define LIST_MAX 256             /* blocks kept per class and thread */

typedef struct blk_s {
  size_t cls;                    /* 1 .. NCLASS, or 0: malloc'd to size */
  struct blk_s *next;            /* on a free list */
} blk_t;

typedef struct lists_s {
  blk_t *head[NCLASS + 1];
  unsigned n[NCLASS + 1];
} lists_t;

static _Thread_local lists_t *lists;
static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void give_back(void *arg) {
  lists_t *l = arg;
  for (int c = 1; c <= NCLASS; c++)
    for (blk_t *b = l->head[c], *n; b != NULL; b = n) {
      n = b->next;
      free(b);
    }
  free(l);
}

static void make_key(void) { pthread_key_create(&key, give_back); }

static __attribute__((noinline)) lists_t *make_lists(void) {
  pthread_once(&once, make_key);
  lists = calloc(1, sizeof *lists);
  if (lists != NULL)
    pthread_setspecific(key, lists);
  return lists;
}

static inline lists_t *mine(void) {
  return lists != NULL ? lists : make_lists();
}


void *nr_h2_alloc(size_t n) {
  size_t c = (n + CLASS - 1) / CLASS;
  if (c == 0)
    c = 1;
  blk_t *b;
  if (c > NCLASS) {
    b = malloc(HDR + n);
    if (b == NULL)
      return NULL;
    b->cls = 0;
    return (char *)b + HDR;
  }
  lists_t *l = mine();
  if (l != NULL && (b = l->head[c]) != NULL) {
    l->head[c] = b->next;
    l->n[c]--;
  } else if ((b = malloc(HDR + c * CLASS)) == NULL) {
    return NULL;
  }
  b->cls = c;
  return (char *)b + HDR;
}

void nr_h2_free(void *p) {
  if (p == NULL)
    return;
  blk_t *b = (blk_t *)((char *)p - HDR);
  lists_t *l;
  if (b->cls == 0 || (l = mine()) == NULL || l->n[b->cls] >= LIST_MAX) {
    free(b);
    return;
  }
  b->next = l->head[b->cls];
  l->head[b->cls] = b;
  l->n[b->cls]++;
}

static void *m_malloc(size_t n, void *ud) {
  (void)ud;
  return nr_h2_alloc(n);
}

static void m_free(void *p, void *ud) {
  (void)ud;
  nr_h2_free(p);
}

static void *m_calloc(size_t n, size_t size, void *ud) {
  (void)ud;
  if (size != 0 && n > SIZE_MAX / size)
    return NULL;
  void *p = nr_h2_alloc(n * size);
  if (p != NULL)
    memset(p, 0, n * size);
  return p;
}

static void *m_realloc(void *p, size_t n, void *ud) {
  (void)ud;
  if (p == NULL)
    return nr_h2_alloc(n);
  blk_t *b = (blk_t *)((char *)p - HDR);
  if (b->cls == 0) {                     /* a large block stays one */
    blk_t *nb = realloc(b, HDR + n);
    return nb == NULL ? NULL : (char *)nb + HDR;
  }
  size_t have = b->cls * CLASS;
  if (n <= have)
    return p;
  void *q = nr_h2_alloc(n);
  if (q != NULL) {
    memcpy(q, p, have);
    nr_h2_free(p);
  }
  return q;
}

static nghttp2_mem mem = {NULL, m_malloc, m_free, m_calloc, m_realloc};

void *nr_h2_mem(void) { return &mem; }
