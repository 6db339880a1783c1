/* Prints sizeof/offsetof of the structs in rshmem/state.cuh and rshmem/internal/harness.cuh
 * and the values of their constants, as "key value" lines, for host/tests/gpu_layouts.rs. */
#include <stddef.h>
#include <stdio.h>

#include "rshmem/internal/harness.cuh"
#include "rshmem/state.cuh"
#include "rshmem/types.cuh"

#define SZ(t) printf("sizeof.%s %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(t, f))
#define K(c) printf("%s %llu\n", #c, (unsigned long long)(c))

int main(void) {
  SZ(rshmem_team_entry_t);
  OFF(rshmem_team_entry_t, start);
  OFF(rshmem_team_entry_t, stride);
  OFF(rshmem_team_entry_t, size);
  OFF(rshmem_team_entry_t, my_pe);
  SZ(rshmem_peer_t);
  OFF(rshmem_peer_t, heap_base);
  OFF(rshmem_peer_t, transport);
  OFF(rshmem_peer_t, qp);
  OFF(rshmem_peer_t, raddr);
  OFF(rshmem_peer_t, rkey);
  OFF(rshmem_peer_t, flags);
  SZ(rshmem_device_error_t);
  OFF(rshmem_device_error_t, code);
  OFF(rshmem_device_error_t, pe);
  OFF(rshmem_device_error_t, addr);
  OFF(rshmem_device_error_t, expected);
  OFF(rshmem_device_error_t, observed);
  OFF(rshmem_device_error_t, cmp);
  OFF(rshmem_device_error_t, block);
  OFF(rshmem_device_error_t, thread);
  OFF(rshmem_device_error_t, reserved);
  SZ(rshmem_device_state_t);
  OFF(rshmem_device_state_t, magic);
  OFF(rshmem_device_state_t, version);
  OFF(rshmem_device_state_t, my_pe);
  OFF(rshmem_device_state_t, n_pes);
  OFF(rshmem_device_state_t, heap_base);
  OFF(rshmem_device_state_t, heap_size);
  OFF(rshmem_device_state_t, peers);
  OFF(rshmem_device_state_t, timeout_ns);
  OFF(rshmem_device_state_t, sync_offset);
  OFF(rshmem_device_state_t, sync_bytes);
  OFF(rshmem_device_state_t, error);
  OFF(rshmem_device_state_t, ibgda);
  OFF(rshmem_device_state_t, flags);
  OFF(rshmem_device_state_t, lkey);
  OFF(rshmem_device_state_t, reserved);
  SZ(rshmem_harness_args_t);
  OFF(rshmem_harness_args_t, scratch);
  OFF(rshmem_harness_args_t, scratch_bytes);
  OFF(rshmem_harness_args_t, result);
  OFF(rshmem_harness_args_t, param0);
  OFF(rshmem_harness_args_t, param1);
  OFF(rshmem_harness_args_t, param2);
  OFF(rshmem_harness_args_t, seed);
  OFF(rshmem_harness_args_t, team);
  SZ(rshmem_test_result_t);
  OFF(rshmem_test_result_t, checks);
  OFF(rshmem_test_result_t, failures);
  OFF(rshmem_test_result_t, first_index);
  OFF(rshmem_test_result_t, expected);
  OFF(rshmem_test_result_t, observed);
  OFF(rshmem_test_result_t, reserved);
  SZ(rshmem_bench_record_t);
  OFF(rshmem_bench_record_t, start_ns);
  OFF(rshmem_bench_record_t, end_ns);
  OFF(rshmem_bench_record_t, iters);
  OFF(rshmem_bench_record_t, bytes);
  OFF(rshmem_bench_record_t, checksum);
  OFF(rshmem_bench_record_t, reserved);
  K(RSHMEM_STATE_MAGIC);
  K(RSHMEM_STATE_VERSION);
  K(RSHMEM_STATE_CHECKS);
  K(RSHMEM_STATE_SELF_IBGDA);
  K(RSHMEM_STATE_HOST_HEAP);
  K(RSHMEM_PEER_NO_P2P_ATOMICS);
  K(RSHMEM_TRANSPORT_NONE);
  K(RSHMEM_TRANSPORT_P2P);
  K(RSHMEM_TRANSPORT_IBGDA);
  K(RSHMEM_DEVICE_ERR_NONE);
  K(RSHMEM_DEVICE_ERR_UNBOUND);
  K(RSHMEM_DEVICE_ERR_BAD_PE);
  K(RSHMEM_DEVICE_ERR_OUT_OF_HEAP);
  K(RSHMEM_DEVICE_ERR_WAIT_TIMEOUT);
  K(RSHMEM_DEVICE_ERR_QUEUE);
  K(RSHMEM_DEVICE_ERR_BAD_ARG);
  K(RSHMEM_TEAM_SLOTS);
  K(RSHMEM_TEAM_MAX_ROUNDS);
  K(RSHMEM_TEAM_INVALID);
  K(RSHMEM_TEAM_WORLD);
  K(RSHMEM_TEAM_SHARED);
  printf("RSHMEM_STATE_SYMBOL %s\n", RSHMEM_STATE_SYMBOL);
  return 0;
}
