/*
 * static_path.c -- the static handler's paths: a request path turned into
 * one relative to the root (refusing what could lead out of it), the open
 * that cannot leave the root, and the MIME table. No state; any thread.
 *
 * Two fences, each enough alone: the path check refuses every lexical way
 * out (a ".." segment however spelled, an encoded '/', a backslash, NUL),
 * and the open refuses every way out the file system has (symlinks,
 * absolute or leading up): openat2(RESOLVE_BENEATH) where the kernel has
 * it, else a walk one component at a time with O_NOFOLLOW.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "handler/static.h"

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Whether the segment out[from .. to) may be served: not empty (but at
 * the end, a directory's slash), not "." or "..". */
static bool segment_ok(const char *s, size_t len, bool last) {
  if (len == 0)
    return last;
  if (len == 1 && s[0] == '.')
    return false;
  return !(len == 2 && s[0] == '.' && s[1] == '.');
}

int nr_static_path(const char *path, size_t len, char *out, size_t n) {
  if (len == 0 || path[0] != '/')
    return -EPERM;
  size_t w = 0, seg = 0;
  for (size_t i = 1; i < len; i++) {
    char c = path[i];
    if (c == '%') {
      int hi = i + 2 < len ? hexval(path[i + 1]) : -1;
      int lo = hi >= 0 ? hexval(path[i + 2]) : -1;
      if (lo < 0)
        return -EPERM;
      c = (char)(hi * 16 + lo);
      i += 2;
      if (c == '/')
        return -EPERM;         /* an encoded slash is not a separator */
    } else if (c == '/') {
      if (!segment_ok(out + seg, w - seg, false))
        return -EPERM;
      if (w + 1 >= n)
        return -ENAMETOOLONG;
      out[w++] = '/';
      seg = w;
      continue;
    }
    if (c == '\0' || c == '\\')
      return -EPERM;
    if (w + 1 >= n)
      return -ENAMETOOLONG;
    out[w++] = c;
  }
  if (!segment_ok(out + seg, w - seg, true))
    return -EPERM;
  if (n == 0)
    return -ENAMETOOLONG;
  out[w] = '\0';
  return (int)w;
}

/* ---- opening beneath the root ---- */

#define OPEN_FLAGS (O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)

static int no_openat2;          /* the kernel said ENOSYS once */

/* The walk where there is no openat2: each directory with O_NOFOLLOW, so
 * no symlink is followed at all. */
static int open_walk(int dirfd, const char *rel) {
  char part[256];
  int at = dirfd;
  for (;;) {
    const char *slash = strchr(rel, '/');
    size_t len = slash ? (size_t)(slash - rel) : strlen(rel);
    if (len >= sizeof part) {
      if (at != dirfd)
        close(at);
      return -ENAMETOOLONG;
    }
    memcpy(part, rel, len);
    part[len] = '\0';
    bool last = slash == NULL || slash[1] == '\0';
    int fd = openat(at, len ? part : ".",
                    OPEN_FLAGS | O_NOFOLLOW | (last ? 0 : O_DIRECTORY));
    int err = fd < 0 ? -errno : 0;
    if (at != dirfd)
      close(at);
    if (fd < 0)
      return err == -ENOTDIR && !last ? -ENOENT : err;
    if (last)
      return fd;
    at = fd;
    rel = slash + 1;
  }
}

int nr_static_open(int dirfd, const char *rel, bool follow_symlinks) {
  if (rel[0] == '\0')
    rel = ".";
  if (follow_symlinks) {
    int fd = openat(dirfd, rel, OPEN_FLAGS);
    return fd < 0 ? -errno : fd;
  }
  if (!__atomic_load_n(&no_openat2, __ATOMIC_RELAXED)) {
    struct open_how how = {.flags = OPEN_FLAGS,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
    long fd;
    do
      fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
    while (fd < 0 && errno == EAGAIN);
    if (fd >= 0)
      return (int)fd;
    if (errno != ENOSYS)
      return -errno;
    __atomic_store_n(&no_openat2, 1, __ATOMIC_RELAXED);
  }
  return open_walk(dirfd, rel);
}

/* ---- MIME types ---- */

static const struct {
  const char *ext, *type;
} mime[] = {
    {"html", "text/html"}, {"htm", "text/html"}, {"css", "text/css"},
    {"js", "text/javascript"}, {"mjs", "text/javascript"},
    {"json", "application/json"}, {"map", "application/json"},
    {"txt", "text/plain"}, {"md", "text/markdown"}, {"csv", "text/csv"},
    {"xml", "text/xml"}, {"svg", "image/svg+xml"}, {"png", "image/png"},
    {"jpg", "image/jpeg"}, {"jpeg", "image/jpeg"}, {"gif", "image/gif"},
    {"webp", "image/webp"}, {"avif", "image/avif"}, {"ico", "image/x-icon"},
    {"bmp", "image/bmp"}, {"woff", "font/woff"}, {"woff2", "font/woff2"},
    {"ttf", "font/ttf"}, {"otf", "font/otf"}, {"wasm", "application/wasm"},
    {"pdf", "application/pdf"}, {"zip", "application/zip"},
    {"gz", "application/gzip"}, {"tar", "application/x-tar"},
    {"mp4", "video/mp4"}, {"webm", "video/webm"}, {"mp3", "audio/mpeg"},
    {"ogg", "audio/ogg"}, {"wav", "audio/wav"}, {"txt", "text/plain"},
    {"webmanifest", "application/manifest+json"},
    {"rss", "application/rss+xml"}, {"atom", "application/atom+xml"},
};

const char *nr_static_mime(const char *name, size_t len) {
  size_t dot = len;
  while (dot > 0 && name[dot - 1] != '.' && name[dot - 1] != '/')
    dot--;
  if (dot == 0 || name[dot - 1] != '.')
    return "application/octet-stream";
  const char *ext = name + dot;
  size_t elen = len - dot;
  for (size_t i = 0; i < sizeof mime / sizeof mime[0]; i++)
    if (strlen(mime[i].ext) == elen && strncasecmp(mime[i].ext, ext, elen) == 0)
      return mime[i].type;
  return "application/octet-stream";
}
