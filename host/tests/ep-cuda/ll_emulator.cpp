// Runs the GPU EP kernels (device-kernels/src/ep_ll.cu, unchanged) on the host CPU with
// the CUDA emulation of emu/cuda_emu.h, for host/tests/ep_cuda_parity.rs to compare with
// the CPU oracle. R PEs share this process; each kernel launch runs its blocks one after
// another, and every PE's send kernel runs before any receive kernel, so no wait blocks.
//
// stdin:  R N H E K FP8 ROUND GRID REPEATS MASKED_PE(-1 = none) MODE (0 = dispatch +
//         combine, 1 = dispatch only: for inputs that poison the call)
//         then per PE: T, T*K expert ids, T*K weights (f32 bit patterns in hex)
// stdout: per repeat and PE: recv_count, per (local expert, source) block its begin/count
//         and per row src_info, recv_topk_slot and an FNV-1a hash of the row's bytes
//         (recv_x row, then its scales), per token the FNV-1a hash of combined_x's row,
//         the status of both sets.
#include <vector>

#include "../../../device-kernels/src/ep_ll.cu"


namespace {

using Kernel = void (*)(const ep_ll_args_t);

struct Kernels {
  Kernel dsend, drecv, csend, crecv;
};

#define EMU_K(H)                                                                            \
  case H:                                                                                   \
    return fp8 ? Kernels{ep_ll_dispatch_send_h##H##_fp8, ep_ll_dispatch_recv_h##H##_fp8,     \
                         ep_ll_combine_send_h##H, ep_ll_combine_recv_h##H}                   \
               : Kernels{ep_ll_dispatch_send_h##H##_bf16, ep_ll_dispatch_recv_h##H##_bf16,   \
                         ep_ll_combine_send_h##H, ep_ll_combine_recv_h##H};

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

void launch(Kernel k, const ep_ll_args_t &a, unsigned grid) {
  static std::vector<EmuFiber> fibers(EP_LL_THREADS);
  static bool stacks = false;
  if (!stacks) {
    for (auto &f : fibers) f.stack = static_cast<char *>(malloc(kStack));
    stacks = true;
  }
  gridDim.x = grid;
  blockDim.x = EP_LL_THREADS;
  g_kernel = k;
  g_args = &a;
  for (unsigned b = 0; b < grid; ++b) {
    EmuBlock block(EP_LL_THREADS);
    emu_block = &block;
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
    emu_block = nullptr;
  }
}

uint64_t fnv(const void *p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const uint8_t *b = static_cast<const uint8_t *>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

template <class T>
T *dev_alloc(size_t n) {
  size_t bytes = (n * sizeof(T) + 4095) / 4096 * 4096;
  if (bytes == 0) bytes = 4096;
  void *p = aligned_alloc(4096, bytes);
  memset(p, 0, bytes);
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
};

}  // namespace

int main() {
  unsigned R, N, H, E, K, fp8, round, grid, repeats;
  int masked_pe;
  unsigned mode;
  if (scanf("%u %u %u %u %u %u %u %u %u %d %u", &R, &N, &H, &E, &K, &fp8, &round, &grid, &repeats,
            &masked_pe, &mode) != 11)
    return 2;
  ep_layout_t lay;
  if (ep_layout_init(&lay, N, H, E, K, fp8 != 0, R) != EP_LAYOUT_OK) return 3;
  const unsigned L = E / R;
  const uint64_t rows = uint64_t(R) * N, buf = 65536, heap_size = buf + lay.total_bytes;
  std::vector<Pe> pes(R);
  std::vector<rshmem_peer_t> peers(R);
  for (unsigned p = 0; p < R; ++p) {
    Pe &pe = pes[p];
    if (scanf("%u", &pe.T) != 1) return 2;
    pe.idx.resize(pe.T * K);
    pe.w.resize(pe.T * K);
    for (auto &v : pe.idx)
      if (scanf("%lld", reinterpret_cast<long long *>(&v)) != 1) return 2;
    for (auto &v : pe.w)
      if (scanf("%x", &v) != 1) return 2;
    pe.heap = dev_alloc<uint8_t>(heap_size);
    pe.ctl = dev_alloc<ep_ll_ctl_t>(1);
    pe.x = dev_alloc<uint16_t>(size_t(pe.T) * H);
    // origin_x: row t of PE p = p - 128, last 128 columns = t (host/src/ep/check.rs).
    for (unsigned t = 0; t < pe.T; ++t)
      for (unsigned h = 0; h < H; ++h)
        pe.x[size_t(t) * H + h] = ep_f32_to_bf16(h + 128 >= H ? float(t) : float(p) - 128.0f);
    pe.topk = dev_alloc<int64_t>(pe.idx.size());
    memcpy(pe.topk, pe.idx.data(), pe.idx.size() * 8);
    pe.weights = dev_alloc<float>(pe.w.size());
    memcpy(pe.weights, pe.w.data(), pe.w.size() * 4);
    pe.expert_out = dev_alloc<uint16_t>(L * rows * H);
    pe.combined = dev_alloc<uint16_t>(size_t(pe.T) * H);
    pe.recv_x = dev_alloc<uint8_t>(L * rows * H * (fp8 ? 1 : 2));
    pe.scales = dev_alloc<float>(L * rows * (H / 128));
    pe.recv_count = dev_alloc<int32_t>(L);
    pe.src_info = dev_alloc<int32_t>(L * rows);
    pe.slot = dev_alloc<int32_t>(L * rows);
    pe.layout_range = dev_alloc<int64_t>(size_t(L) * R);
    pe.mask = dev_alloc<int32_t>(R);
    if (masked_pe >= 0)
      for (unsigned q = 0; q < R; ++q) pe.mask[q] = (q == unsigned(masked_pe) && q != p) ? 1 : 0;
    peers[p] = rshmem_peer_t{reinterpret_cast<uint64_t>(pe.heap), RSHMEM_TRANSPORT_P2P, 0, 0, 0, 0};
  }
  for (unsigned p = 0; p < R; ++p) {
    rshmem_device_state_t &s = pes[p].state;
    memset(&s, 0, sizeof s);
    s.magic = RSHMEM_STATE_MAGIC;
    s.version = RSHMEM_STATE_VERSION;
    s.my_pe = int32_t(p);
    s.n_pes = int32_t(R);
    s.heap_base = reinterpret_cast<uint64_t>(pes[p].heap);
    s.heap_size = heap_size;
    s.peers = reinterpret_cast<uint64_t>(peers.data());
    s.timeout_ns = 5000000000ull;
  }
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
    a.flags = (round ? EP_LL_ROUND_SCALE : 0) | (fp8 ? EP_LL_FP8_BUFFER : 0);
    return a;
  };
  auto skip = [&](unsigned p) { return masked_pe >= 0 && p == unsigned(masked_pe); };
  unsigned call = 0;
  for (unsigned rep = 0; rep < repeats; ++rep) {
    unsigned set = call++ % 2;
    for (unsigned p = 0; p < R; ++p) {
      if (skip(p)) continue;
      rshmemi_device_state = pes[p].state;
      launch(k.dsend, args(p, reinterpret_cast<uint64_t>(pes[p].x), 0, set), grid);
    }
    for (unsigned p = 0; p < R; ++p) {
      if (skip(p)) continue;
      rshmemi_device_state = pes[p].state;
      launch(k.drecv, args(p, 0, reinterpret_cast<uint64_t>(pes[p].recv_x), set), grid);
    }
    if (mode == 1) {
      for (unsigned p = 0; p < R; ++p) {
        if (skip(p)) continue;
        printf("rep %u pe %u\n", rep, p);
        for (unsigned s = 0; s < 2; ++s)
          printf("status %u %u %d %llu %llu %llu\n", s, pes[p].ctl->status[s].kind,
                 pes[p].ctl->status[s].peer, (unsigned long long)pes[p].ctl->status[s].value,
                 (unsigned long long)pes[p].ctl->status[s].commit,
                 (unsigned long long)pes[p].ctl->set_calls[s]);
      }
      continue;
    }
    // The simulated expert of host/src/ep/check.rs expert_forward:
    // out = bf16(dequant(recv) * (1 + (e % 4) / 4)).
    for (unsigned p = 0; p < R; ++p) {
      Pe &pe = pes[p];
      for (unsigned le = 0; le < L; ++le) {
        const float f = 1.0f + float((p * L + le) % 4) * 0.25f;
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
    }
    set = call++ % 2;
    for (unsigned p = 0; p < R; ++p) {
      if (skip(p)) continue;
      rshmemi_device_state = pes[p].state;
      launch(k.csend, args(p, reinterpret_cast<uint64_t>(pes[p].expert_out), 0, set), grid);
    }
    for (unsigned p = 0; p < R; ++p) {
      if (skip(p)) continue;
      rshmemi_device_state = pes[p].state;
      launch(k.crecv, args(p, 0, reinterpret_cast<uint64_t>(pes[p].combined), set), grid);
    }
    for (unsigned p = 0; p < R; ++p) {
      if (skip(p)) continue;
      Pe &pe = pes[p];
      printf("rep %u pe %u\ncount", rep, p);
      for (unsigned le = 0; le < L; ++le) printf(" %d", pe.recv_count[le]);
      printf("\n");
      for (unsigned le = 0; le < L; ++le)
        for (unsigned s = 0; s < R; ++s) {
          const int64_t lr = pe.layout_range[le * R + s];
          const uint64_t begin = uint64_t(lr) >> 32, count = lr & 0xffffffff;
          printf("block %u %u %llu %llu\n", le, s, (unsigned long long)begin, (unsigned long long)count);
          for (uint64_t i = 0; i < count; ++i) {
            const uint64_t row = le * rows + begin + i;
            uint64_t h;
            if (fp8) {
              h = fnv(pe.recv_x + row * H, H);
              h = fnv(pe.scales + row * (H / 128), (H / 128) * 4, h);
            } else {
              h = fnv(pe.recv_x + row * H * 2, size_t(H) * 2);
            }
            printf("row %d %d %016llx\n", pe.src_info[row], pe.slot[row], (unsigned long long)h);
          }
        }
      for (unsigned t = 0; t < pe.T; ++t)
        printf("comb %016llx\n", (unsigned long long)fnv(pe.combined + size_t(t) * H, size_t(H) * 2));
      for (unsigned s = 0; s < 2; ++s)
        printf("status %u %u %d %llu %llu %llu\n", s, pe.ctl->status[s].kind, pe.ctl->status[s].peer,
               (unsigned long long)pe.ctl->status[s].value, (unsigned long long)pe.ctl->status[s].commit,
               (unsigned long long)pe.ctl->set_calls[s]);
    }
  }
  return 0;
}
