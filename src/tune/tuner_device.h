/*
 * The tuner's model of device-buffer calls on one node (tuner_device.c):
 * direct, device to device, against staging through host memory.
 */
#ifndef BRAID_TUNER_DEVICE_H_
#define BRAID_TUNER_DEVICE_H_

#include <stddef.h>

struct ncclComm;

/* Whether direct is modelled faster than staging through host memory for
 * a device-buffer call of `bytes` on one node, `ranks_per_device` ranks at
 * most sharing a GPU. */
int tuner_prefers_direct(const struct ncclComm* comm, int coll, size_t bytes, int ranks_per_device);

#endif /* BRAID_TUNER_DEVICE_H_ */
