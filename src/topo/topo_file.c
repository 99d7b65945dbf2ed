/*
 * NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE: struct topo_system as JSON. One field
 * table drives both the writer and the parser, so the two cannot drift apart
 * and every field round-trips exactly.
 *
 * Format, version 1: one object; every key is required, unknown or repeated
 * keys are rejected, key order and whitespace are free.
 *
 *   {
 *     "version": 1,
 *     "hostname": "node7",
 *     "ncores": 2,
 *     "npus": 2,
 *     "l1d_bytes": 32768,
 *     "l2_bytes": 1048576,
 *     "l3_bytes": 33554432,
 *     "mem_mbps": 12000,
 *     "from_file": 0,
 *     "numa": [
 *       {"os_index": 0, "ncores": 2, "npus": 2, "mem_bytes": 8331374592, "cpuset": "0-1"}
 *     ],
 *     "nics": [
 *       {"name": "eth0", "pci": "0000:00:03.0", "numa": 0, "speed_mbps": 10000},
 *       {"name": "veth1", "pci": "", "numa": 0, "speed_mbps": 0}
 *     ],
 *     "gpus": []
 *   }
 *
 * Numbers are decimal integers (no fraction, no exponent) within the range of
 * their C field. Strings are shorter than their field (63 bytes, cpuset 255)
 * and use the escapes \" \\ \/ \b \f \n \r \t and \u0001..\u007f; other bytes
 * pass through as they are. The array lengths are nnuma/nnics/ngpus (at most
 * 64/32/32). "from_file" tells where the described topology came from (a
 * dump of a topology that was itself loaded says 1); a file loaded through
 * NCCL_TOPO_FILE always counts as from_file = 1.
 */
#include "topo/topo_file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

#define TOPO_FILE_VERSION 1
#define TOPO_FILE_MAX_BYTES (1 << 20) /* a full struct is about 10 KiB of JSON */

enum topo_kind { TOPO_VERSION, TOPO_INT, TOPO_U32, TOPO_U64, TOPO_STR, TOPO_ARRAY };

struct topo_array;

struct topo_field {
  const char* key;
  enum topo_kind kind;
  size_t off, size;               /* of the C member in its struct */
  const struct topo_array* array; /* TOPO_ARRAY only */
};

struct topo_array {
  size_t count_off; /* the int holding the length, in the parent struct */
  size_t elem_size;
  int max;
  const struct topo_field* fields;
  size_t nfields;
};

#define TOPO_NFIELDS(a) (sizeof(a) / sizeof((a)[0]))
#define TOPO_FIELD(type, kind, m) \
  { #m, kind, offsetof(type, m), sizeof(((type*)0)->m), NULL }
#define TOPO_SYS(kind, m) TOPO_FIELD(struct topo_system, kind, m)
#define TOPO_NUMA(kind, m) TOPO_FIELD(struct topo_numa, kind, m)
#define TOPO_NIC(kind, m) TOPO_FIELD(struct topo_nic, kind, m)
#define TOPO_GPU(kind, m) TOPO_FIELD(struct topo_gpu, kind, m)

static const struct topo_field topo_numa_fields[] = {
    TOPO_NUMA(TOPO_INT, os_index), TOPO_NUMA(TOPO_INT, ncores), TOPO_NUMA(TOPO_INT, npus),
    TOPO_NUMA(TOPO_U64, mem_bytes), TOPO_NUMA(TOPO_STR, cpuset)};
static const struct topo_field topo_nic_fields[] = {
    TOPO_NIC(TOPO_STR, name), TOPO_NIC(TOPO_STR, pci), TOPO_NIC(TOPO_INT, numa),
    TOPO_NIC(TOPO_INT, speed_mbps)};
static const struct topo_field topo_gpu_fields[] = {TOPO_GPU(TOPO_STR, pci),
                                                    TOPO_GPU(TOPO_INT, numa)};

#define TOPO_ARRAY_OF(count, type, max, fields) \
  { offsetof(struct topo_system, count), sizeof(type), max, fields, TOPO_NFIELDS(fields) }
static const struct topo_array topo_numa_array =
    TOPO_ARRAY_OF(nnuma, struct topo_numa, TOPO_MAX_NUMA, topo_numa_fields);
static const struct topo_array topo_nic_array =
    TOPO_ARRAY_OF(nnics, struct topo_nic, TOPO_MAX_NICS, topo_nic_fields);
static const struct topo_array topo_gpu_array =
    TOPO_ARRAY_OF(ngpus, struct topo_gpu, TOPO_MAX_GPUS, topo_gpu_fields);

#define TOPO_SYS_ARRAY(m, array) \
  { #m, TOPO_ARRAY, offsetof(struct topo_system, m), 0, &array }
static const struct topo_field topo_system_fields[] = {{"version", TOPO_VERSION, 0, 0, NULL},
                                                       TOPO_SYS(TOPO_STR, hostname),
                                                       TOPO_SYS(TOPO_INT, ncores),
                                                       TOPO_SYS(TOPO_INT, npus),
                                                       TOPO_SYS(TOPO_U64, l1d_bytes),
                                                       TOPO_SYS(TOPO_U64, l2_bytes),
                                                       TOPO_SYS(TOPO_U64, l3_bytes),
                                                       TOPO_SYS(TOPO_U32, mem_mbps),
                                                       TOPO_SYS(TOPO_INT, from_file),
                                                       TOPO_SYS_ARRAY(numa, topo_numa_array),
                                                       TOPO_SYS_ARRAY(nics, topo_nic_array),
                                                       TOPO_SYS_ARRAY(gpus, topo_gpu_array)};

/* ---- writer ---- */

static void topo_write_string(FILE* f, const char* s, size_t cap) {
  fputc('"', f);
  for (size_t i = 0; i < cap && s[i] != '\0'; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20 || c == 0x7f)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static void topo_write_object(FILE* f, const struct topo_field* fields, size_t n, const char* base,
                              int top);

static void topo_write_array(FILE* f, const struct topo_field* fd, const char* base) {
  const struct topo_array* a = fd->array;
  int count;
  memcpy(&count, base + a->count_off, sizeof(count));
  count = MAX(0, MIN(count, a->max));
  if (count == 0) {
    fputs("[]", f);
    return;
  }
  fputs("[\n", f);
  for (int i = 0; i < count; i++) {
    fputs("    ", f);
    topo_write_object(f, a->fields, a->nfields, base + fd->off + (size_t)i * a->elem_size, 0);
    fputs(i + 1 < count ? ",\n" : "\n", f);
  }
  fputs("  ]", f);
}

static void topo_write_value(FILE* f, const struct topo_field* fd, const char* base) {
  const char* p = base + fd->off;
  int i;
  uint32_t u32;
  uint64_t u64;
  switch (fd->kind) {
    case TOPO_VERSION:
      fprintf(f, "%d", TOPO_FILE_VERSION);
      break;
    case TOPO_INT:
      memcpy(&i, p, sizeof(i));
      fprintf(f, "%d", i);
      break;
    case TOPO_U32:
      memcpy(&u32, p, sizeof(u32));
      fprintf(f, "%" PRIu32, u32);
      break;
    case TOPO_U64:
      memcpy(&u64, p, sizeof(u64));
      fprintf(f, "%" PRIu64, u64);
      break;
    case TOPO_STR:
      topo_write_string(f, p, fd->size);
      break;
    case TOPO_ARRAY:
      topo_write_array(f, fd, base);
      break;
  }
}

/* The top level gets a key per line; array entries stay on one line each. */
static void topo_write_object(FILE* f, const struct topo_field* fields, size_t n, const char* base,
                              int top) {
  fputs(top ? "{\n  " : "{", f);
  for (size_t i = 0; i < n; i++) {
    if (i > 0) fputs(top ? ",\n  " : ", ", f);
    fprintf(f, "\"%s\": ", fields[i].key);
    topo_write_value(f, &fields[i], base);
  }
  fputs(top ? "\n}\n" : "}", f);
}

ncclResult_t topo_write_file(const struct topo_system* sys, const char* path) {
  ncclResult_t res = ncclSuccess;
  char tmp[PATH_MAX] = "";
  FILE* f = NULL;
  if (sys == NULL || path == NULL)
    FAIL(ncclInvalidArgument, "topo_write_file: %s is NULL", sys ? "path" : "sys");
  /* Every rank of a host may dump to the same path: write a private file and
   * rename it into place, so a reader never sees a torn one. The private
   * name is random and made exclusively: in a shared folder a predictable
   * one (pid, counter) could be a link a stranger planted first. */
  int fd = -1;
  if (snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >= (int)sizeof(tmp))
    FAIL(ncclInvalidArgument, "Topology file path too long: %s", path);
  if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0) {
    int err = errno;
    tmp[0] = '\0';
    FAIL(ncclSystemError, "Topology file %s: cannot create a file beside it: %s", path,
         strerror(err));
  }
  if ((f = fdopen(fd, "w")) == NULL) {
    close(fd);
    FAIL(ncclSystemError, "Topology file %s: cannot open: %s", tmp, strerror(errno));
  }
  topo_write_object(f, topo_system_fields, TOPO_NFIELDS(topo_system_fields), (const char*)sys, 1);
  int bad = ferror(f);
  bad |= fclose(f);
  f = NULL;
  if (bad) FAIL(ncclSystemError, "Topology file %s: write failed: %s", tmp, strerror(errno));
  if (rename(tmp, path) != 0)
    FAIL(ncclSystemError, "Topology file %s: cannot rename %s to it: %s", path, tmp,
         strerror(errno));
  return ncclSuccess;
fail:
  if (f != NULL) fclose(f);
  if (tmp[0] != '\0') unlink(tmp);
  return res;
}

/* ---- parser ---- */

struct topo_parser {
  const char* path;
  const char* s;
  size_t len, pos;
};

/* WARN naming the file, the line and the problem; ncclInvalidArgument. */
static ncclResult_t topo_parse_fail(const struct topo_parser* p, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t topo_parse_fail(const struct topo_parser* p, const char* fmt, ...) {
  char msg[256];
  int line = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  for (size_t i = 0; i < p->pos && i < p->len; i++) line += p->s[i] == '\n';
  WARN("Topology file %s, line %d: %s", p->path, line, msg);
  return ncclInvalidArgument;
}

#define PARSE_FAIL(p, ...)                   \
  do {                                       \
    res = topo_parse_fail((p), __VA_ARGS__); \
    goto fail;                               \
  } while (0)

/* The next non-blank byte, '\0' at the end of the text. */
static char topo_parse_peek(struct topo_parser* p) {
  while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' ||
                             p->s[p->pos] == '\r'))
    p->pos++;
  return p->pos < p->len ? p->s[p->pos] : '\0';
}

static ncclResult_t topo_parse_expect(struct topo_parser* p, char want, const char* where) {
  unsigned char got = (unsigned char)topo_parse_peek(p);
  if (p->pos >= p->len)
    return topo_parse_fail(p, "expected '%c' %s, found the end of the file (truncated?)", want,
                           where);
  if (got != (unsigned char)want) {
    if (got >= 0x20 && got < 0x7f)
      return topo_parse_fail(p, "expected '%c' %s, found '%c'", want, where, got);
    return topo_parse_fail(p, "expected '%c' %s, found byte 0x%02x", want, where, got);
  }
  p->pos++;
  return ncclSuccess;
}

static int topo_hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The byte an escape stands for; p->pos is just past the backslash. */
static ncclResult_t topo_parse_escape(struct topo_parser* p, char* out) {
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  if (p->pos >= p->len) return topo_parse_fail(p, "unterminated string (truncated?)");
  char e = p->s[p->pos++];
  const char* hit = e ? strchr(from, e) : NULL;
  if (hit != NULL) {
    *out = to[hit - from];
    return ncclSuccess;
  }
  if (e != 'u') return topo_parse_fail(p, "unknown escape \\%c in a string", e);
  int v = 0;
  for (int i = 0; i < 4; i++) {
    int d = p->pos < p->len ? topo_hex_digit(p->s[p->pos]) : -1;
    if (d < 0) return topo_parse_fail(p, "\\u needs four hex digits");
    v = v * 16 + d;
    p->pos++;
  }
  if (v == 0 || v > 0x7f) return topo_parse_fail(p, "\\u%04x: only \\u0001..\\u007f allowed", v);
  *out = (char)v;
  return ncclSuccess;
}

/* A string into out[cap], NUL-terminated; `what` ("a key", "\"name\"")
 * names it in errors. */
static ncclResult_t topo_parse_string(struct topo_parser* p, char* out, size_t cap,
                                      const char* what) {
  ncclResult_t res = ncclSuccess;
  char where[96];
  size_t n = 0;
  snprintf(where, sizeof(where), "to open %s", what);
  CHECK(topo_parse_expect(p, '"', where));
  for (;;) {
    if (p->pos >= p->len) PARSE_FAIL(p, "unterminated string (truncated?)");
    char c = p->s[p->pos++];
    if (c == '"') break;
    if ((unsigned char)c < 0x20) PARSE_FAIL(p, "control byte 0x%02x in %s", c, what);
    if (c == '\\') CHECK(topo_parse_escape(p, &c));
    if (n + 1 >= cap) PARSE_FAIL(p, "%s longer than %zu bytes", what, cap - 1);
    out[n++] = c;
  }
  out[n] = '\0';
fail:
  return res;
}

/* An integer token: optional '-' and digits, nothing else; into tok. */
static ncclResult_t topo_parse_int_token(struct topo_parser* p, const char* key, char* tok,
                                         size_t cap) {
  topo_parse_peek(p);
  size_t start = p->pos;
  if (p->pos < p->len && p->s[p->pos] == '-') p->pos++;
  size_t digits = p->pos;
  while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
  if (p->pos == digits && p->pos >= p->len)
    return topo_parse_fail(p, "\"%s\" needs an integer, found the end of the file (truncated?)",
                           key);
  if (p->pos == digits) return topo_parse_fail(p, "\"%s\" needs an integer", key);
  if (p->pos < p->len && p->s[p->pos] != '\0' && strchr(".eE", p->s[p->pos]) != NULL)
    return topo_parse_fail(p, "\"%s\" must be an integer, without fraction or exponent", key);
  if (p->pos - start >= cap) return topo_parse_fail(p, "\"%s\": number too long", key);
  memcpy(tok, p->s + start, p->pos - start);
  tok[p->pos - start] = '\0';
  return ncclSuccess;
}

static ncclResult_t topo_parse_number(struct topo_parser* p, const struct topo_field* fd,
                                      char* dst) {
  ncclResult_t res = ncclSuccess;
  char tok[32];
  CHECK(topo_parse_int_token(p, fd->key, tok, sizeof(tok)));
  errno = 0;
  if (fd->kind == TOPO_INT || fd->kind == TOPO_VERSION) {
    long long v = strtoll(tok, NULL, 10);
    if (errno != 0 || v < INT_MIN || v > INT_MAX) PARSE_FAIL(p, "\"%s\" out of range", fd->key);
    if (fd->kind == TOPO_VERSION && v != TOPO_FILE_VERSION)
      PARSE_FAIL(p, "version %lld unsupported (this library reads %d)", v, TOPO_FILE_VERSION);
    int i = (int)v;
    if (fd->kind == TOPO_INT) memcpy(dst, &i, sizeof(i));
    return ncclSuccess;
  }
  unsigned long long v = strtoull(tok, NULL, 10);
  uint64_t max = fd->kind == TOPO_U32 ? UINT32_MAX : UINT64_MAX;
  if (tok[0] == '-' || errno != 0 || v > max) PARSE_FAIL(p, "\"%s\" out of range", fd->key);
  if (fd->kind == TOPO_U32) {
    uint32_t u32 = (uint32_t)v;
    memcpy(dst, &u32, sizeof(u32));
  } else {
    uint64_t u64 = v;
    memcpy(dst, &u64, sizeof(u64));
  }
fail:
  return res;
}

static ncclResult_t topo_parse_object(struct topo_parser* p, const struct topo_field* fields,
                                      size_t n, char* base, const char* what);

static ncclResult_t topo_parse_array(struct topo_parser* p, const struct topo_field* fd,
                                     char* base) {
  ncclResult_t res = ncclSuccess;
  const struct topo_array* a = fd->array;
  int count = 0;
  char what[TOPO_NAME_LEN];
  snprintf(what, sizeof(what), "an entry of \"%s\"", fd->key);
  CHECK(topo_parse_expect(p, '[', "to open an array"));
  while (topo_parse_peek(p) != ']') {
    if (count > 0) CHECK(topo_parse_expect(p, ',', "or ']' after an array entry"));
    if (count == a->max) PARSE_FAIL(p, "more than %d entries in \"%s\"", a->max, fd->key);
    char* elem = base + fd->off + (size_t)count * a->elem_size;
    CHECK(topo_parse_object(p, a->fields, a->nfields, elem, what));
    count++;
  }
  p->pos++;
  memcpy(base + a->count_off, &count, sizeof(count));
fail:
  return res;
}

static ncclResult_t topo_parse_value(struct topo_parser* p, const struct topo_field* fd,
                                     char* base) {
  char what[TOPO_NAME_LEN];
  if (fd->kind == TOPO_ARRAY) return topo_parse_array(p, fd, base);
  if (fd->kind != TOPO_STR) return topo_parse_number(p, fd, base + fd->off);
  snprintf(what, sizeof(what), "\"%s\"", fd->key);
  return topo_parse_string(p, base + fd->off, fd->size, what);
}

static const struct topo_field* topo_field_find(const struct topo_field* fields, size_t n,
                                                const char* key) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(fields[i].key, key) == 0) return &fields[i];
  return NULL;
}

/* An object whose keys are exactly `fields` (at most 64), in any order. */
static ncclResult_t topo_parse_object(struct topo_parser* p, const struct topo_field* fields,
                                      size_t n, char* base, const char* what) {
  ncclResult_t res = ncclSuccess;
  uint64_t seen = 0;
  char key[TOPO_NAME_LEN];
  CHECK(topo_parse_expect(p, '{', "to open an object"));
  while (topo_parse_peek(p) != '}') {
    if (seen != 0) CHECK(topo_parse_expect(p, ',', "or '}' after a value"));
    CHECK(topo_parse_string(p, key, sizeof(key), "a key"));
    const struct topo_field* fd = topo_field_find(fields, n, key);
    if (fd == NULL) PARSE_FAIL(p, "unknown key \"%s\" in %s", key, what);
    uint64_t bit = 1ull << (fd - fields);
    if (seen & bit) PARSE_FAIL(p, "key \"%s\" repeated in %s", key, what);
    seen |= bit;
    CHECK(topo_parse_expect(p, ':', "after a key"));
    CHECK(topo_parse_value(p, fd, base));
  }
  for (size_t i = 0; i < n; i++)
    if (!(seen & (1ull << i))) PARSE_FAIL(p, "key \"%s\" missing in %s", fields[i].key, what);
  p->pos++;
fail:
  return res;
}

/* The whole file, NUL-terminated; ncclSystemError when it cannot be read. */
static ncclResult_t topo_file_slurp(const char* path, char** text, size_t* len) {
  ncclResult_t res = ncclSuccess;
  char* buf = NULL;
  FILE* f = fopen(path, "r");
  if (f == NULL) FAIL(ncclSystemError, "Topology file %s: cannot open: %s", path, strerror(errno));
  CHECK(braid_calloc(&buf, TOPO_FILE_MAX_BYTES + 1, 1));
  size_t n = fread(buf, 1, TOPO_FILE_MAX_BYTES + 1, f);
  if (ferror(f)) FAIL(ncclSystemError, "Topology file %s: read failed: %s", path, strerror(errno));
  if (n > TOPO_FILE_MAX_BYTES)
    FAIL(ncclInvalidArgument, "Topology file %s: larger than %d bytes", path, TOPO_FILE_MAX_BYTES);
  *text = buf;
  *len = n;
  buf = NULL;
fail:
  if (f != NULL) fclose(f);
  free(buf);
  return res;
}

ncclResult_t topo_parse_text(const char* name, const char* text, size_t len,
                             struct topo_system* sys) {
  ncclResult_t res = ncclSuccess;
  if (name == NULL || text == NULL || sys == NULL)
    FAIL(ncclInvalidArgument, "topo_parse_text: name, text or sys is NULL");
  memset(sys, 0, sizeof(*sys));
  struct topo_parser p = {name, text, len, 0};
  CHECK(topo_parse_object(&p, topo_system_fields, TOPO_NFIELDS(topo_system_fields), (char*)sys,
                          "the top-level object"));
  topo_parse_peek(&p);
  if (p.pos < p.len) PARSE_FAIL(&p, "unexpected data after the top-level object");
  return ncclSuccess;
fail:
  if (sys != NULL) memset(sys, 0, sizeof(*sys)); /* never half a topology */
  return res;
}

ncclResult_t topo_read_file(const char* path, struct topo_system* sys) {
  ncclResult_t res = ncclSuccess;
  char* text = NULL;
  size_t len = 0;
  if (path == NULL || sys == NULL)
    FAIL(ncclInvalidArgument, "topo_read_file: %s is NULL", path ? "sys" : "path");
  memset(sys, 0, sizeof(*sys));
  CHECK(topo_file_slurp(path, &text, &len));
  res = topo_parse_text(path, text, len, sys);
fail:
  free(text);
  return res;
}
