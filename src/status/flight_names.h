/*
 * The names a flight snapshot's numbers are shown by, and back
 * (flight_names.c): the dumps braid-status reads hold names, so that a
 * person reads them as they are. A name not known parses as -1 (the
 * transport's as 255, the state's as 0, the status's as ncclInternalError).
 */
#ifndef BRAID_FLIGHT_NAMES_H_
#define BRAID_FLIGHT_NAMES_H_

#include <stddef.h>
#include <stdint.h>

#define FLIGHT_ALGO_DIRECT (-2) /* a device collective run in one pass, no schedule */

enum flight_state { FLIGHT_QUEUED = 1, FLIGHT_RUNNING, FLIGHT_DONE, FLIGHT_FAILED };
enum flight_kind { FLIGHT_COLL = 0, FLIGHT_SEND, FLIGHT_RECV };

const char* flight_op_name(int kind, int coll);
const char* flight_type_name(int type);
const char* flight_redop_name(int op);
const char* flight_algo_name(int algo);
const char* flight_transport_name(int id);
const char* flight_state_name(int state);
int flight_op_parse(const char* name, int* kind, int* coll);
int flight_type_parse(const char* name);
int flight_redop_parse(const char* name);
int flight_algo_parse(const char* name);
int flight_transport_parse(const char* name);
int flight_state_parse(const char* name);
int flight_status_parse(const char* name);
/* A CLOCK_REALTIME time in ms as ISO 8601 (UTC) into out. */
void flight_wall_time(uint64_t wall_ms, char* out, size_t cap);

#endif /* BRAID_FLIGHT_NAMES_H_ */
