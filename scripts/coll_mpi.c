/* The Open MPI side of scripts/bench-coll-vs-mpi: MPI_Bcast (root 0), MPI_Allgather,
 * MPI_Alltoall and MPI_Allreduce (u64 sum) measured exactly as `rshmem bench
 * broadcast|fcollect|alltoall|reduce` measures its collectives (host/src/bench.rs):
 * sizes doubling from MIN to MAX bytes per block (multiples of 8), at most 32 MiB of blocks
 * per rank; per size min(WARMUP, n) warm-up calls and n = min(ITERS, max(256 MiB / bytes
 * received per call, 20)) measured calls in batches (16 calls up to 64 KiB, else 1), timed
 * on rank 0; median (mean of the middle two for an even count) and p99 (nearest rank) of
 * the batch means; algbw = bytes received per call / median. Every rank checks the last
 * call's result exactly with the same payload words as rshmem; a mismatch exits 1.
 * TIMING `slowest` (rshmem's --timing slowest, OSU's max column): an MPI_Barrier before
 * every call, one call per sample, and a call's time is the slowest rank's (MPI_Reduce
 * with MPI_MAX of every rank's times after the timed calls); `back-to-back` (default) is
 * the batches above.
 *
 * Usage: coll_mpi OP MIN MAX ITERS WARMUP [TIMING]   (OP: broadcast, fcollect, alltoall,
 * reduce; TIMING: back-to-back, slowest)
 * Prints one JSON object: {"bench": OP, "pes": N, "rows": [{"size", "latency_us_median",
 * "latency_us_p99", "bandwidth_gbps", "iters"}...]}.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_MAX (32u << 20)

static uint64_t word(size_t i, uint64_t tag) { return (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull ^ tag; }
static uint64_t tag_of(uint64_t salt, int p, int j) { return salt ^ ((uint64_t)p << 32) ^ ((uint64_t)j << 16); }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int me, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 6 && argc != 7) {
    if (me == 0) fprintf(stderr, "usage: coll_mpi OP MIN MAX ITERS WARMUP [back-to-back|slowest]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int slowest = argc == 7 && !strcmp(argv[6], "slowest");
  if (argc == 7 && !slowest && strcmp(argv[6], "back-to-back")) {
    if (me == 0) fprintf(stderr, "coll_mpi: TIMING is back-to-back or slowest, not %s\n", argv[6]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const char *op = argv[1];
  int kind = !strcmp(op, "broadcast") ? 0 : !strcmp(op, "fcollect") ? 1 : !strcmp(op, "alltoall") ? 2
             : !strcmp(op, "reduce")  ? 3
                                      : -1;
  if (kind < 0) {
    if (me == 0) fprintf(stderr, "coll_mpi: unknown OP %s\n", op);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  size_t min = strtoull(argv[2], 0, 0), max = strtoull(argv[3], 0, 0);
  size_t iters_arg = strtoull(argv[4], 0, 0), warmup_arg = strtoull(argv[5], 0, 0);
  size_t blocks = (kind == 1 || kind == 2) ? (size_t)n : 1;
  uint64_t *src = malloc(BUF_MAX), *dst = malloc(BUF_MAX);
  double *samples = malloc(sizeof(double) * (iters_arg + 16));
  double *slowest_of = malloc(sizeof(double) * (iters_arg + 16));
  if (!src || !dst || !samples || !slowest_of) MPI_Abort(MPI_COMM_WORLD, 3);
  if (me == 0) printf("{\"bench\": \"%s\", \"pes\": %d, \"rows\": [", op, n);
  int first = 1, si = 0;
  for (size_t size = (min + 7) / 8 * 8; size <= (max < 8 ? 8 : max); size *= 2, ++si) {
    if (size * blocks > BUF_MAX) break;
    const size_t w = size / 8, out = w * blocks;
    const uint64_t salt = (uint64_t)(si + 1) << 48;
    for (size_t j = 0; j < blocks; ++j)
      for (size_t i = 0; i < w; ++i) src[j * w + i] = word(i, tag_of(salt, me, kind == 2 ? (int)j : 0));
    /* Broadcast is in place in MPI: the root's buffer is the source. */
    if (kind == 0 && me == 0) memcpy(dst, src, size);
    size_t lat = (256u << 20) / (out * 8);
    if (lat < 20) lat = 20;
    const size_t iters = iters_arg < lat ? iters_arg : lat;
    const size_t warm = warmup_arg < iters ? warmup_arg : iters;
    const size_t batch = slowest ? 1 : size <= (64u << 10) ? 16 : 1;
    const size_t nb = (iters + batch - 1) / batch;
#define CALL()                                                                                \
  do {                                                                                        \
    if (kind == 0) MPI_Bcast(dst, (int)w, MPI_UINT64_T, 0, MPI_COMM_WORLD);                   \
    else if (kind == 1) MPI_Allgather(src, (int)w, MPI_UINT64_T, dst, (int)w, MPI_UINT64_T, MPI_COMM_WORLD); \
    else if (kind == 2) MPI_Alltoall(src, (int)w, MPI_UINT64_T, dst, (int)w, MPI_UINT64_T, MPI_COMM_WORLD); \
    else MPI_Allreduce(src, dst, (int)w, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);              \
  } while (0)
    MPI_Barrier(MPI_COMM_WORLD);
    for (size_t k = 0; k < warm; ++k) CALL();
    for (size_t b = 0; b < nb; ++b) {
      if (slowest) MPI_Barrier(MPI_COMM_WORLD);
      double t = MPI_Wtime();
      for (size_t k = 0; k < batch; ++k) CALL();
      samples[b] = (MPI_Wtime() - t) * 1e6 / (double)batch;
    }
    if (slowest) {
      MPI_Reduce(samples, slowest_of, (int)nb, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (me == 0) memcpy(samples, slowest_of, nb * sizeof(double));
    }
    /* Check the last call. */
    size_t bad = (size_t)-1;
    for (size_t j = 0; j < blocks && bad == (size_t)-1; ++j)
      for (size_t i = 0; i < w; ++i) {
        uint64_t want;
        if (kind == 0) want = word(i, tag_of(salt, 0, 0));
        else if (kind == 1) want = word(i, tag_of(salt, (int)j, 0));
        else if (kind == 2) want = word(i, tag_of(salt, (int)j, me));
        else {
          want = 0;
          for (int p = 0; p < n; ++p) want += word(i, tag_of(salt, p, 0));
        }
        if (dst[j * w + i] != want) {
          bad = j * w + i;
          break;
        }
      }
    if (bad != (size_t)-1) {
      fprintf(stderr, "coll_mpi: rank %d: %zu-byte %s: word %zu wrong\n", me, size, op, bad);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (me == 0) {
      qsort(samples, nb, sizeof(double), cmp_double);
      const double med = nb % 2 ? samples[nb / 2] : (samples[nb / 2 - 1] + samples[nb / 2]) / 2;
      size_t r = (size_t)((99 * nb + 99) / 100); /* ceil(0.99 n), 1-based */
      if (r < 1) r = 1;
      const double p99 = samples[r - 1];
      printf("%s{\"size\": %zu, \"latency_us_median\": %.3f, \"latency_us_p99\": %.3f, "
             "\"bandwidth_gbps\": %.4f, \"iters\": %zu}",
             first ? "" : ", ", size, med, p99, (double)(out * 8) / (med * 1e-6) / 1e9, iters);
      first = 0;
    }
  }
  if (me == 0) printf("]}\n");
  free(slowest_of);
  free(samples);
  free(dst);
  free(src);
  MPI_Finalize();
  return 0;
}
