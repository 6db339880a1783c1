// Prints sizeof/offsetof of the structs in rshmem/ep/ll.cuh and the values of the
// constants of ll.cuh and layout.cuh the Rust launcher mirrors (host/src/gpu/ep.rs), as
// "key value" lines, for host/tests/ep_gpu_abi.rs.
#include <cstddef>
#include <cstdio>

#include "rshmem/ep/layout.cuh"
#include "rshmem/ep/ll.cuh"

#define SZ(t) printf("sizeof.%s %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(t, f))
#define K(c) printf("%s %llu\n", #c, (unsigned long long)(c))

int main() {
  SZ(ep_ll_args_t);
  OFF(ep_ll_args_t, buf);
  OFF(ep_ll_args_t, ctl);
  OFF(ep_ll_args_t, mask);
  OFF(ep_ll_args_t, x);
  OFF(ep_ll_args_t, topk_idx);
  OFF(ep_ll_args_t, topk_weights);
  OFF(ep_ll_args_t, out);
  OFF(ep_ll_args_t, recv_scales);
  OFF(ep_ll_args_t, recv_count);
  OFF(ep_ll_args_t, src_info);
  OFF(ep_ll_args_t, recv_topk_slot);
  OFF(ep_ll_args_t, layout_range);
  OFF(ep_ll_args_t, num_tokens);
  OFF(ep_ll_args_t, num_max_tokens);
  OFF(ep_ll_args_t, num_experts);
  OFF(ep_ll_args_t, num_topk);
  OFF(ep_ll_args_t, set);
  OFF(ep_ll_args_t, flags);
  OFF(ep_ll_args_t, fault);
  OFF(ep_ll_args_t, shrink_timeout_ms);
  SZ(ep_ll_status_t);
  OFF(ep_ll_status_t, claim);
  OFF(ep_ll_status_t, commit);
  OFF(ep_ll_status_t, kind);
  OFF(ep_ll_status_t, peer);
  OFF(ep_ll_status_t, value);
  OFF(ep_ll_status_t, expected);
  OFF(ep_ll_status_t, reserved);
  SZ(ep_ll_ctl_t);
  OFF(ep_ll_ctl_t, set_calls);
  OFF(ep_ll_ctl_t, status);
  OFF(ep_ll_ctl_t, grid_done);
  OFF(ep_ll_ctl_t, dest_done);
  OFF(ep_ll_ctl_t, staged);
  OFF(ep_ll_ctl_t, shrink_decided);
  OFF(ep_ll_ctl_t, team_size);
  OFF(ep_ll_ctl_t, team_rank);
  OFF(ep_ll_ctl_t, team_pe);
  OFF(ep_ll_ctl_t, credit_decided);
  K(EP_LL_THREADS);
  K(EP_LL_MAX_PES);
  K(EP_LL_MAX_LOCAL_EXPERTS);
  K(EP_LL_IDX_I32);
  K(EP_LL_ROUND_SCALE);
  K(EP_LL_FP8_BUFFER);
  K(EP_LL_SHRINK);
  K(EP_LL_CREDITS_ONLY);
  K(EP_LL_STATUS_NONE);
  K(EP_LL_STATUS_DISPATCH_INPUT);
  K(EP_LL_STATUS_DISPATCH_PEER);
  K(EP_LL_STATUS_DISPATCH_CORRUPT);
  K(EP_LL_STATUS_COMBINE_INPUT);
  K(EP_LL_STATUS_COMBINE_PEER);
  K(EP_LL_STATUS_COMBINE_ROWS);
  K(EP_LL_STATUS_COMBINE_HANDLE);
  K(EP_LL_STATUS_DISPATCH_HEADER);
  K(EP_LL_MARK_SHIFT);
  K(EP_LL_MARK_BITS);
  K(EP_LL_DEVICE_ERR_CONFIG);
  K(EP_LL_DISPATCH_SEND);
  K(EP_LL_DISPATCH_RECV);
  K(EP_LL_COMBINE_SEND);
  K(EP_LL_COMBINE_RECV);
  K(EP_REGION_ALIGN);
  K(EP_HEADER_BYTES);
  K(EP_MAX_TOPK);
  K(EP_MAX_TOKENS_PER_RANK);
  K(EP_POISON);
  K(EP_COUNT_MASK);
  K(EP_SHRUNK);
  return 0;
}
