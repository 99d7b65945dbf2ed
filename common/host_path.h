/*
 * File names a user gives with %h and %p in them (NCCL_DEBUG_FILE,
 * BRAID_OP_LOG): this host's short name and this process's pid put in
 * (common/host_path.c). Below the log: nothing here logs.
 */
#ifndef BRAID_HOST_PATH_H_
#define BRAID_HOST_PATH_H_

#include <stddef.h>

/* This host's short name (up to the first dot) into out (cap bytes). */
void host_short_name(char* out, size_t cap);

/* pattern with %h (the short host name) and %p (the pid) expanded into out
 * (cap bytes; a longer one is cut). */
void host_expand_path(const char* pattern, char* out, size_t cap);

#endif /* BRAID_HOST_PATH_H_ */
