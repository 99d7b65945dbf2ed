/*
 * Topology: detection agrees with hwloc, sysconf and sysfs on this machine;
 * the JSON file round-trips every field and rejects malformed input; the
 * process-wide copy honours NCCL_TOPO_FILE and NCCL_TOPO_DUMP_FILE; binding.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <hwloc.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "debug.h"
#include "param.h"
#include "topo/topo.h"
#include "topo/topo_file.h"
#include "topo/topo_hwloc.h"
#include "topo/topo_nic.h"
#include "topo/topo_bind.h"
#include "topo/topo_sysfs.h"

static char g_dir[] = "/tmp/braid_test_topo_XXXXXX";

static void path_make(char* out, size_t cap, const char* name) {
  snprintf(out, cap, "%s/%s", g_dir, name);
}

static void text_write(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

/* The whole file as a malloc'd string. */
static char* text_read(const char* path) {
  FILE* f = fopen(path, "r");
  assert_non_null(f);
  char* buf = calloc(1 << 20, 1);
  assert_non_null(buf);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* A topology with every field set, at the edges of its range, every array
 * full, and strings that need escaping or fill their field. */
static void synthetic_fill(struct topo_system* s) {
  memset(s, 0, sizeof(*s));
  static const char odd[] = "h\"o\\s/t\t\x01\x7f\xc3\xa9-";
  memset(s->hostname, 'x', TOPO_NAME_LEN - 1); /* as long as the field allows */
  memcpy(s->hostname, odd, sizeof(odd) - 1);
  s->ncores = INT_MAX;
  s->npus = INT_MIN;
  s->l1d_bytes = 48 * 1024;
  s->l2_bytes = UINT64_MAX;
  s->l3_bytes = 1;
  s->mem_mbps = UINT32_MAX;
  s->from_file = 1;
  s->nnuma = TOPO_MAX_NUMA;
  for (int i = 0; i < TOPO_MAX_NUMA; i++) {
    s->numa[i] = (struct topo_numa){i * 2, i + 1, 2 * i + 2, (uint64_t)i << 33, ""};
    memset(s->numa[i].cpuset, '7', TOPO_CPUSET_LEN - 1);
  }
  s->nnics = TOPO_MAX_NICS;
  for (int i = 0; i < TOPO_MAX_NICS; i++) {
    snprintf(s->nics[i].name, TOPO_NAME_LEN, "nic%d", i);
    snprintf(s->nics[i].pci, TOPO_NAME_LEN, "0000:%02x:00.0", i);
    s->nics[i].numa = i % 3 - 1;
    s->nics[i].speed_mbps = i * 1000;
  }
  s->ngpus = TOPO_MAX_GPUS;
  for (int i = 0; i < TOPO_MAX_GPUS; i++) {
    snprintf(s->gpus[i].pci, TOPO_NAME_LEN, "0001:%02x:00.0", i);
    s->gpus[i].numa = -i;
  }
}

/* A small one-node host, as a hand-written file would describe it. */
static void small_fill(struct topo_system* s) {
  memset(s, 0, sizeof(*s));
  snprintf(s->hostname, sizeof(s->hostname), "fakehost");
  s->ncores = s->npus = 4;
  s->l3_bytes = 8 << 20;
  s->mem_mbps = 5000;
  s->nnuma = 1;
  s->numa[0] = (struct topo_numa){0, 4, 4, 1ull << 30, "0-3"};
  s->nnics = 2;
  s->nics[0] = (struct topo_nic){"eth0", "0000:00:03.0", 0, 25000};
  s->nics[1] = (struct topo_nic){"veth7", "", 0, 0};
}

static int sysfs_ifaces(char names[][TOPO_NAME_LEN], int max) {
  DIR* d = opendir("/sys/class/net");
  int n = 0;
  if (d == NULL) return 0;
  for (struct dirent* e = readdir(d); e != NULL; e = readdir(d))
    if (e->d_name[0] != '.' && n < max) snprintf(names[n++], TOPO_NAME_LEN, "%.63s", e->d_name);
  closedir(d);
  return n;
}

/* What every detection must show, with hwloc or without. */
static void detect_check_common(const struct topo_system* s) {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  assert_int_equal(strncmp(s->hostname, host, TOPO_NAME_LEN - 1), 0);
  assert_true(s->npus >= 1 && s->ncores >= 1 && s->ncores <= s->npus);
  assert_true(s->nnuma >= 1 && s->nnuma <= TOPO_MAX_NUMA);
  int pus = 0;
  for (int i = 0; i < s->nnuma; i++) pus += s->numa[i].npus;
  assert_int_equal(pus, s->npus);
  assert_true(s->mem_mbps > 0);
  assert_int_equal(s->from_file, 0);
  char names[256][TOPO_NAME_LEN];
  int n = sysfs_ifaces(names, 256);
  assert_true(n >= 1); /* lo at least */
  if (n <= TOPO_MAX_NICS) {
    for (int i = 0; i < n; i++) {
      if (topo_nic_find(s, names[i]) == NULL) fail_msg("interface %s missing", names[i]);
    }
  } else {
    assert_int_equal(s->nnics, TOPO_MAX_NICS);
  }
  for (int i = 0; i < s->nnics; i++) assert_true(s->nics[i].speed_mbps >= 0);
}

static void test_detect(void** state) {
  (void)state;
  static struct topo_system s;
  assert_int_equal(topo_detect(&s), ncclSuccess);
  detect_check_common(&s);
  hwloc_topology_t t;
  assert_int_equal(hwloc_topology_init(&t), 0);
  assert_int_equal(hwloc_topology_load(t), 0);
  assert_int_equal(s.ncores, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE));
  assert_int_equal(s.npus, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU));
  int nodes = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  assert_int_equal(s.nnuma, nodes < TOPO_MAX_NUMA ? nodes : TOPO_MAX_NUMA);
  hwloc_topology_destroy(t);
  /* hwloc leaves out CPUs this process may not use; compare with the online
   * count only when it may use them all. */
  cpu_set_t mine;
  assert_int_equal(sched_getaffinity(0, sizeof(mine), &mine), 0);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (CPU_COUNT(&mine) == online) assert_int_equal(s.npus, online);
  assert_true(s.npus <= online);
  topo_log_summary(&s);
}

/* With libhwloc out of reach (BRAID_HWLOC_LIB names no library), detection
 * reads sysfs and reaches what hwloc's view gives on this machine: cores,
 * PUs, NUMA nodes with their CPUs, GPUs; the NICs come from sysfs either
 * way. In a child that detects first: the library is opened, or not, once
 * per process. */
static int hidden_child(void) {
  static struct topo_system s, hw;
  setenv("BRAID_HWLOC_LIB", "/nonexistent/libhwloc.so.15", 1);
  param_cache_reset();
  if (topo_hwloc_fill(&hw) != ncclSystemError) return 2;
  if (topo_detect(&s) != ncclSuccess) return 3;
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0 ||
      hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0 ||
      hwloc_topology_load(t) != 0)
    return 4;
  int cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  int pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  int nodes = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  int bad = s.npus != pus ? 5 : s.ncores != cores ? 6 : s.nnuma != nodes ? 7 : 0;
  for (int i = 0; !bad && i < nodes && i < TOPO_MAX_NUMA; i++) {
    hwloc_obj_t n = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)i);
    if (s.numa[i].os_index != (int)n->os_index ||
        s.numa[i].npus != hwloc_get_nbobjs_inside_cpuset_by_type(t, n->cpuset, HWLOC_OBJ_PU))
      bad = 8;
  }
  int gpus = 0;
  for (hwloc_obj_t p = hwloc_get_next_pcidev(t, NULL); p; p = hwloc_get_next_pcidev(t, p))
    gpus += p->attr->pcidev.vendor_id == 0x10de &&
            (p->attr->pcidev.class_id == 0x0300 || p->attr->pcidev.class_id == 0x0302);
  if (!bad && s.ngpus != gpus) bad = 9;
  hwloc_topology_destroy(t);
  if (bad)
    fprintf(stderr, "sysfs: %d cores %d PUs %d nodes %d GPUs; hwloc: %d %d %d %d\n", s.ncores,
            s.npus, s.nnuma, s.ngpus, cores, pus, nodes, gpus);
  return bad;
}

static void test_detect_hwloc_hidden(void** state) {
  (void)state;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(hidden_child());
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
}

/* A made-up sysfs: 8 online CPUs in 2 packages of 2 cores with 2 threads
 * each, one node per package, and on the PCI bus an NVIDIA 3D controller on
 * node 1, an NVIDIA audio function and an Intel VGA device. */
static void fake_file(const char* root, const char* rel, const char* text) {
  char path[PATH_MAX], cmd[PATH_MAX + 32];
  snprintf(path, sizeof(path), "%s/%s", root, rel);
  snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\"", path);
  assert_int_equal(system(cmd), 0);
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_sysfs_fake_tree(void** state) {
  (void)state;
  char root[PATH_MAX], rel[128], text[64];
  snprintf(root, sizeof(root), "%s/sysfs", g_dir);
  fake_file(root, "sys/devices/system/cpu/online", "0-7\n");
  for (int c = 0; c < 8; c++) { /* cpu c: package c / 4, core (c / 2) % 2 */
    snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
    snprintf(text, sizeof(text), "%d\n", c / 4);
    fake_file(root, rel, text);
    snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/topology/core_id", c);
    snprintf(text, sizeof(text), "%d\n", (c / 2) % 2);
    fake_file(root, rel, text);
  }
  fake_file(root, "sys/devices/system/node/node0/cpulist", "0-3\n");
  fake_file(root, "sys/devices/system/node/node1/cpulist", "4-7\n");
  fake_file(root, "sys/devices/system/node/node1/meminfo", "Node 1 MemTotal:  2048 kB\n");
  fake_file(root, "sys/devices/system/node/node2/cpulist", "\n"); /* memory only */
  fake_file(root, "sys/bus/pci/devices/0000:81:00.0/vendor", "0x10de\n");
  fake_file(root, "sys/bus/pci/devices/0000:81:00.0/class", "0x030200\n");
  fake_file(root, "sys/bus/pci/devices/0000:81:00.0/numa_node", "1\n");
  fake_file(root, "sys/bus/pci/devices/0000:81:00.1/vendor", "0x10de\n");
  fake_file(root, "sys/bus/pci/devices/0000:81:00.1/class", "0x040300\n");
  fake_file(root, "sys/bus/pci/devices/0000:00:02.0/vendor", "0x8086\n");
  fake_file(root, "sys/bus/pci/devices/0000:00:02.0/class", "0x030000\n");
  static struct topo_system s;
  memset(&s, 0, sizeof(s));
  topo_sysfs_fill_at(&s, root);
  assert_int_equal(s.npus, 8);
  assert_int_equal(s.ncores, 4);
  assert_int_equal(s.nnuma, 2);
  assert_int_equal(s.numa[1].os_index, 1);
  assert_int_equal(s.numa[1].npus, 4);
  assert_int_equal(s.numa[1].ncores, 2);
  assert_int_equal(s.numa[1].mem_bytes, 2048 * 1024);
  assert_string_equal(s.numa[0].cpuset, "0-3");
  assert_int_equal(s.ngpus, 1);
  assert_string_equal(s.gpus[0].pci, "0000:81:00.0");
  assert_int_equal(s.gpus[0].numa, 1);
}

/* HWLOC_COMPONENTS=stop makes hwloc_topology_load fail. */
static void test_detect_without_hwloc(void** state) {
  (void)state;
  static struct topo_system s;
  setenv("HWLOC_COMPONENTS", "stop", 1);
  assert_int_equal(topo_detect(&s), ncclSuccess);
  unsetenv("HWLOC_COMPONENTS");
  detect_check_common(&s);
  assert_true(s.npus <= sysconf(_SC_NPROCESSORS_ONLN));
  assert_true(s.numa[0].cpuset[0] != '\0');
}

/* Two packages, one NUMA node each; an NVIDIA 3D controller on node 0, a NIC
 * and a device with a CUDA OS device on node 1, a NIC on the machine root. */
static const char fake_xml[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
    "<topology version=\"2.0\">\n"
    "<object type=\"Machine\" os_index=\"0\" cpuset=\"0xf\" complete_cpuset=\"0xf\""
    " allowed_cpuset=\"0xf\" nodeset=\"0x3\" complete_nodeset=\"0x3\" allowed_nodeset=\"0x3\">\n"
    " <object type=\"Package\" os_index=\"0\" cpuset=\"0x3\" complete_cpuset=\"0x3\""
    "  nodeset=\"0x1\" complete_nodeset=\"0x1\">\n"
    "  <object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x3\" complete_cpuset=\"0x3\""
    "   nodeset=\"0x1\" complete_nodeset=\"0x1\" local_memory=\"1073741824\"/>\n"
    "  <object type=\"L3Cache\" cpuset=\"0x3\" complete_cpuset=\"0x3\" nodeset=\"0x1\""
    "   complete_nodeset=\"0x1\" cache_size=\"16777216\" depth=\"3\" cache_linesize=\"64\""
    "   cache_associativity=\"16\" cache_type=\"0\">\n"
    "   <object type=\"L2Cache\" cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\""
    "    complete_nodeset=\"0x1\" cache_size=\"2097152\" depth=\"2\" cache_linesize=\"64\""
    "    cache_associativity=\"8\" cache_type=\"0\">\n"
    "    <object type=\"L1Cache\" cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\""
    "     complete_nodeset=\"0x1\" cache_size=\"49152\" depth=\"1\" cache_linesize=\"64\""
    "     cache_associativity=\"8\" cache_type=\"1\">\n"
    "     <object type=\"Core\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\""
    "      nodeset=\"0x1\" complete_nodeset=\"0x1\">\n"
    "      <object type=\"PU\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\""
    "       nodeset=\"0x1\" complete_nodeset=\"0x1\"/>\n"
    "     </object>\n"
    "    </object>\n"
    "   </object>\n"
    "   <object type=\"Core\" os_index=\"1\" cpuset=\"0x2\" complete_cpuset=\"0x2\""
    "    nodeset=\"0x1\" complete_nodeset=\"0x1\">\n"
    "    <object type=\"PU\" os_index=\"1\" cpuset=\"0x2\" complete_cpuset=\"0x2\""
    "     nodeset=\"0x1\" complete_nodeset=\"0x1\"/>\n"
    "   </object>\n"
    "  </object>\n"
    "  <object type=\"Bridge\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[17-17]\">\n"
    "   <object type=\"PCIDev\" pci_busid=\"0000:17:00.0\""
    "    pci_type=\"0302 [10de:2330] [10de:16c1] a1\"/>\n"
    "  </object>\n"
    " </object>\n"
    " <object type=\"Package\" os_index=\"1\" cpuset=\"0xc\" complete_cpuset=\"0xc\""
    "  nodeset=\"0x2\" complete_nodeset=\"0x2\">\n"
    "  <object type=\"NUMANode\" os_index=\"1\" cpuset=\"0xc\" complete_cpuset=\"0xc\""
    "   nodeset=\"0x2\" complete_nodeset=\"0x2\" local_memory=\"2147483648\"/>\n"
    "  <object type=\"Core\" os_index=\"2\" cpuset=\"0x4\" complete_cpuset=\"0x4\""
    "   nodeset=\"0x2\" complete_nodeset=\"0x2\">\n"
    "   <object type=\"PU\" os_index=\"2\" cpuset=\"0x4\" complete_cpuset=\"0x4\""
    "    nodeset=\"0x2\" complete_nodeset=\"0x2\"/>\n"
    "  </object>\n"
    "  <object type=\"Core\" os_index=\"3\" cpuset=\"0x8\" complete_cpuset=\"0x8\""
    "   nodeset=\"0x2\" complete_nodeset=\"0x2\">\n"
    "   <object type=\"PU\" os_index=\"3\" cpuset=\"0x8\" complete_cpuset=\"0x8\""
    "    nodeset=\"0x2\" complete_nodeset=\"0x2\"/>\n"
    "  </object>\n"
    "  <object type=\"Bridge\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[41-42]\">\n"
    "   <object type=\"PCIDev\" pci_busid=\"0000:41:00.0\""
    "    pci_type=\"0200 [15b3:1017] [15b3:0020] 00\">\n"
    "    <object type=\"OSDev\" name=\"fakenic1\" osdev_type=\"2\"/>\n"
    "   </object>\n"
    "   <object type=\"PCIDev\" pci_busid=\"0000:42:00.0\""
    "    pci_type=\"0380 [10de:1234] [10de:0000] 00\">\n"
    "    <object type=\"OSDev\" name=\"cuda1\" subtype=\"CUDA\" osdev_type=\"5\"/>\n"
    "   </object>\n"
    "  </object>\n"
    " </object>\n"
    " <object type=\"Bridge\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[80-80]\">\n"
    "  <object type=\"PCIDev\" pci_busid=\"0000:80:00.0\""
    "   pci_type=\"0200 [8086:1572] [8086:0000] 01\">\n"
    "   <object type=\"OSDev\" name=\"fakenic0\" osdev_type=\"2\"/>\n"
    "  </object>\n"
    " </object>\n"
    "</object>\n"
    "</topology>\n";

/* The cache a process is bound inside, from a made-up sysfs: 4 CPUs, an
 * L2 per pair (0-1, 2-3), one L3; CPU 3 lists its instruction cache as
 * index2 (sysfs numbers them per CPU), its L2 as index1. */
static void test_bound_cache(void** state) {
  (void)state;
  char root[PATH_MAX], rel[128];
  static const char* const kind[][3] = {
      {"1", "Data", ""}, {"1", "Instruction", ""}, {"2", "Unified", "l2"}, {"3", "Unified", "0-3"}};
  snprintf(root, sizeof(root), "%s/bindfs", g_dir);
  for (int c = 0; c < 4; c++)
    for (int i = 0; i < 4; i++) {
      int idx = c == 3 && i >= 1 && i <= 2 ? 3 - i : i; /* cpu 3: index1 = L2, index2 = L1i */
      char text[16];
      snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/cache/index%d/level", c, idx);
      fake_file(root, rel, kind[i][0]);
      snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/cache/index%d/type", c, idx);
      fake_file(root, rel, kind[i][1]);
      snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/cache/index%d/shared_cpu_list", c,
               idx);
      if (strcmp(kind[i][2], "l2") == 0)
        snprintf(text, sizeof(text), "%d-%d\n", c & ~1, (c & ~1) + 1);
      else
        snprintf(text, sizeof(text), "%s\n", i == 3 ? "0-3" : "");
      fake_file(root, rel, text);
    }
  cpu_set_t set;
  CPU_ZERO(&set);
  assert_int_equal(topo_bound_cache_at(root, &set, 2), -1); /* no CPU */
  CPU_SET(1, &set);
  assert_int_equal(topo_bound_cache_at(root, &set, 2), 0); /* the L2 of 0-1 */
  assert_int_equal(topo_bound_cache_at(root, &set, 3), 0);
  CPU_SET(0, &set);
  assert_int_equal(topo_bound_cache_at(root, &set, 2), 0);
  CPU_SET(2, &set);
  assert_int_equal(topo_bound_cache_at(root, &set, 2), -1); /* two L2s */
  assert_int_equal(topo_bound_cache_at(root, &set, 3), 0);
  CPU_ZERO(&set);
  CPU_SET(3, &set);
  assert_int_equal(topo_bound_cache_at(root, &set, 2), 2);
  assert_int_equal(topo_bound_cache_at(root, &set, 4), -1); /* no such level */
  CPU_SET(5, &set);                                         /* a CPU sysfs does not list */
  assert_int_equal(topo_bound_cache_at(root, &set, 2), -1);
  assert_int_equal(topo_bound_cache_at(root, &set, 3), -1);
}

/* hwloc reads a machine description from HWLOC_XMLFILE: the NUMA, cache,
 * NIC and GPU paths run on hardware this machine does not have. */
static void test_detect_hwloc_xml(void** state) {
  (void)state;
  static struct topo_system s;
  char path[PATH_MAX];
  path_make(path, sizeof(path), "fake.xml");
  text_write(path, fake_xml);
  setenv("HWLOC_XMLFILE", path, 1);
  assert_int_equal(topo_detect(&s), ncclSuccess);
  unsetenv("HWLOC_XMLFILE");
  assert_int_equal(s.ncores, 4);
  assert_int_equal(s.npus, 4);
  assert_int_equal(s.l1d_bytes, 48 * 1024);
  assert_int_equal(s.l2_bytes, 2 << 20);
  assert_int_equal(s.l3_bytes, 16 << 20);
  assert_int_equal(s.nnuma, 2);
  assert_int_equal(s.numa[0].os_index, 0);
  assert_string_equal(s.numa[0].cpuset, "0-1");
  assert_int_equal(s.numa[1].os_index, 1);
  assert_int_equal(s.numa[1].ncores, 2);
  assert_int_equal(s.numa[1].npus, 2);
  assert_int_equal(s.numa[1].mem_bytes, 2ull << 30);
  assert_string_equal(s.numa[1].cpuset, "2-3");
  const struct topo_nic* nic = topo_nic_find(&s, "fakenic1");
  assert_non_null(nic);
  assert_string_equal(nic->pci, "0000:41:00.0");
  assert_int_equal(nic->numa, 1);
  nic = topo_nic_find(&s, "fakenic0");
  assert_non_null(nic);
  assert_string_equal(nic->pci, "0000:80:00.0");
  assert_int_equal(nic->numa, -1);          /* on the machine root: no node is nearer */
  assert_non_null(topo_nic_find(&s, "lo")); /* sysfs interfaces join hwloc's */
  assert_int_equal(s.ngpus, 2);
  assert_string_equal(s.gpus[0].pci, "0000:17:00.0");
  assert_int_equal(s.gpus[0].numa, 0);
  assert_string_equal(s.gpus[1].pci, "0000:42:00.0");
  assert_int_equal(s.gpus[1].numa, 1);
  topo_log_summary(&s);
}

static void roundtrip_check(const struct topo_system* in, const char* name) {
  static struct topo_system out;
  char path[PATH_MAX];
  path_make(path, sizeof(path), name);
  memset(&out, 0xa5, sizeof(out)); /* the reader must clear what it does not set */
  assert_int_equal(topo_write_file(in, path), ncclSuccess);
  assert_int_equal(topo_read_file(path, &out), ncclSuccess);
  assert_memory_equal(in, &out, sizeof(out));
}

static void test_roundtrip(void** state) {
  (void)state;
  static struct topo_system s;
  assert_int_equal(topo_detect(&s), ncclSuccess);
  roundtrip_check(&s, "detected.json");
  synthetic_fill(&s);
  roundtrip_check(&s, "synthetic.json");
  small_fill(&s);
  roundtrip_check(&s, "small.json");
  memset(&s, 0, sizeof(s));
  roundtrip_check(&s, "empty.json");
}

/* Any layout of whitespace reads the same. */
static void test_whitespace(void** state) {
  (void)state;
  static struct topo_system s, out;
  char path[PATH_MAX];
  small_fill(&s);
  path_make(path, sizeof(path), "ws.json");
  assert_int_equal(topo_write_file(&s, path), ncclSuccess);
  char* text = text_read(path);
  char* squeezed = calloc(strlen(text) * 3 + 1, 1);
  char* spread = calloc(strlen(text) * 3 + 1, 1);
  size_t a = 0, b = 0;
  int in_str = 0;
  for (const char* c = text; *c; c++) {
    if (*c == '"' && (c == text || c[-1] != '\\')) in_str = !in_str;
    if (!in_str && (*c == ' ' || *c == '\n')) continue;
    squeezed[a++] = *c;
    spread[b++] = *c;
    if (!in_str && strchr("{}[],:", *c)) spread[b++] = '\n', spread[b++] = '\t';
  }
  text_write(path, squeezed);
  assert_int_equal(topo_read_file(path, &out), ncclSuccess);
  assert_memory_equal(&s, &out, sizeof(s));
  text_write(path, spread);
  assert_int_equal(topo_read_file(path, &out), ncclSuccess);
  assert_memory_equal(&s, &out, sizeof(s));
  free(text);
  free(squeezed);
  free(spread);
}

static void reject_check(const char* path, const char* text) {
  static struct topo_system out;
  text_write(path, text);
  memset(&out, 0xa5, sizeof(out));
  ncclResult_t r = topo_read_file(path, &out);
  if (r != ncclInvalidArgument) fail_msg("accepted (%d): %s", (int)r, text);
  if (strstr(debug_last_error(), path) == NULL) fail_msg("WARN lacks the path: %s", text);
  static const struct topo_system zero;
  assert_memory_equal(&out, &zero, sizeof(zero));
}

/* `good` with its first `from` replaced by `to`. */
static void reject_variant(const char* path, const char* good, const char* from, const char* to) {
  const char* at = strstr(good, from);
  assert_non_null(at);
  char* bad = calloc(strlen(good) + strlen(to) + 1, 1);
  memcpy(bad, good, (size_t)(at - good));
  strcat(bad, to);
  strcat(bad, at + strlen(from));
  reject_check(path, bad);
  free(bad);
}

static void test_malformed(void** state) {
  (void)state;
  static struct topo_system s;
  char path[PATH_MAX];
  small_fill(&s);
  path_make(path, sizeof(path), "bad.json");
  assert_int_equal(topo_write_file(&s, path), ncclSuccess);
  char* good = text_read(path);
  /* Every truncation: no prefix of the object is a whole one. */
  size_t last = strrchr(good, '}') - good;
  for (size_t n = 0; n <= last; n++) {
    char* cut = strndup(good, n);
    reject_check(path, cut);
    free(cut);
  }
  reject_variant(path, good, "\"version\": 1", "\"version\": 2");
  reject_variant(path, good, "\"ncores\": 4", "\"ncores\": 4.0");
  reject_variant(path, good, "\"ncores\": 4", "\"ncores\": 4e0");
  reject_variant(path, good, "\"ncores\": 4", "\"ncores\": \"4\"");
  reject_variant(path, good, "\"ncores\": 4", "\"ncores\": 2147483648");
  reject_variant(path, good, "\"ncores\": 4", "\"ncores\": -");
  reject_variant(path, good, "\"mem_mbps\": 5000", "\"mem_mbps\": 4294967296");
  reject_variant(path, good, "\"mem_mbps\": 5000", "\"mem_mbps\": -1");
  reject_variant(path, good, "\"l3_bytes\": 8388608", "\"l3_bytes\": 18446744073709551616");
  reject_variant(path, good, "\"ncores\": 4,", "");                /* missing key */
  reject_variant(path, good, "\"ncores\": 4,", "\"cores\": 4,");   /* unknown key */
  reject_variant(path, good, "\"npus\": 4,", "\"ncores\": 4,");    /* repeated key */
  reject_variant(path, good, "\"speed_mbps\": 0", "\"speed\": 0"); /* in an array entry */
  reject_variant(path, good, "\"ncores\": 4,", "\"ncores\": 4,,");
  reject_variant(path, good, "\"fakehost\"", "\"fake\\xhost\"");
  reject_variant(path, good, "\"fakehost\"", "\"fake\\u0000host\"");
  reject_variant(path, good, "\"fakehost\"", "\"fake\\u00e9host\"");
  reject_variant(path, good, "\"fakehost\"", "\"fake\thost\"");
  reject_variant(path, good, "\"fakehost\"",
                 "\"0123456789012345678901234567890123456789012345678901234567890123\"");
  reject_variant(path, good, "\"veth7\"", "\"veth7\", \"x\": 1");
  reject_variant(path, good, "\"gpus\": []", "\"gpus\": [{}]");
  reject_variant(path, good, "\"gpus\": []", "\"gpus\": {}");
  reject_variant(path, good, "\n}", "\n} {}");
  reject_variant(path, good, "\n}", ",\n}");
  /* More entries than the struct holds. */
  char* many = calloc(4096, 1);
  strcpy(many, "\"gpus\": [");
  for (int i = 0; i <= TOPO_MAX_GPUS; i++)
    strcat(many, i ? ", {\"pci\": \"\", \"numa\": 0}" : "{\"pci\": \"\", \"numa\": 0}");
  strcat(many, "]");
  reject_variant(path, good, "\"gpus\": []", many);
  free(many);
  free(good);
  /* Unreadable files are a system error, not a parse error. */
  path_make(path, sizeof(path), "does-not-exist.json");
  assert_int_equal(topo_read_file(path, &s), ncclSystemError);
}

static void test_nic_find(void** state) {
  (void)state;
  static struct topo_system s;
  small_fill(&s);
  assert_ptr_equal(topo_nic_find(&s, "veth7"), &s.nics[1]);
  assert_ptr_equal(topo_nic_find(&s, "eth0"), &s.nics[0]);
  assert_null(topo_nic_find(&s, "eth"));
  assert_null(topo_nic_find(&s, NULL));
  assert_null(topo_nic_find(NULL, "eth0"));
}

struct bind_case {
  const struct topo_system* sys;
  const char *ifname, *gpu;
  ncclResult_t res;
  cpu_set_t after;
};

static void* bind_thread(void* arg) {
  struct bind_case* c = arg;
  c->res = topo_bind_thread_near(c->sys, c->ifname, c->gpu);
  pthread_getaffinity_np(pthread_self(), sizeof(c->after), &c->after);
  return NULL;
}

/* Runs on a fresh thread so the test's own affinity stays as it was. */
static struct bind_case bind_run(const struct topo_system* s, const char* ifname, const char* gpu) {
  struct bind_case c = {s, ifname, gpu, ncclInternalError, {{0}}};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, bind_thread, &c), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  return c;
}

static void test_bind(void** state) {
  (void)state;
  static struct topo_system s;
  cpu_set_t mine;
  assert_int_equal(sched_getaffinity(0, sizeof(mine), &mine), 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &mine)) cpu++;
  small_fill(&s); /* one node: nothing to do */
  struct bind_case c = bind_run(&s, "eth0", NULL);
  assert_int_equal(c.res, ncclSuccess);
  assert_true(CPU_EQUAL(&c.after, &mine));
  /* Two nodes; the NIC and the GPU sit on node 5, which owns one CPU. */
  s.nnuma = 2;
  s.numa[1] = (struct topo_numa){5, 1, 1, 0, ""};
  snprintf(s.numa[1].cpuset, TOPO_CPUSET_LEN, "%d", cpu);
  s.nics[0].numa = 5;
  s.ngpus = 1;
  s.gpus[0] = (struct topo_gpu){"0000:17:00.0", 5};
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  c = bind_run(&s, "eth0", NULL);
  assert_int_equal(c.res, ncclSuccess);
  assert_true(CPU_EQUAL(&c.after, &one));
  c = bind_run(&s, NULL, "0000:17:00.0");
  assert_int_equal(c.res, ncclSuccess);
  assert_true(CPU_EQUAL(&c.after, &one));
  /* Unknown device or node: left alone. */
  c = bind_run(&s, "nosuch0", NULL);
  assert_int_equal(c.res, ncclSuccess);
  assert_true(CPU_EQUAL(&c.after, &mine));
  s.nics[1].numa = 9; /* a node the topology does not describe */
  c = bind_run(&s, "veth7", NULL);
  assert_int_equal(c.res, ncclSuccess);
  assert_true(CPU_EQUAL(&c.after, &mine));
  snprintf(s.numa[1].cpuset, TOPO_CPUSET_LEN, "0-");
  c = bind_run(&s, "eth0", NULL);
  assert_int_equal(c.res, ncclInvalidArgument);
  assert_int_equal(topo_bind_thread_near(NULL, "eth0", NULL), ncclInvalidArgument);
}

static void test_log_summary(void** state) {
  (void)state;
  static struct topo_system s;
  synthetic_fill(&s); /* lines longer than a log line must be cut, not overrun */
  topo_log_summary(&s);
  small_fill(&s);
  topo_log_summary(&s);
  topo_log_summary(NULL);
}

/* In a child, so this process's cached copy stays unset for the next tests:
 * a malformed NCCL_TOPO_FILE falls back to detection, and a dump of a
 * detected topology loads back the same. Returns the child's exit code. */
static int child_fallback_and_dump(const char* bad, const char* dump) {
  static struct topo_system back;
  const struct topo_system* s = NULL;
  setenv("NCCL_TOPO_FILE", bad, 1);
  setenv("NCCL_TOPO_DUMP_FILE", dump, 1);
  if (topo_system_get(&s) != ncclSuccess || s == NULL) return 1;
  if (s->from_file != 0 || s->npus < 1 || s->nnuma < 1) return 2;
  if (topo_read_file(dump, &back) != ncclSuccess) return 3;
  if (memcmp(&back, s, sizeof(back)) != 0) return 4;
  return 0;
}

static void test_system_get_fallback(void** state) {
  (void)state;
  char bad[PATH_MAX], dump[PATH_MAX];
  path_make(bad, sizeof(bad), "garbage.json");
  path_make(dump, sizeof(dump), "dump-detected.json");
  text_write(bad, "{\"version\": 1, \"hostname\": ");
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(child_fallback_and_dump(bad, dump));
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_system_get(void** state) {
  (void)state;
  static struct topo_system want, back;
  char file[PATH_MAX], dump[PATH_MAX];
  small_fill(&want);
  path_make(file, sizeof(file), "given.json");
  path_make(dump, sizeof(dump), "dump.json");
  assert_int_equal(topo_write_file(&want, file), ncclSuccess);
  setenv("NCCL_TOPO_FILE", file, 1);
  setenv("NCCL_TOPO_DUMP_FILE", dump, 1);
  const struct topo_system *s = NULL, *again = NULL;
  assert_int_equal(topo_system_get(&s), ncclSuccess);
  want.from_file = 1;
  assert_memory_equal(s, &want, sizeof(want));
  assert_int_equal(topo_read_file(dump, &back), ncclSuccess);
  assert_memory_equal(&back, s, sizeof(back));
  /* Cached: later environment changes and calls change nothing, and the
   * dump is written once. */
  assert_int_equal(unlink(dump), 0);
  setenv("NCCL_TOPO_FILE", "/nonexistent/topo.json", 1);
  assert_int_equal(topo_system_get(&again), ncclSuccess);
  assert_ptr_equal(again, s);
  assert_memory_equal(again, &want, sizeof(want));
  assert_int_not_equal(access(dump, F_OK), 0);
  unsetenv("NCCL_TOPO_FILE");
  unsetenv("NCCL_TOPO_DUMP_FILE");
  assert_int_equal(topo_system_get(NULL), ncclInvalidArgument);
}

static int dir_setup(void** state) {
  (void)state;
  return mkdtemp(g_dir) == NULL ? -1 : 0;
}

static int dir_teardown(void** state) {
  (void)state;
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_detect_hwloc_hidden),
      cmocka_unit_test(test_detect),
      cmocka_unit_test(test_detect_without_hwloc),
      cmocka_unit_test(test_sysfs_fake_tree),
      cmocka_unit_test(test_bound_cache),
      cmocka_unit_test(test_detect_hwloc_xml),
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_whitespace),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_nic_find),
      cmocka_unit_test(test_bind),
      cmocka_unit_test(test_log_summary),
      /* Before test_system_get: the child must not inherit a cached copy. */
      cmocka_unit_test(test_system_get_fallback),
      cmocka_unit_test(test_system_get),
  };
  return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
