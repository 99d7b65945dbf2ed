/*
 * What braid-status and a process's status service say to each other on
 * the service's Unix socket (status_service.c answers, status_api.c asks):
 * one fixed-size request, then the answer's text until the socket closes.
 */
#ifndef BRAID_STATUS_PROTO_H_
#define BRAID_STATUS_PROTO_H_

#include <stdint.h>

#define STATUS_PREFIX "braid-status-"
#define STATUS_MAGIC 0x53544154u /* "STAT" */
#define STATUS_VERSION 1u

/* What braid-status asks a process (one fixed-size hello on the socket):
 * the answer is text, then the connection closes. */
enum status_what { STATUS_VERDICT = 1, STATUS_JSON, STATUS_PROMETHEUS };

struct status_request {
  uint32_t magic, version;
  uint32_t what; /* enum status_what */
  uint32_t flags;
};

#endif /* BRAID_STATUS_PROTO_H_ */
