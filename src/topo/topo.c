/*
 * Topology detection: hwloc's view of this host (topo_hwloc.c, when the
 * library can be opened) or sysconf's and sysfs's, plus the network
 * interfaces only sysfs knows (veth, bridges, lo), and a memcpy bandwidth
 * probe; cached once per process. The NCCL_TOPO_FILE format lives in
 * topo_file.c.
 */
#include "topo/topo.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core.h"
#include "param.h"
#include "topo/topo_file.h"
#include "topo/topo_hwloc.h"
#include "topo/topo_nic.h"
#include "topo/topo_sysfs.h"

#define TOPO_BENCH_BYTES ((size_t)64 << 20)
#define TOPO_BENCH_REPS 3
#define TOPO_SYSFS_NET "/sys/class/net"
#define TOPO_MAX_IFACES 1024 /* names read from sysfs before the TOPO_MAX_NICS cut */

static struct {
  pthread_once_t once;
  ncclResult_t res;
  struct topo_system sys;
} g_topo = {.once = PTHREAD_ONCE_INIT};

/* ---- sysfs and sysconf helpers ---- */

static uint64_t topo_sysconf_u64(int name) {
  long v = sysconf(name);
  return v > 0 ? (uint64_t)v : 0;
}

static void topo_hostname_read(char* out, size_t cap) {
  char host[HOST_NAME_MAX + 1] = "";
  if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "unknown");
  host[HOST_NAME_MAX] = '\0'; /* gethostname need not terminate a truncated name */
  snprintf(out, cap, "%s", host);
}

/* The PCI bus id in a sysfs device path: the last component shaped like
 * "0000:00:03.0" (a virtio NIC's device is virtioN, under its PCI function). */
static void topo_sysfs_pci_find(const char* ifname, char* out, size_t cap) {
  char link[PATH_MAX], real[PATH_MAX];
  out[0] = '\0';
  snprintf(link, sizeof(link), TOPO_SYSFS_NET "/%s/device", ifname);
  if (realpath(link, real) == NULL) return; /* virtual device: no PCI id */
  char* save = NULL;
  for (char* c = strtok_r(real, "/", &save); c != NULL; c = strtok_r(NULL, "/", &save)) {
    unsigned d, b, s, f;
    char end;
    if (strlen(c) == 12 && sscanf(c, "%4x:%2x:%2x.%1x%c", &d, &b, &s, &f, &end) == 4)
      snprintf(out, cap, "%s", c);
  }
}

/* sysfs knows the node of a PCI NIC (on its PCI function: a virtio NIC's own
 * device has none); a virtual one is as near to the only node as anything,
 * and to none in particular when there are several. */
static int topo_sysfs_nic_numa(const struct topo_system* sys, const struct topo_nic* nic) {
  char path[PATH_MAX];
  if (nic->pci[0] != '\0')
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", nic->pci);
  else
    snprintf(path, sizeof(path), TOPO_SYSFS_NET "/%s/device/numa_node", nic->name);
  long node = topo_sysfs_read_long(path, -1);
  if (node >= 0 && node <= INT_MAX) return (int)node;
  return sys->nnuma == 1 ? sys->numa[0].os_index : -1;
}

static int topo_name_cmp(const void* a, const void* b) {
  return strcmp((const char*)a, (const char*)b);
}

/* Interfaces hwloc did not report: hwloc only lists devices with a PCI
 * parent, and the emulated cluster runs over veth pairs and bridges. */
static void topo_sysfs_nics_add(struct topo_system* sys) {
  char(*names)[TOPO_NAME_LEN] = NULL;
  DIR* dir = NULL;
  int n = 0;
  if (braid_calloc(&names, TOPO_MAX_IFACES, TOPO_NAME_LEN) != ncclSuccess) goto done;
  if ((dir = opendir(TOPO_SYSFS_NET)) == NULL) {
    INFO(TOPO_LOG_SUB, "Topology: cannot list " TOPO_SYSFS_NET ": %s", strerror(errno));
    goto done;
  }
  for (struct dirent* e = readdir(dir); e != NULL && n < TOPO_MAX_IFACES; e = readdir(dir)) {
    size_t len = strlen(e->d_name); /* IFNAMSIZ keeps real names far shorter */
    if (e->d_name[0] != '.' && len < TOPO_NAME_LEN) memcpy(names[n++], e->d_name, len + 1);
  }
  qsort(names, (size_t)n, TOPO_NAME_LEN, topo_name_cmp); /* readdir order is arbitrary */
  for (int i = 0; i < n; i++) {
    if (topo_nic_find(sys, names[i]) != NULL) continue;
    struct topo_nic* nic = topo_nic_add(sys, names[i]);
    if (nic == NULL) break;
    topo_sysfs_pci_find(names[i], nic->pci, sizeof(nic->pci));
    nic->numa = topo_sysfs_nic_numa(sys, nic);
  }
done:
  if (dir != NULL) closedir(dir);
  free(names);
}

/* ---- the last resort: one node of every online CPU ---- */

static void topo_fallback_numa_fill(struct topo_system* sys) {
  struct topo_numa* nm = &sys->numa[0];
  sys->nnuma = 1;
  nm->os_index = 0;
  nm->ncores = sys->ncores;
  nm->npus = sys->npus;
  nm->mem_bytes = topo_sysconf_u64(_SC_PHYS_PAGES) * topo_sysconf_u64(_SC_PAGESIZE);
  FILE* f = fopen("/sys/devices/system/cpu/online", "r");
  if (f == NULL || fgets(nm->cpuset, sizeof(nm->cpuset), f) == NULL)
    snprintf(nm->cpuset, sizeof(nm->cpuset), "0-%d", sys->npus - 1);
  if (f != NULL) fclose(f);
  nm->cpuset[strcspn(nm->cpuset, "\n")] = '\0';
}

/* ---- memcpy bandwidth ---- */

/* One thread copies one half of a 64 MiB buffer to the other, best of
 * TOPO_BENCH_REPS: the tuner's bound for a copy step. The buffer is twice
 * the last-level cache of most hosts, so the copies go to memory. An untimed
 * first copy faults the destination in, so the timing sees copies, not page
 * faults. The buffer asks for transparent huge pages: faulting it in as
 * 4 KiB pages was most of the probe's cost (32768 faults, in every process's
 * first communicator); where THP is off, the advice is ignored. */
static uint32_t topo_memcpy_mbps_measure(void) {
  const size_t half = TOPO_BENCH_BYTES / 2;
  uint64_t best = UINT64_MAX;
  char* buf =
      mmap(NULL, TOPO_BENCH_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) {
    INFO(TOPO_LOG_SUB, "Topology: no memory for the memcpy probe, bandwidth unknown");
    return 0;
  }
  (void)madvise(buf, TOPO_BENCH_BYTES, MADV_HUGEPAGE);
  memset(buf, 1, half);
  for (int i = -1; i < TOPO_BENCH_REPS; i++) {
    uint64_t t0 = braid_now_ns();
    memcpy(buf + half, buf, half);
    __asm__ volatile("" : : "r"(buf) : "memory"); /* keep the copy: it is never read */
    uint64_t dt = braid_now_ns() - t0;
    if (i >= 0) best = MIN(best, dt);
  }
  munmap(buf, TOPO_BENCH_BYTES);
  uint64_t mbps = (uint64_t)half * 1000u / MAX(best, 1u); /* bytes/ns = GB/s */
  return mbps > UINT32_MAX ? UINT32_MAX : (uint32_t)mbps;
}

ncclResult_t topo_detect(struct topo_system* sys) {
  if (sys == NULL) {
    WARN("topo_detect: sys is NULL");
    return ncclInvalidArgument;
  }
  memset(sys, 0, sizeof(*sys));
  topo_hostname_read(sys->hostname, sizeof(sys->hostname));
  if (topo_hwloc_fill(sys) != ncclSuccess) {
    INFO(TOPO_LOG_SUB, "Topology: using sysconf/sysfs instead of hwloc");
    topo_sysfs_fill(sys); /* hwloc wrote nothing: it fails only before filling */
  }
  if (sys->ncores <= 0) sys->ncores = sys->npus; /* some VMs show hwloc no cores */
  if (sys->nnuma == 0) topo_fallback_numa_fill(sys);
  topo_sysfs_nics_add(sys);
  sys->mem_mbps = topo_memcpy_mbps_measure();
  return ncclSuccess;
}

/* ---- the process-wide copy ---- */

static ncclResult_t topo_system_load(struct topo_system* sys) {
  const char* path = param_topo_file();
  if (path != NULL) {
    if (topo_read_file(path, sys) == ncclSuccess) {
      sys->from_file = 1;
      INFO(TOPO_LOG_SUB, "Topology: loaded from NCCL_TOPO_FILE %s", path);
      return ncclSuccess;
    }
    WARN("Topology: cannot use NCCL_TOPO_FILE %s, detecting the topology instead", path);
  }
  return topo_detect(sys);
}

/* A dump is a diagnostic: failing to write one must not fail the caller. */
static void topo_system_dump(const struct topo_system* sys) {
  const char* path = param_topo_dump_file();
  if (path != NULL && topo_write_file(sys, path) == ncclSuccess)
    INFO(TOPO_LOG_SUB, "Topology: written to NCCL_TOPO_DUMP_FILE %s", path);
}

static void topo_system_init(void) {
  g_topo.res = topo_system_load(&g_topo.sys);
  if (g_topo.res == ncclSuccess) topo_system_dump(&g_topo.sys);
}

ncclResult_t topo_system_get(const struct topo_system** out) {
  if (out == NULL) {
    WARN("topo_system_get: out is NULL");
    return ncclInvalidArgument;
  }
  pthread_once(&g_topo.once, topo_system_init);
  if (g_topo.res == ncclSuccess) *out = &g_topo.sys;
  return g_topo.res;
}

/* ---- summary ---- */

struct topo_text {
  char s[900]; /* under debug_log's 1024-byte line */
  size_t len;
};

static void topo_text_add(struct topo_text* t, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void topo_text_add(struct topo_text* t, const char* fmt, ...) {
  if (t->len >= sizeof(t->s) - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->s + t->len, sizeof(t->s) - t->len, fmt, ap);
  va_end(ap);
  if (n > 0) t->len = MIN(t->len + (size_t)n, sizeof(t->s) - 1);
}

static void topo_text_size(struct topo_text* t, const char* name, uint64_t b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  if (b == 0) return;
  while (u < 3 && b % 1024 == 0) b /= 1024, u++;
  topo_text_add(t, ", %s %llu %s", name, (unsigned long long)b, units[u]);
}

static void topo_text_numa(struct topo_text* t, int numa) {
  if (numa >= 0)
    topo_text_add(t, "NUMA %d", numa);
  else
    topo_text_add(t, "NUMA ?");
}

static void topo_text_nics(struct topo_text* t, const struct topo_system* sys) {
  topo_text_add(t, "NICs%s", sys->nnics ? "" : " none");
  for (int i = 0; i < sys->nnics; i++) {
    const struct topo_nic* n = &sys->nics[i];
    topo_text_add(t, "%s %s (", i ? "," : "", n->name);
    if (n->speed_mbps > 0)
      topo_text_add(t, "%d Mb/s, ", n->speed_mbps);
    else
      topo_text_add(t, "? Mb/s, ");
    topo_text_numa(t, n->numa);
    topo_text_add(t, "%s%s)", n->pci[0] ? ", PCI " : "", n->pci);
  }
}

static void topo_text_gpus(struct topo_text* t, const struct topo_system* sys) {
  topo_text_add(t, "GPUs%s", sys->ngpus ? "" : " none");
  for (int i = 0; i < sys->ngpus; i++) {
    topo_text_add(t, "%s %s (", i ? "," : "", sys->gpus[i].pci);
    topo_text_numa(t, sys->gpus[i].numa);
    topo_text_add(t, ")");
  }
}

/* One line as NCCL prints it; three when many NICs would not fit in one. */
void topo_log_summary(const struct topo_system* sys) {
  struct topo_text head = {"", 0}, nics = {"", 0}, gpus = {"", 0};
  if (sys == NULL || !debug_enabled(DEBUG_INFO, TOPO_LOG_SUB)) return;
  topo_text_add(&head, "host %s, %d NUMA node%s, %d cores/%d PUs", sys->hostname, sys->nnuma,
                sys->nnuma == 1 ? "" : "s", sys->ncores, sys->npus);
  topo_text_size(&head, "L1d", sys->l1d_bytes);
  topo_text_size(&head, "L2", sys->l2_bytes);
  topo_text_size(&head, "L3", sys->l3_bytes);
  topo_text_nics(&nics, sys);
  topo_text_gpus(&gpus, sys);
  const char* origin = sys->from_file ? " (from NCCL_TOPO_FILE)" : "";
  if (head.len + nics.len + gpus.len + 64 < sizeof(head.s)) {
    INFO(TOPO_LOG_SUB, "Topology: %s, %s, %s, memcpy %u MB/s%s", head.s, nics.s, gpus.s,
         (unsigned)sys->mem_mbps, origin);
    return;
  }
  INFO(TOPO_LOG_SUB, "Topology: %s, memcpy %u MB/s%s", head.s, (unsigned)sys->mem_mbps, origin);
  INFO(TOPO_LOG_SUB, "Topology: %s", nics.s);
  INFO(TOPO_LOG_SUB, "Topology: %s", gpus.s);
}

/* ---- binding ---- */

static int topo_device_numa(const struct topo_system* sys, const char* ifname, const char* pci) {
  if (ifname != NULL) {
    const struct topo_nic* nic = topo_nic_find(sys, ifname);
    return nic ? nic->numa : -1;
  }
  for (int i = 0; pci != NULL && i < sys->ngpus; i++)
    if (strcmp(sys->gpus[i].pci, pci) == 0) return sys->gpus[i].numa;
  return -1;
}

static const struct topo_numa* topo_numa_find(const struct topo_system* sys, int os_index) {
  for (int i = 0; os_index >= 0 && i < sys->nnuma; i++)
    if (sys->numa[i].os_index == os_index) return &sys->numa[i];
  return NULL;
}

ncclResult_t topo_bind_thread_near(const struct topo_system* sys, const char* ifname,
                                   const char* gpu_pci) {
  ncclResult_t res = ncclSuccess;
  if (sys == NULL) FAIL(ncclInvalidArgument, "topo_bind_thread_near: sys is NULL");
  const char* what = ifname ? ifname : gpu_pci ? gpu_pci : "no device";
  const struct topo_numa* node = topo_numa_find(sys, topo_device_numa(sys, ifname, gpu_pci));
  if (sys->nnuma <= 1 || node == NULL) {
    INFO(TOPO_LOG_SUB, "Topology: not binding near %s: %s", what,
         sys->nnuma <= 1 ? "one NUMA node" : "its NUMA node is unknown");
    return ncclSuccess;
  }
  cpu_set_t set;
  if (topo_cpuset_parse(node->cpuset, &set) != 0)
    FAIL(ncclInvalidArgument, "Topology: malformed cpuset \"%s\" of NUMA node %d", node->cpuset,
         node->os_index);
  if (CPU_COUNT(&set) == 0) {
    INFO(TOPO_LOG_SUB, "Topology: not binding near %s: NUMA node %d has no CPUs", what,
         node->os_index);
    return ncclSuccess;
  }
  int err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (err != 0)
    FAIL(ncclSystemError, "Topology: cannot bind to NUMA node %d (CPUs %s) near %s: %s",
         node->os_index, node->cpuset, what, strerror(err));
  INFO(TOPO_LOG_SUB, "Topology: bound thread to NUMA node %d (CPUs %s) near %s", node->os_index,
       node->cpuset, what);
fail:
  return res;
}
