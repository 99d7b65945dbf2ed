/*
 * Whether GPUDirect RDMA would be available: the NIC reading and writing
 * GPU memory directly needs the NVIDIA peer-memory kernel module
 * (nvidia_peermem, or the older nv_peer_mem), as NCCL checks for it. Braid
 * does not use it yet: device buffers cross the verbs transport through
 * pinned host slots. The transport logs what it found.
 */
#ifndef BRAID_IB_GDR_H_
#define BRAID_IB_GDR_H_

/* The module found under the file system at `root` ("/" on a host), or
 * NULL: "nvidia_peermem", "nv_peer_mem". */
const char* ib_gdr_module(const char* root);

#endif /* BRAID_IB_GDR_H_ */
