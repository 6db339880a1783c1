// bench/nvshmem/pingpong.cu — NVSHMEM's side of the 8-byte p / signal ping-pong latency
// comparison (issue 3, second target), built by scripts/build-nvshmem-bench into
// .gpu/nvshmem/nvshmem_pingpong and run by scripts/nvshmem-pingpong (the gpu-check step
// `nvshmem-pingpong`) next to `rshmem bench p|signal --device gpu`.
//
// What it measures is exactly what rshmem's latency kernels measure
// (device-kernels/src/rshmem_device_bench.cu, rshmem_bench_{p,signal}_lat_<scope>), with
// NVSHMEM's device API in place of rshmem's:
//   - scratch: a symmetric buffer of 4096 + 2 * 4096 bytes, zeroed before every launch:
//     [0, 4096) flags (ping word at 0, pong word at 64), then the source buffer (word 0 =
//     rshmem_pattern_u64(seed + my_pe, 0)), then the destination buffer.
//   - one launch = kWarmup (16) untimed round trips, then `iters` timed ones. Round trip v
//     (v = 1, 2, ...): PE 0 sends v into PE 1's ping word and waits until its own pong
//     word == v; PE 1 waits for ping == v and answers the same way into PE 0's pong word.
//       op p:      nvshmem_uint64_p(flag, v, pe)           (rshmem_uint64_p)
//       op signal: nvshmem[x]_putmem_signal_nbi[_warp|_block](dst, src, 8, flag, v,
//                  NVSHMEM_SIGNAL_SET, pe)                 (rshmem_putmem_signal_nbi*)
//       wait:      the scope's leader nvshmem_signal_wait_until(flag, NVSHMEM_CMP_EQ, v),
//                  then the scope syncs (__syncwarp / __syncthreads)
//   - grid 1; block 1 (thread), 32 (warp), 256 (block), as rshmem's manifest.
//   - timing: %globaltimer (ns) read by PE 0's thread 0 before round trip kWarmup + 1 and
//     after the last wait; one launch gives one sample, (end - start) / iters / 2 ns (the
//     one-way, "half round trip" latency).
//   - one unmeasured warm-up launch, then `reps` measured ones; median (mean of the two
//     middle samples for an even count), p99 (nearest rank: the ceil(0.99 n)-th smallest)
//     and mean over the reps samples, as rshmem's gpu::runner::stats.
//   - exact checks: op p: PE 0's pong word ends at kWarmup + iters; op signal: PE 0's
//     destination word 0 holds PE 1's pattern word and the pong word kWarmup + iters.
// Output: one JSON line per op on stdout, in the shape of `rshmem bench --device gpu
// --json` plus "impl":"nvshmem" and NVSHMEM's facts (version, MPG mode). A run that hits
// its deadline prints the launches it completed, "complete":false and the reason.
//
// Two PEs on one GPU: NVSHMEM is one PE per process, so this program forks two PE
// processes (nothing CUDA happens in the parent) that meet through NVSHMEM's unique-id
// bootstrap (NVSHMEMX_INIT_WITH_UNIQUEID; PE 0 makes the id, a socketpair carries it to
// PE 1) over the loopback interface. NVSHMEM calls several PEs on one GPU "MPG"; without
// MPS it runs them in "limited MPG" mode, where the two PEs' kernels belong to different
// CUDA contexts and are time-sliced, not concurrent: the ping-pong then advances one
// way per time slice and measures the GPU's context switching, not NVSHMEM. The JSON says
// which mode NVSHMEM chose ("mpg": "full" / "limited" / "none"), and scripts/nvshmem-pingpong
// runs it under a private MPS daemon when the machine has one.
//
// Bounded waits: NVSHMEM's signal_wait_until has no bound, so the host bounds every
// launch (it polls the stream until the run's deadline, then reads how far the
// ping-pong got and exits, which ends the kernel with the process); every socket wait is
// bounded by the same deadline, and the parent kills both PEs when it passes.
//
// Usage: nvshmem_pingpong [--op p|signal|both] [--scope thread|warp|block] [--iters N]
//                         [--reps R] [--timeout-s S] [--device D]
// Exit codes: 0 results printed (complete or not: see "complete"); 2 bad arguments or
// CUDA/NVSHMEM unavailable before any PE started; 3 the deadline passed before any
// measured launch finished (a JSON line with the reason is printed); 4 NVSHMEM refused to
// start the two PEs (its messages precede ours); 1 anything else (message on stderr).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "rshmem/pattern.cuh"

namespace nvshmem_pingpong_detail {

constexpr uint64_t kWarmup = 16;          // untimed round trips per launch (rshmem: kWarmup)
constexpr uint64_t kPing = 0, kPong = 64;  // flag word offsets in the scratch buffer
constexpr size_t kMessage = 8;             // bytes per send (signal: the putmem payload)
constexpr size_t kScratch = 4096 + 2 * 4096;
constexpr size_t kSrc = 4096, kDst = 8192;
constexpr uint64_t kSeedBase = 0xbe9c0000ull;  // rshmem: seed = 0xbe9c_0000 + size
// PE 0's exit code after printing a partial result (the parent turns it into 0): PE 1's
// code then does not count, whatever the deadline left it doing.
constexpr int kPartial = 5;

enum Op { OP_P = 0, OP_SIGNAL = 1 };
enum Scope { SCOPE_THREAD = 0, SCOPE_WARP = 1, SCOPE_BLOCK = 2 };

// The rshmem bench record's layout (rshmem/internal/harness.cuh, rshmem_bench_record_t),
// plus two words this program checks.
struct Record {
  unsigned long long start_ns;
  unsigned long long end_ns;
  unsigned long long iters;
  unsigned long long bytes;
  unsigned long long checksum;  // op p: the last pong value; op signal: dst word 0
  unsigned long long pong;      // the pong word after the last round trip
  unsigned long long reserved[2];
};
static_assert(sizeof(Record) == 64, "record layout");

__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <int S>
__device__ __forceinline__ unsigned scope_rank() {
  return S == SCOPE_THREAD ? 0u : S == SCOPE_WARP ? (threadIdx.x & 31u) : threadIdx.x;
}
template <int S>
__device__ __forceinline__ unsigned scope_size() {
  return S == SCOPE_THREAD ? 1u : S == SCOPE_WARP ? 32u : blockDim.x;
}
template <int S>
__device__ __forceinline__ void scope_sync() {
  if (S == SCOPE_WARP) __syncwarp();
  if (S == SCOPE_BLOCK) __syncthreads();
}

// One send of round-trip value v into `flag` on `pe`. Ordering is NVSHMEM's own (that is
// what is measured): nvshmem_uint64_p is a single remote store that the peer's
// signal_wait_until observes; putmem_signal_nbi orders the payload before the signal
// update, as the OpenSHMEM put-with-signal contract requires.
template <int O, int S>
__device__ __forceinline__ void send(unsigned char *s, uint64_t *flag, uint64_t v, int pe) {
  if (O == OP_P) {
    nvshmem_uint64_p(flag, v, pe);
  } else if (S == SCOPE_THREAD) {
    nvshmem_putmem_signal_nbi(s + kDst, s + kSrc, kMessage, flag, v, NVSHMEM_SIGNAL_SET, pe);
  } else if (S == SCOPE_WARP) {
    nvshmemx_putmem_signal_nbi_warp(s + kDst, s + kSrc, kMessage, flag, v, NVSHMEM_SIGNAL_SET, pe);
  } else {
    nvshmemx_putmem_signal_nbi_block(s + kDst, s + kSrc, kMessage, flag, v, NVSHMEM_SIGNAL_SET, pe);
  }
}

// The leader waits (NVSHMEM's wait: volatile polling of the local word), then the scope
// syncs so no thread runs ahead of the value it waited for.
template <int S>
__device__ __forceinline__ void wait_eq(uint64_t *flag, uint64_t v) {
  if (scope_rank<S>() == 0) nvshmem_signal_wait_until(flag, NVSHMEM_CMP_EQ, v);
  scope_sync<S>();
}

template <int O, int S>
__global__ void pingpong(unsigned char *s, Record *rec, uint64_t iters, int peer) {
  const int me = nvshmem_my_pe();
  if (me != 0 && me != peer) return;
  // The source buffer: PE-specific pattern words (as rshmem's fill_source with param0 = 8).
  uint64_t *src = reinterpret_cast<uint64_t *>(s + kSrc);
  for (unsigned i = scope_rank<S>(); i < kMessage / 8; i += scope_size<S>())
    src[i] = rshmem_pattern_u64(kSeedBase + kMessage + static_cast<uint64_t>(me), i);
  scope_sync<S>();
  uint64_t *ping = reinterpret_cast<uint64_t *>(s + kPing);
  uint64_t *pong = reinterpret_cast<uint64_t *>(s + kPong);
  const uint64_t total = kWarmup + iters;
  if (me == peer) {
    for (uint64_t v = 1; v <= total; ++v) {
      wait_eq<S>(ping, v);
      send<O, S>(s, pong, v, 0);
    }
    return;
  }
  uint64_t start = 0;
  for (uint64_t v = 1; v <= total; ++v) {
    if (v == kWarmup + 1) start = globaltimer();
    send<O, S>(s, ping, v, peer);
    wait_eq<S>(pong, v);
  }
  const uint64_t end = globaltimer();
  if (scope_rank<S>() == 0) {
    rec->start_ns = start;
    rec->end_ns = end;
    rec->iters = iters;
    rec->bytes = kMessage * iters;
    // volatile: the words were written by the peer through NVSHMEM; signal_wait_until
    // returned after seeing the last pong, and put-with-signal made the payload visible
    // before it.
    rec->pong = *reinterpret_cast<volatile uint64_t *>(pong);
    rec->checksum = O == OP_P ? rec->pong : *reinterpret_cast<volatile uint64_t *>(s + kDst);
  }
}

// ------------------------------------------------------------------------ host side

struct Opts {
  std::vector<int> ops{OP_P, OP_SIGNAL};
  int scope = SCOPE_THREAD;
  uint64_t iters = 1000;
  int reps = 10;
  double timeout_s = 30;
  int device = 0;
};

const char *op_name(int op) { return op == OP_P ? "p" : "signal"; }
const char *scope_name(int s) { return s == SCOPE_THREAD ? "thread" : s == SCOPE_WARP ? "warp" : "block"; }
unsigned scope_block(int s) { return s == SCOPE_THREAD ? 1 : s == SCOPE_WARP ? 32 : 256; }

double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

[[noreturn]] void usage_error(const std::string &msg) {
  fprintf(stderr,
          "nvshmem_pingpong: %s\nusage: nvshmem_pingpong [--op p|signal|both] [--scope thread|warp|block]"
          " [--iters N] [--reps R] [--timeout-s S] [--device D]\n",
          msg.c_str());
  exit(2);
}

bool parse_u64(const char *s, uint64_t *out) {
  if (!s || !*s) return false;
  char *end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || s[0] == '-') return false;
  *out = v;
  return true;
}

Opts parse(int argc, char **argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
    uint64_t n = 0;
    if (a == "--help" || a == "-h") {
      printf("nvshmem_pingpong: NVSHMEM's 8-byte p / signal ping-pong between two PEs on one GPU"
             " (see bench/nvshmem/pingpong.cu)\n");
      exit(0);
    } else if (a == "--op") {
      if (!v) usage_error("--op needs a value");
      std::string s = v;
      if (s == "p") o.ops = {OP_P};
      else if (s == "signal") o.ops = {OP_SIGNAL};
      else if (s == "both") o.ops = {OP_P, OP_SIGNAL};
      else usage_error("--op " + s + ": one of p, signal, both");
      ++i;
    } else if (a == "--scope") {
      if (!v) usage_error("--scope needs a value");
      std::string s = v;
      if (s == "thread") o.scope = SCOPE_THREAD;
      else if (s == "warp") o.scope = SCOPE_WARP;
      else if (s == "block") o.scope = SCOPE_BLOCK;
      else usage_error("--scope " + s + ": one of thread, warp, block");
      ++i;
    } else if (a == "--iters") {
      if (!parse_u64(v, &n) || n < 1 || n > 100000) usage_error("--iters: a whole number in 1..=100000");
      o.iters = n;
      ++i;
    } else if (a == "--reps") {
      if (!parse_u64(v, &n) || n < 1 || n > 10000) usage_error("--reps: a whole number in 1..=10000");
      o.reps = static_cast<int>(n);
      ++i;
    } else if (a == "--timeout-s") {
      if (!parse_u64(v, &n) || n < 1 || n > 3600) usage_error("--timeout-s: whole seconds in 1..=3600");
      o.timeout_s = static_cast<double>(n);
      ++i;
    } else if (a == "--device") {
      if (!parse_u64(v, &n) || n > 1024) usage_error("--device: a CUDA device ordinal");
      o.device = static_cast<int>(n);
      ++i;
    } else {
      usage_error("unknown argument " + a);
    }
  }
  if (o.scope != SCOPE_THREAD && std::find(o.ops.begin(), o.ops.end(), OP_P) != o.ops.end())
    usage_error(std::string("--scope ") + scope_name(o.scope) +
                ": op p exists at thread scope only (as rshmem's p bench); use --op signal");
  return o;
}

// ---- the socket between the two PE processes (unique id, barriers), every wait bounded

struct Link {
  int fd;
  double deadline;
  int me;
};

[[noreturn]] void die(const Link &l, int code, const char *fmt, const char *detail) {
  fprintf(stderr, "nvshmem_pingpong: PE %d: ", l.me);
  fprintf(stderr, fmt, detail);
  fputc('\n', stderr);
  fflush(stdout);
  fflush(stderr);
  _exit(code);  // no atexit handlers: NVSHMEM's teardown may wait on the peer
}

void send_all(const Link &l, const void *buf, size_t n) {
  const char *p = static_cast<const char *>(buf);
  while (n) {
    ssize_t w = send(l.fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die(l, 1, "the peer PE's socket closed (%s): it exited; see its messages", strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void recv_all(const Link &l, void *buf, size_t n, const char *what) {
  char *p = static_cast<char *>(buf);
  while (n) {
    int left_ms = static_cast<int>((l.deadline - now_s()) * 1000);
    if (left_ms <= 0) die(l, 3, "deadline passed waiting for the peer PE (%s)", what);
    pollfd pf{l.fd, POLLIN, 0};
    int r = poll(&pf, 1, left_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) die(l, 3, "deadline passed waiting for the peer PE (%s)", what);
    ssize_t got = recv(l.fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) die(l, 1, "the peer PE exited while this one waited for %s; see its messages", what);
    p += got;
    n -= static_cast<size_t>(got);
  }
}

void barrier(const Link &l, const char *what) {
  char b = 1;
  send_all(l, &b, 1);
  recv_all(l, &b, 1, what);
}

#define CUDA_OR_DIE(l, call)                                                                \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      std::string m_ = std::string(#call) + ": " + cudaGetErrorName(e_) + ": " +          \
                       cudaGetErrorString(e_);                                              \
      die(l, 1, "CUDA error: %s", m_.c_str());                                              \
    }                                                                                       \
  } while (0)

// rshmem's gpu::runner::stats: median (interpolated for an even count), p99 (nearest
// rank), mean.
void stats(std::vector<double> v, double *med, double *p99, double *mean) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
  size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n)));
  rank = std::min(std::max<size_t>(rank, 1), n);
  *p99 = v[rank - 1];
  double sum = 0;
  for (double x : v) sum += x;
  *mean = sum / static_cast<double>(n);
}

std::string json_str(const std::string &s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else o += c;
  }
  return o + "\"";
}

std::string num(double x) {
  char b[64];
  snprintf(b, sizeof b, "%.6f", x);
  return b;
}

const char *mpg_name(int status) {
  switch (status) {
    case NVSHMEM_STATUS_LIMITED_MPG: return "limited";
    case NVSHMEM_STATUS_FULL_MPG: return "full";
    case NVSHMEM_STATUS_IS_INITIALIZED: return "none";
    default: return "unknown";
  }
}

typedef void (*kernel_t)(unsigned char *, Record *, uint64_t, int);

kernel_t kernel_for(int op, int scope) {
  if (op == OP_P) return pingpong<OP_P, SCOPE_THREAD>;
  if (scope == SCOPE_THREAD) return pingpong<OP_SIGNAL, SCOPE_THREAD>;
  if (scope == SCOPE_WARP) return pingpong<OP_SIGNAL, SCOPE_WARP>;
  return pingpong<OP_SIGNAL, SCOPE_BLOCK>;
}

// Waits for `stream` until the deadline; false when it passed (the kernel still runs).
bool wait_stream(const Link &l, cudaStream_t stream) {
  for (;;) {
    cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      std::string m = std::string("the ping-pong kernel failed: ") + cudaGetErrorName(e) + ": " +
                      cudaGetErrorString(e);
      die(l, 1, "%s", m.c_str());
    }
    if (now_s() > l.deadline) return false;
    usleep(50);
  }
}

int run_pe(int me, int fd, const Opts &o, double deadline) {
  Link l{fd, deadline, me};
  // Defaults for two PEs of one node on one GPU; the caller's settings win.
  setenv("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo", 0);  // both PEs are on this host
  setenv("NVSHMEM_REMOTE_TRANSPORT", "none", 0);         // P2P only, no NIC probing
  setenv("NVSHMEM_DISABLE_NCCL", "1", 0);                // NCCL refuses several PEs per GPU
  setenv("NVSHMEM_SYMMETRIC_SIZE", "64M", 0);

  CUDA_OR_DIE(l, cudaSetDevice(o.device));
  cudaDeviceProp prop;
  CUDA_OR_DIE(l, cudaGetDeviceProperties(&prop, o.device));

  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  if (me == 0) {
    if (nvshmemx_get_uniqueid(&id) != 0) die(l, 4, "NVSHMEM refused: %s", "nvshmemx_get_uniqueid failed");
    send_all(l, &id, sizeof id);
  } else {
    recv_all(l, &id, sizeof id, "NVSHMEM's unique id");
  }
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  if (nvshmemx_set_attr_uniqueid_args(me, 2, &id, &attr) != 0)
    die(l, 4, "NVSHMEM refused: %s", "nvshmemx_set_attr_uniqueid_args failed");
  // nvshmemx_init_attr() without its exit(-1): the status is reported instead.
  {
    int provided = 0;
    nvshmemi_version_t app = {NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION,
                              NVSHMEM_VENDOR_PATCH_VERSION};
    nvshmemx_init_init_attr_ver_only(attr);
    int st = nvshmemi_init_thread(NVSHMEM_THREAD_SERIALIZED, &provided, NVSHMEMX_INIT_WITH_UNIQUEID,
                                  &attr, app);
    if (st != 0) {
      std::string m = "nvshmem init (unique-id bootstrap, 2 PEs on GPU " + std::to_string(o.device) +
                      ") returned " + std::to_string(st) + "; NVSHMEM's own messages are above";
      die(l, 4, "NVSHMEM refused two PEs on one GPU: %s", m.c_str());
    }
  }
  const int mpg = nvshmemx_init_status();
  if (nvshmem_my_pe() != me || nvshmem_n_pes() != 2) {
    std::string m = "NVSHMEM says PE " + std::to_string(nvshmem_my_pe()) + " of " +
                    std::to_string(nvshmem_n_pes()) + ", expected PE " + std::to_string(me) + " of 2";
    die(l, 1, "%s", m.c_str());
  }
  int hmaj = 0, hmin = 0, hpatch = 0;
  nvshmemx_vendor_get_version_info(&hmaj, &hmin, &hpatch);

  unsigned char *scratch = static_cast<unsigned char *>(nvshmem_malloc(kScratch));
  if (!scratch) die(l, 1, "nvshmem_malloc(%s) returned NULL", std::to_string(kScratch).c_str());
  Record *rec = nullptr;
  CUDA_OR_DIE(l, cudaMalloc(&rec, sizeof(Record)));
  cudaStream_t stream;
  CUDA_OR_DIE(l, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  for (int op : o.ops) {
    const int scope = op == OP_P ? SCOPE_THREAD : o.scope;
    kernel_t k = kernel_for(op, scope);
    std::vector<double> samples;
    std::string error;
    uint64_t checked = 0;
    for (int rep = 0; rep <= o.reps; ++rep) {
      CUDA_OR_DIE(l, cudaMemsetAsync(scratch, 0, kScratch, stream));
      CUDA_OR_DIE(l, cudaMemsetAsync(rec, 0, sizeof(Record), stream));
      CUDA_OR_DIE(l, cudaStreamSynchronize(stream));
      barrier(l, "the pre-launch barrier");  // both scratch buffers are zero
      k<<<1, scope_block(scope), 0, stream>>>(scratch, rec, o.iters, 1);
      CUDA_OR_DIE(l, cudaGetLastError());
      const double t0 = now_s();
      if (!wait_stream(l, stream)) {
        // How far did it get? Read the flags on a second stream (copy engines run beside
        // the spinning kernel).
        cudaStream_t side;
        uint64_t flags[2] = {0, 0};
        bool read = false;
        if (cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess &&
            cudaMemcpyAsync(&flags[0], scratch + kPing, 8, cudaMemcpyDeviceToHost, side) == cudaSuccess &&
            cudaMemcpyAsync(&flags[1], scratch + kPong, 8, cudaMemcpyDeviceToHost, side) == cudaSuccess) {
          const double until = now_s() + 1.0;
          while (cudaStreamQuery(side) == cudaErrorNotReady && now_s() < until) usleep(100);
          read = cudaStreamQuery(side) == cudaSuccess;
        }
        if (me != 0) {
          fflush(stdout);
          _exit(3);
        }
        char b[512];
        const uint64_t done = flags[1];
        snprintf(b, sizeof b,
                 "deadline (%.0f s) passed in launch %d of %d (%s) after %.3f s: %s%llu of %llu round trips"
                 " done%s",
                 o.timeout_s, rep, o.reps, rep == 0 ? "the warm-up" : "measured", now_s() - t0,
                 read ? "" : "unknown (flags unreadable), ", static_cast<unsigned long long>(read ? done : 0),
                 static_cast<unsigned long long>(kWarmup + o.iters),
                 read && done > 0 ? ("; about " + num((now_s() - t0) * 1e6 / done / 2) +
                                     " us one-way, the pace of time-sliced kernels")
                                        .c_str()
                                  : "");
        error = b;
        break;
      }
      barrier(l, "the post-launch barrier");
      if (me != 0) continue;
      Record r;
      CUDA_OR_DIE(l, cudaMemcpy(&r, rec, sizeof r, cudaMemcpyDeviceToHost));
      const uint64_t last = kWarmup + o.iters;
      const uint64_t want_dst = rshmem_pattern_u64(kSeedBase + kMessage + 1, 0);
      if (r.pong != last || (op == OP_P ? r.checksum != last : r.checksum != want_dst) || r.end_ns <= r.start_ns ||
          r.iters != o.iters) {
        char b[400];
        snprintf(b, sizeof b,
                 "verification failed in launch %d: pong %llu (want %llu), checksum 0x%llx (want 0x%llx),"
                 " start %llu end %llu iters %llu",
                 rep, r.pong, static_cast<unsigned long long>(last), r.checksum,
                 static_cast<unsigned long long>(op == OP_P ? last : want_dst), r.start_ns, r.end_ns, r.iters);
        die(l, 1, "%s", b);
      }
      checked += 2;
      if (rep == 0) continue;  // the warm-up launch
      samples.push_back(static_cast<double>(r.end_ns - r.start_ns) / static_cast<double>(o.iters) / 2.0 / 1000.0);
    }
    if (me == 0) {
      std::string row = "{\"size\":8";
      if (samples.empty()) {
        row += ",\"latency_us_median\":null,\"latency_us_p99\":null,\"latency_us_mean\":null";
      } else {
        double med, p99, mean;
        stats(samples, &med, &p99, &mean);
        row += ",\"latency_us_median\":" + num(med) + ",\"latency_us_p99\":" + num(p99) +
               ",\"latency_us_mean\":" + num(mean);
      }
      row += ",\"bandwidth_gbps\":null,\"iters\":" + std::to_string(o.iters) +
             ",\"bw_iters\":0,\"launches\":" + std::to_string(samples.size()) + "}";
      char ver[64];
      snprintf(ver, sizeof ver, "%d.%d.%d", hmaj, hmin, hpatch);
      char built[64];
      snprintf(built, sizeof built, "%d.%d.%d", NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION,
               NVSHMEM_VENDOR_PATCH_VERSION);
      std::string kname = std::string("nvshmem_pingpong_") + op_name(op) + "_" + scope_name(scope);
      std::string j = std::string("{\"bench\":\"") + op_name(op) + "\",\"scope\":\"" + scope_name(scope) +
                      "\",\"pes\":2,\"device\":\"gpu\",\"transport\":\"p2p\",\"gpu\":" + json_str(prop.name) +
                      ",\"latency_kind\":\"half_round_trip\",\"latency_kernel\":" + json_str(kname) +
                      ",\"bandwidth_kernel\":null,\"rows\":[" + row + "],\"impl\":\"nvshmem\",\"nvshmem_version\":\"" +
                      ver + "\",\"nvshmem_built_with\":\"" + built + "\",\"mpg\":\"" + mpg_name(mpg) +
                      "\",\"mps_pipe_directory\":" +
                      (getenv("CUDA_MPS_PIPE_DIRECTORY") ? json_str(getenv("CUDA_MPS_PIPE_DIRECTORY")) : "null") +
                      ",\"values_checked\":" + std::to_string(checked) +
                      ",\"complete\":" + (error.empty() ? "true" : "false") +
                      (error.empty() ? "" : ",\"error\":" + json_str(error)) + "}";
      printf("%s\n", j.c_str());
      fflush(stdout);
    }
    if (!error.empty()) {
      // The kernel still spins: leave without NVSHMEM's teardown (it would wait on it).
      fflush(stdout);
      fflush(stderr);
      _exit(samples.empty() ? 3 : kPartial);
    }
  }
  CUDA_OR_DIE(l, cudaStreamDestroy(stream));
  CUDA_OR_DIE(l, cudaFree(rec));
  barrier(l, "the final barrier");
  nvshmem_free(scratch);
  nvshmem_finalize();
  return 0;
}

}  // namespace nvshmem_pingpong_detail

using namespace nvshmem_pingpong_detail;

int main(int argc, char **argv) {
  const Opts o = parse(argc, argv);
  // CUDA must be there before two processes are started to find out it is not.
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda) {
    fprintf(stderr,
            "nvshmem_pingpong: libcuda.so.1 not found (%s): the NVIDIA driver is not installed or not on the"
            " library path; nothing ran\n",
            dlerror());
    return 2;
  }
  dlclose(cuda);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    fprintf(stderr, "nvshmem_pingpong: socketpair: %s\n", strerror(errno));
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  const double deadline = now_s() + o.timeout_s;
  pid_t pids[2] = {-1, -1};
  for (int pe = 0; pe < 2; ++pe) {
    pid_t p = fork();
    if (p < 0) {
      fprintf(stderr, "nvshmem_pingpong: fork: %s\n", strerror(errno));
      if (pe == 1) kill(pids[0], SIGKILL);
      return 1;
    }
    if (p == 0) {
      close(sv[1 - pe]);
      const int rc = run_pe(pe, sv[pe], o, deadline);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids[pe] = p;
  }
  close(sv[0]);
  close(sv[1]);
  // Reap both; past the deadline (+ 5 s for the PEs' own reports) kill what is left.
  int status[2] = {-1, -1};
  int left = 2;
  bool killed = false;
  while (left) {
    for (int pe = 0; pe < 2; ++pe) {
      if (status[pe] != -1) continue;
      int st;
      pid_t r = waitpid(pids[pe], &st, WNOHANG);
      if (r == pids[pe]) {
        status[pe] = st;
        --left;
      }
    }
    if (left && !killed && now_s() > deadline + 5) {
      for (int pe = 0; pe < 2; ++pe)
        if (status[pe] == -1) kill(pids[pe], SIGKILL);
      killed = true;
      fprintf(stderr, "nvshmem_pingpong: the PEs outlived the deadline (%.0f s + 5 s) and were killed\n",
              o.timeout_s);
    }
    if (left) usleep(10000);
  }
  // PE 0 reports, so its exit code is the program's; PE 1's counts when PE 0 succeeded
  // and PE 1 failed for a reason of its own (not the shared deadline).
  int code[2] = {0, 0};
  for (int pe = 0; pe < 2; ++pe) {
    if (WIFEXITED(status[pe])) {
      code[pe] = WEXITSTATUS(status[pe]);
      if (code[pe] == 255) code[pe] = 4;  // NVSHMEM's own exit(-1) paths
      if (code[pe] != 0 && !(pe == 0 && code[pe] == kPartial))
        fprintf(stderr, "nvshmem_pingpong: PE %d exited with %d\n", pe, WEXITSTATUS(status[pe]));
    } else {
      fprintf(stderr, "nvshmem_pingpong: PE %d was killed by signal %d\n", pe,
              WIFSIGNALED(status[pe]) ? WTERMSIG(status[pe]) : -1);
      code[pe] = killed ? 3 : 1;
    }
  }
  int rc = code[0] == kPartial ? 0 : code[0] != 0 ? code[0] : (code[1] == 3 ? 0 : code[1]);
  return rc;
}
