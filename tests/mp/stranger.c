/* A local stranger for the tests (stranger.h). */
#include "stranger.h"

#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Drop every right of root: groups, then gid, then uid (the order that
 * cannot be undone). */
static int drop_to(uid_t uid) {
  if (uid == geteuid()) return 0;
  return setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0;
}

int stranger_run(const mp_env* env, uid_t uid, int (*fn)(void* arg), void* arg, int wait,
                 pid_t* child) {
  pid_t pid = fork();
  if (pid < 0) {
    mp_fail(env, "stranger: fork failed");
    return -1;
  }
  if (pid == 0) {
    if (drop_to(uid) != 0) _exit(126);
    _exit(fn(arg) & 0x7f);
  }
  if (child) *child = pid;
  return wait ? stranger_join(env, pid) : 0;
}

int stranger_join(const mp_env* env, pid_t child) {
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) >= 126) {
    mp_fail(env, "stranger %d could not drop its rights or died (status 0x%x)", (int)child, status);
    return -1;
  }
  return WEXITSTATUS(status);
}

void stranger_stop(pid_t child) {
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
}

int stranger_abstract_names(const char* prefix, char out[][108], int max) {
  char line[512];
  int n = 0;
  FILE* f = fopen("/proc/net/unix", "re");
  while (f && n < max && fgets(line, sizeof(line), f)) {
    char* at = strchr(line, '@');
    if (at == NULL || strncmp(at + 1, prefix, strlen(prefix)) != 0) continue;
    at[strcspn(at, "\n")] = '\0';
    snprintf(out[n++], 108, "%s", at + 1);
  }
  if (f) fclose(f);
  return n;
}
