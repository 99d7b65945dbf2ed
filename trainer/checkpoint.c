/* Checkpoint file: head, meta, history rows, params, velocity, then an FNV-1a checksum of all
 * that precedes it. */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CKPT_MAGIC "BRAIDCKP"
#define CKPT_VERSION 2u

typedef struct {
  char magic[8];
  uint32_t version;
  uint32_t meta_bytes, row_bytes, pad_;
  uint64_t nparams;
  uint64_t total_bytes;
  uint64_t state_floats; /* per rank */
  uint32_t state_ranks, pad2_;
} ckpt_head_t;

uint64_t ckpt_fnv1a(const void* data, size_t bytes, uint64_t h) {
  const unsigned char* p = data;
  for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

static size_t body_bytes(int nhistory, size_t nparams, size_t states) {
  return sizeof(ckpt_head_t) + sizeof(ckpt_meta_t) + (size_t)nhistory * sizeof(epoch_row_t) +
         (2 * nparams + states) * sizeof(float);
}

int ckpt_build(ckpt_blob_t* blob, const ckpt_meta_t* meta, const epoch_row_t* history,
               const float* params, const float* velocity, size_t nparams, const float* states,
               int state_ranks, size_t state_floats) {
  const size_t nstates = (size_t)state_ranks * state_floats;
  const size_t body = body_bytes(meta->nhistory, nparams, nstates);
  char* p = malloc(body + sizeof(uint64_t));
  if (p == NULL) return -1;
  ckpt_head_t head = {.version = CKPT_VERSION,
                      .meta_bytes = sizeof(ckpt_meta_t),
                      .row_bytes = sizeof(epoch_row_t),
                      .nparams = nparams,
                      .total_bytes = body + sizeof(uint64_t),
                      .state_floats = state_floats,
                      .state_ranks = (uint32_t)state_ranks};
  memcpy(head.magic, CKPT_MAGIC, sizeof(head.magic));
  size_t off = 0;
  memcpy(p + off, &head, sizeof(head));
  off += sizeof(head);
  memcpy(p + off, meta, sizeof(*meta));
  off += sizeof(*meta);
  memcpy(p + off, history, (size_t)meta->nhistory * sizeof(epoch_row_t));
  off += (size_t)meta->nhistory * sizeof(epoch_row_t);
  memcpy(p + off, params, nparams * sizeof(float));
  off += nparams * sizeof(float);
  memcpy(p + off, velocity, nparams * sizeof(float));
  off += nparams * sizeof(float);
  if (nstates) memcpy(p + off, states, nstates * sizeof(float));
  off += nstates * sizeof(float);
  uint64_t sum = ckpt_fnv1a(p, off, CKPT_FNV_SEED);
  memcpy(p + off, &sum, sizeof(sum));
  blob->data = p;
  blob->bytes = off + sizeof(sum);
  return 0;
}

static int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* The rename is durable only once the directory entry is on disk too. */
static void sync_dir_of(const char* path) {
  char copy[4096];
  snprintf(copy, sizeof(copy), "%s", path);
  int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

int ckpt_write(const char* path, const ckpt_blob_t* blob, char* err, size_t errlen) {
  char tmp[4200];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    return -1;
  }
  int bad = write_all(fd, blob->data, blob->bytes) != 0 || fsync(fd) != 0;
  int saved = errno;
  bad |= close(fd) != 0;
  if (!bad && rename(tmp, path) == 0) {
    sync_dir_of(path);
    return 0;
  }
  if (!bad) saved = errno;
  snprintf(err, errlen, "cannot write checkpoint %s: %s", path, strerror(saved));
  unlink(tmp);
  return -1;
}

int ckpt_read(const char* path, ckpt_blob_t* blob, char* err, size_t errlen) {
  blob->data = NULL;
  blob->bytes = 0;
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    snprintf(err, errlen, "cannot open checkpoint %s: %s", path, strerror(errno));
    return -1;
  }
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  char* p = size > 0 ? malloc((size_t)size) : NULL;
  int ok = p && fseek(f, 0, SEEK_SET) == 0 && fread(p, 1, (size_t)size, f) == (size_t)size;
  fclose(f);
  if (!ok) {
    free(p);
    snprintf(err, errlen, "cannot read checkpoint %s", path);
    return -1;
  }
  blob->data = p;
  blob->bytes = (size_t)size;
  return 0;
}

static int check_head(const ckpt_blob_t* blob, ckpt_head_t* head, char* err, size_t errlen) {
  if (blob->bytes < sizeof(*head) + sizeof(ckpt_meta_t) + sizeof(uint64_t)) {
    snprintf(err, errlen, "not a braid-train checkpoint (only %zu bytes)", blob->bytes);
    return -1;
  }
  memcpy(head, blob->data, sizeof(*head));
  if (memcmp(head->magic, CKPT_MAGIC, sizeof(head->magic)) != 0) {
    snprintf(err, errlen, "not a braid-train checkpoint (bad magic)");
    return -1;
  }
  if (head->version != CKPT_VERSION || head->meta_bytes != sizeof(ckpt_meta_t) ||
      head->row_bytes != sizeof(epoch_row_t)) {
    snprintf(err, errlen, "checkpoint written by another version of braid-train");
    return -1;
  }
  if (head->total_bytes != blob->bytes) {
    snprintf(err, errlen, "checkpoint is %zu bytes, its header says %llu: truncated or corrupt",
             blob->bytes, (unsigned long long)head->total_bytes);
    return -1;
  }
  uint64_t sum;
  memcpy(&sum, (char*)blob->data + blob->bytes - sizeof(sum), sizeof(sum));
  if (sum != ckpt_fnv1a(blob->data, blob->bytes - sizeof(sum), CKPT_FNV_SEED)) {
    snprintf(err, errlen, "checkpoint checksum mismatch: the file is corrupt");
    return -1;
  }
  return 0;
}

size_t ckpt_nparams(const ckpt_blob_t* blob) {
  ckpt_head_t head;
  char err[256];
  return check_head(blob, &head, err, sizeof(err)) == 0 ? (size_t)head.nparams : 0;
}

int ckpt_parse(const ckpt_blob_t* blob, ckpt_meta_t* meta, epoch_row_t* history, int max_history,
               float* params, float* velocity, size_t nparams, char* err, size_t errlen) {
  ckpt_head_t head;
  if (check_head(blob, &head, err, errlen) != 0) return -1;
  const char* p = (const char*)blob->data + sizeof(head);
  memcpy(meta, p, sizeof(*meta));
  p += sizeof(*meta);
  if (meta->nhistory < 0 ||
      body_bytes(meta->nhistory, head.nparams, (size_t)head.state_ranks * head.state_floats) +
              sizeof(uint64_t) !=
          blob->bytes) {
    snprintf(err, errlen, "checkpoint layout is inconsistent: corrupt");
    return -1;
  }
  if (head.nparams != nparams) {
    snprintf(err, errlen, "checkpoint holds %llu parameters, this model has %zu",
             (unsigned long long)head.nparams, nparams);
    return -1;
  }
  int keep = meta->nhistory < max_history ? meta->nhistory : max_history;
  memcpy(history, p, (size_t)keep * sizeof(epoch_row_t));
  p += (size_t)meta->nhistory * sizeof(epoch_row_t);
  meta->nhistory = keep;
  memcpy(params, p, nparams * sizeof(float));
  p += nparams * sizeof(float);
  memcpy(velocity, p, nparams * sizeof(float));
  return 0;
}

const float* ckpt_states(const ckpt_blob_t* blob, int* ranks, size_t* floats) {
  ckpt_head_t head;
  ckpt_meta_t meta;
  memcpy(&head, blob->data, sizeof(head));
  memcpy(&meta, (const char*)blob->data + sizeof(head), sizeof(meta));
  *ranks = (int)head.state_ranks;
  *floats = (size_t)head.state_floats;
  if (head.state_ranks == 0) return NULL;
  return (const float*)((const char*)blob->data + body_bytes(meta.nhistory, head.nparams, 0));
}

void ckpt_blob_free(ckpt_blob_t* blob) {
  free(blob->data);
  blob->data = NULL;
  blob->bytes = 0;
}
