// signal_kernel.cpp — the host-side signal kernel of host/src/gpu/module.rs (SIGNAL_PTX,
// hand-written PTX that ptxas checks in host/tests/gpu_ptx.rs) as host C++ for hostcuda's
// kernel libraries, instruction for instruction: op 0 stores the value with release
// semantics (st.release.sys), any other op adds it (red.release.sys.add).
#include <stdint.h>

extern "C" void rshmem_host_signal(uint64_t addr, uint64_t value, uint32_t op) {
  uint64_t *p = reinterpret_cast<uint64_t *>(addr);
  if (op == 0)
    __atomic_store_n(p, value, __ATOMIC_RELEASE);
  else
    __atomic_fetch_add(p, value, __ATOMIC_RELEASE);
}
