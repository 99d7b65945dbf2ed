/* IDX reader: header check, then exactly the advertised number of bytes, then a read past the
 * end so zlib verifies the gzip trailer (CRC and length) and stray bytes are noticed. */
#include "idx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "failure.h"

#define IDX_MAGIC_UBYTE_1D 0x00000801u
#define IDX_MAGIC_UBYTE_3D 0x00000803u
#define IDX_MAX_COUNT 100000000u
#define IDX_MAX_SIDE 4096u

/* zlib's message without the "path: " it puts in front. */
static const char* gz_reason(gzFile f, const char* path) {
  int code = Z_OK;
  const char* msg = gzerror(f, &code);
  if (code == Z_ERRNO) return strerror(errno);
  if (code == Z_OK) return "unexpected end of file";
  size_t n = strlen(path);
  if (strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0) msg += n + 2;
  return msg;
}

/* Reads exactly n bytes or explains why not. */
static int read_exact(gzFile f, const char* path, void* buf, size_t n, const char* what, char* err,
                      size_t errlen) {
  size_t got = 0;
  while (got < n) {
    size_t want = n - got > (1u << 30) ? (1u << 30) : n - got;
    int r = gzread(f, (char*)buf + got, (unsigned)want);
    if (r < 0)
      return train_errorf(err, errlen, "%s: corrupt file reading %s: %s", path, what,
                          gz_reason(f, path));
    if (r == 0) {
      return train_errorf(err, errlen,
                          "%s: truncated: %s should be %zu bytes, the file ends after %zu (%s)",
                          path, what, n, got, gz_reason(f, path));
    }
    got += (size_t)r;
  }
  return 0;
}

/* After the payload the file must end cleanly: this read also makes zlib check the trailer. */
static int expect_end(gzFile f, const char* path, char* err, size_t errlen) {
  char extra;
  int r = gzread(f, &extra, 1);
  if (r < 0) return train_errorf(err, errlen, "%s: corrupt file: %s", path, gz_reason(f, path));
  if (r > 0)
    return train_errorf(err, errlen, "%s: corrupt file: data continues past the end", path);
  int code = Z_OK;
  gzerror(f, &code);
  if (code != Z_OK)
    return train_errorf(err, errlen, "%s: corrupt file: %s", path, gz_reason(f, path));
  return 0;
}

static uint32_t be32(const uint8_t* p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static gzFile open_idx(const char* path, char* err, size_t errlen) {
  struct stat st;
  if (stat(path, &st) != 0) {
    train_errorf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  gzFile f = gzopen(path, "rb");
  if (f == NULL) train_errorf(err, errlen, "cannot open %s: %s", path, strerror(errno));
  return f;
}

/* Header words after the magic: dims[0..ndims). */
static int read_header(gzFile f, const char* path, uint32_t magic, int ndims, uint32_t* dims,
                       char* err, size_t errlen) {
  uint8_t head[16];
  if (read_exact(f, path, head, 4 + 4 * (size_t)ndims, "the header", err, errlen)) return -1;
  if (be32(head) != magic) {
    return train_errorf(err, errlen,
                        "%s: not an IDX file of this kind (magic 0x%08x, expected 0x%08x)", path,
                        be32(head), magic);
  }
  for (int i = 0; i < ndims; i++) dims[i] = be32(head + 4 + 4 * i);
  if (dims[0] == 0 || dims[0] > IDX_MAX_COUNT)
    return train_errorf(err, errlen, "%s: corrupt header: %u items", path, dims[0]);
  for (int i = 1; i < ndims; i++)
    if (dims[i] == 0 || dims[i] > IDX_MAX_SIDE)
      return train_errorf(err, errlen, "%s: corrupt header: dimension %u", path, dims[i]);
  return 0;
}

/* A whole unsigned-byte IDX file of ndims dimensions: *data (malloc'd) holds the product of
 * dims bytes. Returns 0, or -1 with a message and nothing allocated. */
static int load_ubyte(const char* path, uint32_t magic, int ndims, uint32_t* dims, const char* what,
                      uint8_t** data, char* err, size_t errlen) {
  gzFile f = open_idx(path, err, errlen);
  if (f == NULL) return -1;
  *data = NULL;
  int rc = read_header(f, path, magic, ndims, dims, err, errlen);
  size_t bytes = 1;
  for (int i = 0; rc == 0 && i < ndims; i++) bytes *= dims[i];
  if (rc == 0 && (*data = malloc(bytes)) == NULL)
    rc = train_errorf(err, errlen, "%s: cannot allocate %zu bytes", path, bytes);
  if (rc == 0) rc = read_exact(f, path, *data, bytes, what, err, errlen);
  if (rc == 0) rc = expect_end(f, path, err, errlen);
  gzclose(f);
  if (rc != 0) {
    free(*data);
    *data = NULL;
  }
  return rc;
}

int idx_load_images(const char* path, idx_set_t* set, char* err, size_t errlen) {
  uint32_t dims[3] = {0, 0, 0};
  uint8_t* data;
  if (load_ubyte(path, IDX_MAGIC_UBYTE_3D, 3, dims, "the pixel data", &data, err, errlen) != 0)
    return -1;
  free(set->images);
  set->images = data;
  set->count = (int)dims[0];
  set->rows = (int)dims[1];
  set->cols = (int)dims[2];
  return 0;
}

int idx_load_labels(const char* path, idx_set_t* set, char* err, size_t errlen) {
  uint32_t count = 0;
  uint8_t* data;
  if (load_ubyte(path, IDX_MAGIC_UBYTE_1D, 1, &count, "the label data", &data, err, errlen) != 0)
    return -1;
  for (uint32_t i = 0; i < count; i++)
    if (data[i] >= IDX_NUM_CLASSES) {
      train_errorf(err, errlen, "%s: corrupt file: label %u of item %u is not a class 0..%d", path,
                   data[i], i, IDX_NUM_CLASSES - 1);
      free(data);
      return -1;
    }
  free(set->labels);
  set->labels = data;
  set->count = (int)count;
  return 0;
}

/* DIR/NAME when an uncompressed copy exists, else DIR/NAME.gz. */
static void pick_path(const char* dir, const char* name, char* out, size_t outlen) {
  struct stat st;
  snprintf(out, outlen, "%s/%s", dir, name);
  if (stat(out, &st) == 0) return;
  snprintf(out, outlen, "%s/%s.gz", dir, name);
}

int idx_load_set(const char* dir, const char* prefix, idx_set_t* set, char* err, size_t errlen) {
  char images[4096], labels[4096], name[256];
  memset(set, 0, sizeof(*set));
  snprintf(name, sizeof(name), "%s-images-idx3-ubyte", prefix);
  pick_path(dir, name, images, sizeof(images));
  snprintf(name, sizeof(name), "%s-labels-idx1-ubyte", prefix);
  pick_path(dir, name, labels, sizeof(labels));
  if (idx_load_images(images, set, err, errlen) != 0) return -1;
  int image_count = set->count;
  if (idx_load_labels(labels, set, err, errlen) != 0) {
    idx_free(set);
    return -1;
  }
  if (set->count != image_count) {
    train_errorf(err, errlen, "%s has %d images but %s has %d labels", images, image_count, labels,
                 set->count);
    idx_free(set);
    return -1;
  }
  return 0;
}

void idx_free(idx_set_t* set) {
  free(set->images);
  free(set->labels);
  memset(set, 0, sizeof(*set));
}
