/* Multi-process tests that play another user on the same host: a child
 * process dropped to uid/gid `nobody` (the tests run as root), which can
 * read /proc, connect to any socket and bind any abstract name, as a local
 * stranger can. */
#ifndef MP_STRANGER_H_
#define MP_STRANGER_H_

#include <sys/types.h>

#include "launcher.h"

#define STRANGER_UID 65534 /* nobody */

/* Runs fn(arg) in a forked child as uid and gid `uid` (STRANGER_UID, or
 * this process's own uid for a stranger of the same user) and returns its
 * result (fn's return value, 0..125), or -1 when it could not drop its
 * rights or died. When `wait` is 0 the child runs on and *child is its
 * pid (stranger_join collects it). */
int stranger_run(const mp_env* env, uid_t uid, int (*fn)(void* arg), void* arg, int wait,
                 pid_t* child);
int stranger_join(const mp_env* env, pid_t child);
/* Kill a stranger that runs on (stranger_run with wait 0) and reap it. */
void stranger_stop(pid_t child);

/* Every abstract Unix socket name in /proc/net/unix that starts with
 * `prefix` (without the leading '@'), one after another in out (each
 * NUL-terminated, at most max names); returns how many. */
int stranger_abstract_names(const char* prefix, char out[][108], int max);

#endif /* MP_STRANGER_H_ */
