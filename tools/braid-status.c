/*
 * braid-status: what a Braid job is doing, and who holds it up.
 *
 *   braid-status [--json | --prometheus] PID...      ask these processes
 *   braid-status [--json | --prometheus] --comm-id ID   every process of
 *                                  this user whose NCCL_COMM_ID is ID
 *   braid-status [--json | --prometheus] --dumps DIR    what the ranks left
 *                                  in BRAID_TRACE_DIR when they failed
 *
 * A process asked gathers every rank's flight recorder over the job's own
 * authenticated control channels (it answers only this user), so one
 * local rank tells of the whole job. The library does the asking and the
 * telling (braid.h); this is its command line.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "braid.h"

static void usage(FILE* out) {
  fprintf(out,
          "usage: braid-status [--json | --prometheus] PID...\n"
          "       braid-status [--json | --prometheus] --comm-id HOST:PORT\n"
          "       braid-status [--json | --prometheus] --dumps DIR\n"
          "Tells what a Braid job is doing and who holds it up: asked of one of its\n"
          "processes (this user's), it gathers every rank's flight recorder; from\n"
          "--dumps, it merges what the ranks wrote to BRAID_TRACE_DIR.\n"
          "  --json        every rank's recorder and the verdict, as JSON lines\n"
          "  --prometheus  the job's counters in Prometheus' text format\n");
}

/* Whether process pid's environment holds NCCL_COMM_ID=id (readable only
 * for this user's processes, the only ones that would answer). */
static int has_comm_id(const char* pid, const char* id) {
  char path[64], env[1 << 16];
  snprintf(path, sizeof(path), "/proc/%s/environ", pid);
  FILE* f = fopen(path, "re");
  if (f == NULL) return 0;
  size_t n = fread(env, 1, sizeof(env) - 1, f);
  fclose(f);
  env[n] = '\0';
  size_t want = strlen("NCCL_COMM_ID=") + strlen(id);
  for (size_t o = 0; o < n; o += strlen(env + o) + 1)
    if (strncmp(env + o, "NCCL_COMM_ID=", 13) == 0 && strcmp(env + o + 13, id) == 0 &&
        strlen(env + o) == want)
      return 1;
  return 0;
}

/* The first process of this user with NCCL_COMM_ID=id that answers. */
static int ask_comm_id(const char* id, braidStatusFormat_t format) {
  DIR* d = opendir("/proc");
  struct dirent* de;
  int asked = 0, ok = 0;
  if (d == NULL) {
    perror("braid-status: /proc");
    return 2;
  }
  while (!ok && (de = readdir(d)) != NULL) {
    if (de->d_name[0] < '1' || de->d_name[0] > '9' || atoi(de->d_name) == (int)getpid()) continue;
    if (!has_comm_id(de->d_name, id)) continue;
    asked++;
    ok = braidStatusAsk(atoi(de->d_name), format, STDOUT_FILENO) == ncclSuccess;
  }
  closedir(d);
  if (ok) return 0;
  fprintf(stderr, "braid-status: %s\n",
          asked ? "no process with that NCCL_COMM_ID answered (see the lines above)"
                : "no process of this user has that NCCL_COMM_ID");
  return 1;
}

int main(int argc, char** argv) {
  braidStatusFormat_t format = braidStatusText;
  const char *dumps = NULL, *comm_id = NULL;
  int i = 1, bad = 0;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--json") == 0)
      format = braidStatusJson;
    else if (strcmp(argv[i], "--prometheus") == 0)
      format = braidStatusPrometheus;
    else if (strcmp(argv[i], "--dumps") == 0 && i + 1 < argc)
      dumps = argv[++i];
    else if (strcmp(argv[i], "--comm-id") == 0 && i + 1 < argc)
      comm_id = argv[++i];
    else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
      return usage(stdout), 0;
    else
      return usage(stderr), 2;
  }
  if ((dumps != NULL) + (comm_id != NULL) + (i < argc) != 1) return usage(stderr), 2;
  if (dumps) return braidStatusFromDumps(dumps, format, STDOUT_FILENO) == ncclSuccess ? 0 : 1;
  if (comm_id) return ask_comm_id(comm_id, format);
  for (; i < argc; i++) {
    char* end;
    long pid = strtol(argv[i], &end, 10);
    if (*end || pid <= 0) {
      fprintf(stderr, "braid-status: '%s' is not a process id\n", argv[i]);
      bad++;
      continue;
    }
    bad += braidStatusAsk((int)pid, format, STDOUT_FILENO) != ncclSuccess;
  }
  return bad ? 1 : 0;
}
