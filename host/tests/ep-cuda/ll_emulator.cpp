// Runs the GPU EP kernels (device-kernels/src/ep_ll.cu, unchanged, on the real device API)
// on the host CPU with the CUDA emulation of host/tests/device-emu/emu/ (the device API's
// one emulation: GPU threads as fibers, PTX primitives as host atomics), for
// host/tests/ep_cuda_parity.rs to compare with the CPU oracle. R PEs share this process;
// each kernel launch runs its blocks one after another, and every PE's send kernel runs
// before any receive kernel, so no wait blocks. With --concurrent, each PE is a process
// that runs its own sequence of launches, and each launch's blocks are processes too
// (every buffer lives in one shared mapping), so PEs and blocks run at once as on a GPU:
// a receive kernel may start before its peers' send kernels, the waits and credits
// between calls are real, and only the order of each PE's own launches (its stream) is
// fixed. The output is the same.
//
// Transports. By default every peer is P2P (stores through the mapped heaps). With
// RSHMEM_EMU_SHM (host/tests/emu_ibgda: the same variables as device_emulator.cpp) the
// heaps, queues, peer tables and states come from a memfd that the test's soft HCA
// engine serves: peers the table marks IBGDA get WQEs on their queue pair, and each
// dispatch first runs the stage kernel, as the Rust launcher does (gpu::ep::needs_stage).
//
// stdin:  R N H E K FP8 ROUND GRID REPEATS MASKED_PE(-1 = none) MODE (0 = dispatch +
//         combine, 1 = dispatch only: for inputs that poison the call)
//         then per PE: T, T*K expert ids, T*K weights (f32 bit patterns in hex)
// Shrink mode (RSHMEM_EMU_SHRINK=1): MASKED_PE is not masked by the host but dead: it runs
// its first RSHMEM_EMU_DEAD_AFTER repeats (default 0; --concurrent only for more) and then
// stops, and the others launch with EP_LL_SHRINK, so their kernels give up on it after
// RSHMEM_EMU_TIMEOUT_MS (P2P mode) and mask it themselves; each PE's output then ends
// with "mask" and its mask entries. RSHMEM_EMU_DIES_IN (sequential mode) says how the
// repeat of the death goes: "counts" — the dead PE still runs its dispatch send, then its
// count word for local expert 0 is taken back (the word's tag made stale) on every
// receiver: it died after sending some of its counts; "combine" — it runs the dispatch
// (send and receive) and dies before the combine; "credit" — its dispatch credit of the
// repeat before is taken back on every receiver, so their send kernels give up on it;
// "late" — as "counts", but the word comes back right after block 0 of each receiver's
// dispatch receive ran (a PE later than the whole bound: block 0 gave up on it, the
// other blocks find all its words). RSHMEM_EMU_CORRUPT_HEADER="DST SRC TOKEN SLOT"
// (sequential mode): after the first dispatch's sends, the header of the first message
// from PE SRC in PE DST's receive area becomes (TOKEN, SLOT), as a corrupt message would.
// stdout: per repeat and PE: recv_count, per (local expert, source) block its begin/count
//         and per row src_info, recv_topk_slot and an FNV-1a hash of the row's bytes
//         (recv_x row, then its scales), per token the FNV-1a hash of combined_x's row,
//         the status of both sets.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "../../../device-kernels/src/ep_ll.cu"


namespace {

using Kernel = void (*)(const ep_ll_args_t);

struct Kernels {
  Kernel dstage, dsend, drecv, csend, crecv;
};

#define EMU_K(H)                                                                            \
  case H:                                                                                   \
    return fp8 ? Kernels{ep_ll_dispatch_stage_h##H##_fp8, ep_ll_dispatch_send_h##H##_fp8,    \
                         ep_ll_dispatch_recv_h##H##_fp8, ep_ll_combine_send_h##H,            \
                         ep_ll_combine_recv_h##H}                                            \
               : Kernels{ep_ll_dispatch_stage_h##H##_bf16, ep_ll_dispatch_send_h##H##_bf16,  \
                         ep_ll_dispatch_recv_h##H##_bf16, ep_ll_combine_send_h##H,           \
                         ep_ll_combine_recv_h##H};

Kernels kernels(unsigned h, bool fp8) {
  switch (h) {
    EMU_K(2048)
    EMU_K(2560)
    EMU_K(4096)
    EMU_K(5120)
    EMU_K(7168)
    EMU_K(8192)
  }
  fprintf(stderr, "no kernel for H=%u\n", h);
  exit(2);
}

// The running launch, for the fiber entry point.
Kernel g_kernel;
const ep_ll_args_t *g_args;
ucontext_t g_main;
constexpr size_t kStack = 256 << 10;

void fiber_main() {
  g_kernel(*g_args);
  emu_fibers[emu_cur].done = true;
  for (unsigned i = 0; i < emu_nfibers; ++i)
    if (!emu_fibers[i].done) {
      emu_yield();  // never resumed: this fiber is done
      break;
    }
  setcontext(&g_main);
}

bool g_concurrent = false;

// Runs block b of the current launch (g_kernel, g_args) to completion: its threads as
// fibers on this OS thread, with fresh block and warp barriers.
void run_block(unsigned b) {
  static std::vector<EmuFiber> fibers(EP_LL_THREADS);
  static EmuBarrier warp_bars[EP_LL_THREADS / 32];
  static uint64_t warp_vals[EP_LL_THREADS];
  static bool stacks = false;
  if (!stacks) {
    for (auto &f : fibers) f.stack = static_cast<char *>(malloc(kStack));
    stacks = true;
  }
  emu_block_bar = EmuBarrier{};
  emu_block_bar.n = EP_LL_THREADS;
  for (auto &w : warp_bars) {
    w = EmuBarrier{};
    w.n = 32;
  }
  emu_warp_bars = warp_bars;
  emu_warp_vals = warp_vals;
  blockIdx.x = b;
  for (unsigned t = 0; t < EP_LL_THREADS; ++t) {
    EmuFiber &f = fibers[t];
    f.done = false;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &g_main;
    makecontext(&f.ctx, fiber_main, 0);
  }
  emu_fibers = fibers.data();
  emu_nfibers = EP_LL_THREADS;
  emu_cur = 0;
  threadIdx.x = 0;
  swapcontext(&g_main, &fibers[0].ctx);
  for (auto &f : fibers)
    if (!f.done) {
      fprintf(stderr, "emulator: block %u ended with unfinished threads\n", b);
      exit(4);
    }
}

// Waits for every child; exits 5 (after saying which) if one did not exit 0.
void wait_all(const std::vector<pid_t> &kids, const char *what) {
  bool bad = false;
  for (pid_t k : kids) {
    int st = 0;
    if (waitpid(k, &st, 0) != k || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "emulator: a %s process ended with status %#x\n", what, st);
      bad = true;
    }
  }
  if (bad) exit(5);
}

// One launch: its blocks one after another, or (--concurrent) each block a process, all
// at once; returns when every block has finished (the stream's order).
// Sequential mode: run after block 0 of the next launch, then cleared (a death test's
// late word: RSHMEM_EMU_DIES_IN=late).
std::function<void()> g_after_block0;

void launch(Kernel k, const ep_ll_args_t &a, unsigned grid) {
  gridDim.x = grid;
  blockDim.x = EP_LL_THREADS;
  g_kernel = k;
  g_args = &a;
  if (!g_concurrent) {
    for (unsigned b = 0; b < grid; ++b) {
      run_block(b);
      if (b == 0 && g_after_block0) {
        g_after_block0();
        g_after_block0 = nullptr;
      }
    }
    return;
  }
  fflush(nullptr);
  std::vector<pid_t> kids;
  for (unsigned b = 0; b < grid; ++b) {
    const pid_t pid = fork();
    if (pid < 0) {
      perror("emulator: fork");
      exit(3);
    }
    if (pid == 0) {
      run_block(b);
      fflush(nullptr);
      _exit(0);
    }
    kids.push_back(pid);
  }
  wait_all(kids, "block");
}

uint64_t fnv(const void *p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const uint8_t *b = static_cast<const uint8_t *>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

// "Device memory": one shared anonymous mapping (reserved, committed when touched), so
// that the processes of --concurrent see every PE's buffers at the same addresses.
uint8_t *g_arena = nullptr;
size_t g_arena_used = 0;
constexpr size_t kArena = 16ull << 30;

template <class T>
T *dev_alloc(size_t n) {
  if (!g_arena) {
    void *m = mmap(nullptr, kArena, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      perror("emulator: mmap of the device arena");
      exit(3);
    }
    g_arena = static_cast<uint8_t *>(m);
  }
  size_t bytes = (n * sizeof(T) + 4095) / 4096 * 4096;
  if (bytes == 0) bytes = 4096;
  if (g_arena_used + bytes > kArena) {
    fprintf(stderr, "emulator: device arena exhausted\n");
    exit(3);
  }
  void *p = g_arena + g_arena_used;  // zero: fresh shared anonymous pages
  g_arena_used += bytes;
  return static_cast<T *>(p);
}

struct Pe {
  uint8_t *heap;
  ep_ll_ctl_t *ctl;
  rshmem_device_state_t state;
  unsigned T;
  std::vector<int64_t> idx;
  std::vector<uint32_t> w;
  uint16_t *x, *expert_out, *combined;
  uint8_t *recv_x;
  float *scales, *weights;
  int32_t *recv_count, *src_info, *slot, *mask;
  int64_t *layout_range, *topk;
  // The PE's EP team (RSHMEM_EMU_TEAMS; else the world): size, this PE's rank, members'
  // world PEs, and what the layout derives from the size.
  unsigned n, rank, L;
  uint64_t rows;
  std::vector<int32_t> members;
  ep_layout_t lay;
};

}  // namespace

int main(int argc, char **argv) {
  g_concurrent = argc > 1 && strcmp(argv[1], "--concurrent") == 0;
  unsigned R, N, H, E, K, fp8, round, grid, repeats;
  int masked_pe;
  unsigned mode;
  if (scanf("%u %u %u %u %u %u %u %u %u %d %u", &R, &N, &H, &E, &K, &fp8, &round, &grid, &repeats,
            &masked_pe, &mode) != 11)
    return 2;
  const uint64_t buf = 65536;
  std::vector<Pe> pes(R);
  // EP teams: RSHMEM_EMU_TEAMS="0,2,4/1,3" (world PEs, '/' between teams; every PE in
  // one), else one team of every PE (the ctl's team fields stay zero: the world team).
  const char *teams_env = getenv("RSHMEM_EMU_TEAMS");
  {
    std::vector<std::vector<int32_t>> teams;
    if (teams_env == nullptr) {
      teams.emplace_back();
      for (unsigned p = 0; p < R; ++p) teams.back().push_back(int32_t(p));
    } else {
      teams.emplace_back();
      for (const char *c = teams_env; *c; ++c) {
        if (*c == '/') {
          teams.emplace_back();
        } else if (*c >= '0' && *c <= '9') {
          char *end;
          teams.back().push_back(int32_t(strtol(c, &end, 10)));
          c = end - 1;
        } else if (*c != ',') {
          return 2;
        }
      }
    }
    std::vector<unsigned> seen(R, 0);
    for (const auto &t : teams)
      for (unsigned i = 0; i < t.size(); ++i) {
        if (t[i] < 0 || unsigned(t[i]) >= R) return 2;
        Pe &pe = pes[t[i]];
        pe.n = unsigned(t.size());
        pe.rank = i;
        pe.members = t;
        ++seen[t[i]];
      }
    for (unsigned p = 0; p < R; ++p) {
      if (seen[p] != 1) return 2;
      Pe &pe = pes[p];
      if (ep_layout_init(&pe.lay, N, H, E, K, fp8 != 0, pe.n) != EP_LAYOUT_OK) return 3;
      pe.L = E / pe.n;
      pe.rows = uint64_t(pe.n) * N;
    }
  }
  // The world team's layout (the death tests, which run on the world team, use it).
  ep_layout_t lay = pes[0].lay;
  uint64_t heap_size = buf;
  for (const Pe &pe : pes) heap_size = std::max(heap_size, buf + pe.lay.total_bytes);
  std::vector<rshmem_peer_t> peers(R);
  // IBGDA mode: the heaps and states the test built in its memfd (see the header).
  std::vector<rshmem_device_state_t> shm_states;
  if (const uint64_t st = emu_map_shm()) {
    for (unsigned p = 0; p < R; ++p) {
      shm_states.push_back(reinterpret_cast<const rshmem_device_state_t *>(st)[p]);
      if (shm_states[p].n_pes != int32_t(R) || shm_states[p].heap_size < heap_size) {
        fprintf(stderr, "PE %u's state: %d PEs, heap %llu bytes (need %u PEs, %llu bytes)\n", p,
                shm_states[p].n_pes, (unsigned long long)shm_states[p].heap_size, R,
                (unsigned long long)heap_size);
        return 4;
      }
    }
    heap_size = shm_states[0].heap_size;
    // A producer that backs off in a queue wait lets the other fibers of its block run.
    rshmem::ibgda::hooks().relax = [](void *) -> int {
      emu_yield();
      return 1;
    };
  }
  const bool ibgda = !shm_states.empty();
  const char *shrink_env = getenv("RSHMEM_EMU_SHRINK");
  const bool shrink = shrink_env != nullptr && strcmp(shrink_env, "1") == 0;
  const char *dead_env = getenv("RSHMEM_EMU_DEAD_AFTER");
  const unsigned dead_after = dead_env ? unsigned(strtoul(dead_env, nullptr, 10)) : 0;
  const char *dies_env = getenv("RSHMEM_EMU_DIES_IN");
  const std::string dies_in = dies_env ? dies_env : "";
  if (!dies_in.empty() && dies_in != "counts" && dies_in != "combine" && dies_in != "credit" &&
      dies_in != "late")
    return 2;
  if (shrink && (masked_pe < 0 || (!dies_in.empty() && g_concurrent))) return 2;
  // Death tests run on the world team (`lay` is then every PE's layout).
  if (shrink && teams_env != nullptr) return 2;
  int corrupt[4] = {-1, -1, 0, 0};  // DST SRC TOKEN SLOT
  if (const char *c = getenv("RSHMEM_EMU_CORRUPT_HEADER")) {
    if (sscanf(c, "%d %d %d %d", &corrupt[0], &corrupt[1], &corrupt[2], &corrupt[3]) != 4 ||
        g_concurrent || ibgda || corrupt[0] < 0 || unsigned(corrupt[0]) >= R || corrupt[1] < 0 ||
        unsigned(corrupt[1]) >= R)
      return 2;
  }
  const char *timeout_env = getenv("RSHMEM_EMU_TIMEOUT_MS");
  const uint64_t timeout_ns =
      timeout_env ? strtoull(timeout_env, nullptr, 10) * 1000000ull : 5000000000ull;
  for (unsigned p = 0; p < R; ++p) {
    Pe &pe = pes[p];
    if (scanf("%u", &pe.T) != 1) return 2;
    pe.idx.resize(pe.T * K);
    pe.w.resize(pe.T * K);
    for (auto &v : pe.idx)
      if (scanf("%lld", reinterpret_cast<long long *>(&v)) != 1) return 2;
    for (auto &v : pe.w)
      if (scanf("%x", &v) != 1) return 2;
    pe.heap = ibgda ? reinterpret_cast<uint8_t *>(shm_states[p].heap_base) : dev_alloc<uint8_t>(heap_size);
    pe.ctl = dev_alloc<ep_ll_ctl_t>(1);
    pe.x = dev_alloc<uint16_t>(size_t(pe.T) * H);
    // origin_x: row t of team rank r = r - 128, last 128 columns = t, and with H >= 384
    // the 128 before them t - bf16(t) (host/src/ep/check.rs).
    for (unsigned t = 0; t < pe.T; ++t) {
      const float residual = float(t) - ep_bf16_to_f32(ep_f32_to_bf16(float(t)));
      for (unsigned h = 0; h < H; ++h)
        pe.x[size_t(t) * H + h] = ep_f32_to_bf16(h + 128 >= H                ? float(t)
                                                 : H >= 384 && h + 256 >= H ? residual
                                                                            : float(pe.rank) - 128.0f);
    }
    pe.topk = dev_alloc<int64_t>(pe.idx.size());
    memcpy(pe.topk, pe.idx.data(), pe.idx.size() * 8);
    pe.weights = dev_alloc<float>(pe.w.size());
    memcpy(pe.weights, pe.w.data(), pe.w.size() * 4);
    const unsigned L = pe.L;
    const uint64_t rows = pe.rows;
    pe.expert_out = dev_alloc<uint16_t>(L * rows * H);
    pe.combined = dev_alloc<uint16_t>(size_t(pe.T) * H);
    pe.recv_x = dev_alloc<uint8_t>(L * rows * H * (fp8 ? 1 : 2));
    pe.scales = dev_alloc<float>(L * rows * (H / 128));
    pe.recv_count = dev_alloc<int32_t>(L);
    pe.src_info = dev_alloc<int32_t>(L * rows);
    pe.slot = dev_alloc<int32_t>(L * rows);
    pe.layout_range = dev_alloc<int64_t>(size_t(L) * pe.n);
    pe.mask = dev_alloc<int32_t>(pe.n);
    if (masked_pe >= 0 && !shrink)
      for (unsigned q = 0; q < pe.n; ++q)
        pe.mask[q] = (pe.members[q] == masked_pe && pe.members[q] != int32_t(p)) ? 1 : 0;
    // RSHMEM_EMU_FIRST_SET_CALLS=K: start as if K calls had run on each buffer set (the
    // first call is LL call 2K), with every peer's credits for them in place, to run calls
    // across the point where the signal words' 32-bit tags wrap.
    if (const char *first = getenv("RSHMEM_EMU_FIRST_SET_CALLS")) {
      const uint64_t k = strtoull(first, nullptr, 10);
      pe.ctl->set_calls[0] = pe.ctl->set_calls[1] = k;
      for (unsigned set = 0; set < 2; ++set)
        for (unsigned q = 0; q < pe.n; ++q)
          *reinterpret_cast<uint64_t *>(pe.heap + buf + ep_credit_word(&pe.lay, set, q)) =
              2 * k - 1 + set;  // the tag of call 2(k-1) + set, the last on that set
    }
    if (teams_env != nullptr) {
      pe.ctl->team_size = pe.n;
      pe.ctl->team_rank = int32_t(pe.rank);
      for (unsigned i = 0; i < pe.n; ++i) pe.ctl->team_pe[i] = pe.members[i];
    }
    peers[p] = rshmem_peer_t{reinterpret_cast<uint64_t>(pe.heap), RSHMEM_TRANSPORT_P2P, 0, 0, 0, 0};
  }
  for (unsigned p = 0; p < R; ++p) {
    rshmem_device_state_t &s = pes[p].state;
    if (ibgda) {
      s = shm_states[p];
      continue;
    }
    memset(&s, 0, sizeof s);
    s.magic = RSHMEM_STATE_MAGIC;
    s.version = RSHMEM_STATE_VERSION;
    s.my_pe = int32_t(p);
    s.n_pes = int32_t(R);
    s.heap_base = reinterpret_cast<uint64_t>(pes[p].heap);
    s.heap_size = heap_size;
    s.peers = reinterpret_cast<uint64_t>(peers.data());
    s.timeout_ns = timeout_ns;
    s.flags = RSHMEM_STATE_CHECKS;
  }
  // Whether PE p's dispatches need the stage kernel (gpu::ep::needs_stage).
  auto needs_stage = [&](unsigned p) {
    const rshmem_peer_t *t = reinterpret_cast<const rshmem_peer_t *>(pes[p].state.peers);
    for (unsigned q = 0; q < R; ++q)
      if (q != p && t[q].transport != RSHMEM_TRANSPORT_P2P) return true;
    return false;
  };
  const Kernels k = kernels(H, fp8 != 0);
  auto args = [&](unsigned p, uint64_t x, uint64_t out, unsigned set) {
    Pe &pe = pes[p];
    ep_ll_args_t a;
    memset(&a, 0, sizeof a);
    a.buf = buf;
    a.ctl = reinterpret_cast<uint64_t>(pe.ctl);
    a.mask = reinterpret_cast<uint64_t>(pe.mask);
    a.x = x;
    a.topk_idx = reinterpret_cast<uint64_t>(pe.topk);
    a.topk_weights = reinterpret_cast<uint64_t>(pe.weights);
    a.out = out;
    a.recv_scales = fp8 ? reinterpret_cast<uint64_t>(pe.scales) : 0;
    a.recv_count = reinterpret_cast<uint64_t>(pe.recv_count);
    a.src_info = reinterpret_cast<uint64_t>(pe.src_info);
    a.recv_topk_slot = reinterpret_cast<uint64_t>(pe.slot);
    a.layout_range = reinterpret_cast<uint64_t>(pe.layout_range);
    a.num_tokens = pe.T;
    a.num_max_tokens = N;
    a.num_experts = E;
    a.num_topk = K;
    a.set = set;
    a.flags = (round ? EP_LL_ROUND_SCALE : 0) | (fp8 ? EP_LL_FP8_BUFFER : 0) |
              (shrink ? EP_LL_SHRINK : 0);
    return a;
  };
  // Whether PE p runs repeat `rep`: the masked PE never does (the host masked it, or, in
  // shrink mode, it is dead), except its first RSHMEM_EMU_DEAD_AFTER repeats.
  auto runs = [&](unsigned p, unsigned rep) {
    return masked_pe < 0 || p != unsigned(masked_pe) || rep < dead_after;
  };
  auto status = [&](FILE *out, unsigned p) {
    for (unsigned s = 0; s < 2; ++s) {
      // Per set: the later of its dispatch and combine records (by commit tag).
      const ep_ll_status_t &d = pes[p].ctl->status[s][0], &c = pes[p].ctl->status[s][1];
      const ep_ll_status_t &st = c.commit > d.commit ? c : d;
      fprintf(out, "status %u %u %d %llu %llu %llu\n", s, st.kind, st.peer,
              (unsigned long long)st.value, (unsigned long long)st.commit,
              (unsigned long long)pes[p].ctl->set_calls[s]);
    }
    if (shrink) {
      fprintf(out, "mask");
      for (unsigned q = 0; q < pes[p].n; ++q) fprintf(out, " %d", pes[p].mask[q]);
      fprintf(out, "\n");
    }
  };
  // The simulated expert of host/src/ep/check.rs expert_forward:
  // out = bf16(dequant(recv) * (1 + (e % 4) / 4)).
  auto forward = [&](unsigned p) {
    Pe &pe = pes[p];
    const unsigned L = pe.L;
    const uint64_t rows = pe.rows;
    for (unsigned le = 0; le < L; ++le) {
      const float f = 1.0f + float((pe.rank * L + le) % 4) * 0.25f;
      for (int j = 0; j < pe.recv_count[le]; ++j) {
        const uint64_t row = le * rows + j;
        for (unsigned h = 0; h < H; ++h) {
          float v;
          if (fp8)
            v = ep_e4m3_to_f32(pe.recv_x[row * H + h]) * pe.scales[row * (H / 128) + h / 128];
          else
            v = ep_bf16_to_f32(reinterpret_cast<uint16_t *>(pe.recv_x)[row * H + h]);
          pe.expert_out[row * H + h] = ep_f32_to_bf16(v * f);
        }
      }
    }
  };
  auto outputs = [&](FILE *out, unsigned p) {
    Pe &pe = pes[p];
    fprintf(out, "count");
    const unsigned L = pe.L, R = pe.n;
    const uint64_t rows = pe.rows;
    for (unsigned le = 0; le < L; ++le) fprintf(out, " %d", pe.recv_count[le]);
    fprintf(out, "\n");
    for (unsigned le = 0; le < L; ++le)
      for (unsigned s = 0; s < R; ++s) {
        const int64_t lr = pe.layout_range[le * R + s];
        const uint64_t begin = uint64_t(lr) >> 32, count = lr & 0xffffffff;
        fprintf(out, "block %u %u %llu %llu\n", le, s, (unsigned long long)begin, (unsigned long long)count);
        for (uint64_t i = 0; i < count; ++i) {
          const uint64_t row = le * rows + begin + i;
          uint64_t h;
          if (fp8) {
            h = fnv(pe.recv_x + row * H, H);
            h = fnv(pe.scales + row * (H / 128), (H / 128) * 4, h);
          } else {
            h = fnv(pe.recv_x + row * H * 2, size_t(H) * 2);
          }
          fprintf(out, "row %d %d %016llx\n", pe.src_info[row], pe.slot[row], (unsigned long long)h);
        }
      }
    for (unsigned t = 0; t < pe.T; ++t)
      fprintf(out, "comb %016llx\n", (unsigned long long)fnv(pe.combined + size_t(t) * H, size_t(H) * 2));
    status(out, p);
  };
  auto dsend = [&](unsigned p, unsigned set) {
    rshmemi_device_state = pes[p].state;
    const ep_ll_args_t a = args(p, reinterpret_cast<uint64_t>(pes[p].x), 0, set);
    if (needs_stage(p)) launch(k.dstage, a, grid);
    launch(k.dsend, a, grid);
  };
  auto drecv = [&](unsigned p, unsigned set) {
    rshmemi_device_state = pes[p].state;
    launch(k.drecv, args(p, 0, reinterpret_cast<uint64_t>(pes[p].recv_x), set), grid);
  };
  auto csend = [&](unsigned p, unsigned set) {
    rshmemi_device_state = pes[p].state;
    launch(k.csend, args(p, reinterpret_cast<uint64_t>(pes[p].expert_out), 0, set), grid);
  };
  auto crecv = [&](unsigned p, unsigned set) {
    rshmemi_device_state = pes[p].state;
    launch(k.crecv, args(p, 0, reinterpret_cast<uint64_t>(pes[p].combined), set), grid);
  };

  if (g_concurrent) {
    // Each PE a process running its stream of launches; its output goes to a file of its
    // own, printed afterwards in the sequential mode's order (repeat, then PE).
    std::vector<FILE *> outs(R, nullptr);
    std::vector<pid_t> kids;
    fflush(nullptr);
    for (unsigned p = 0; p < R; ++p) {
      if (!runs(p, 0)) continue;  // never runs
      outs[p] = tmpfile();
      if (!outs[p]) {
        perror("emulator: tmpfile");
        return 3;
      }
      const pid_t pid = fork();
      if (pid < 0) {
        perror("emulator: fork");
        return 3;
      }
      if (pid == 0) {
        unsigned call = 0;
        for (unsigned rep = 0; rep < repeats && runs(p, rep); ++rep) {
          const unsigned dset = call++ % 2;
          dsend(p, dset);
          drecv(p, dset);
          fprintf(outs[p], "rep %u pe %u\n", rep, p);
          if (mode == 1) {
            status(outs[p], p);
            continue;
          }
          forward(p);
          const unsigned cset = call++ % 2;
          csend(p, cset);
          crecv(p, cset);
          outputs(outs[p], p);
        }
        fflush(outs[p]);
        _exit(0);
      }
      kids.push_back(pid);
    }
    wait_all(kids, "PE");
    // Sections per PE, split at their "rep" lines.
    std::vector<std::vector<std::string>> sections(R);
    for (unsigned p = 0; p < R; ++p) {
      if (!outs[p]) continue;
      rewind(outs[p]);
      char line[4096];
      while (fgets(line, sizeof line, outs[p])) {
        if (strncmp(line, "rep ", 4) == 0) sections[p].emplace_back();
        if (sections[p].empty()) return 6;
        sections[p].back() += line;
      }
    }
    for (unsigned rep = 0; rep < repeats; ++rep)
      for (unsigned p = 0; p < R; ++p)
        if (outs[p] && runs(p, rep)) {
          if (rep >= sections[p].size()) return 6;
          fputs(sections[p][rep].c_str(), stdout);
        }
    return 0;
  }

  unsigned call = 0;
  for (unsigned rep = 0; rep < repeats; ++rep) {
    unsigned set = call++ % 2;
    const bool dies_now = shrink && rep == dead_after;
    const unsigned dead = unsigned(masked_pe);
    // Takes back word `off` of the dead PE's on every other PE.
    auto take_back = [&](uint64_t off) {
      for (unsigned p = 0; p < R; ++p)
        if (p != dead) *reinterpret_cast<uint64_t *>(pes[p].heap + buf + off) = 0;
    };
    if (dies_now && dies_in == "credit") take_back(ep_credit_word(&lay, set, dead));
    const bool late = dies_now && dies_in == "late";
    const bool half = dies_now && (dies_in == "counts" || dies_in == "combine" || late);
    for (unsigned p = 0; p < R; ++p)
      if (runs(p, rep) || (half && p == dead)) dsend(p, set);
    // The dead PE's count word for local expert 0 on each receiver, as it was sent (only
    // in a death test: without one, `dead` is no PE).
    std::vector<uint64_t> sent(R, 0);
    const uint64_t w0 = dies_now ? ep_dispatch_count_word(&lay, set, 0, dead) : 0;
    if (late)
      for (unsigned p = 0; p < R; ++p)
        if (p != dead) sent[p] = *reinterpret_cast<uint64_t *>(pes[p].heap + buf + w0);
    if (dies_now && (dies_in == "counts" || late)) take_back(w0);
    if (rep == 0 && corrupt[0] >= 0) {
      int32_t *hdr = reinterpret_cast<int32_t *>(
          pes[corrupt[0]].heap + buf + ep_dispatch_recv_msg(&lay, set, unsigned(corrupt[1]), 0));
      hdr[0] = corrupt[2];
      hdr[1] = corrupt[3];
    }
    for (unsigned p = 0; p < R; ++p) {
      if (late && p != dead)
        g_after_block0 = [&, p] { *reinterpret_cast<uint64_t *>(pes[p].heap + buf + w0) = sent[p]; };
      if (runs(p, rep) || (dies_now && dies_in == "combine" && p == dead)) drecv(p, set);
    }
    if (mode == 1) {
      for (unsigned p = 0; p < R; ++p) {
        if (!runs(p, rep)) continue;
        printf("rep %u pe %u\n", rep, p);
        status(stdout, p);
      }
      continue;
    }
    for (unsigned p = 0; p < R; ++p)
      if (runs(p, rep)) forward(p);
    set = call++ % 2;
    for (unsigned p = 0; p < R; ++p)
      if (runs(p, rep)) csend(p, set);
    for (unsigned p = 0; p < R; ++p)
      if (runs(p, rep)) crecv(p, set);
    for (unsigned p = 0; p < R; ++p) {
      if (!runs(p, rep)) continue;
      printf("rep %u pe %u\n", rep, p);
      outputs(stdout, p);
    }
  }
  return 0;
}
