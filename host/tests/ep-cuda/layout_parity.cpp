// Host C++ side of host/tests/ep_cuda_parity.rs: reads configs "N H E K FP8 R" (one per
// line) and prints, per config, the return code of ep_layout_init and, when 0, every
// field of ep_layout_t and the accessors at their last valid index, for the Rust test to
// compare with rshmem::ep::Layout.
#include <inttypes.h>
#include <stdio.h>

#include "rshmem/ep/layout.cuh"

static void region(const char *name, ep_region_t r) {
  printf(" %s=%" PRIu64 "+%" PRIu64, name, r.offset, r.bytes);
}

int main() {
  unsigned long long n, h, e, k, fp8, r;
  while (scanf("%llu %llu %llu %llu %llu %llu", &n, &h, &e, &k, &fp8, &r) == 6) {
    ep_layout_t l;
    const int rc = ep_layout_init(&l, n, h, e, k, fp8 != 0, r);
    printf("rc=%d", rc);
    if (rc == EP_LAYOUT_OK) {
      printf(" R=%" PRIu64 " L=%" PRIu64 " N=%" PRIu64 " H=%" PRIu64 " K=%" PRIu64 " fp8=%" PRIu64
             " msg=%" PRIu64 " slots=%" PRIu64,
             l.num_pes, l.num_local_experts, l.num_max_tokens, l.hidden, l.num_topk, l.use_fp8,
             l.msg_bytes, l.slots_per_src);
      region("dispatch_count", l.dispatch_count);
      region("combine_flag", l.combine_flag);
      region("credit", l.credit);
      region("dispatch_send", l.dispatch_send);
      region("dispatch_recv", l.dispatch_recv);
      region("combine_send", l.combine_send);
      region("combine_recv", l.combine_recv);
      printf(" set=%" PRIu64 " total=%" PRIu64, l.set_bytes, l.total_bytes);
      const uint64_t R = l.num_pes, L = l.num_local_experts, N = l.num_max_tokens,
                     K = l.num_topk;
      for (uint64_t set = 0; set < 2; ++set) {
        printf(" count=%" PRIu64 ",%" PRIu64 " flag=%" PRIu64 " credit=%" PRIu64
               " send=%" PRIu64 " recv=%" PRIu64 ",%" PRIu64 " csend=%" PRIu64 ",%" PRIu64
               " crecv=%" PRIu64 ",%" PRIu64,
               ep_dispatch_count_word(&l, set, L - 1, R - 1), ep_dispatch_count_word(&l, set, 0, R / 2),
               ep_combine_flag_word(&l, set, R - 1), ep_credit_word(&l, set, R - 1),
               ep_dispatch_send_msg(&l, set, N - 1), ep_dispatch_recv_msg(&l, set, R - 1, l.slots_per_src - 1),
               ep_dispatch_recv_msg(&l, set, R / 2, 1), ep_combine_send_row(&l, set, L - 1, R * N - 1),
               ep_combine_send_row(&l, set, L / 2, 3), ep_combine_recv_row(&l, set, N - 1, K - 1),
               ep_combine_recv_row(&l, set, N / 2, 0));
      }
      printf(" payload=%" PRIu64 " scales=%" PRIu64 " payload_bytes=%" PRIu64, ep_payload_offset(&l),
             ep_scales_offset(&l), ep_payload_bytes(&l));
    }
    printf("\n");
  }
  return 0;
}
