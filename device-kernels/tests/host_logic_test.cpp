// host_logic_test.cpp — host C++ tests of the device API's pure logic (no GPU).
//
// Owns: checks of rshmem/device/layout.cuh (heap bounds, symmetric-address translation,
// comparison predicate, sync-scratch layout) and rshmem/device/copy.cuh (the cooperative
// copy, emulating thread/warp/block participants sequentially) compiled with g++.
// Run by scripts/check-device-code; exits non-zero on the first failure, naming it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "rshmem/pattern.cuh"
#include "rshmem/rshmem.cuh"

static int g_checks = 0;

#define CHECK(cond)                                                             \
  do {                                                                          \
    ++g_checks;                                                                 \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "host_logic_test: %s:%d: CHECK(%s) failed\n", __FILE__, \
                   __LINE__, #cond);                                            \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

static void test_range() {
  const uint64_t base = 0x7f0000000000ull, size = 1ull << 30;
  CHECK(rshmemi_range_in_heap(base, size, base, 0));
  CHECK(rshmemi_range_in_heap(base, size, base, size));
  CHECK(!rshmemi_range_in_heap(base, size, base, size + 1));
  CHECK(rshmemi_range_in_heap(base, size, base + size - 8, 8));
  CHECK(!rshmemi_range_in_heap(base, size, base + size - 4, 8));  // the trap_out_of_heap case
  CHECK(rshmemi_range_in_heap(base, size, base + size, 0));        // empty range at the end
  CHECK(!rshmemi_range_in_heap(base, size, base + size, 1));
  CHECK(!rshmemi_range_in_heap(base, size, base + size + 1, 0));
  CHECK(!rshmemi_range_in_heap(base, size, base - 1, 1));
  CHECK(!rshmemi_range_in_heap(base, size, base - 1, 2));  // straddles the start
  CHECK(!rshmemi_range_in_heap(base, size, 0, 0));
  // Lengths that would wrap the address space must not pass.
  CHECK(!rshmemi_range_in_heap(base, size, base + 16, UINT64_MAX));
  CHECK(!rshmemi_range_in_heap(base, size, base + 16, UINT64_MAX - 15));
  CHECK(!rshmemi_range_in_heap(UINT64_MAX - 100, 50, UINT64_MAX - 60, 100));
  CHECK(rshmemi_range_in_heap(UINT64_MAX - 100, 100, UINT64_MAX - 60, 60));
  // Unbound state (all zero): nothing is inside.
  CHECK(!rshmemi_range_in_heap(0, 0, base, 8));
}

static void test_translate() {
  CHECK(rshmemi_translate(0x1000, 0x9000, 0x1000) == 0x9000);
  CHECK(rshmemi_translate(0x1000, 0x9000, 0x1234) == 0x9234);
  CHECK(rshmemi_translate(0x9000, 0x1000, 0x9234) == 0x1234);  // peer below us
  CHECK(rshmemi_translate(0x5000, 0x5000, 0x5678) == 0x5678);  // self
}

template <typename T>
static void test_cmp_type(T lo, T hi) {
  const int ops[] = {RSHMEM_CMP_EQ, RSHMEM_CMP_NE, RSHMEM_CMP_GT,
                     RSHMEM_CMP_GE, RSHMEM_CMP_LT, RSHMEM_CMP_LE};
  // expected[op] for (lo, hi), (hi, lo), (lo, lo)
  const bool lh[] = {false, true, false, false, true, true};
  const bool hl[] = {false, true, true, true, false, false};
  const bool ll[] = {true, false, false, true, false, true};
  for (int i = 0; i < 6; ++i) {
    CHECK(rshmemi_cmp_holds<T>(lo, ops[i], hi) == lh[i]);
    CHECK(rshmemi_cmp_holds<T>(hi, ops[i], lo) == hl[i]);
    CHECK(rshmemi_cmp_holds<T>(lo, ops[i], lo) == ll[i]);
  }
  CHECK(!rshmemi_cmp_holds<T>(lo, 6, lo));
  CHECK(!rshmemi_cmp_holds<T>(lo, -1, lo));
}

static void test_cmp() {
  test_cmp_type<int32_t>(-5, 3);  // signed: -5 < 3
  test_cmp_type<uint32_t>(3, 0xfffffffbu);
  test_cmp_type<int64_t>(INT64_MIN, INT64_MAX);
  test_cmp_type<uint64_t>(0, UINT64_MAX);
  CHECK(rshmemi_cmp_valid(RSHMEM_CMP_EQ) && rshmemi_cmp_valid(RSHMEM_CMP_LE));
  CHECK(!rshmemi_cmp_valid(6) && !rshmemi_cmp_valid(-1) && !rshmemi_cmp_valid(17));
}

static void test_sync_layout() {
  CHECK(rshmemi_sync_max_pes(32768) == 2944);
  CHECK(rshmemi_sync_max_pes(9216) == 0);
  CHECK(rshmemi_sync_max_pes(0) == 0);
  CHECK(rshmemi_sync_arrival_offset(0) == 9216);
  CHECK(rshmemi_sync_arrival_offset(2943) + 8 == 32768);
  // Team areas: after the error claim, before the arrival array, one per host team slot,
  // each holding the entry, the epoch and RSHMEM_TEAM_MAX_ROUNDS round words.
  CHECK(RSHMEMI_SYNC_ERROR_CLAIM + 4 <= rshmemi_team_area_offset(0));
  CHECK(rshmemi_team_area_offset(1) == 1024 + 128);
  CHECK(rshmemi_team_area_offset(RSHMEM_TEAM_SLOTS - 1) + RSHMEMI_TEAM_AREA_BYTES == RSHMEMI_SYNC_ARRIVAL);
  CHECK(sizeof(rshmem_team_entry_t) <= RSHMEMI_TEAM_EPOCH);
  CHECK(RSHMEMI_TEAM_EPOCH + 8 <= RSHMEMI_TEAM_ROUND);
  CHECK(RSHMEMI_TEAM_ROUND + 8 * RSHMEM_TEAM_MAX_ROUNDS == RSHMEMI_TEAM_AREA_BYTES);
  // Strided membership.
  CHECK(rshmemi_team_world_pe(1, 2, 3) == 7);
  CHECK(rshmemi_team_index_of(1, 2, 4, 7) == 3 && rshmemi_team_index_of(1, 2, 3, 7) == -1);
  CHECK(rshmemi_team_index_of(1, 2, 4, 4) == -1 && rshmemi_team_index_of(1, 2, 4, 0) == -1);
  CHECK(rshmemi_team_index_of(0, 1, 5, 4) == 4 && rshmemi_team_index_of(0, 0, 5, 0) == -1);
  for (int size = 1; size <= 4096; ++size) {
    const uint32_t r = rshmemi_team_rounds(size);
    CHECK(r <= RSHMEM_TEAM_MAX_ROUNDS);
    CHECK((1ll << r) >= size && (r == 0 || (1ll << (r - 1)) < size));
  }
  CHECK(rshmemi_team_rounds(4097) == RSHMEM_TEAM_MAX_ROUNDS + 1);
  // The grid words, the epoch and the arrival array do not overlap.
  CHECK(RSHMEMI_SYNC_GRID_GEN + 4 <= RSHMEMI_SYNC_PE_EPOCH);
  CHECK(RSHMEMI_SYNC_PE_EPOCH + 8 <= RSHMEMI_SYNC_ERROR_CLAIM);
  CHECK(RSHMEMI_SYNC_ERROR_CLAIM + 4 <= RSHMEMI_SYNC_ARRIVAL);
  CHECK(rshmemi_effective_timeout(0) == RSHMEMI_DEFAULT_TIMEOUT_NS);
  CHECK(rshmemi_effective_timeout(5) == 5);
  // Contract values the Rust side relies on.
  CHECK(sizeof(rshmem_device_state_t) == 128 && sizeof(rshmem_peer_t) == 32);
  CHECK(RSHMEM_CMP_EQ == 0 && RSHMEM_CMP_LE == 5 && RSHMEM_SIGNAL_SET == 0 && RSHMEM_SIGNAL_ADD == 1);
}

static void test_copy_plan() {
  for (uint64_t d = 0; d < 32; ++d)
    for (uint64_t s = 0; s < 32; ++s)
      for (uint64_t n : {0ull, 1ull, 5ull, 15ull, 16ull, 17ull, 100ull, 4097ull}) {
        const rshmemi_copy_plan_t p = rshmemi_copy_plan(0x1000 + d, 0x8000 + s, n);
        CHECK(p.head + p.count * p.width + p.tail == n);
        CHECK(((0x1000 + d) ^ (0x8000 + s)) % p.width == 0);
        if (p.width > 1 && p.count > 0) CHECK((0x1000 + d + p.head) % p.width == 0);
        if (p.width > 1) CHECK(p.tail < p.width);
        if (p.width > 1 && p.head < n) CHECK(p.head < p.width);
      }
  CHECK(rshmemi_copy_plan(0, 16, 64).width == 16);
  CHECK(rshmemi_copy_plan(0, 8, 64).width == 8);
  CHECK(rshmemi_copy_plan(0, 4, 64).width == 4);
  CHECK(rshmemi_copy_plan(0, 2, 64).width == 1);
}

// Emulates `stride` participants (a warp = 32, a block = blockDim) calling rshmemi_copy
// one after another; every destination byte must equal the source, the guards untouched.
static void test_copy() {
  std::vector<unsigned char> src(8192 + 64), dst(8192 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(rshmem_pattern_u64(7, i));
  const uint64_t sizes[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 200, 1000, 4097};
  const uint64_t strides[] = {1, 3, 32, 256};
  // Base addresses 64-aligned so that the offsets below are the misalignment classes.
  unsigned char *sb = reinterpret_cast<unsigned char *>((reinterpret_cast<uintptr_t>(src.data()) + 63) & ~uintptr_t(63));
  unsigned char *db = reinterpret_cast<unsigned char *>((reinterpret_cast<uintptr_t>(dst.data()) + 63) & ~uintptr_t(63));
  for (uint64_t so = 0; so < 16; ++so)
    for (uint64_t dof = 0; dof < 16; ++dof)
      for (uint64_t n : sizes)
        for (uint64_t stride : strides) {
          if (dof + n + 1 > 8192) continue;
          std::memset(db, 0, 8192);
          for (uint64_t first = 0; first < stride; ++first) {
            if (stride & 1)
              rshmemi_copy<true>(db + 1 + dof, sb + so, n, first, stride);  // the get flavour
            else
              rshmemi_copy(db + 1 + dof, sb + so, n, first, stride);
          }
          bool ok = db[dof] == 0 && db[1 + dof + n] == 0;
          for (uint64_t k = 0; k < n && ok; ++k) ok = db[1 + dof + k] == sb[so + k];
          if (!ok)
            std::fprintf(stderr, "copy mismatch: src off %llu, dst off %llu, n %llu, stride %llu\n",
                         (unsigned long long)so, (unsigned long long)(1 + dof), (unsigned long long)n,
                         (unsigned long long)stride);
          CHECK(ok);
        }
}

int main() {
  test_range();
  test_translate();
  test_cmp();
  test_sync_layout();
  test_copy_plan();
  test_copy();
  std::printf("host_logic_test: %d checks passed\n", g_checks);
  return 0;
}
