/*
 * A NIC's shaped rate: the token-bucket (tbf) qdisc at the root of an
 * interface caps what it sends below what sysfs says the link can do.
 * Emulated clusters (scripts/cluster.sh) and rate-limited tenants shape
 * links this way, and a tuner fed the raw 10 Gb/s of a veth would price
 * the network five times too cheap. Asked of the kernel over rtnetlink
 * (RTM_GETQDISC), once per interface at detection time.
 */
#include "topo/topo_shaping.h"

#include <errno.h>
#include <linux/netlink.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "core.h"

#define SHAPING_BUF_BYTES 32768

/* The tbf rate in bytes/s from a qdisc's TCA_OPTIONS: the 64-bit
 * attribute when the rate needs it, else the classic parameter block. */
static uint64_t tbf_rate_bytes(const struct rtattr* opts) {
  uint64_t rate = 0, rate64 = 0;
  int len = (int)RTA_PAYLOAD(opts);
  for (const struct rtattr* a = RTA_DATA(opts); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
    if (a->rta_type == TCA_TBF_PARMS && RTA_PAYLOAD(a) >= sizeof(struct tc_tbf_qopt)) {
      struct tc_tbf_qopt q;
      memcpy(&q, RTA_DATA(a), sizeof(q));
      rate = q.rate.rate;
    } else if (a->rta_type == TCA_TBF_RATE64 && RTA_PAYLOAD(a) >= sizeof(uint64_t)) {
      memcpy(&rate64, RTA_DATA(a), sizeof(rate64));
    }
  }
  return rate64 ? rate64 : rate;
}

/* Bytes/s of the root tbf on `ifindex` in one RTM_NEWQDISC message, or 0. */
static uint64_t qdisc_root_tbf(const struct nlmsghdr* h, unsigned ifindex) {
  const struct tcmsg* tc = NLMSG_DATA(h);
  if (h->nlmsg_type != RTM_NEWQDISC || (unsigned)tc->tcm_ifindex != ifindex ||
      tc->tcm_parent != TC_H_ROOT)
    return 0;
  int len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*tc)));
  const struct rtattr* opts = NULL;
  int is_tbf = 0;
  for (const struct rtattr* a = (const struct rtattr*)((const char*)tc + NLMSG_ALIGN(sizeof(*tc)));
       RTA_OK(a, len); a = RTA_NEXT(a, len)) {
    if (a->rta_type == TCA_KIND) is_tbf = strcmp(RTA_DATA(a), "tbf") == 0;
    if (a->rta_type == TCA_OPTIONS) opts = a;
  }
  return is_tbf && opts ? tbf_rate_bytes(opts) : 0;
}

static int qdisc_dump_request(int fd) {
  struct {
    struct nlmsghdr h;
    struct tcmsg tc;
  } req = {.h = {.nlmsg_len = NLMSG_LENGTH(sizeof(struct tcmsg)),
                 .nlmsg_type = RTM_GETQDISC,
                 .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP,
                 .nlmsg_seq = 1},
           .tc = {.tcm_family = AF_UNSPEC}};
  return send(fd, &req, req.h.nlmsg_len, MSG_NOSIGNAL) == (ssize_t)req.h.nlmsg_len ? 0 : -1;
}

/* Reads the dump to its end; the rate of the root tbf on ifindex, or 0. */
static uint64_t qdisc_dump_scan(int fd, unsigned ifindex) {
  char buf[SHAPING_BUF_BYTES] __attribute__((aligned(NLMSG_ALIGNTO)));
  uint64_t found = 0;
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return found;
    int len = (int)n;
    for (const struct nlmsghdr* h = (const struct nlmsghdr*)buf; NLMSG_OK(h, len);
         h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) return found;
      uint64_t r = qdisc_root_tbf(h, ifindex);
      if (r) found = r;
    }
  }
}

int topo_nic_shaped_mbps(const char* ifname) {
  unsigned ifindex = if_nametoindex(ifname);
  if (ifindex == 0) return 0;
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return 0;
  struct timeval tmo = {.tv_sec = 1}; /* the kernel answers at once; never hang init on it */
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof(tmo));
  uint64_t bytes = qdisc_dump_request(fd) == 0 ? qdisc_dump_scan(fd, ifindex) : 0;
  close(fd);
  uint64_t mbps = bytes * 8 / 1000000;
  return mbps > (uint64_t)INT32_MAX ? INT32_MAX : (int)mbps;
}
