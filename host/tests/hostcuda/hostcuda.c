// hostcuda.c — a stand-in for the CUDA driver (libcuda.so.1) that runs on the CPU, for
// the host/tests/gpu_host_layer.rs tests: the GPU host layer (GpuPe setup, the VMM heap
// and its fd exchange, module binding, teams, EP buffer creation, finalize) has no GPU in
// CI, and before this stand-in none of it had ever run (a bounds check that refused the
// runtime's own team entries failed every GPU PE's setup; found by reading, 2026-12-05).
//
// It implements the driver calls rshmem names (host/src/gpu/driver.rs DRIVER_SYMBOLS)
// against host memory, with the real driver's types and constants (cuda.h of the pinned
// CUDA 13.0 wheel): device memory is host memory (a device pointer is the host address),
// the VMM heap is a memfd mapped where the reservation is (so an exported fd mapped by
// another PE, thread or process, shows the same bytes), and each stream is a worker
// thread that runs its operations in order, asynchronously; frees and unloads wait for
// every stream (the real driver may). It checks what the real driver checks and returns
// its errors:
// sizes against the allocation granularity, pointers and copies inside live
// allocations, mappings and registrations, handles that exist, a current context.
// Fresh device memory is filled with 0xA5 (the real driver does not zero it).
//
// Kernels: a launch runs the kernel's host-C++ build from the kernel libraries that
// HOSTCUDA_KERNEL_LIBS names (host/tests/hostcuda/kernels.cpp; host/tests/gpu_on_hostcuda.rs
// builds them from the unchanged .cu sources with the CPU emulation of
// host/tests/device-emu), one forked process per block, all blocks at once; without a
// library that has the kernel, the launch is refused (CUDA_ERROR_NOT_SUPPORTED). Stream
// capture records launches and graphs replay them; 32-bit stream memory waits and writes.
// Device affinity: cuMemAlloc memory belongs to its device, and so does pinned host memory
// made without PORTABLE (cuMemHostGetDevicePointer from another device's context fails);
// a stream memory operation of another device's stream on such memory is refused (peer
// access is never enabled).
// Not emulated: dma-buf export, cubin images. Test code only.
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <signal.h>
#include <errno.h>
#include <sys/mman.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture (Linux 5.3)
#endif
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define GRANULARITY ((size_t)2 << 20)
#define MAX_RANGES 4096

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;
static __thread CUcontext current;

struct ctx {
  int device;
  int retained;
};
static struct ctx contexts[8];

static int device_count(void) {
  const char *e = getenv("HOSTCUDA_DEVICES");
  int n = e ? atoi(e) : 1;
  return n < 1 ? 1 : (n > 8 ? 8 : n);
}

// Live ranges a device pointer may fall into.
enum kind { R_FREE = 0, R_ALLOC, R_HOSTALLOC, R_REGISTERED, R_MAPPED, R_RESERVED, R_GLOBAL };
struct range {
  enum kind kind;
  uintptr_t lo, hi;
  int access;    // R_MAPPED: cuMemSetAccess granted read-write
  void *handle;  // R_MAPPED: the allocation handle
  int moved;     // R_REGISTERED: share_range moved the range onto a memfd (undone at
                 // unregistration)
  int device;    // R_ALLOC, and R_HOSTALLOC / R_REGISTERED without PORTABLE: the device
                 // whose context made it (else -1: every context)
};
static struct range ranges[MAX_RANGES];

static struct range *add_range(enum kind k, uintptr_t lo, size_t len) {
  for (int i = 0; i < MAX_RANGES; ++i)
    if (ranges[i].kind == R_FREE) {
      ranges[i] = (struct range){k, lo, lo + len, 0, NULL, 0, -1};
      return &ranges[i];
    }
  return NULL;
}
static struct range *find_range(enum kind k, uintptr_t p) {
  for (int i = 0; i < MAX_RANGES; ++i)
    if (ranges[i].kind == k && p >= ranges[i].lo && p < ranges[i].hi) return &ranges[i];
  return NULL;
}
static struct range *find_exact(enum kind k, uintptr_t lo) {
  for (int i = 0; i < MAX_RANGES; ++i)
    if (ranges[i].kind == k && ranges[i].lo == lo) return &ranges[i];
  return NULL;
}
// Whether [p, p + len) is memory the device may access: an allocation, host memory
// mapped for the device, a mapped VMM range with access granted, or a module global.
static int device_accessible(uintptr_t p, size_t len) {
  if (len == 0) return 1;
  for (int i = 0; i < MAX_RANGES; ++i) {
    const struct range *r = &ranges[i];
    if (r->kind == R_FREE || r->kind == R_RESERVED) continue;
    if (p >= r->lo && p + len <= r->hi && p + len >= p) return r->kind != R_MAPPED || r->access;
  }
  return 0;
}

// A launch whose block ended abnormally (a trap aborts its process) leaves the context
// unusable, as on a GPU: every later call that needs it returns this.
static CUresult sticky = CUDA_SUCCESS;

static CUresult sync_all_streams(void);
// Frees and unloads wait for every stream first, as the real driver may ("may perform
// implicit synchronization"): host code that frees while a peer's kernel still waits for
// this PE deadlocks here as it could on a GPU (docs/gpu-design.md), until the bounds.
static void implicit_sync(void) { sync_all_streams(); }

static CUresult need_ctx(void) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  return __atomic_load_n(&sticky, __ATOMIC_ACQUIRE);
}

// ----------------------------------------------------------------------- init, devices

EXPORT CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  initialised = 1;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDriverGetVersion(int *v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
  switch (e) {
#define N(x) \
  case x: *s = #x; return CUDA_SUCCESS;
    N(CUDA_SUCCESS) N(CUDA_ERROR_INVALID_VALUE) N(CUDA_ERROR_OUT_OF_MEMORY)
    N(CUDA_ERROR_NOT_INITIALIZED) N(CUDA_ERROR_INVALID_CONTEXT) N(CUDA_ERROR_INVALID_HANDLE)
    N(CUDA_ERROR_NOT_FOUND) N(CUDA_ERROR_NOT_SUPPORTED) N(CUDA_ERROR_INVALID_DEVICE)
    N(CUDA_ERROR_INVALID_IMAGE) N(CUDA_ERROR_NOT_READY) N(CUDA_ERROR_ALREADY_MAPPED)
    N(CUDA_ERROR_NOT_MAPPED) N(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
    N(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) N(CUDA_ERROR_OPERATING_SYSTEM)
#undef N
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
}
EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
  CUresult r = cuGetErrorName(e, s);
  if (r == CUDA_SUCCESS && e == CUDA_ERROR_NOT_SUPPORTED)
    *s = "operation not supported (hostcuda: not emulated on the CPU)";
  return r;
}
EXPORT CUresult cuDeviceGetCount(int *n) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  *n = device_count();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "hostcuda %d (CPU stand-in)", d);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(id, (size_t)len, "0000:%02x:00.0", 0x10 + d);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: {
      const char *e = getenv("HOSTCUDA_SMS");  // few SMs keep collective grids small
      *v = e ? atoi(e) : 132;
      break;
    }
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *v = 1; break;
    // No NIC here: nothing is GPUDirect-RDMA capable.
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: *v = 1; break;
    default:
      fprintf(stderr, "hostcuda: cuDeviceGetAttribute(%d) is not modelled\n", (int)a);
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem(size_t *bytes, CUdevice d) {
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = (size_t)80 << 30;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
  if (d < 0 || d >= device_count() || peer < 0 || peer >= device_count())
    return CUDA_ERROR_INVALID_DEVICE;
  *can = 1;
  return CUDA_SUCCESS;
}
// Every pair of distinct devices has P2P access; native atomics over it unless
// HOSTCUDA_P2P_NO_ATOMICS=1 (GPUs on PCIe without atomics between them). Like the real
// driver, a device paired with itself is an invalid pair.
EXPORT CUresult cuDeviceGetP2PAttribute(int *v, CUdevice_P2PAttribute a, CUdevice src, CUdevice dst) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  if (src < 0 || src >= device_count() || dst < 0 || dst >= device_count() || src == dst)
    return CUDA_ERROR_INVALID_DEVICE;
  const char *e = getenv("HOSTCUDA_P2P_NO_ATOMICS");
  switch (a) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *v = 0; return CUDA_SUCCESS;
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: *v = 1; return CUDA_SUCCESS;
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: *v = !(e && strcmp(e, "1") == 0); return CUDA_SUCCESS;
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: *v = 0; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

// ----------------------------------------------------------------------------- contexts

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  contexts[d].device = d;
  contexts[d].retained++;
  pthread_mutex_unlock(&lock);
  *c = (CUcontext)&contexts[d];
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  CUresult r = contexts[d].retained > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  if (r == CUDA_SUCCESS) contexts[d].retained--;
  pthread_mutex_unlock(&lock);
  return r;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (c && ((struct ctx *)c)->retained == 0) return CUDA_ERROR_INVALID_CONTEXT;
  current = c;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void) {
  CUresult r = sync_all_streams();
  return r ? r : need_ctx();
}

// ------------------------------------------------------------------------ plain memory

// Device and pinned host memory: shared mappings, so that what a launch's block
// processes (forked, see "kernels") write is what the PEs' threads then read.
static void *shared_alloc(size_t len, int fill) {
  void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  if (fill) memset(p, 0xA5, len);
  return p;
}
EXPORT CUresult cuMemAlloc(CUdeviceptr *p, size_t len) {
  CUresult r = need_ctx();
  if (r) return r;
  if (len == 0) return CUDA_ERROR_INVALID_VALUE;
  void *m = shared_alloc(len, 1);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  struct range *g = add_range(R_ALLOC, (uintptr_t)m, len);
  if (g) g->device = ((struct ctx *)current)->device;
  pthread_mutex_unlock(&lock);
  if (!g) {
    munmap(m, len);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFree(CUdeviceptr p) {
  implicit_sync();
  CUresult r = need_ctx();
  if (r) return r;
  pthread_mutex_lock(&lock);
  struct range *g = find_exact(R_ALLOC, (uintptr_t)p);
  size_t len = g ? g->hi - g->lo : 0;
  if (g) g->kind = R_FREE;
  pthread_mutex_unlock(&lock);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  munmap((void *)(uintptr_t)p, len);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemHostAlloc(void **p, size_t len, unsigned int flags) {
  CUresult r = need_ctx();
  if (r) return r;
  if (len == 0 || (flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
  void *m = shared_alloc(len, 1);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  struct range *h = add_range(R_HOSTALLOC, (uintptr_t)m, len);
  if (h && !(flags & CU_MEMHOSTALLOC_PORTABLE)) h->device = ((struct ctx *)current)->device;
  pthread_mutex_unlock(&lock);
  *p = m;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFreeHost(void *p) {
  implicit_sync();
  pthread_mutex_lock(&lock);
  struct range *g = find_exact(R_HOSTALLOC, (uintptr_t)p);
  size_t len = g ? g->hi - g->lo : 0;
  if (g) g->kind = R_FREE;
  pthread_mutex_unlock(&lock);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, len);
  return CUDA_SUCCESS;
}
// How much of [p, p + len) shared mappings cover (/proc/self/maps): 2 all of it, 1 part,
// 0 none.
static int shared_coverage(uintptr_t p, size_t len) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return 0;
  char line[512];
  uintptr_t cur = p;  // the lines are sorted: the first byte not yet known shared
  int some = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || hi <= p || lo >= p + len) continue;
    if (perms[3] != 's') continue;
    some = 1;
    if (lo <= cur && hi > cur) cur = hi;
  }
  fclose(f);
  return cur >= p + len ? 2 : some;
}

// Registered host memory must be shared with the launch's block processes (forked): a
// private page-aligned range is moved, contents and address kept, onto a shared memfd
// mapping. (Host memory a GPU reads and writes over PCIe is the same memory for both
// sides; a fork would otherwise give the blocks a copy.) Registration happens before the
// range is in use by other threads (as it must on a GPU too). Sets *moved when it moved
// the range.
static CUresult share_range(void *p, size_t len, int *moved) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  *moved = 0;
  const int cover = shared_coverage((uintptr_t)p, len);
  if (cover == 2) return CUDA_SUCCESS;
  // The real driver pins any range; this stand-in can only share whole private pages. A
  // range it cannot share would silently be a copy in the block processes: refuse it.
  if ((uintptr_t)p % page || len % page || cover) {
    fprintf(stderr,
            "hostcuda: cannot share host range %p + %zu with the block processes (%s): "
            "register whole private pages\n",
            p, len, cover ? "partly shared already" : "not page-aligned");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  int fd = memfd_create("hostcuda-registered", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  if (ftruncate(fd, (off_t)len) || pwrite(fd, p, len, 0) != (ssize_t)len) {
    close(fd);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  void *m = mmap(p, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  close(fd);
  if (m != p) {
    // MAP_FIXED may have unmapped the range already: the program's memory is gone.
    perror("hostcuda: moving a registered range onto shared memory");
    abort();
  }
  *moved = 1;
  return CUDA_SUCCESS;
}

// Unregistration moves a range share_range moved back onto private anonymous memory,
// contents and address kept. Without it the pages stay shared with every block process
// forked later: once the program frees the buffer, malloc reuses those pages (a small
// page-aligned buffer lies in the brk heap) for its own chunk headers, and a block
// process's malloc then corrupts the parent's heap ("malloc(): unsorted double linked
// list corrupted" in CI, 2026-12-06), which a real driver's pinning never does. As at
// registration, nobody else writes the range meanwhile (it is about to be freed).
static void unshare_range(void *p, size_t len) {
  void *copy = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  // mremap moves the private copy over the range in one step (the old shared mapping is
  // unmapped by it), so the address never points at nothing. A range left shared is the
  // heap corruption above, silently: a failure here ends the process.
  if (copy == MAP_FAILED) {
    perror("hostcuda: unregistration: a private copy of the range");
    abort();
  }
  memcpy(copy, p, len);
  if (mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, p) != p) {
    perror("hostcuda: unregistration: moving the range back onto private memory");
    abort();
  }
}

// Whether a registration overlaps [lo, hi). The real driver refuses overlapping bytes
// (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) but, as reported against driver 590, not
// separate ranges that share a page. Called with `lock` held.
static int registered_overlap(uintptr_t lo, uintptr_t hi) {
  for (int i = 0; i < MAX_RANGES; ++i)
    if (ranges[i].kind == R_REGISTERED && ranges[i].lo < hi && lo < ranges[i].hi) return 1;
  return 0;
}

// Serialises registrations and unregistrations with the moves of their pages (not `lock`:
// unregistration's implicit sync takes it).
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

EXPORT CUresult cuMemHostRegister(void *p, size_t len, unsigned int flags) {
  CUresult r = need_ctx();
  if (r) return r;
  if (!p || len == 0 || (flags & ~0xfu) || (uintptr_t)p + len < (uintptr_t)p)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&reg_lock);
  pthread_mutex_lock(&lock);
  const int taken = registered_overlap((uintptr_t)p, (uintptr_t)p + len);
  pthread_mutex_unlock(&lock);
  int moved = 0;
  if (taken)
    r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  else
    r = share_range(p, len, &moved);
  if (r) {
    pthread_mutex_unlock(&reg_lock);
    return r;
  }
  pthread_mutex_lock(&lock);
  struct range *g = add_range(R_REGISTERED, (uintptr_t)p, len);
  if (g) {
    g->moved = moved;
    if (!(flags & CU_MEMHOSTREGISTER_PORTABLE)) g->device = ((struct ctx *)current)->device;
  }
  pthread_mutex_unlock(&lock);
  if (!g && moved) unshare_range(p, len);
  pthread_mutex_unlock(&reg_lock);
  return g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuMemHostUnregister(void *p) {
  implicit_sync();
  pthread_mutex_lock(&reg_lock);
  pthread_mutex_lock(&lock);
  struct range *g = find_exact(R_REGISTERED, (uintptr_t)p);
  const int moved = g && g->moved;
  const size_t len = g ? g->hi - g->lo : 0;
  if (g) g->kind = R_FREE;
  pthread_mutex_unlock(&lock);
  if (moved) unshare_range(p, len);
  pthread_mutex_unlock(&reg_lock);
  return g ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}
EXPORT CUresult cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned int flags) {
  CUresult r = need_ctx();
  if (r) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  struct range *g = find_range(R_REGISTERED, (uintptr_t)p);
  if (!g) g = find_range(R_HOSTALLOC, (uintptr_t)p);
  // Pinned memory without PORTABLE is pinned for the context that made it only.
  const int ok = g && (g->device < 0 || g->device == ((struct ctx *)current)->device);
  pthread_mutex_unlock(&lock);
  if (!ok) return CUDA_ERROR_INVALID_VALUE;
  *d = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

// Copies and sets: run at once; both sides must be device-accessible (a host pointer of
// HtoD/DtoH is any host memory).
static CUresult copy(void *dst, const void *src, size_t len, int dst_dev, int src_dev) {
  CUresult r = need_ctx();
  if (r) return r;
  pthread_mutex_lock(&lock);
  int ok = (!dst_dev || device_accessible((uintptr_t)dst, len)) &&
           (!src_dev || device_accessible((uintptr_t)src, len));
  pthread_mutex_unlock(&lock);
  if (!ok) {
    fprintf(stderr, "hostcuda: copy of %zu bytes %p -> %p outside device memory\n", len, src, dst);
    return CUDA_ERROR_INVALID_VALUE;
  }
  memmove(dst, src, len);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoD(CUdeviceptr d, const void *s, size_t len) {
  return copy((void *)(uintptr_t)d, s, len, 1, 0);
}
EXPORT CUresult cuMemcpyDtoH(void *d, CUdeviceptr s, size_t len) {
  return copy(d, (const void *)(uintptr_t)s, len, 0, 1);
}
static CUresult enqueue_copy(CUstream s, void *dst, const void *src, size_t len, int set,
                             unsigned char byte);
EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t len, CUstream st) {
  return enqueue_copy(st, (void *)(uintptr_t)d, (const void *)(uintptr_t)s, len, 0, 0);
}
static CUresult set8(CUdeviceptr d, unsigned char v, size_t len) {
  CUresult r = need_ctx();
  if (r) return r;
  pthread_mutex_lock(&lock);
  int ok = device_accessible((uintptr_t)d, len);
  pthread_mutex_unlock(&lock);
  if (!ok) {
    fprintf(stderr, "hostcuda: memset of %zu bytes at %#llx outside device memory\n", len,
            (unsigned long long)d);
    return CUDA_ERROR_INVALID_VALUE;
  }
  memset((void *)(uintptr_t)d, v, len);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD8(CUdeviceptr d, unsigned char v, size_t len) { return set8(d, v, len); }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t len, CUstream s) {
  return enqueue_copy(s, (void *)(uintptr_t)d, NULL, len, 1, v);
}

// --------------------------------------------------------------------------------- VMM

struct alloc {
  int fd;
  size_t size;
  int refs;  // the handle's own reference + one per mapping
};
static CUresult check_prop(const CUmemAllocationProp *p) {
  if (!p || p->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      p->location.type != CU_MEM_LOCATION_TYPE_DEVICE || p->location.id < 0 ||
      p->location.id >= device_count())
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p,
                                              CUmemAllocationGranularity_flags f) {
  (void)f;
  CUresult r = check_prop(p);
  if (r) return r;
  *g = GRANULARITY;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                            const CUmemAllocationProp *p, unsigned long long flags) {
  CUresult r = need_ctx();
  if (r || (r = check_prop(p))) return r;
  if (flags != 0 || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  if (p->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_NOT_SUPPORTED;
  // No GPUDirect RDMA here (the device attribute says so): refused as a driver would.
  if (p->allocFlags.gpuDirectRDMACapable) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = memfd_create("hostcuda-vmm", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  if (ftruncate(fd, (off_t)size)) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  struct alloc *a = malloc(sizeof *a);
  *a = (struct alloc){fd, size, 1};
  // Fresh memory holds garbage on a GPU: fill it so that nothing relies on zeros.
  void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m != MAP_FAILED) {
    memset(m, 0xA5, size);
    munmap(m, size);
  }
  *h = (CUmemGenericAllocationHandle)(uintptr_t)a;
  return CUDA_SUCCESS;
}
static void unref(struct alloc *a) {
  if (--a->refs == 0) {
    close(a->fd);
    free(a);
  }
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  unref((struct alloc *)(uintptr_t)h);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
                                             CUmemAllocationHandleType t,
                                             unsigned long long flags) {
  if (!h || !out || flags) return CUDA_ERROR_INVALID_VALUE;
  if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  // HOSTCUDA_NO_FD_EXPORT=1: a driver that cannot create POSIX-fd handles although the
  // device attribute says it can (gVisor's nvproxy forwards no export ioctl).
  const char *e = getenv("HOSTCUDA_NO_FD_EXPORT");
  if (e && strcmp(e, "1") == 0) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = dup(((struct alloc *)(uintptr_t)h)->fd);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  *(int *)out = fd;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
                                               CUmemAllocationHandleType t) {
  CUresult r = need_ctx();
  if (r) return r;
  if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  // The driver does not take the caller's fd: it keeps a duplicate.
  int fd = dup((int)(intptr_t)os);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  off_t size = lseek(fd, 0, SEEK_END);
  if (size <= 0) {
    close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  struct alloc *a = malloc(sizeof *a);
  *a = (struct alloc){fd, (size_t)size, 1};
  *h = (CUmemGenericAllocationHandle)(uintptr_t)a;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
  pthread_mutex_lock(&lock);
  struct range *g = find_range(R_MAPPED, (uintptr_t)addr);
  if (g) ((struct alloc *)g->handle)->refs++;
  pthread_mutex_unlock(&lock);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  *h = (CUmemGenericAllocationHandle)(uintptr_t)g->handle;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
  if (size == 0 || size % GRANULARITY || flags || addr) return CUDA_ERROR_INVALID_VALUE;
  if (align == 0) align = GRANULARITY;
  if (align & (align - 1)) return CUDA_ERROR_INVALID_VALUE;
  size_t over = size + align;
  char *m = mmap(NULL, over, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t lo = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
  if (lo > (uintptr_t)m) munmap(m, lo - (uintptr_t)m);
  uintptr_t end = (uintptr_t)m + over;
  if (end > lo + size) munmap((void *)(lo + size), end - (lo + size));
  pthread_mutex_lock(&lock);
  add_range(R_RESERVED, lo, size);
  pthread_mutex_unlock(&lock);
  *p = (CUdeviceptr)lo;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
  pthread_mutex_lock(&lock);
  struct range *g = find_exact(R_RESERVED, (uintptr_t)p);
  CUresult r = CUDA_SUCCESS;
  if (!g || g->hi - g->lo != size)
    r = CUDA_ERROR_INVALID_VALUE;
  else if (find_range(R_MAPPED, (uintptr_t)p))
    r = CUDA_ERROR_INVALID_VALUE;  // still mapped: unmap first
  else
    g->kind = R_FREE;
  pthread_mutex_unlock(&lock);
  if (r == CUDA_SUCCESS) munmap((void *)(uintptr_t)p, size);
  return r;
}
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset,
                         CUmemGenericAllocationHandle h, unsigned long long flags) {
  if (!h || flags || offset || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  struct alloc *a = (struct alloc *)(uintptr_t)h;
  pthread_mutex_lock(&lock);
  CUresult r = CUDA_SUCCESS;
  struct range *res = find_range(R_RESERVED, (uintptr_t)p);
  if (!res || (uintptr_t)p + size > res->hi || size > a->size)
    r = CUDA_ERROR_INVALID_VALUE;
  else if (find_range(R_MAPPED, (uintptr_t)p) || find_range(R_MAPPED, (uintptr_t)p + size - 1))
    r = CUDA_ERROR_ALREADY_MAPPED;
  if (r == CUDA_SUCCESS) {
    // Mapped without access until cuMemSetAccess, as on a GPU.
    void *m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, 0);
    if (m == MAP_FAILED) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      struct range *g = add_range(R_MAPPED, (uintptr_t)p, size);
      g->handle = a;
      a->refs++;
    }
  }
  pthread_mutex_unlock(&lock);
  return r;
}
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d,
                               size_t count) {
  if (!d || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i)
    if (d[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || d[i].location.id < 0 ||
        d[i].location.id >= device_count())
      return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  struct range *g = find_exact(R_MAPPED, (uintptr_t)p);
  CUresult r = (!g || g->hi - g->lo != size) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) {
    const int rw = d[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    mprotect((void *)(uintptr_t)p, size, rw ? PROT_READ | PROT_WRITE : PROT_READ);
    g->access = rw;
  }
  pthread_mutex_unlock(&lock);
  return r;
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  pthread_mutex_lock(&lock);
  struct range *g = find_exact(R_MAPPED, (uintptr_t)p);
  CUresult r = (!g || g->hi - g->lo != size) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) {
    // Back to a bare reservation.
    mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
         -1, 0);
    unref((struct alloc *)g->handle);
    g->kind = R_FREE;
  }
  pthread_mutex_unlock(&lock);
  return r;
}
// The allocation containing p, as a GPU driver answers: a cuMemAlloc allocation whole,
// or one cuMemMap mapping of a VMM range (one physical chunk, not the whole reservation);
// CUDA_ERROR_NOT_FOUND elsewhere (this stand-in does not describe host memory).
EXPORT CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  CUresult r = need_ctx();
  if (r) return r;
  pthread_mutex_lock(&lock);
  const struct range *g = find_range(R_ALLOC, (uintptr_t)p);
  if (!g) g = find_range(R_MAPPED, (uintptr_t)p);
  if (g) {
    if (base) *base = (CUdeviceptr)g->lo;
    if (size) *size = g->hi - g->lo;
  }
  pthread_mutex_unlock(&lock);
  return g ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuMemGetHandleForAddressRange(void *h, CUdeviceptr p, size_t size,
                                              CUmemRangeHandleType t, unsigned long long f) {
  (void)h, (void)p, (void)size, (void)t, (void)f;
  return CUDA_ERROR_NOT_SUPPORTED;  // no dma-buf here
}

// ------------------------------------------------------------------------------ modules
// An image is PTX text: its `.entry` kernels and its `.global` / `.const` variables
// (their bytes are host memory, zeroed as the loader zeroes uninitialised globals).

struct global {
  char name[128];
  void *at;
  size_t size;
};
struct function {
  char name[160];
  struct module *mod;
  int nparams;
  uint32_t sizes[32];  // bytes of each parameter, from the PTX's .param declarations
};
struct module {
  int nglobals, nfuncs;
  struct global globals[64];
  struct function funcs[512];
};

static size_t type_bytes(const char *t) {
  if (!strncmp(t, ".b8", 3) || !strncmp(t, ".u8", 3) || !strncmp(t, ".s8", 3)) return 1;
  if (!strncmp(t, ".b16", 4) || !strncmp(t, ".u16", 4) || !strncmp(t, ".s16", 4)) return 2;
  if (!strncmp(t, ".b32", 4) || !strncmp(t, ".u32", 4) || !strncmp(t, ".s32", 4) ||
      !strncmp(t, ".f32", 4))
    return 4;
  if (!strncmp(t, ".b64", 4) || !strncmp(t, ".u64", 4) || !strncmp(t, ".s64", 4) ||
      !strncmp(t, ".f64", 4))
    return 8;
  return 0;
}

// Parses one `.visible .global .align 8 .b8 name[128];` style declaration at `s`.
static void parse_var(struct module *m, const char *s) {
  char buf[512];
  size_t n = strcspn(s, ";\n");
  if (n >= sizeof buf) return;
  memcpy(buf, s, n);
  buf[n] = 0;
  if (strchr(buf, '=')) *strchr(buf, '=') = 0;  // initialisers are not modelled
  size_t elem = 0;
  char *name = NULL;
  for (char *tok = strtok(buf, " \t"); tok; tok = strtok(NULL, " \t")) {
    if (tok[0] == '.') {
      size_t b = type_bytes(tok);
      if (b) elem = b;
    } else if (strcmp(tok, "align") != 0 && (tok[0] < '0' || tok[0] > '9')) {
      name = tok;
    }
  }
  if (!name || !elem || m->nglobals == 64) return;
  size_t count = 1;
  char *br = strchr(name, '[');
  if (br) {
    count = strtoull(br + 1, NULL, 10);
    *br = 0;
  }
  struct global *g = &m->globals[m->nglobals++];
  snprintf(g->name, sizeof g->name, "%s", name);
  g->size = elem * count;
  g->at = shared_alloc(g->size, 0);  // zero, as the loader zeroes uninitialised globals
  add_range(R_GLOBAL, (uintptr_t)g->at, g->size);
}

EXPORT CUresult cuModuleLoadData(CUmodule *out, const void *image);
// The options are the JIT's (log buffers): no JIT runs here, so the error log stays empty.
EXPORT CUresult cuModuleLoadDataEx(CUmodule *out, const void *image, unsigned n,
                                   CUjit_option *opts, void **vals) {
  if (n && (!opts || !vals)) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; ++i)
    if (opts[i] == CU_JIT_ERROR_LOG_BUFFER && vals[i]) *(char *)vals[i] = 0;
  return cuModuleLoadData(out, image);
}
EXPORT CUresult cuModuleLoadData(CUmodule *out, const void *image) {
  CUresult r = need_ctx();
  if (r) return r;
  const char *t = image;
  if (!t) return CUDA_ERROR_INVALID_VALUE;
  if (!memcmp(t, "\177ELF", 4)) return CUDA_ERROR_NOT_SUPPORTED;  // cubins: not modelled
  if (!strstr(t, ".version") || !strstr(t, ".target")) return CUDA_ERROR_INVALID_IMAGE;
  struct module *m = calloc(1, sizeof *m);
  pthread_mutex_lock(&lock);
  for (const char *line = t; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    while (*line == ' ' || *line == '\t') ++line;
    const char *e = NULL;
    if (!strncmp(line, ".visible .entry ", 16)) e = line + 16;
    else if (!strncmp(line, ".entry ", 7)) e = line + 7;
    else if (!strncmp(line, ".weak .entry ", 13)) e = line + 13;
    if (e && m->nfuncs < 512) {
      size_t n = strcspn(e, "( \t\n");
      struct function *f = &m->funcs[m->nfuncs++];
      snprintf(f->name, sizeof f->name, "%.*s", (int)n, e);
      f->mod = m;
      // Its parameters: `.param .u64 x,` / `.param .align 8 .b8 x[64]` lines up to ')'.
      for (const char *q = strchr(e, '\n'); q && *++q && f->nparams < 32; q = strchr(q, '\n')) {
        while (*q == ' ' || *q == '\t') ++q;
        if (*q == ')') break;
        if (strncmp(q, ".param ", 7) != 0) continue;
        size_t len = strcspn(q, "\n");
        const char *br = memchr(q, '[', len);
        uint32_t bytes = 0;
        if (br) {
          bytes = (uint32_t)strtoul(br + 1, NULL, 10);
        } else {
          for (const char *t = q + 7; t < q + len; ++t)
            if (*t == '.' && (bytes = (uint32_t)type_bytes(t))) break;
        }
        f->sizes[f->nparams++] = bytes;
      }
      continue;
    }
    // A module-scope variable: one line, no parameters.
    size_t len = strcspn(line, "\n");
    if ((!strncmp(line, ".visible .global ", 17) || !strncmp(line, ".visible .const ", 16) ||
         !strncmp(line, ".global ", 8) || !strncmp(line, ".const ", 7)) &&
        memchr(line, '(', len) == NULL)
      parse_var(m, line);
  }
  pthread_mutex_unlock(&lock);
  *out = (CUmodule)m;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleUnload(CUmodule mod) {
  implicit_sync();
  struct module *m = (struct module *)mod;
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < m->nglobals; ++i) {
    struct range *g = find_exact(R_GLOBAL, (uintptr_t)m->globals[i].at);
    if (g) g->kind = R_FREE;
    munmap(m->globals[i].at, m->globals[i].size);
  }
  pthread_mutex_unlock(&lock);
  free(m);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetGlobal(CUdeviceptr *p, size_t *bytes, CUmodule mod, const char *name) {
  struct module *m = (struct module *)mod;
  if (!m || !name) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < m->nglobals; ++i)
    if (!strcmp(m->globals[i].name, name)) {
      if (p) *p = (CUdeviceptr)(uintptr_t)m->globals[i].at;
      if (bytes) *bytes = m->globals[i].size;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name) {
  struct module *m = (struct module *)mod;
  if (!m || !name) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < m->nfuncs; ++i)
    if (!strcmp(m->funcs[i].name, name)) {
      *f = (CUfunction)&m->funcs[i];
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuModuleGetFunctionCount(unsigned int *n, CUmodule mod) {
  if (!mod || !n) return CUDA_ERROR_INVALID_VALUE;
  *n = (unsigned)((struct module *)mod)->nfuncs;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleEnumerateFunctions(CUfunction *fs, unsigned int n, CUmodule mod) {
  struct module *m = (struct module *)mod;
  if (!m || !fs || n == 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n && i < (unsigned)m->nfuncs; ++i) fs[i] = (CUfunction)&m->funcs[i];
  return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncLoad(CUfunction f) { return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block,
                                                            size_t smem) {
  (void)smem;
  if (!f || block <= 0 || block > 1024) return CUDA_ERROR_INVALID_VALUE;
  *n = 2048 / block > 32 ? 32 : 2048 / block;
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------------- not modelled

// The driver's private interfaces. NVRTC looks for an already loaded libcuda.so.1 and
// asks it for one; with none it does without (as on a machine without a driver).
EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id) {
  (void)id;
  if (table) *table = NULL;
  return CUDA_ERROR_NOT_SUPPORTED;
}

// ------------------------------------------------------------------------------ kernels
// A launch runs the kernel's host-C++ build (the same .cu compiled with the CPU emulation
// of host/tests/device-emu: each block's threads are fibers of one process) from the
// kernel libraries HOSTCUDA_KERNEL_LIBS names (colon-separated). Each library exports
// hostcuda_has(name) and hostcuda_run_block(...); the launch forks one process per block
// (so all blocks of all PEs run at once, as a co-resident grid does), each copies its
// module instance's bound state into the library's and runs its block. Without the
// kernel in any library the launch is refused.

typedef int (*has_fn)(const char *);
typedef void (*run_fn)(const char *name, void **params, const uint32_t *sizes, int nparams,
                       unsigned grid, unsigned block, unsigned b, const void *state,
                       size_t state_bytes);
static struct {
  has_fn has;
  run_fn run;
} klibs[8];
static int nklibs = -1;

static void load_kernel_libs(void) {
  nklibs = 0;
  const char *e = getenv("HOSTCUDA_KERNEL_LIBS");
  if (!e) return;
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", e);
  for (char *path = strtok(buf, ":"); path && nklibs < 8; path = strtok(NULL, ":")) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      fprintf(stderr, "hostcuda: kernel library %s: %s\n", path, dlerror());
      continue;
    }
    klibs[nklibs].has = (has_fn)dlsym(h, "hostcuda_has");
    klibs[nklibs].run = (run_fn)dlsym(h, "hostcuda_run_block");
    if (klibs[nklibs].has && klibs[nklibs].run) ++nklibs;
  }
}

// ------------------------------------------------------------------ streams and events
// A stream other than the legacy one is a worker thread that runs its operations in
// order, asynchronously to the host thread that enqueued them, as a GPU's stream does:
// kernel launches (the blocks as forked processes; the next operation waits for all of
// them), device copies and sets, event records, 32-bit stream memory waits and writes.
// The legacy stream's operations run when they are called. Every wait is bounded by
// HOSTCUDA_LAUNCH_TIMEOUT_S (60 s): past it the blocks are killed, or the wait given up,
// and the context fails (CUDA_ERROR_LAUNCH_TIMEOUT).

// A launch whose block ended abnormally (a trap aborts its process) leaves the context
// unusable, as on a GPU: need_ctx() returns it from then on.
static void fail_ctx(CUresult e) {
  // The first failure is the one reported (a timeout's kills must not turn it into
  // LAUNCH_FAILED).
  CUresult none = CUDA_SUCCESS;
  __atomic_compare_exchange_n(&sticky, &none, e, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static double limit_s(void) {
  const char *e = getenv("HOSTCUDA_LAUNCH_TIMEOUT_S");
  return e ? atof(e) : 60.0;
}
static double since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

struct captured {
  struct function *f;
  run_fn run;
  unsigned grid, block;
  unsigned char params[32][128];  // each parameter's bytes, copied when enqueued
};
struct event {
  struct timespec at;
  int recorded;  // set by the stream's worker when it reaches the record
  // Records enqueued and not reached yet, and whether cuEventDestroy came: as the real
  // driver documents, destroying an event whose record is pending returns at once and
  // the event is released once the record completes (under ev_lock).
  int pending;
  int destroyed;
};
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
enum op_kind { OP_LAUNCH, OP_COPY, OP_SET, OP_EVENT, OP_WAIT32, OP_WRITE32 };
struct op {
  enum op_kind kind;
  struct captured launch;
  void *dst;
  const void *src;
  size_t len;
  unsigned char byte;
  struct event *ev;
  uint32_t *word;
  uint32_t value;
  unsigned flags;
  struct op *next;
};
struct stream {
  int magic;
  int capturing;
  int n;  // launches captured
  struct captured *launches;
  pthread_mutex_t m;
  pthread_cond_t cv;
  struct op *head, *tail;
  int busy, stop, started;
  pthread_t worker;
  int device;  // of the context that created it
};
#define STREAM_MAGIC 0x5354524d
static struct stream *streams[256];

static int legacy(CUstream s) {
  return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}
static CUresult check_stream(CUstream s) {
  if (legacy(s)) return CUDA_SUCCESS;
  return ((struct stream *)s)->magic == STREAM_MAGIC ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

// Runs a launch: one process per block, then waits for all of them.
static void run_launch(struct captured *c) {
  // The context failed: later work does not run. (The worker has no current context:
  // the failure is read directly.)
  if (__atomic_load_n(&sticky, __ATOMIC_ACQUIRE)) return;
  const void *state = NULL;
  size_t state_bytes = 0;
  for (int i = 0; i < c->f->mod->nglobals; ++i)
    if (!strcmp(c->f->mod->globals[i].name, "rshmemi_device_state")) {
      state = c->f->mod->globals[i].at;
      state_bytes = c->f->mod->globals[i].size;
    }
  void *params[32];
  for (int k = 0; k < c->f->nparams && k < 32; ++k) params[k] = c->params[k];
  pid_t *kids = calloc(c->grid, sizeof *kids);
  int *pidfds = calloc(c->grid, sizeof *pidfds);
  struct pollfd *pfds = calloc(c->grid, sizeof *pfds);
  fflush(NULL);
  unsigned started = 0;
  const pid_t parent = getpid();
  for (; started < c->grid; ++started) {
    const pid_t pid = fork();
    if (pid < 0) {
      // The blocks started would wait for this one at their grid barriers until the
      // bound: they are killed (below) and the launch fails now.
      fprintf(stderr, "hostcuda: fork for block %u of %s failed: %s\n", started, c->f->name,
              strerror(errno));
      for (unsigned b = 0; b < started; ++b) kill(kids[b], SIGKILL);
      fail_ctx(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
      break;
    }
    if (pid == 0) {
      // A block does not outlive the process that launched it (a PE killed by its test
      // would otherwise leave its blocks polling until their bound, on the same cores).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      c->run(c->f->name, params, c->f->sizes, c->f->nparams, c->grid, c->block, started, state,
             state_bytes);
      fflush(NULL);
      _exit(0);
    }
    kids[started] = pid;
    // A pidfd per block: the wait below sleeps until one ends instead of polling (with 8
    // PEs' streams polling every 100 µs, the waits took a share of CI's 2 cores from the
    // blocks). Where pidfd_open is missing, the wait polls.
    // At most 256 (a 132-SM grid of PE threads would otherwise take the fd table's
    // 1024), and none after one failed: that launch polls.
    pidfds[started] = started < 256 && (started == 0 || pidfds[started - 1] >= 0)
                          ? (int)syscall(SYS_pidfd_open, pid, 0)
                          : -1;
  }
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  unsigned left = started;
  int killed = 0;
  while (left > 0) {
    for (unsigned b = 0; b < started; ++b) {
      int status = 0;
      if (kids[b] == 0) continue;
      const pid_t w = waitpid(kids[b], &status, WNOHANG);
      if (w == -1 && errno == ECHILD) {  // reaped elsewhere: it ended, status unknown
        kids[b] = 0;
        --left;
        continue;
      }
      if (w != kids[b]) continue;
      kids[b] = 0;
      --left;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      if (WIFSIGNALED(status))
        fprintf(stderr, "hostcuda: block %u of %s ended by signal %d: the launch failed\n", b,
                c->f->name, WTERMSIG(status));
      else
        fprintf(stderr, "hostcuda: block %u of %s exited %d: the launch failed\n", b, c->f->name,
                WEXITSTATUS(status));
      fail_ctx(CUDA_ERROR_LAUNCH_FAILED);
    }
    if (left && !killed && since(&t0) > limit_s()) {
      fprintf(stderr, "hostcuda: %s still ran after %.0f s: its blocks are killed\n", c->f->name,
              limit_s());
      for (unsigned b = 0; b < started; ++b)
        if (kids[b]) kill(kids[b], SIGKILL);
      killed = 1;
      fail_ctx(CUDA_ERROR_LAUNCH_TIMEOUT);
    }
    if (!left) break;
    // Sleep until a live block ends (its pidfd turns readable), at most 100 ms so that the
    // bound above is checked; poll every 100 µs where some block has no pidfd.
    nfds_t n = 0;
    int all = 1;
    for (unsigned b = 0; b < started; ++b)
      if (kids[b]) {
        if (pidfds[b] < 0) all = 0;
        pfds[n++] = (struct pollfd){.fd = pidfds[b], .events = POLLIN};
      }
    if (!all || (poll(pfds, n, 100) < 0 && errno != EINTR)) usleep(100);
  }
  for (unsigned b = 0; b < started; ++b)
    if (pidfds[b] >= 0) close(pidfds[b]);
  free(pfds);
  free(pidfds);
  free(kids);
}

static int wait32_met(uint32_t have, uint32_t want, unsigned flags) {
  switch (flags & 3) {
    case CU_STREAM_WAIT_VALUE_GEQ: return (int32_t)(have - want) >= 0;  // cyclic, as CUDA
    case CU_STREAM_WAIT_VALUE_EQ: return have == want;
    case CU_STREAM_WAIT_VALUE_AND: return (have & want) != 0;
    default: return ~(have | ~want) != 0;  // NOR
  }
}

static void run_op(struct op *o) {
  switch (o->kind) {
    case OP_LAUNCH: run_launch(&o->launch); break;
    case OP_COPY: memmove(o->dst, o->src, o->len); break;
    case OP_SET: memset(o->dst, o->byte, o->len); break;
    case OP_EVENT: {
      pthread_mutex_lock(&ev_lock);
      clock_gettime(CLOCK_MONOTONIC, &o->ev->at);
      __atomic_store_n(&o->ev->recorded, 1, __ATOMIC_RELEASE);
      const int release = --o->ev->pending == 0 && o->ev->destroyed;
      pthread_mutex_unlock(&ev_lock);
      if (release) free(o->ev);
      break;
    }
    case OP_WAIT32: {
      struct timespec t0;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      while (!wait32_met(__atomic_load_n(o->word, __ATOMIC_ACQUIRE), o->value, o->flags)) {
        if (since(&t0) > limit_s()) {
          fprintf(stderr, "hostcuda: a stream waited %.0f s for %#x at %p: given up\n", limit_s(),
                  o->value, (void *)o->word);
          fail_ctx(CUDA_ERROR_LAUNCH_TIMEOUT);
          break;
        }
        usleep(20);
      }
      break;
    }
    case OP_WRITE32: __atomic_store_n(o->word, o->value, __ATOMIC_RELEASE); break;
  }
}

static void *worker(void *arg) {
  struct stream *st = arg;
  pthread_mutex_lock(&st->m);
  for (;;) {
    while (!st->head && !st->stop) pthread_cond_wait(&st->cv, &st->m);
    if (!st->head) break;  // stopped and empty
    struct op *o = st->head;
    st->busy = 1;
    pthread_mutex_unlock(&st->m);
    run_op(o);
    pthread_mutex_lock(&st->m);
    st->head = o->next;
    if (!st->head) st->tail = NULL;
    st->busy = 0;
    pthread_cond_broadcast(&st->cv);
    free(o);
  }
  pthread_mutex_unlock(&st->m);
  return NULL;
}

// Runs `o` on stream `s`: at once on the legacy stream, else after the stream's earlier
// operations, on its worker.
static CUresult enqueue(CUstream s, struct op *o) {
  if (legacy(s)) {
    run_op(o);
    free(o);
    return need_ctx();
  }
  struct stream *st = (struct stream *)s;
  pthread_mutex_lock(&st->m);
  if (!st->started) {
    if (pthread_create(&st->worker, NULL, worker, st)) {
      pthread_mutex_unlock(&st->m);
      free(o);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    st->started = 1;
  }
  o->next = NULL;
  if (st->tail)
    st->tail->next = o;
  else
    st->head = o;
  st->tail = o;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->m);
  return CUDA_SUCCESS;
}

// Waits until stream `s` ran everything enqueued (bounded: each operation is).
static CUresult stream_sync(struct stream *st) {
  pthread_mutex_lock(&st->m);
  while (st->head || st->busy) pthread_cond_wait(&st->cv, &st->m);
  pthread_mutex_unlock(&st->m);
  return need_ctx();
}

static CUresult sync_all_streams(void) {
  struct stream *all[256];
  int n = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 256; ++i)
    if (streams[i]) all[n++] = streams[i];
  pthread_mutex_unlock(&lock);
  for (int i = 0; i < n; ++i) stream_sync(all[i]);
  return need_ctx();
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
  CUresult r = need_ctx();
  if (r) return r;
  if (flags & ~1u) return CUDA_ERROR_INVALID_VALUE;
  struct stream *p = calloc(1, sizeof *p);
  p->magic = STREAM_MAGIC;
  p->device = ((struct ctx *)current)->device;
  pthread_mutex_init(&p->m, NULL);
  pthread_cond_init(&p->cv, NULL);
  pthread_mutex_lock(&lock);
  int slot = -1;
  for (int i = 0; i < 256 && slot < 0; ++i)
    if (!streams[i]) slot = i;
  if (slot >= 0) streams[slot] = p;
  pthread_mutex_unlock(&lock);
  if (slot < 0) {
    free(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *s = (CUstream)p;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy(CUstream s) {
  if (legacy(s) || check_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  struct stream *st = (struct stream *)s;
  stream_sync(st);
  pthread_mutex_lock(&st->m);
  st->stop = 1;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->m);
  if (st->started) pthread_join(st->worker, NULL);
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 256; ++i)
    if (streams[i] == st) streams[i] = NULL;
  pthread_mutex_unlock(&lock);
  // The struct is left allocated (idle, magic cleared): another thread's
  // sync_all_streams may have taken it in its snapshot and be about to lock its mutex.
  // (Freeing it was a use after free when PEs finalised together.) Small, and test code.
  pthread_mutex_lock(&st->m);
  st->magic = 0;
  free(st->launches);
  st->launches = NULL;
  st->n = 0;
  pthread_mutex_unlock(&st->m);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamQuery(CUstream s) {
  CUresult r = check_stream(s);
  if (r) return r;
  if (!legacy(s)) {
    struct stream *st = (struct stream *)s;
    pthread_mutex_lock(&st->m);
    const int idle = !st->head && !st->busy;
    pthread_mutex_unlock(&st->m);
    if (!idle) return CUDA_ERROR_NOT_READY;
  }
  return need_ctx();
}
EXPORT CUresult cuStreamSynchronize(CUstream s) {
  CUresult r = check_stream(s);
  if (r) return r;
  return legacy(s) ? need_ctx() : stream_sync((struct stream *)s);
}

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags) {
  (void)flags;
  CUresult r = need_ctx();
  if (r) return r;
  *e = (CUevent)calloc(1, sizeof(struct event));
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  CUresult r = need_ctx();
  if (r || (r = check_stream(s))) return r;
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  struct event *ev = (struct event *)e;
  pthread_mutex_lock(&ev_lock);
  __atomic_store_n(&ev->recorded, 0, __ATOMIC_RELEASE);
  ev->pending++;
  pthread_mutex_unlock(&ev_lock);
  struct op *o = calloc(1, sizeof *o);
  o->kind = OP_EVENT;
  o->ev = ev;
  CUresult q = enqueue(s, o);
  if (q) {
    pthread_mutex_lock(&ev_lock);
    ev->pending--;
    pthread_mutex_unlock(&ev_lock);
  }
  return q;
}
EXPORT CUresult cuEventQuery(CUevent e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  return __atomic_load_n(&((struct event *)e)->recorded, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS
                                                                            : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
  struct event *x = (struct event *)a, *y = (struct event *)b;
  if (!x || !y) return CUDA_ERROR_INVALID_HANDLE;
  if (!__atomic_load_n(&x->recorded, __ATOMIC_ACQUIRE) ||
      !__atomic_load_n(&y->recorded, __ATOMIC_ACQUIRE))
    return CUDA_ERROR_NOT_READY;
  *ms = (float)((y->at.tv_sec - x->at.tv_sec) * 1e3 + (y->at.tv_nsec - x->at.tv_nsec) / 1e6);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy(CUevent e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  struct event *ev = (struct event *)e;
  pthread_mutex_lock(&ev_lock);
  ev->destroyed = 1;
  const int release = ev->pending == 0;
  pthread_mutex_unlock(&ev_lock);
  if (release) free(ev);
  return CUDA_SUCCESS;
}

// Stream-ordered copies and sets; both ranges checked when enqueued.
static CUresult enqueue_copy(CUstream s, void *dst, const void *src, size_t len, int set,
                             unsigned char byte) {
  CUresult r = need_ctx();
  if (r || (r = check_stream(s))) return r;
  pthread_mutex_lock(&lock);
  const int ok = device_accessible((uintptr_t)dst, len) && (set || device_accessible((uintptr_t)src, len));
  pthread_mutex_unlock(&lock);
  if (!ok) {
    fprintf(stderr, "hostcuda: stream %s of %zu bytes at %p outside device memory\n",
            set ? "memset" : "copy", len, dst);
    return CUDA_ERROR_INVALID_VALUE;
  }
  struct op *o = calloc(1, sizeof *o);
  o->kind = set ? OP_SET : OP_COPY;
  o->dst = dst;
  o->src = src;
  o->len = len;
  o->byte = byte;
  return enqueue(s, o);
}

static CUresult launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned smem, CUstream s, void **p) {
  CUresult r = need_ctx();
  if (r || (r = check_stream(s))) return r;
  struct function *f = (struct function *)fn;
  if (!f || !p) return CUDA_ERROR_INVALID_VALUE;
  if (gy != 1 || gz != 1 || by != 1 || bz != 1 || smem != 0 || gx == 0 || bx == 0 || bx > 1024)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  if (nklibs < 0) load_kernel_libs();
  run_fn run = NULL;
  for (int i = 0; i < nklibs && !run; ++i)
    if (klibs[i].has(f->name)) run = klibs[i].run;
  pthread_mutex_unlock(&lock);
  if (!run) {
    fprintf(stderr, "hostcuda: launch of %s refused: no kernel library has it\n", f->name);
    fprintf(stderr, "hostcuda: a kernel launch is not emulated on the CPU\n");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  struct captured c = {f, run, gx, bx, {{0}}};
  for (int i = 0; i < f->nparams && i < 32; ++i) {
    if (f->sizes[i] > sizeof c.params[i]) return CUDA_ERROR_NOT_SUPPORTED;
    memcpy(c.params[i], p[i], f->sizes[i]);
  }
  struct stream *st = (struct stream *)s;
  if (!legacy(s) && st->capturing) {
    // Stream capture: the launch is recorded with its parameters' values, not run.
    st->launches = realloc(st->launches, sizeof *st->launches * (size_t)(st->n + 1));
    st->launches[st->n++] = c;
    return CUDA_SUCCESS;
  }
  struct op *o = calloc(1, sizeof *o);
  o->kind = OP_LAUNCH;
  o->launch = c;
  return enqueue(s, o);
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned smem, CUstream s, void **p,
                               void **e) {
  if (e) return CUDA_ERROR_INVALID_VALUE;  // "extra" launch options are not modelled
  return launch(f, gx, gy, gz, bx, by, bz, smem, s, p);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                          CUstream s, void **p) {
  return launch(f, gx, gy, gz, bx, by, bz, smem, s, p);
}

// 32-bit stream memory operations on device-accessible words.
static CUresult enqueue_value(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned f, int wait) {
  CUresult r = need_ctx();
  if (r || (r = check_stream(s))) return r;
  if (a % 4) return CUDA_ERROR_INVALID_VALUE;
  // cuMemAlloc memory belongs to its device: another device's stream cannot address it
  // (rshmem never enables peer access; its heaps are VMM mappings with access granted).
  const int dev = legacy(s) ? ((struct ctx *)current)->device : ((struct stream *)s)->device;
  pthread_mutex_lock(&lock);
  const int ok = device_accessible((uintptr_t)a, 4);
  const struct range *g = find_range(R_ALLOC, (uintptr_t)a);
  if (!g) g = find_range(R_HOSTALLOC, (uintptr_t)a);
  if (!g) g = find_range(R_REGISTERED, (uintptr_t)a);
  const int owner = g ? g->device : -1;
  pthread_mutex_unlock(&lock);
  if (!ok) return CUDA_ERROR_INVALID_VALUE;
  if (owner >= 0 && owner != dev) {
    fprintf(stderr,
            "hostcuda: stream memory operation of GPU %d on %#llx, memory of GPU %d (cuMemAlloc "
            "without peer access, or pinned host memory without PORTABLE)\n",
            dev, (unsigned long long)a, owner);
    return CUDA_ERROR_INVALID_VALUE;
  }
  struct op *o = calloc(1, sizeof *o);
  o->kind = wait ? OP_WAIT32 : OP_WRITE32;
  o->word = (uint32_t *)(uintptr_t)a;
  o->value = v;
  o->flags = f;
  return enqueue(s, o);
}
EXPORT CUresult cuStreamWaitValue32(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) {
  if (f & ~3u) return CUDA_ERROR_INVALID_VALUE;  // CU_STREAM_WAIT_VALUE_FLUSH: not modelled
  return enqueue_value(s, a, v, f, 1);
}
EXPORT CUresult cuStreamWriteValue32(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) {
  if (f != 0) return CUDA_ERROR_INVALID_VALUE;
  return enqueue_value(s, a, v, f, 0);
}

// Graphs: a captured stream's kernel launches, replayed in order on a stream. (Other
// stream work during a capture is not modelled.)
struct graph {
  int n;
  struct captured *launches;
};
EXPORT CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode m) {
  (void)m;
  CUresult r = need_ctx();
  if (r) return r;
  struct stream *st = (struct stream *)s;
  if (!st || check_stream(s) || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
    return CUDA_ERROR_INVALID_VALUE;  // the legacy stream cannot be captured
  if (st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  st->capturing = 1;
  st->n = 0;
  st->launches = NULL;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
  struct stream *st = (struct stream *)s;
  if (!st || check_stream(s) || !st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  struct graph *gr = malloc(sizeof *gr);
  gr->n = st->n;
  gr->launches = st->launches;
  st->capturing = 0;
  st->n = 0;
  st->launches = NULL;
  *g = (CUgraph)gr;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long f) {
  if (!g || f) return CUDA_ERROR_INVALID_VALUE;
  const struct graph *src = (const struct graph *)g;
  struct graph *x = malloc(sizeof *x);
  x->n = src->n;
  x->launches = malloc(sizeof *x->launches * (size_t)(src->n ? src->n : 1));
  memcpy(x->launches, src->launches, sizeof *x->launches * (size_t)src->n);
  *e = (CUgraphExec)x;
  return CUDA_SUCCESS;
}
// Nothing to upload on the CPU; the real driver queues the upload on the stream.
EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s) {
  (void)s;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  const struct graph *x = (const struct graph *)e;
  if (!x) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < x->n; ++i) {
    struct captured *c = &x->launches[i];
    void *params[32];
    for (int k = 0; k < c->f->nparams && k < 32; ++k) params[k] = c->params[k];
    CUresult r = launch((CUfunction)c->f, c->grid, 1, 1, c->block, 1, 1, 0, s, params);
    if (r) return r;
  }
  return CUDA_SUCCESS;
}
static void graph_free(struct graph *g) {
  free(g->launches);
  free(g);
}
EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  graph_free((struct graph *)e);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphDestroy(CUgraph g) {
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  graph_free((struct graph *)g);
  return CUDA_SUCCESS;
}
