// device_emulator.cpp — runs one kernel of device-kernels/src/rshmem_device_tests.cu on
// emulated GPU PEs (host/tests/device-emu/emu/cuda_emu.h) and prints what a GPU runner
// would read back: every PE's harness result record and device error record, and how
// each block ended. Driven by host/tests/device_emu.rs, which checks the numbers against
// the kernel manifest (device-kernels/src/rshmem_device_tests.json).
//
// Usage: device_emulator KERNEL GRID BLOCK NPES PARAM0 PARAM1 PARAM2 SEED SCRATCH_BYTES
//                        TIMEOUT_MS BIND
// Output lines: `env pe=..` (the values of the trap manifest's symbols), `exit pe=..
// block=.. status=exited:N|signal:N`, `result pe=..` (the harness result record of a test
// kernel), `record pe=.. w0=..` (the same 64 bytes as words: a bench kernel's
// rshmem_bench_record_t), `error pe=..` (the device error record); the kernels' own
// printf lines in between. The same driver links with rshmem_device_bench.cu.
//
// Memory, mapped shared before any fork (the same addresses in every process):
//   NPES heaps of HEAP_BYTES; in each, [0, 64 KiB) is the runtime's reserved area with
//   the device sync scratch at 32 KiB (as host/src/gpu/heap.rs lays it out) and the
//   case's scratch range starts at 64 KiB (zeroed, as the runner zeroes it);
//   then, outside every heap ("device memory"): the PEs' peer tables, harness result
//   records and device error records.
// Each PE's state is what GpuPe::bind_module writes for a p2p job with device checks on
// (BIND=0 leaves it zero: an unbound module). Then one process per (PE, block) runs that
// block's threads as fibers.
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "rshmem/device/layout.cuh"
#include "rshmem/ibgda/queue.cuh"
#include "rshmem/internal/harness.cuh"
#include "rshmem/state.cuh"

#if !defined(RSHMEM_EMU_PRODUCER) && !defined(RSHMEM_EMU_HARNESS) && !defined(RSHMEM_EMU_RING)
#error "define RSHMEM_EMU_HARNESS (kernels taking rshmem_harness_args_t), RSHMEM_EMU_PRODUCER or RSHMEM_EMU_RING"
#endif
#if defined(RSHMEM_EMU_RING)
// Built with examples/gpu_ring/ring.cu (the user example): ring_exchange(sym_buf,
// sym_signal, words, rounds, seed, errors, checked) with sym_buf at the scratch range,
// the signal word after its 2 * words, and the counters in the PE's result record
// (errors -> failures, checked -> checks). PARAM0 = words, PARAM1 = rounds, SEED = seed.
extern "C" void ring_exchange(uint64_t *sym_buf, uint64_t *sym_signal, uint64_t words, uint64_t rounds,
                              uint64_t seed, unsigned long long *errors, unsigned long long *checked);
#endif
#if defined(RSHMEM_EMU_PRODUCER)
// Built with rshmem_ibgda_producer.cu (the IBGDA rate kernels, which do not include the
// device API): the state global is only this driver's, and the kernels take their own
// arguments (RSHMEM_EMU_PRODUCER_ARGS, comma-separated, in the kernel's order).
extern "C" rshmem_device_state_t rshmemi_device_state;
rshmem_device_state_t rshmemi_device_state;
extern "C" void rshmem_ibgda_post_writes(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                         uint64_t laddr, uint32_t lkey, uint32_t bytes,
                                         uint32_t iters, uint32_t warp_batch,
                                         rshmem_device_error_t *err, uint64_t *times);
extern "C" void rshmem_ibgda_fetch_add(rshmem_ibgda_qp_t *qp, uint64_t raddr, uint32_t rkey,
                                       uint64_t result, uint32_t lkey, uint32_t iters,
                                       rshmem_device_error_t *err, uint64_t *out);
#else
// The module's state global (rshmem/device/core.cuh), set in each block's process.
extern "C" rshmem_device_state_t rshmemi_device_state;
#endif

namespace {

constexpr uint64_t kHeapBytes = 4ull << 20;
constexpr uint64_t kSyncOffset = 32ull << 10;  // host/src/gpu/heap.rs SYNC_OFFSET
constexpr uint64_t kSyncBytes = 32ull << 10;   // SYNC_BYTES
constexpr uint64_t kScratchOffset = 64ull << 10;  // the first user allocation (RESERVED_BYTES)

using Kernel = void (*)(rshmem_harness_args_t);

Kernel emu_kernel;
rshmem_harness_args_t emu_args;

uint64_t arg(char **argv, int i) { return strtoull(argv[i], nullptr, 0); }

}  // namespace

int main(int argc, char **argv) {
  if (argc != 12) {
    fprintf(stderr,
            "usage: %s KERNEL GRID BLOCK NPES PARAM0 PARAM1 PARAM2 SEED SCRATCH_BYTES TIMEOUT_MS BIND\n",
            argv[0]);
    return 2;
  }
  const char *name = argv[1];
  const unsigned grid = static_cast<unsigned>(arg(argv, 2));
  const unsigned block = static_cast<unsigned>(arg(argv, 3));
  const int npes = static_cast<int>(arg(argv, 4));
  const uint64_t scratch_bytes = arg(argv, 9), timeout_ms = arg(argv, 10);
  const bool bind = arg(argv, 11) != 0;
  emu_kernel = reinterpret_cast<Kernel>(dlsym(RTLD_DEFAULT, name));
  // What every GPU thread runs (a harness kernel by default; the modes below differ).
  emu_body = [] { emu_kernel(emu_args); };
#if defined(RSHMEM_EMU_PRODUCER)
  {
    static uint64_t a[10];
    const char *pa = getenv("RSHMEM_EMU_PRODUCER_ARGS");
    for (int i = 0; pa && i < 10; ++i) {
      char *end;
      a[i] = strtoull(pa, &end, 0);
      pa = *end == ',' ? end + 1 : nullptr;
    }
    if (strcmp(name, "rshmem_ibgda_post_writes") == 0)
      emu_body = [] {
        rshmem_ibgda_post_writes(reinterpret_cast<rshmem_ibgda_qp_t *>(a[0]), a[1], (uint32_t)a[2],
                                 a[3], (uint32_t)a[4], (uint32_t)a[5], (uint32_t)a[6], (uint32_t)a[7],
                                 reinterpret_cast<rshmem_device_error_t *>(a[8]),
                                 reinterpret_cast<uint64_t *>(a[9]));
      };
    else if (strcmp(name, "rshmem_ibgda_fetch_add") == 0)
      emu_body = [] {
        rshmem_ibgda_fetch_add(reinterpret_cast<rshmem_ibgda_qp_t *>(a[0]), a[1], (uint32_t)a[2], a[3],
                               (uint32_t)a[4], (uint32_t)a[5],
                               reinterpret_cast<rshmem_device_error_t *>(a[6]),
                               reinterpret_cast<uint64_t *>(a[7]));
      };
  }
#endif
#if defined(RSHMEM_EMU_RING)
  if (strcmp(name, "ring_exchange") == 0)
    emu_body = [] {
      uint64_t *buf = reinterpret_cast<uint64_t *>(rshmemi_device_state.heap_base + emu_args.scratch);
      rshmem_test_result_t *r = reinterpret_cast<rshmem_test_result_t *>(emu_args.result);
      ring_exchange(buf, buf + 2 * emu_args.param0, emu_args.param0, emu_args.param1, emu_args.seed,
                    &r->failures, &r->checks);
    };
#endif
  if (!emu_kernel) {
    fprintf(stderr, "no kernel %s in this build\n", name);
    return 2;
  }
  if (grid == 0 || block == 0 || npes <= 0) {
    fprintf(stderr, "bad geometry: grid %u block %u pes %d scratch %llu\n", grid, block, npes,
            (unsigned long long)scratch_bytes);
    return 2;
  }

  std::vector<rshmem_device_state_t> states(npes);
  std::vector<rshmem_test_result_t *> results(npes);
  std::vector<rshmem_device_error_t *> errors(npes);
  std::vector<uint64_t> heap_bases(npes);  // each PE's heap (also for an unbound module)
  uint64_t heap_bytes = kHeapBytes;
  if (const uint64_t st = emu_map_shm()) {
    // The IBGDA mode (host/tests/device_emu.rs): the test built everything — heaps,
    // queues, descriptors, tables, peer tables and each PE's state — in the memfd
    // emu_map_shm mapped; take the states and result records from it.
    const uint64_t rs = strtoull(getenv("RSHMEM_EMU_RESULTS"), nullptr, 0);
    for (int pe = 0; pe < npes; ++pe) {
      states[pe] = reinterpret_cast<const rshmem_device_state_t *>(st)[pe];
      results[pe] = reinterpret_cast<rshmem_test_result_t *>(rs + 64 * pe);
      errors[pe] = reinterpret_cast<rshmem_device_error_t *>(states[pe].error);
      heap_bases[pe] = states[pe].heap_base;
      heap_bytes = states[pe].heap_size;
    }
    // A producer that backs off in a queue wait lets the other fibers of its block run.
    rshmem::ibgda::hooks().relax = [](void *) -> int {
      emu_yield();
      return 1;
    };
  } else {
    const size_t heaps_bytes = kHeapBytes * npes;
    const size_t dev_bytes = 4096 + npes * (npes * sizeof(rshmem_peer_t) + 2 * 64);
    char *mem = static_cast<char *>(mmap(nullptr, heaps_bytes + dev_bytes, PROT_READ | PROT_WRITE,
                                         MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (mem == MAP_FAILED) {
      perror("mmap heaps");
      return 3;
    }
    char *dev = mem + heaps_bytes + 4096;  // one page between the last heap and device memory
    auto heap = [&](int pe) { return reinterpret_cast<uint64_t>(mem + kHeapBytes * pe); };
    auto peers = [&](int pe) { return reinterpret_cast<rshmem_peer_t *>(dev) + npes * pe; };
    char *records = dev + npes * npes * sizeof(rshmem_peer_t);
    // RSHMEM_EMU_FAULT=misroute maps every peer q != me at q + 1's heap: a deliberately
    // wrong peer table, so the test can show that a broken translation fails the checks.
    const char *fault = getenv("RSHMEM_EMU_FAULT");
    const bool misroute = fault && strcmp(fault, "misroute") == 0;
    for (int pe = 0; pe < npes; ++pe)
      for (int q = 0; q < npes; ++q) {
        peers(pe)[q].heap_base = heap(misroute && q != pe ? (q + 1) % npes : q);
        peers(pe)[q].transport = RSHMEM_TRANSPORT_P2P;
      }
    for (int pe = 0; pe < npes; ++pe) {
      results[pe] = reinterpret_cast<rshmem_test_result_t *>(records + 64 * pe);
      errors[pe] = reinterpret_cast<rshmem_device_error_t *>(records + 64 * npes + 64 * pe);
      heap_bases[pe] = heap(pe);
      rshmem_device_state_t &s = states[pe];
      memset(&s, 0, sizeof s);
      if (!bind) continue;
      s.magic = RSHMEM_STATE_MAGIC;
      s.version = RSHMEM_STATE_VERSION;
      s.my_pe = pe;
      s.n_pes = npes;
      s.heap_base = heap(pe);
      s.heap_size = kHeapBytes;
      s.peers = reinterpret_cast<uint64_t>(peers(pe));
      s.timeout_ns = timeout_ms * 1000000ull;
      s.sync_offset = kSyncOffset;
      s.sync_bytes = kSyncBytes;
      s.error = reinterpret_cast<uint64_t>(errors[pe]);
      s.flags = RSHMEM_STATE_CHECKS;
    }
  }
  if (kScratchOffset + scratch_bytes > heap_bytes) {
    fprintf(stderr, "a scratch range of %llu bytes does not fit a heap of %llu\n",
            (unsigned long long)scratch_bytes, (unsigned long long)heap_bytes);
    return 2;
  }
  // Device teams, as GpuPe writes them into each bound PE's sync scratch: WORLD (slot 0)
  // and SHARED (slot 1, every emulated PE is on this node); RSHMEM_EMU_TEAM=parity (a
  // manifest "team") adds the even and the odd PEs in slot 2, the slot the host's team
  // agreement gives the first split of a fresh job, and passes each PE that handle.
  const char *team_mode = getenv("RSHMEM_EMU_TEAM");
  const bool parity = team_mode && strcmp(team_mode, "parity") == 0;
  if (team_mode && !parity) {
    fprintf(stderr, "unknown RSHMEM_EMU_TEAM=%s (known: parity)\n", team_mode);
    return 2;
  }
  for (int pe = 0; pe < npes && bind; ++pe) {
    auto entry = [&](uint32_t slot) {
      return reinterpret_cast<rshmem_team_entry_t *>(heap_bases[pe] + states[pe].sync_offset +
                                                     rshmemi_team_area_offset(slot));
    };
    *entry(0) = rshmem_team_entry_t{0, 1, npes, pe};
    *entry(1) = rshmem_team_entry_t{0, 1, npes, pe};
    if (parity) *entry(2) = rshmem_team_entry_t{pe % 2, 2, (npes - pe % 2 + 1) / 2, pe / 2};
  }
  auto result = [&](int pe) { return results[pe]; };
  auto error = [&](int pe) { return errors[pe]; };
  for (int pe = 0; pe < npes; ++pe)
    printf("env pe=%d n_pes=%d heap_base=%llu heap_size=%llu scratch=%llu result=%llu\n", pe, npes,
           (unsigned long long)heap_bases[pe], (unsigned long long)heap_bytes,
           (unsigned long long)(heap_bases[pe] + kScratchOffset), (unsigned long long)result(pe));
  fflush(stdout);

  struct Child {
    pid_t pid;
    int pe;
    unsigned block;
    int status;
    bool done;
  };
  std::vector<Child> kids;
  for (int pe = 0; pe < npes; ++pe)
    for (unsigned b = 0; b < grid; ++b) {
      const pid_t pid = fork();
      if (pid < 0) {
        perror("fork");
        for (Child &k : kids) kill(k.pid, SIGKILL);
        return 3;
      }
      if (pid == 0) {
        rshmemi_device_state = states[pe];
        blockIdx = {b, 0, 0};
        gridDim = {grid, 1, 1};
        blockDim = {block, 1, 1};
        emu_args = rshmem_harness_args_t{};
        emu_args.scratch = kScratchOffset;
        emu_args.scratch_bytes = scratch_bytes;
        emu_args.result = reinterpret_cast<uint64_t>(result(pe));
        emu_args.param0 = arg(argv, 5);
        emu_args.param1 = arg(argv, 6);
        emu_args.param2 = arg(argv, 7);
        emu_args.seed = arg(argv, 8);
        emu_args.team = parity ? 2 : 0;
        emu_run_block(block);
        fflush(stdout);
        _exit(0);
      }
      kids.push_back({pid, pe, b, 0, false});
    }

  // Bounded: the kernels' own waits end at TIMEOUT_MS; past that plus a grace period the
  // launch is killed and reported as such.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms) + std::chrono::seconds(30);
  size_t left = kids.size();
  bool killed = false;
  while (left > 0) {
    for (Child &k : kids) {
      if (k.done) continue;
      const pid_t r = waitpid(k.pid, &k.status, WNOHANG);
      if (r == k.pid) {
        k.done = true;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline && !killed) {
      for (Child &k : kids)
        if (!k.done) kill(k.pid, SIGKILL);
      killed = true;
    }
    usleep(1000);
  }
  for (const Child &k : kids) {
    if (WIFEXITED(k.status))
      printf("exit pe=%d block=%u status=exited:%d\n", k.pe, k.block, WEXITSTATUS(k.status));
    else
      printf("exit pe=%d block=%u status=signal:%d%s\n", k.pe, k.block, WTERMSIG(k.status),
             killed && WTERMSIG(k.status) == SIGKILL ? " (killed at the deadline)" : "");
  }
  for (int pe = 0; pe < npes; ++pe) {
    const rshmem_test_result_t *r = result(pe);
    printf("result pe=%d checks=%llu failures=%llu first_index=%llu expected=%llu observed=%llu\n", pe,
           r->checks, r->failures, r->first_index, r->expected, r->observed);
    const unsigned long long *w = reinterpret_cast<const unsigned long long *>(r);
    printf("record pe=%d w0=%llu w1=%llu w2=%llu w3=%llu w4=%llu\n", pe, w[0], w[1], w[2], w[3], w[4]);
    const rshmem_device_error_t *e = error(pe);
    printf("error pe=%d code=%u target=%d addr=%llu expected=%llu observed=%llu cmp=%u block=%u thread=%u\n",
           pe, e->code, e->pe, (unsigned long long)e->addr, (unsigned long long)e->expected,
           (unsigned long long)e->observed, e->cmp, e->block, e->thread);
  }
  return 0;
}
