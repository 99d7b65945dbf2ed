/*
 * This host and process (host.h): its identity as peers compare it, and
 * random numbers from the kernel.
 */
#include "host.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"
#include "param.h"

uint64_t host_random64(void) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != sizeof(v)) v = braid_now_ns() ^ ((uint64_t)getpid() << 32);
  return v;
}

uint64_t host_hash(void) {
  const char* forced = param_hostid();
  char buf[512] = {0};
  if (forced) return braid_fnv1a(BRAID_FNV_OFFSET, forced, strlen(forced));
  gethostname(buf, 255);
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    size_t n = strlen(buf);
    if (fgets(buf + n, (int)(sizeof(buf) - n), f) == NULL) buf[n] = '\0';
    fclose(f);
  }
  return braid_fnv1a(BRAID_FNV_OFFSET, buf, strlen(buf));
}

/* Processes that see the same boot, the same /dev/shm and the same pid
 * namespace can map each other's segments and check each other's pids. */
uint64_t host_shm_domain(void) {
  char buf[512] = {0};
  struct stat st;
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (fgets(buf, (int)sizeof(buf), f) == NULL) buf[0] = '\0';
    fclose(f);
  }
  uint64_t h = braid_fnv1a(BRAID_FNV_OFFSET, buf, strlen(buf));
  if (stat("/dev/shm", &st) == 0) {
    h = braid_fnv1a(h, &st.st_dev, sizeof(st.st_dev));
    h = braid_fnv1a(h, &st.st_ino, sizeof(st.st_ino));
  }
  if (stat("/proc/self/ns/pid", &st) == 0) h = braid_fnv1a(h, &st.st_ino, sizeof(st.st_ino));
  return h;
}
