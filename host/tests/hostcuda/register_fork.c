// register_fork.c — checks hostcuda's host registration against what a real driver does
// to the memory (host/tests/gpu_host_layer.rs builds and runs it): while registered, a
// page-aligned malloc'd buffer is the same memory for the host and the kernels (hostcuda
// runs each block in a forked process, so it maps the buffer shared); after
// cuMemHostUnregister it is the program's private memory again, contents kept. A page
// left shared was reused by malloc once freed and the block processes' mallocs corrupted
// the parent's heap (CI, 2026-12-06). Prints one line per failed check; exits non-zero on
// any.
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;
#define CHECK(cond, ...)             \
  do {                               \
    if (!(cond)) {                   \
      fprintf(stderr, __VA_ARGS__);  \
      fputc('\n', stderr);           \
      ++failures;                    \
    }                                \
  } while (0)

// 's' or 'p' for the mapping holding p, '?' if none.
static char sharing(const void *p) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512], perms[8], out = '?';
  unsigned long lo, hi;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && (unsigned long)p >= lo &&
        (unsigned long)p < hi)
      out = perms[3];
  if (f) fclose(f);
  return out;
}

// A forked child stores v into *p; returns once it has exited 0.
static void child_stores(volatile unsigned char *p, unsigned char v) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    *p = v;
    _exit(0);
  }
  int st = 0;
  CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
        "the forked child did not exit 0");
}

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "no context\n");
    return 2;
  }
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  // Small and page-aligned: malloc takes it from the brk heap, between its own chunks.
  unsigned char *buf = aligned_alloc(page, page);
  if (!buf) return 2;
  memset(buf, 7, page);
  CHECK(sharing(buf) == 'p', "before registration the buffer is %c, expected private",
        sharing(buf));

  CUresult r = cuMemHostRegister(buf, page, 0);
  CHECK(r == CUDA_SUCCESS, "cuMemHostRegister returned %d", (int)r);
  CHECK(buf[1] == 7, "registration changed the contents: byte 1 is %d, expected 7", buf[1]);
  r = cuMemHostRegister(buf, page, 0);
  CHECK(r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "a second registration returned %d",
        (int)r);
  child_stores(buf, 9);
  CHECK(buf[0] == 9, "registered: a block process's store is not seen (byte 0 is %d, expected 9)",
        buf[0]);

  r = cuMemHostUnregister(buf);
  CHECK(r == CUDA_SUCCESS, "cuMemHostUnregister returned %d", (int)r);
  CHECK(sharing(buf) == 'p', "after unregistration the buffer is %c, expected private",
        sharing(buf));
  CHECK(buf[0] == 9 && buf[1] == 7,
        "unregistration changed the contents: bytes 0, 1 are %d, %d, expected 9, 7", buf[0],
        buf[1]);
  child_stores(buf, 11);
  CHECK(buf[0] == 9, "unregistered: a child's store reached the parent (byte 0 is %d, expected 9)",
        buf[0]);
  r = cuMemHostUnregister(buf);
  CHECK(r == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "a second unregistration returned %d",
        (int)r);

  // Registered again (the program may), then freed after unregistration: malloc's reuse
  // of the page stays private.
  CHECK(cuMemHostRegister(buf, page, 0) == CUDA_SUCCESS, "registering again failed");
  CHECK(cuMemHostUnregister(buf) == CUDA_SUCCESS, "unregistering again failed");
  free(buf);
  unsigned char *again = aligned_alloc(page, page);
  if (again) {
    CHECK(sharing(again) == 'p', "malloc's next page is %c, expected private", sharing(again));
    free(again);
  }
  // The driver refuses a range overlapping a registered one; hostcuda refuses a private
  // range it cannot share whole (the real driver would pin it; here the blocks would see
  // a copy).
  unsigned char *two = aligned_alloc(page, 2 * page);
  if (two) {
    CHECK(cuMemHostRegister(two, page, 0) == CUDA_SUCCESS, "registering page 0 failed");
    r = cuMemHostRegister(two + page - 8, 16, 0);
    CHECK(r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
          "a range overlapping a registered one returned %d", (int)r);
    r = cuMemHostRegister(two + page + 8, 8, 0);
    CHECK(r == CUDA_ERROR_NOT_SUPPORTED, "an unaligned private range returned %d", (int)r);
    CHECK(sharing(two + page) == 'p', "the refused range's page is %c, expected private",
          sharing(two + page));
    CHECK(cuMemHostUnregister(two) == CUDA_SUCCESS, "unregistering page 0 failed");
    free(two);
  }
  if (!failures) puts("register_fork: ok");
  return failures ? 1 : 0;
}
