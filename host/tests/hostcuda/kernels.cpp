// kernels.cpp — the block runner of a hostcuda kernel library: linked with one module's
// .cu (built as host C++ with the CPU emulation of host/tests/device-emu, as
// device_emu.rs builds it) into a shared library that hostcuda loads
// (HOSTCUDA_KERNEL_LIBS) to run that module's kernels. hostcuda forks one process per
// block of a launch and calls hostcuda_run_block there: the module instance's bound state
// becomes the library's `rshmemi_device_state`, and the block's threads run as fibers.
//
// Kernels are found by their extern "C" names (dlsym in this library). Their parameters,
// as the PTX declares them: one struct by value (the harness and EP argument blocks, 64
// or 128 bytes), or up to 12 scalars of at most 8 bytes (pointers, integers: each in a
// 64-bit integer slot of the x86-64 calling convention, which is how a u32 parameter is
// passed too). Floating-point scalars are not supported.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rshmem/state.cuh"

// The module's state global, when its source includes the device API (rshmem/device/
// core.cuh defines it); weak, so a module without one links too.
extern "C" __attribute__((weak)) rshmem_device_state_t rshmemi_device_state;

namespace {

template <size_t N>
struct Bytes {
  uint64_t w[N / 8];
};

void *self_symbol(const char *name) {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void *>(&self_symbol), &info)) return nullptr;
  void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  return h ? dlsym(h, name) : nullptr;
}

// The call of this launch (set before the fibers start).
void *g_fn;
void **g_params;
const uint32_t *g_sizes;
int g_nparams;

uint64_t scalar(int i) {
  uint64_t v = 0;
  memcpy(&v, g_params[i], g_sizes[i]);
  return v;
}

void call() {
  if (g_nparams == 1 && g_sizes[0] == 64) {
    reinterpret_cast<void (*)(Bytes<64>)>(g_fn)(*static_cast<Bytes<64> *>(g_params[0]));
    return;
  }
  if (g_nparams == 1 && g_sizes[0] == 128) {
    reinterpret_cast<void (*)(Bytes<128>)>(g_fn)(*static_cast<Bytes<128> *>(g_params[0]));
    return;
  }
  uint64_t a[12] = {};
  for (int i = 0; i < g_nparams; ++i) a[i] = scalar(i);
  using F = void (*)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                     uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);
  // Extra trailing arguments are ignored by a callee that takes fewer (x86-64 SysV: the
  // caller owns the stack and passes the first six in registers).
  reinterpret_cast<F>(g_fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]);
}

bool supported(const uint32_t *sizes, int n) {
  if (n == 1 && (sizes[0] == 64 || sizes[0] == 128)) return true;
  if (n > 12) return false;
  for (int i = 0; i < n; ++i)
    if (sizes[i] == 0 || sizes[i] > 8) return false;
  return true;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int hostcuda_has(const char *name) {
  return self_symbol(name) != nullptr;
}

extern "C" __attribute__((visibility("default"))) void hostcuda_run_block(
    const char *name, void **params, const uint32_t *sizes, int nparams, unsigned grid,
    unsigned block, unsigned b, const void *state, size_t state_bytes) {
  g_fn = self_symbol(name);
  if (!g_fn || !supported(sizes, nparams)) {
    fprintf(stderr, "hostcuda kernels: cannot call %s (%d parameters)\n", name, nparams);
    _exit(4);
  }
  if (state && &rshmemi_device_state != nullptr) {
    // A module whose state differs in size from this build's would run unbound: say so.
    if (state_bytes != sizeof(rshmemi_device_state)) {
      fprintf(stderr, "hostcuda kernels: %s: the module's device state is %zu bytes, this build's %zu\n",
              name, state_bytes, sizeof(rshmemi_device_state));
      _exit(4);
    }
    memcpy(&rshmemi_device_state, state, state_bytes);
  }
  g_params = params;
  g_sizes = sizes;
  g_nparams = nparams;
  blockIdx = {b, 0, 0};
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  emu_body = call;
  emu_run_block(block);
}
