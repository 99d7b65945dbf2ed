/*
 * BRAID_TUNE_FILE: override the tuner's model and force choices. Every
 * rank must read the same file (the choice must agree across ranks).
 * Lines, '#' starts a comment:
 *
 *   link <intra|net> <Ring|Tree|RecDoubling|Hier|all> <alpha_us> <beta_us_per_KB>
 *       replace that link's cost line for that algorithm (or all of them)
 *   reduce <us_per_KB>
 *       a rank's cost per KB it reduces, apart from the links (the
 *       library's own lines hold it: 0)
 *   force <AllReduce|AllGather|ReduceScatter|Broadcast|Reduce> <min_bytes> <max_bytes>
 *         <algorithm> [chunk_bytes]
 *       calls of that collective on min..max bytes (inclusive; sizes accept
 *       K/M/G) use that algorithm, if NCCL_ALGO allows it and it implements
 *       the collective on this layout; the first matching line wins
 *
 * A malformed line fails communicator creation with ncclInvalidArgument
 * and a WARN naming the file and line.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core.h"
#include "param.h"
#include "tune/tuner_file.h"
#include "sched_algos.h"

static int name_index(const char* s, const char* (*name)(int), int count) {
  for (int i = 0; i < count; i++)
    if (strcasecmp(s, name(i)) == 0) return i;
  return -1;
}

static int parse_size(const char* s, size_t* out) {
  int64_t v;
  if (param_parse_int(s, &v) != 0 || v < 0) return -1;
  *out = (size_t)v;
  return 0;
}

/* A cost: a finite number >= 0. strtod also takes "nan" and "inf" and turns
 * 1e999 into inf; any of those made the model's times meaningless. */
static int parse_cost(const char* s, double* out) {
  char* end;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || !isfinite(v) || v < 0) return -1;
  *out = v;
  return 0;
}

/* "link" line: words[1..4]. Returns NULL or what is wrong. */
static const char* parse_link(char** w, int nw, struct tuner_model* m) {
  double alpha, beta;
  if (nw != 5) return "expected: link <intra|net> <algorithm|all> <alpha_us> <beta_us_per_KB>";
  struct tuner_link* l = strcasecmp(w[1], "intra") == 0 ? &m->intra
                         : strcasecmp(w[1], "net") == 0 ? &m->net
                                                        : NULL;
  if (l == NULL) return "link must be intra or net";
  int algo =
      strcasecmp(w[2], "all") == 0 ? -2 : name_index(w[2], sched_algo_name, sched_algo_count());
  if (algo == -1) return "unknown algorithm";
  if (parse_cost(w[3], &alpha)) return "alpha must be a finite number >= 0";
  if (parse_cost(w[4], &beta)) return "beta must be a finite number >= 0";
  for (int a = 0; a < sched_algo_count(); a++)
    if (algo == -2 || algo == a) l->alpha_us[a] = alpha, l->beta_us_per_kb[a] = beta;
  if (l == &m->net) m->net_alone = m->net; /* the file's figures hold for a rank alone too */
  return NULL;
}

/* "reduce" line: words[1]. */
static const char* parse_reduce(char** w, int nw, struct tuner_model* m) {
  if (nw != 2) return "expected: reduce <us_per_KB>";
  if (parse_cost(w[1], &m->reduce_us_per_kb)) return "the cost must be a finite number >= 0";
  return NULL;
}

static const char* parse_force(char** w, int nw, struct tuner_model* m) {
  struct tuner_forced f = {0};
  if (nw != 5 && nw != 6)
    return "expected: force <collective> <min_bytes> <max_bytes> <algorithm> [chunk_bytes]";
  if ((f.coll = name_index(w[1], sched_coll_name, COLL_COUNT)) < 0) return "unknown collective";
  if (parse_size(w[2], &f.lo) || parse_size(w[3], &f.hi) || f.lo > f.hi) return "bad byte range";
  if ((f.algo = name_index(w[4], sched_algo_name, sched_algo_count())) < 0)
    return "unknown algorithm";
  if (nw == 6 && (parse_size(w[5], &f.chunk) || f.chunk < PARAM_CHUNK_MIN))
    return "bad chunk size (4096 bytes or more)";
  if (m->nforced == TUNER_MAX_FORCED) return "too many force lines";
  m->forced[m->nforced++] = f;
  return NULL;
}

/* strtok_r: ncclCommInitAll reads the file on one thread per rank, and
 * strtok's hidden cursor made one rank fail on a valid line now and then. */
static int split_words(char* line, char** w, int max) {
  int n = 0;
  char *hash = strchr(line, '#'), *save = NULL;
  if (hash) *hash = '\0';
  for (char* tok = strtok_r(line, " \t\r\n", &save); tok && n < max;
       tok = strtok_r(NULL, " \t\r\n", &save))
    w[n++] = tok;
  return n;
}

/* getline, not a fixed buffer: fgets into 512 bytes cut a longer line (a
 * long comment, say) in two and parsed the rest as a line of its own. */
ncclResult_t tuner_file_parse(FILE* f, const char* name, struct tuner_model* m) {
  ncclResult_t res = ncclSuccess;
  char *line = NULL, *w[8];
  size_t cap = 0;
  ssize_t len;
  int lineno = 0;
  while ((len = getline(&line, &cap, f)) >= 0) {
    lineno++;
    const char* bad = NULL;
    if (strlen(line) != (size_t)len) {
      bad = "a NUL byte in the line";
    } else {
      int nw = split_words(line, w, 8);
      if (nw == 0) continue;
      if (strcasecmp(w[0], "link") == 0)
        bad = parse_link(w, nw, m);
      else if (strcasecmp(w[0], "force") == 0)
        bad = parse_force(w, nw, m);
      else if (strcasecmp(w[0], "reduce") == 0)
        bad = parse_reduce(w, nw, m);
      else
        bad = "a line starts with link, reduce or force";
    }
    if (bad) FAIL(ncclInvalidArgument, "BRAID_TUNE_FILE %s, line %d: %s", name, lineno, bad);
  }
  INFO(SUB_TUNING, "Tuner: read %s (%d forced ranges)", name, m->nforced);
fail:
  free(line);
  return res;
}

ncclResult_t tuner_file_read(const char* path, struct tuner_model* m) {
  ncclResult_t res = ncclSuccess;
  FILE* f = fopen(path, "r");
  if (f == NULL) FAIL(ncclInvalidArgument, "BRAID_TUNE_FILE %s: cannot open it", path);
  res = tuner_file_parse(f, path, m);
fail:
  if (f) fclose(f);
  return res;
}

int tuner_file_choice(const struct tuner_model* m, int coll, size_t bytes, unsigned allowed,
                      int* algo, size_t* chunk) {
  for (int i = 0; i < m->nforced; i++) {
    const struct tuner_forced* f = &m->forced[i];
    if (f->coll != coll || bytes < f->lo || bytes > f->hi || !(allowed & (1u << f->algo))) continue;
    *algo = f->algo;
    *chunk = f->chunk ? MIN(f->chunk, m->slot_bytes) : 0;
    return 1;
  }
  return 0;
}
