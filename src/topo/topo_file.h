/*
 * NCCL_TOPO_FILE (topo_file.c): a topology written and read back.
 */
#ifndef BRAID_TOPO_FILE_H_
#define BRAID_TOPO_FILE_H_

#include <stddef.h>

#include "nccl.h"
#include "topo/topo_system.h"

ncclResult_t topo_write_file(const struct topo_system* sys, const char* path);
ncclResult_t topo_read_file(const char* path, struct topo_system* sys);
/* The parser of topo_read_file on len bytes of text (no NUL needed); `name`
 * names the text in WARNs. All or nothing: sys is zeroed on failure. */
ncclResult_t topo_parse_text(const char* name, const char* text, size_t len,
                             struct topo_system* sys);

#endif /* BRAID_TOPO_FILE_H_ */
