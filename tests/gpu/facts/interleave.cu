/*
 * Two processes on one GPU (several ranks per GPU): how their kernels and
 * stream memory-op waits interleave under time slicing. Host flags live in
 * one shared page that both processes register with CUDA; the processes
 * fork before CUDA starts. Every device-side wait is bounded by the global
 * timer, so a pairing that cannot progress reports a timeout, not a hang.
 */
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "facts.h"

struct shared {
  volatile unsigned long long f[32]; /* device-visible flags */
  volatile int arrive[64];           /* host rendezvous points */
  volatile double stamp[8];          /* host clock readings */
  volatile double result[8];
};

static struct shared* sh;
static struct shared* shd; /* its device address */

static void meet(int id) {
  __atomic_add_fetch(&sh->arrive[id], 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&sh->arrive[id], __ATOMIC_SEQ_CST) < 2) {
  }
}

__device__ unsigned long long gtime(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Spin until *flag >= want or timeout_ns passes; *out = 1 seen, 2 timeout. */
__global__ void wait_flag(volatile unsigned long long* flag, unsigned long long want,
                          volatile unsigned long long* started, volatile unsigned long long* out,
                          unsigned long long timeout_ns) {
  unsigned long long t0 = gtime();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *started = 1;
    __threadfence_system();
  }
  while (*flag < want && gtime() - t0 < timeout_ns) {
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *out = *flag >= want ? 1 : 2;
    __threadfence_system();
  }
}

__global__ void set_flag(volatile unsigned long long* flag, unsigned long long v) {
  *flag = v;
  __threadfence_system();
}

__global__ void busy(unsigned long long ns) {
  unsigned long long t0 = gtime();
  while (gtime() - t0 < ns) {
  }
}

__global__ void empty_kernel(void) {}

/* Ping-pong between two processes' resident kernels through host flags. */
__global__ void pingpong(volatile unsigned long long* mine, volatile unsigned long long* theirs,
                         int rounds, int first, volatile unsigned long long* out,
                         unsigned long long timeout_ns) {
  unsigned long long t0 = gtime();
  for (int i = 1; i <= rounds; i++) {
    if (!first) {
      while (*theirs < (unsigned long long)i)
        if (gtime() - t0 > timeout_ns) {
          *out = (1ull << 63) | (unsigned long long)i;
          return;
        }
    }
    *mine = i;
    __threadfence_system();
    if (first) {
      while (*theirs < (unsigned long long)i)
        if (gtime() - t0 > timeout_ns) {
          *out = (1ull << 63) | (unsigned long long)i;
          return;
        }
    }
  }
  *out = gtime() - t0;
}

/* t[i] = microseconds of the i-th empty launch + sync on s. */
static void time_launches(cudaStream_t s, double* t, int n) {
  for (int i = 0; i < n; i++) {
    double t0 = now_us();
    empty_kernel<<<1, 32, 0, s>>>();
    RT(cudaStreamSynchronize(s));
    t[i] = now_us() - t0;
  }
  LAUNCHED();
}

static double median_launch(cudaStream_t s, int n) {
  double* t = (double*)malloc(n * sizeof(double));
  time_launches(s, t, n);
  qsort(t, n, sizeof *t, cmp_double);
  double m = t[n / 2];
  free(t);
  return m;
}

static void run(int me, int sms) {
  cudaStream_t s;
  RT(cudaFree(0));
  RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  RT(cudaHostRegister((void*)sh, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
  RT(cudaHostGetDevicePointer((void**)&shd, (void*)sh, 0));
  volatile unsigned long long* f = shd->f;
  const unsigned long long sec = 1000000000ull;

  /* E0: baseline launch latency, each process alone in turn. */
  meet(0);
  if (me == 0) sh->result[0] = median_launch(s, 500);
  meet(1);
  if (me == 1) sh->result[1] = median_launch(s, 500);
  meet(2);
  if (me == 0)
    FACT("empty launch+sync, alone", "median %.1f us (process A), %.1f us (process B)",
         sh->result[0], sh->result[1]);

  /* E1/E2: A's kernel spins on a flag only B's kernel sets (1 block, then
   * every SM busy). Does B's kernel get the GPU, and after how long? */
  for (int e = 0; e < 2; e++) {
    int grid = e == 0 ? 1 : 4 * sms;
    meet(3 + 3 * e);
    if (me == 0) {
      sh->f[0] = 0, sh->f[1] = 0, sh->f[2] = 0;
      wait_flag<<<grid, 128, 0, s>>>(f + 0, 1, f + 1, f + 2, 5 * sec);
      LAUNCHED();
      while (sh->f[1] == 0) {
      }
    }
    meet(4 + 3 * e);
    if (me == 1) {
      sh->stamp[0] = now_us();
      set_flag<<<1, 1, 0, s>>>(f + 0, 1);
      LAUNCHED();
      RT(cudaStreamSynchronize(s));
      sh->stamp[1] = now_us();
    } else {
      RT(cudaStreamSynchronize(s));
      sh->stamp[2] = now_us();
    }
    meet(5 + 3 * e);
    if (me == 0)
      FACT(e == 0 ? "A spins (1 block) on a flag B's kernel sets"
                  : "A spins (4 blocks/SM, all SMs) on a flag B's kernel sets",
           "%s; B's kernel done %.1f us after its launch, A's kernel done %.1f us after B's launch",
           sh->f[2] == 1 ? "A saw it" : "A TIMED OUT (5 s)", sh->stamp[1] - sh->stamp[0],
           sh->stamp[2] - sh->stamp[0]);
  }

  /* E3: A's stream waits (waitValue64) on a host flag; B launches meanwhile.
   * A waiting stream holds no SM: B's latency should match its baseline. */
  meet(10);
  if (me == 0) {
    sh->f[3] = 0, sh->f[4] = 0;
    CU(cuStreamWaitValue64((CUstream)s, (CUdeviceptr)(f + 3), 1, CU_STREAM_WAIT_VALUE_GEQ));
    CU(cuStreamWriteValue64((CUstream)s, (CUdeviceptr)(f + 4), 1, 0));
  }
  meet(11);
  if (me == 1) {
    sh->result[2] = median_launch(s, 500);
    sh->stamp[3] = now_us();
    sh->f[3] = 1;
  } else {
    while (sh->f[4] == 0) {
    }
    sh->stamp[4] = now_us();
    RT(cudaStreamSynchronize(s));
  }
  meet(12);
  if (me == 0)
    FACT("B's empty launch+sync while A's stream sits in waitValue64",
         "median %.1f us; B's host write released A's stream in %.1f us", sh->result[2],
         sh->stamp[4] - sh->stamp[3]);

  /* E4: A runs a 300 ms busy kernel; B's launches meanwhile show the slice. */
  meet(13);
  if (me == 0) {
    busy<<<sms, 128, 0, s>>>(300000000ull);
    LAUNCHED();
  }
  meet(14);
  if (me == 1) {
    usleep(20000);
    int n = 40;
    double t[40];
    time_launches(s, t, n);
    fact_times("B's empty launch+sync while A's kernel is busy 300 ms on every SM", t, n);
  } else {
    RT(cudaStreamSynchronize(s));
  }

  /* E5: resident kernels in both processes ping-pong 200 times. */
  meet(15);
  sh->f[5] = 0, sh->f[6] = 0, sh->f[7] = 0, sh->f[8] = 0;
  meet(16);
  pingpong<<<1, 1, 0, s>>>(f + 5 + me, f + 6 - me, 200, me == 0, f + 7 + me, 10 * sec);
  LAUNCHED();
  RT(cudaStreamSynchronize(s));
  meet(17);
  if (me == 0) {
    unsigned long long a = sh->f[7], b = sh->f[8];
    if (a >> 63)
      FACT("kernel ping-pong across processes", "TIMED OUT at round %llu (10 s)",
           a & 0xffffffffull);
    else
      FACT("kernel ping-pong across processes",
           "200 rounds in %.1f ms: %.1f us per round trip (B's kernel %s)", a / 1e6, a / 1e3 / 200,
           (b >> 63) ? "timed out" : "finished");
  }

  /* E6: the same ping-pong with stream memory ops only (no resident kernel). */
  meet(18);
  sh->f[9] = 0, sh->f[10] = 0;
  meet(19);
  const int rounds = 200;
  CUdeviceptr mine = (CUdeviceptr)(f + 9 + me), theirs = (CUdeviceptr)(f + 10 - me);
  double t0 = now_us();
  for (int b = 1; b <= rounds; b += 50) {
    for (int i = b; i < b + 50; i++) {
      if (me == 1) CU(cuStreamWaitValue64((CUstream)s, theirs, i, CU_STREAM_WAIT_VALUE_GEQ));
      CU(cuStreamWriteValue64((CUstream)s, mine, i, 0));
      if (me == 0) CU(cuStreamWaitValue64((CUstream)s, theirs, i, CU_STREAM_WAIT_VALUE_GEQ));
    }
    RT(cudaStreamSynchronize(s));
  }
  sh->result[3 + me] = now_us() - t0;
  meet(20);
  if (me == 0)
    FACT("stream-memop ping-pong across processes",
         "%d rounds in %.1f ms: %.1f us per round trip (enqueued 50 at a time)", rounds,
         sh->result[3] / 1e3, sh->result[3] / rounds);
  RT(cudaHostUnregister((void*)sh));
  RT(cudaStreamDestroy(s));
}

int main(void) {
  sh = (struct shared*)mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 2;
  memset((void*)sh, 0, 4096);
  int sms = 0;
  pid_t pid = fork();
  /* The SM count comes after the fork: CUDA must not start before it. */
  if (pid == 0) {
    RT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    run(1, sms);
    return 0;
  }
  RT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  run(0, sms);
  int st = 0;
  waitpid(pid, &st, 0);
  FACT("interleave second process exit", "%d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return 0;
}
