/*
 * Segment names and the sweep of stale ones. A sender unlinks its segment
 * if the receiver never mapped it, and the receiver as soon as it has; a
 * process killed in between (SIGKILL during connection setup) leaves it in
 * /dev/shm. The name carries the creator's pid and a hash of its
 * shared-memory domain (boot, /dev/shm, pid namespace), so that another
 * process can tell such a segment apart from a live one even when /dev/shm
 * is shared with containers whose pids mean other processes. The rest of
 * the name is a keyed hash of the link: what another user sees of a job's
 * segments tells nothing of the next one's name.
 */
#include "shm_names.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"
#include "siphash.h"
#include "transport.h"

static uint32_t shm_domain_tag(uint64_t domain) {
  return (uint32_t)(domain ^ (domain >> 32));
}

void shm_name_make(char* out, uint64_t secret, pid_t sender_pid, const struct shm_blob* sender,
                   int sender_rank, int receiver, int channel) {
  char link[96];
  int n = snprintf(link, sizeof(link), "shm/%" PRIx64 "/%d/%d/%d", sender->tag, sender_rank,
                   receiver, channel);
  uint64_t h = siphash24(secret, ~secret, link, (size_t)MIN(n, (int)sizeof(link) - 1));
  snprintf(out, SHM_NAME_MAX, "/braid-%d-%08" PRIx32 "-%016" PRIx64, (int)sender_pid,
           shm_domain_tag(sender->domain), h);
}

/* kill(pid, 0) alone takes a zombie for alive, and a peer that is our own
 * unreaped child (a test, a launcher that is also a rank) would never look
 * dead: /proc tells zombies apart. Unknown means alive. */
int shm_pid_alive(pid_t pid) {
  if (kill(pid, 0) == -1 && errno == ESRCH) return 0;
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 1;
  buf[n] = '\0';
  const char* p = strrchr(buf, ')'); /* the command name may hold anything */
  return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* Whose segment `name` (a /dev/shm entry) is, when it is one of ours. */
static int shm_name_owner(const char* name, int* pid, uint32_t* domain) {
  int used = 0;
  if (sscanf(name, "braid-%d-%8" SCNx32 "-%*16[0-9a-f]%n", pid, domain, &used) != 2) return 0;
  return used > 0 && name[used] == '\0' && *pid > 0;
}

void transport_shm_sweep(uint64_t domain) {
  static _Atomic int swept; /* once per process: the first comm does it */
  uint32_t mine = shm_domain_tag(domain);
  char path[NAME_MAX + 2];
  int n = 0, expected = 0;
  if (domain == 0 || !atomic_compare_exchange_strong(&swept, &expected, 1)) return;
  DIR* d = opendir("/dev/shm");
  for (struct dirent* e; d && (e = readdir(d)) != NULL;) {
    int pid;
    uint32_t dom;
    struct stat st;
    if (!shm_name_owner(e->d_name, &pid, &dom) || dom != mine || shm_pid_alive(pid)) continue;
    /* only this user's: a stranger's file that looks like ours is not ours to remove */
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != geteuid())
      continue;
    snprintf(path, sizeof(path), "/%s", e->d_name);
    if (shm_unlink(path) == 0) n++;
  }
  if (d) closedir(d);
  if (n)
    INFO(SUB_SHM | SUB_INIT, "SHM : removed %d segments left in /dev/shm by processes that died",
         n);
}
