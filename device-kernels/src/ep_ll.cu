// ep_ll.cu — MoE expert-parallel low-latency dispatch and combine on GPU PEs
// (compiled to ptx/ep_ll.ptx). Semantics: ../shared/design/EP.md; the CPU implementation
// host/src/ep/mod.rs is the oracle: same buffer layout (rshmem/ep/layout.cuh = Layout),
// same signal words (tag << 32 | count, poison bit, credits), same numerics
// (rshmem/ep/fp8.cuh), so recv_x / recv_scales / src_info / recv_count per block and the
// combine output are bit-identical to the CPU's on the same inputs.
//
// STATUS: compiled (ptxas, no spills) and run in host emulation against the CPU oracle
// (host/tests/ep_cuda_parity.rs, kernels_emulated_*), over P2P, over IBGDA queues drained
// by the soft HCA, and mixed. On a GPU only through scripts/gpu-check (docs/gpu-results.md
// says what has run there).
// Peers are reached through the device API (rshmem/ep/comm.cuh): a destination with a
// P2P mapping (rshmem_ptr != nullptr) gets stores, any other gets RDMA WRITEs on its queue
// (rshmem_putmem_nbi_warp; IBGDA on a NIC, or the proxy transport's soft HCA); signal
// words go through rshmem_signal_op either way.
//
// ---------------------------------------------------------------------------------------
// Launch contract (docs/ep.md "GPU kernels" says the same)
//
// Kernels, for H in {2048, 2560, 4096, 5120, 7168, 8192}:
//   ep_ll_dispatch_send_h<H>_fp8   ep_ll_dispatch_recv_h<H>_fp8
//   ep_ll_dispatch_send_h<H>_bf16  ep_ll_dispatch_recv_h<H>_bf16
//   ep_ll_combine_send_h<H>        ep_ll_combine_recv_h<H>
//   ep_ll_dispatch_stage_h<H>_fp8  ep_ll_dispatch_stage_h<H>_bf16
// Each takes one ep_ll_args_t (rshmem/ep/ll.cuh) by value; block = EP_LL_THREADS (512)
// threads, 1-D; grid = any G >= 1 (each kernel walks its work grid-stride; G only sets
// the parallelism: send kernels use floor(G / R) blocks per destination PE, at least 1).
// No dynamic shared memory. The module must be bound to the PE (state global).
//
// One LL call = its send kernel, then (same stream, or after an event) its receive
// kernel. Without a receive hook the launcher enqueues both back to back; with one, the
// hook enqueues the receive kernel. When some other PE is not P2P (IBGDA), the dispatch
// send kernel is preceded on the same stream by the stage kernel of the same format
// (dispatch_send traps when it did not run: ctl->staged[set] != tag). Nothing is read
// back by the host: counts, flags and the call counter live in device memory, so the
// kernels are capturable in a CUDA graph.
// The call's buffer set is args.set = the host's LL call number % 2 (dispatch and
// combine both count), as on CPU; the *tag* is taken from ctl->set_calls[set] (call
// number = 2 * set_calls[set] + set), which the receive kernel increments, so a replayed
// graph signals with fresh tags. The host must keep the CPU's rule: at most one call per
// set between a send kernel and its receive kernel (a third call before a receive hook
// is refused on the host).
//
// All PEs' kernels of a call must be able to run at the same time (they wait on each
// other's signals): on one GPU shared by several PEs, size G so that every PE's grid is
// resident (e.g. occupancy x SMs / PEs), as for the device barrier.
//
// Per kernel (T = args.num_tokens, R = n_pes, L = E / R, rows = R * N):
//   dispatch_send  reads x [T, H] bf16, topk_idx [T, K]; writes peers' dispatch_recv
//                  messages and dispatch_count words.
//   dispatch_recv  writes out (recv_x), recv_scales (FP8), recv_count [L], src_info,
//                  recv_topk_slot [L, rows], layout_range [L, R]; then this PE's credit
//                  on every unmasked PE; increments set_calls[set].
//   combine_send   reads x = expert outputs [L, rows, H] (or the zero-copy region),
//                  layout_range, src_info, recv_topk_slot of the dispatch (the handle),
//                  topk_idx [T, K] (checked only); writes peers' combine_recv rows and
//                  combine_flag words. With EP_LL_CREDITS_ONLY it only waits for the
//                  credits (below) and returns: the zero-copy guard the host enqueues in
//                  get_next_low_latency_combine_buffer when a peer is behind a queue
//                  (same call, same set: the combine's own wait then passes at once).
//   combine_recv   reads topk_idx, topk_weights [T, K]; writes out = combined_x [T, H]
//                  bf16; credits; increments set_calls[set].
//
// Algorithm.
// - Every send kernel first waits (bounded) until every unmasked PE's credit for this
//   set has reached the tag of call seq - 2 (nothing is overwritten before it was read).
// - dispatch_send: unit = (destination PE d, part p of floor(G/R)), one block. The block
//   counts, over all T*K slots, the slots routed to each of d's L experts and those
//   before its token range, so it knows where each of its messages goes: the CPU's
//   packing (per source: blocks by local expert; within a block, token order). Warp 0
//   assigns slots 32 entries at a time (__match_any_sync ranks), then every warp writes
//   one message: header (token, slot k), then the token quantised straight from x into
//   the peer's receive slot (FP8: 16 lanes per 128-channel group, amax by shuffles, one
//   scale per group; BF16: a 16-byte copy). For an IBGDA destination the message is two
//   WRITEs instead: the header inline, the payload from this PE's dispatch_send area,
//   where the stage kernel cast each token once (as the CPU stages there). The last
//   unit of d (a completion counter in ctl) writes d's L count words (signal_op SET).
// - dispatch_stage (IBGDA only): one warp per token casts x into the token's
//   dispatch_send message, after the credits of call seq - 2 (whose WRITEs read it).
// - dispatch_recv: unit = (local expert le, source s), one warp. Its lanes wait for the
//   count words it needs: (le, s') for s' <= s (the block begins in *source order*, a
//   valid "any order" that is also deterministic), and (le', s) for le' < le (where s's
//   block starts in the receive area); s = R-1 also sums recv_count[le]. Then it copies
//   the block's messages into the outputs. The last block writes the credits.
// - combine_send: unit = (source PE s, part), one block; its warps split the rows of the
//   blocks layout_range[., s] and copy each expert output row to s's combine_recv row
//   (token, slot k) (16-byte copies; IBGDA: one WRITE per row, from the zero-copy
//   region or after a copy into this set's combine_send area). The last unit writes
//   s's flag: tag << 32 | rows.
// - combine_recv: every block waits for every unmasked PE's flag, checks rows against
//   its routing, then reduces tokens grid-stride: acc = 0; acc = acc + w * v in k order
//   with separately rounded * and + (no FMA) in f32; bf16 round to nearest even: the
//   CPU's sum exactly.
//
// Faults (as on CPU; see ep_ll_status_t). A send kernel whose input is invalid (args.fault
// from the host, T > N, an id outside [-1, E)) sends poisoned words instead of data, so
// every PE's receive kernel completes; each PE records what it saw in ctl->status[set][kind]
// (first reporter wins) for the launcher to turn into the CPU's errors. Outputs of a
// failed call are unspecified (combine writes zeros). A dispatch receive that finds a
// peer's count beyond its receive area, or a message header (token, slot) outside
// [0, N) x [0, K), records DISPATCH_CORRUPT or DISPATCH_HEADER (the CPU's verification
// errors) and keeps its writes in bounds; a combine of a handle whose dispatch met a
// corrupt header here is poisoned (EP_FAULT_DISPATCH_HEADER). Every wait is bounded by
// state.timeout_ns and, on timeout, fills the device error record (the peer waited for,
// the word's address, expected tag, last value; the printed line names the expert) and
// traps.
//
// Shrink mode (args.flags & EP_LL_SHRINK; DeepEP's enable_shrink, the CPU's
// Buffer::set_shrink). A wait that times out (args.shrink_timeout_ms, else
// state.timeout_ns) does not trap: the PE waited for is given up on — mask[pe] =
// EP_LL_MASK_SHRUNK(tag), visible to the host's query_mask — and the call goes on
// without it. Once one thread gave up on a PE, the other waits for it in the same kernel
// end at once. Receive kernels settle each signal word they give up on
// (ep_comm::settle_tag: a compare-and-swap to tag << 32 | EP_SHRUNK) and take one
// decision per source and call (ctl->shrink_decided, first decider wins), so all their
// blocks agree on what a PE sent: a dispatch source is used only if all its L count
// words came, a combine flag only if it came. Sends skip PEs masked before the call, and
// send nothing (but still arrive at dest_done) to a PE given up on in this call's credit
// wait, one decision per destination and call (ctl->credit_decided), so no block sends
// to a PE another block gave up on; credits go to every PE not masked. Later calls skip the PE like one the host
// masked; clean_mask brings it back. Limits (docs/ep.md "GPU shrink mode"): a live PE
// delayed by its own give-up can be given up on by a peer (cascade); over IBGDA a queue
// pair error met later still traps.
//
// Differences from the CPU that the oracle comparison must allow: the position of each
// (expert, source) block in recv_x is by source order here, by arrival order on CPU (the
// per-block contents, counts and src_info are identical); empty blocks' `begin` may
// differ; with several faults the one reported may differ.
// ---------------------------------------------------------------------------------------
#include <stdint.h>

// Every block is EP_LL_THREADS (512) threads, whole warps: warp calls take 32 lanes as a
// constant (rshmem/device/core.cuh, rshmemi_warp_lanes).
#define RSHMEM_FULL_WARPS 1

#include "rshmem/ep/fp8.cuh"
#include "rshmem/ep/layout.cuh"
#include "rshmem/ep/ll.cuh"
#include "rshmem/ep/comm.cuh"

// Internal helpers live in a named namespace, not an anonymous one: nvcc names the
// function-local __shared__ variables of anonymous-namespace functions with a hash of
// the source path, which would make ptx/ differ between checkouts.
namespace ep_ll_detail {}
using namespace ep_ll_detail;

namespace ep_ll_detail {

constexpr int kThreads = EP_LL_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
// Slots warp 0 assigns per round of dispatch_send (then every warp sends).
constexpr int kChunk = 128;

// What every kernel derives from its arguments.
struct Ctx {
  ep_layout_t lay;
  int32_t me;
  uint32_t R, L, N, K, E, T;
  uint64_t rows;  // R * N
  uint64_t seq;   // LL call number (2 * set_calls[set] + set)
  uint64_t tag;   // seq + 1
  uint64_t wtag;  // the tag signal words carry in their high 32 bits: 1..2^32-1, wrapping
                  // (host/src/ep/mod.rs `wire`); credits and decisions use the whole tag
  ep_ll_ctl_t *ctl;
  const int32_t *team_pe;  // world PE of each team member; nullptr: the world team
  int32_t *mask;
  bool shrink;          // EP_LL_SHRINK
  uint64_t give_up_ns;  // shrink mode: how long a wait lasts before it gives up on its PE
};

__device__ __forceinline__ uint32_t lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ uint32_t warp_id() { return threadIdx.x >> 5; }
__device__ __forceinline__ uint32_t lanemask_lt() { return (1u << lane_id()) - 1; }

__device__ __forceinline__ void config_fail(const char *what, uint64_t expected, uint64_t got) {
  ep_comm::fail(EP_LL_DEVICE_ERR_CONFIG, ep_comm::state().my_pe, 0, expected, got, RSHMEM_CMP_EQ,
               what, -1);
}

// `fp8`: the layout's message format (the buffer's Config::use_fp8, EP_LL_FP8_BUFFER).
__device__ __forceinline__ Ctx setup(const ep_ll_args_t &a, uint64_t hidden, bool fp8) {
  ep_comm::check_bound();
  Ctx c;
  const rshmem_device_state_t &s = ep_comm::state();
  c.ctl = reinterpret_cast<ep_ll_ctl_t *>(a.ctl);
  // The buffer's team (written by the host before the first launch; stream order makes
  // plain loads see it).
  const uint32_t team_size = c.ctl->team_size;
  const int32_t team_rank = c.ctl->team_rank;
  if (team_size > EP_LL_MAX_PES || (team_size != 0 && (team_rank < 0 ||
                                                       static_cast<uint32_t>(team_rank) >= team_size ||
                                                       c.ctl->team_pe[team_rank] != s.my_pe)))
    config_fail("EP: the buffer's team does not hold this PE (ctl team fields)", s.my_pe,
                team_size);
  const uint64_t n = team_size != 0 ? team_size : static_cast<uint64_t>(s.n_pes);
  const int rc = ep_layout_init(&c.lay, a.num_max_tokens, hidden, a.num_experts, a.num_topk, fp8, n);
  if (rc != EP_LAYOUT_OK) config_fail("EP config invalid for this kernel (ep_layout_init)", 0, rc);
  if (c.lay.num_pes > EP_LL_MAX_PES) config_fail("EP: too many PEs", EP_LL_MAX_PES, c.lay.num_pes);
  if (c.lay.num_local_experts > EP_LL_MAX_LOCAL_EXPERTS)
    config_fail("EP: too many local experts", EP_LL_MAX_LOCAL_EXPERTS, c.lay.num_local_experts);
  if (a.buf % EP_REGION_ALIGN != 0 || a.buf + c.lay.total_bytes > s.heap_size || a.set > 1)
    ep_comm::fail(RSHMEM_DEVICE_ERR_OUT_OF_HEAP, s.my_pe, a.buf, s.heap_size,
                 a.buf + c.lay.total_bytes, RSHMEM_CMP_LE, "EP buffer outside the heap (or set > 1)",
                 -1);
  c.me = team_size != 0 ? team_rank : s.my_pe;
  c.team_pe = team_size != 0 ? c.ctl->team_pe : nullptr;
  c.R = static_cast<uint32_t>(c.lay.num_pes);
  c.L = static_cast<uint32_t>(c.lay.num_local_experts);
  c.N = a.num_max_tokens;
  c.K = a.num_topk;
  c.E = a.num_experts;
  c.T = a.num_tokens;
  c.rows = static_cast<uint64_t>(c.R) * c.N;
  c.mask = reinterpret_cast<int32_t *>(a.mask);
  c.shrink = (a.flags & EP_LL_SHRINK) != 0;
  c.give_up_ns = a.shrink_timeout_ms != 0 ? a.shrink_timeout_ms * 1000000ull
                                          : rshmemi_effective_timeout(s.timeout_ns);
  if (c.shrink && c.mask == nullptr) config_fail("EP shrink mode needs a mask buffer", 1, 0);
  // Written only by the previous receive kernel on this set, which finished before this
  // launch started (stream order), so a plain load sees it.
  c.seq = 2 * *reinterpret_cast<volatile uint64_t *>(&c.ctl->set_calls[a.set]) + a.set;
  c.tag = c.seq + 1;
  c.wtag = (c.tag - 1) % 0xffffffffull + 1;
  return c;
}

// Mask entries. Only this PE's kernels write them (the host between calls; in shrink mode
// the running kernel, EP_LL_MASK_SHRUNK(tag)), and this PE's kernels run one at a time
// (stream order), so an entry can change during a kernel only from 0 to this call's mark.
__device__ __forceinline__ int32_t mask_entry(const Ctx &c, uint32_t pe) {
  return c.mask == nullptr ? 0 : *reinterpret_cast<volatile int32_t *>(&c.mask[pe]);
}
// Masked for sending and credits: by the host, an earlier call, or this one.
__device__ __forceinline__ bool masked(const Ctx &c, uint32_t pe) { return mask_entry(c, pe) != 0; }

// The world PE of team member `p` (the device API, peers' heaps and queues, and error
// reports use world PEs; everything else here uses team ranks).
__device__ __forceinline__ int32_t wpe(const Ctx &c, uint32_t p) {
  return c.team_pe != nullptr ? c.team_pe[p] : static_cast<int32_t>(p);
}
// Masked before this call started: the receive kernels skip it. A PE given up on during
// this call is not: its signal words were settled (ep_comm::settle_tag), and every block
// reads them, so all agree on what it sent.
__device__ __forceinline__ bool masked_before(const Ctx &c, uint32_t pe) {
  const int32_t m = mask_entry(c, pe);
  return m != 0 && m != EP_LL_MASK_SHRUNK(c.tag);
}
__device__ __forceinline__ bool shrunk_now(const Ctx &c, uint32_t pe) {
  return mask_entry(c, pe) == EP_LL_MASK_SHRUNK(c.tag);
}
// Shrink mode, send kernels: whether `pe` is masked, the same answer in every thread of
// the block (it may have been given up on in this call's credit wait: the unit then
// skips its data and signals but still arrives at the completion counter).
__device__ bool block_masked(const Ctx &c, uint32_t pe) {
  __shared__ int s_gone;
  __syncthreads();  // every thread has read the previous unit's answer
  if (threadIdx.x == 0) s_gone = masked(c, pe);
  __syncthreads();
  return s_gone != 0;
}

// Shrink mode: the call's one decision in the word `word` (tag << 1 | yes): `mine` unless
// another unit or block decided first. Device scope: only this PE's kernels read and
// write it.
__device__ bool decide_in(const Ctx &c, uint64_t *word, bool mine) {
  unsigned long long *d = reinterpret_cast<unsigned long long *>(word);
  const unsigned long long want = c.tag << 1 | (mine ? 1ull : 0ull);
  unsigned long long cur = *reinterpret_cast<volatile unsigned long long *>(d);
  while ((cur >> 1) != c.tag) {
    const unsigned long long old = atomicCAS(d, cur, want);
    if (old == cur) return mine;
    cur = old;
  }
  return (cur & 1) != 0;
}

// Receive kernels: the decision about source `pe` on `set` (ep_ll_ctl_t.shrink_decided),
// `mine` = use what it sent.
__device__ __forceinline__ bool decide(const Ctx &c, uint32_t set, uint32_t pe, bool mine) {
  return decide_in(c, &c.ctl->shrink_decided[set][pe], mine);
}

// Shrink mode: gives up on `pe` for good (first writer wins; a host mask stays).
__device__ __forceinline__ void shrink_pe(const Ctx &c, uint32_t pe) {
  atomicCAS_system(&c.mask[pe], 0, EP_LL_MASK_SHRUNK(c.tag));
}

// A receive kernel's wait for PE `pe`'s signal word `w` of this call: traps on timeout,
// or, in shrink mode, settles it (the marker when nothing came) and gives up on `pe`.
__device__ uint64_t recv_word(const Ctx &c, uint64_t *w, uint32_t pe, int32_t expert,
                              const char *what) {
  if (!c.shrink) return ep_comm::wait_tag(w, c.wtag, wpe(c, pe), expert, what);
  const uint64_t v = ep_comm::settle_tag(w, c.wtag, c.give_up_ns, [&] { return shrunk_now(c, pe); });
  if ((v & 0xffffffffu) == EP_SHRUNK) shrink_pe(c, pe);
  return v;
}

__device__ __forceinline__ int64_t idx_at(const ep_ll_args_t &a, uint64_t i) {
  if (a.flags & EP_LL_IDX_I32) return reinterpret_cast<const int32_t *>(a.topk_idx)[i];
  return reinterpret_cast<const int64_t *>(a.topk_idx)[i];
}

__device__ __forceinline__ uint64_t *local_word(const ep_ll_args_t &a, uint64_t off) {
  return reinterpret_cast<uint64_t *>(ep_comm::local(a.buf + off));
}

// First reporter of a call (per set) writes the status; later ones are dropped.
__device__ void record(const Ctx &c, uint32_t set, uint32_t kind, int32_t peer, uint64_t value,
                       uint64_t expected) {
  // Dispatch kinds (1..3, 8) and combine kinds (4..7) keep separate records.
  ep_ll_status_t *st = &c.ctl->status[set][EP_LL_STATUS_IS_COMBINE(kind) ? 1 : 0];
  const unsigned long long old =
      atomicMax(reinterpret_cast<unsigned long long *>(&st->claim), c.tag);
  if (old >= c.tag) return;
  st->kind = kind;
  st->peer = peer;
  st->value = value;
  st->expected = expected;
  // The fields before commit: whoever sees commit == tag (after the kernel) sees them.
  __threadfence();
  *reinterpret_cast<volatile uint64_t *>(&st->commit) = c.tag;
}

// Send kernels: wait until every unmasked PE has received call seq - 2 on this set.
__device__ void wait_credits(const Ctx &c, const ep_ll_args_t &a) {
  if (c.seq >= 2) {
    for (uint32_t p = threadIdx.x; p < c.R; p += kThreads) {
      if (masked(c, p)) continue;
      const uint64_t *w = local_word(a, ep_credit_word(&c.lay, a.set, p));
      if (!c.shrink) {
        ep_comm::wait_ge(w, c.seq - 1, wpe(c, p),
                        "EP send: waiting for PE to finish receiving call seq-2 on this buffer "
                        "set (its credit)");
      } else {
        // One decision per destination and call (ctl->credit_decided): a block that saw
        // the credit arrive just after another block's bound must not send to a PE the
        // other block gave up on (the last unit to arrive would announce counts that
        // cover messages never written). An adopted give-up also writes the mask, so
        // this block's block_masked sees it.
        const bool came = ep_comm::wait_ge_or_give_up(w, c.seq - 1, c.give_up_ns,
                                                      [&] { return shrunk_now(c, p); });
        if (!decide_in(c, &c.ctl->credit_decided[a.set][p], came)) {
          shrink_pe(c, p);
        } else if (!came) {
          // Another block saw the credit, this one gave up: decide_in's CAS is relaxed, so
          // acquire the credit here before writing into p's receive area (the wait returns
          // at once: the credit has come).
          ep_comm::wait_ge(w, c.seq - 1, wpe(c, p),
                           "EP send (shrink): the credit another block saw");
        }
      }
    }
  }
  __syncthreads();
}

// True in every thread of the block that arrives last at `counter` out of `arrivals`;
// resets the counter for the next launch. Memory ordering: the block's stores are
// ordered before thread 0's fence.sc.sys by the barrier; the counter's atomic RMW chain
// carries them to the last block, whose fence orders them before its later stores
// (signal words written with st.release.sys).
__device__ bool arrive_last(uint32_t *counter, uint32_t arrivals) {
  __shared__ uint32_t s_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    const uint32_t old = atomicAdd(counter, 1u);
    s_last = old + 1 == arrivals;
    if (s_last) {
      *counter = 0;
      __threadfence_system();
    }
  }
  __syncthreads();
  return s_last != 0;
}

// The receive kernels' end: credits to every unmasked PE, then the call counter.
__device__ void finish_receive(const Ctx &c, const ep_ll_args_t &a, int kind) {
  if (!arrive_last(&c.ctl->grid_done[a.set][kind], gridDim.x)) return;
  // A dispatch that met no corrupt header clears an earlier dispatch's DISPATCH_HEADER
  // record on this set, so that combine_send poisons only the combine of the dispatch
  // that met one (the latest on its set: the host refuses older handles). Every block's
  // record() came before (arrive_last), and this PE's combine_send runs after this
  // kernel on its stream. Before 2026-12-07 the record stayed and combine_send matched
  // it by the call mod 64: a clean combine 32 round trips later was poisoned, and a
  // graph replay (whose baked mark names the captured call) was not.
  if (kind == EP_LL_DISPATCH_RECV && threadIdx.x == 0) {
    ep_ll_status_t *st = &c.ctl->status[a.set][0];
    if (st->commit != c.tag && st->kind == EP_LL_STATUS_DISPATCH_HEADER) st->kind = EP_LL_STATUS_NONE;
  }
  for (uint32_t p = threadIdx.x; p < c.R; p += kThreads) {
    if (masked(c, p)) continue;
    ep_comm::signal(wpe(c, p), a.buf + ep_credit_word(&c.lay, a.set, c.me), c.tag);
  }
  if (threadIdx.x == 0) c.ctl->set_calls[a.set] += 1;
}

// Scans topk_idx [T, K] for an id outside [-1, E): the smallest such index, or ~0.
__device__ uint64_t first_bad_id(const Ctx &c, const ep_ll_args_t &a) {
  __shared__ unsigned long long s_bad;
  if (threadIdx.x == 0) s_bad = ~0ull;
  __syncthreads();
  const uint64_t n = static_cast<uint64_t>(c.T) * c.K;
  for (uint64_t i = threadIdx.x; i < n; i += kThreads) {
    const int64_t e = idx_at(a, i);
    if (e < -1 || e >= static_cast<int64_t>(c.E)) atomicMin(&s_bad, static_cast<unsigned long long>(i));
  }
  __syncthreads();
  return s_bad;
}

// With ids repeated within a token (sent once per slot, as DeepEP), the smallest index of
// topk_idx [T, K] (ids in [-1, E)) that names its expert for the (N+1)-th time, or ~0:
// more than N rows from this PE would overrun the expert's N rows per source PE. Without
// repeats an expert gets at most T <= N rows, so the ids are counted only when some token
// repeats an id (the CPU's first_overflow, same answer). The count is a shared-memory
// histogram, kOverflowTile experts per pass: linear in T * K per pass (one pass up to
// 1024 experts). Only when an expert is named more than N times (the call fails) is the
// index found by a quadratic scan; before 2026-12-07 that scan ran whenever a token
// repeated an id (milliseconds per block at T = 1024, K = 11).
constexpr uint32_t kOverflowTile = 1024;
__device__ uint64_t first_overflow(const Ctx &c, const ep_ll_args_t &a) {
  __shared__ unsigned long long s_bad;
  __shared__ int s_repeats;
  __shared__ int s_over;
  __shared__ uint32_t s_count[kOverflowTile];
  if (threadIdx.x == 0) {
    s_bad = ~0ull;
    s_repeats = 0;
    s_over = 0;
  }
  __syncthreads();
  const uint64_t n = static_cast<uint64_t>(c.T) * c.K;
  for (uint64_t i = threadIdx.x; i < n; i += kThreads) {
    const int64_t e = idx_at(a, i);
    if (e < 0) continue;
    for (uint64_t j = i - i % c.K; j < i; ++j)
      if (idx_at(a, j) == e) s_repeats = 1;  // every writer stores 1
  }
  __syncthreads();
  if (!s_repeats) return s_bad;  // block-uniform: read after the barrier
  for (uint32_t base = 0; base < c.E; base += kOverflowTile) {
    for (uint32_t i = threadIdx.x; i < kOverflowTile; i += kThreads) s_count[i] = 0;
    __syncthreads();
    for (uint64_t i = threadIdx.x; i < n; i += kThreads) {
      const int64_t e = idx_at(a, i);
      if (e >= static_cast<int64_t>(base) && e < static_cast<int64_t>(base) + kOverflowTile)
        atomicAdd(&s_count[e - base], 1u);
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < kOverflowTile; i += kThreads)
      if (s_count[i] > c.N) s_over = 1;  // every writer stores 1
    // Orders the flag before its read and the counts' reads before the next pass zeroes
    // them.
    __syncthreads();
    if (s_over) break;  // block-uniform
  }
  if (s_over) {
    for (uint64_t i = threadIdx.x; i < n; i += kThreads) {
      const int64_t e = idx_at(a, i);
      if (e < 0) continue;
      uint64_t before = 0;
      for (uint64_t j = 0; j < i; ++j) before += idx_at(a, j) == e;
      if (before >= c.N) atomicMin(&s_bad, static_cast<unsigned long long>(i));
    }
    __syncthreads();
  }
  return s_bad;
}

__device__ __forceinline__ uint64_t fault_word(uint64_t code, uint64_t value) {
  return EP_POISON | code << 24 | (value < EP_COUNT_MASK ? value : EP_COUNT_MASK);
}

// The input fault of a send kernel, in the CPU's order: host-detected, T > N, bad id,
// and in dispatch (check_tokens) an expert named more than N times.
__device__ uint64_t send_fault(const Ctx &c, const ep_ll_args_t &a, bool check_tokens) {
  uint64_t fault = a.fault;
  if (fault == 0 && check_tokens && c.T > c.N) fault = fault_word(EP_FAULT_TOO_MANY_TOKENS, c.T);
  if (fault == 0) {
    const uint64_t bad = first_bad_id(c, a);
    if (bad != ~0ull) fault = fault_word(EP_FAULT_BAD_EXPERT, bad);
  }
  if (fault == 0 && check_tokens) {  // dispatch only, as on the CPU
    const uint64_t over = first_overflow(c, a);
    if (over != ~0ull) fault = fault_word(EP_FAULT_EXPERT_OVERFLOW, over);
  }
  return fault;
}

// Warp-wide copy of `bytes` (a multiple of 16) between 16-byte aligned addresses.
__device__ __forceinline__ void warp_copy16(uint8_t *dst, const uint8_t *src, uint64_t bytes) {
  const uint4 *s = reinterpret_cast<const uint4 *>(src);
  uint4 *d = reinterpret_cast<uint4 *>(dst);
  const uint64_t n = bytes / 16;
  uint64_t i = lane_id();
  for (; i + 96 < n; i += 128) {
    const uint4 v0 = s[i], v1 = s[i + 32], v2 = s[i + 64], v3 = s[i + 96];
    d[i] = v0;
    d[i + 32] = v1;
    d[i + 64] = v2;
    d[i + 96] = v3;
  }
  for (; i < n; i += 32) d[i] = s[i];
}

// ------------------------------------------------------------------------- dispatch

// One message: header + token t of x, quantised (FP8) or copied (BF16), into `dst`.
template <int H, bool FP8>
__device__ __forceinline__ void send_message(uint8_t *dst, const uint16_t *__restrict__ x,
                                             uint32_t t, uint32_t k, bool round_scale) {
  const uint32_t lane = lane_id();
  if (lane == 0) *reinterpret_cast<uint4 *>(dst) = make_uint4(t, k, 0, 0);
  const uint8_t *row = reinterpret_cast<const uint8_t *>(x + static_cast<uint64_t>(t) * H);
  uint8_t *payload = dst + EP_HEADER_BYTES;
  if constexpr (FP8) {
    static_assert(H % 256 == 0, "FP8 kernels take two 128-channel groups per warp step");
    float *scales = reinterpret_cast<float *>(payload + H);
    // Lane: 8 channels; 16 lanes: one group; the warp: groups 2g2 and 2g2 + 1.
#pragma unroll 4
    for (int g2 = 0; g2 < H / 256; ++g2) {
      const uint32_t ch = g2 * 256 + lane * 8;
      const uint4 v = __ldg(reinterpret_cast<const uint4 *>(row + ch * 2));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      float f[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        f[2 * j] = ep_bf16_to_f32(static_cast<uint16_t>(w[j] & 0xffff));
        f[2 * j + 1] = ep_bf16_to_f32(static_cast<uint16_t>(w[j] >> 16));
      }
      float amax = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = ep_amax_step(amax, f[j]);
      // Max over the 16 lanes of this group: exact and order-independent.
#pragma unroll
      for (int o = 8; o >= 1; o >>= 1) {
        const float other = __shfl_xor_sync(kFull, amax, o);
        amax = other > amax ? other : amax;
      }
      float scale, scale_inv;
      ep_group_scale(amax, round_scale, &scale, &scale_inv);
      uint32_t q[2] = {0, 0};
#pragma unroll
      for (int j = 0; j < 8; ++j)
        q[j / 4] |= static_cast<uint32_t>(ep_f32_to_e4m3(ep_mul_rn(f[j], scale))) << (8 * (j % 4));
      *reinterpret_cast<uint2 *>(payload + ch) = make_uint2(q[0], q[1]);
      if ((lane & 15) == 0) scales[g2 * 2 + lane / 16] = scale_inv;
    }
  } else {
    warp_copy16(payload, row, static_cast<uint64_t>(H) * 2);
  }
}

// The dispatch kernels exist per message format; the buffer must have been made for it.
template <bool FP8>
__device__ __forceinline__ void check_format(const ep_ll_args_t &a) {
  if (((a.flags & EP_LL_FP8_BUFFER) != 0) != FP8)
    config_fail("EP dispatch kernel format (fp8/bf16) differs from the buffer's (EP_LL_FP8_BUFFER)",
                FP8, (a.flags & EP_LL_FP8_BUFFER) != 0);
}

__device__ __forceinline__ bool buffer_fp8(const ep_ll_args_t &a) {
  return (a.flags & EP_LL_FP8_BUFFER) != 0;
}

// dispatch_send's guard for its IBGDA destinations: this call's stage kernel ran.
__device__ __forceinline__ void check_staged(const Ctx &c, const ep_ll_args_t &a) {
  const uint64_t staged = *reinterpret_cast<volatile uint64_t *>(&c.ctl->staged[a.set]);
  if (staged != c.tag)
    config_fail("EP dispatch: a destination is reached over IBGDA, but this call's stage kernel "
                "(ep_ll_dispatch_stage_*) did not run before dispatch_send",
                c.tag, staged);
}

// The stage kernel (IBGDA destinations only; the launcher runs it before dispatch_send
// when the PE has such a peer): waits for the credits of call seq - 2 (whose WRITEs read
// this set's staging area), then casts every token once into its dispatch_send message
// (header: token, slot 0), one warp per token, grid-stride, and records the call's tag in
// ctl->staged[set] for dispatch_send to check. With an invalid input (T > N, a host
// fault) it casts nothing: dispatch_send poisons the call instead.
template <int H, bool FP8>
__device__ void dispatch_stage(const ep_ll_args_t &a) {
  check_format<FP8>(a);
  const Ctx c = setup(a, H, FP8);
  wait_credits(c, a);
  const uint16_t *x = reinterpret_cast<const uint16_t *>(a.x);
  const bool round_scale = (a.flags & EP_LL_ROUND_SCALE) != 0;
  if (a.fault == 0 && c.T <= c.N) {
    for (uint64_t t = blockIdx.x * static_cast<uint64_t>(kWarps) + warp_id(); t < c.T;
         t += static_cast<uint64_t>(gridDim.x) * kWarps)
      send_message<H, FP8>(ep_comm::local(a.buf + ep_dispatch_send_msg(&c.lay, a.set, t)), x,
                           static_cast<uint32_t>(t), 0, round_scale);
  }
  // Read by the next kernel of the stream (dispatch_send), after this grid finished.
  if (blockIdx.x == 0 && threadIdx.x == 0) c.ctl->staged[a.set] = c.tag;
}

template <int H, bool FP8>
__device__ void dispatch_send(const ep_ll_args_t &a) {
  __shared__ uint32_t s_total[EP_LL_MAX_LOCAL_EXPERTS];
  __shared__ uint32_t s_base[EP_LL_MAX_LOCAL_EXPERTS];
  __shared__ uint32_t s_t[kChunk], s_k[kChunk], s_slot[kChunk];
  __shared__ uint32_t s_n;

  check_format<FP8>(a);
  const Ctx c = setup(a, H, FP8);
  wait_credits(c, a);
  const uint64_t fault = send_fault(c, a, true);
  if (fault != 0 && threadIdx.x == 0)
    record(c, a.set, EP_LL_STATUS_DISPATCH_INPUT, c.me, fault & 0xffffffffu, 0);
  const uint16_t *x = reinterpret_cast<const uint16_t *>(a.x);
  const bool round_scale = (a.flags & EP_LL_ROUND_SCALE) != 0;
  const uint32_t parts = gridDim.x / c.R > 0 ? gridDim.x / c.R : 1;
  const uint64_t TK = static_cast<uint64_t>(c.T) * c.K;

  for (uint32_t u = blockIdx.x; u < c.R * parts; u += gridDim.x) {
    const uint32_t d = (c.me + 1 + u / parts) % c.R;
    const uint32_t part = u % parts;
    // Block- and grid-uniform: entries set before this call do not change during it (a PE
    // given up on in this call's credit wait still gets its messages, so that every unit
    // of d arrives at dest_done and the counter is reset for the next call).
    if (masked_before(c, d)) continue;
    // Shrink mode: a PE given up on in this call's credit wait (it has not released its
    // receive slots) gets nothing; the unit still arrives below.
    const bool gone = c.shrink && block_masked(c, d);
    // Where d's messages go: its mapped heap (P2P, or this PE), or its queue (nullptr).
    uint8_t *const peer = ep_comm::peer_ptr(wpe(c, d), a.buf);
    if (peer == nullptr && fault == 0 && !gone) check_staged(c, a);
    const uint32_t t0 = static_cast<uint32_t>(static_cast<uint64_t>(c.T) * part / parts);
    const uint32_t t1 = static_cast<uint32_t>(static_cast<uint64_t>(c.T) * (part + 1) / parts);
    const uint64_t e_lo = static_cast<uint64_t>(d) * c.L;

    if (fault == 0 && !gone) {
      for (uint32_t le = threadIdx.x; le < c.L; le += kThreads) s_total[le] = s_base[le] = 0;
      __syncthreads();
      // Slots routed to d's experts: all of them, and those of tokens before t0.
      for (uint64_t i = threadIdx.x; i < TK; i += kThreads) {
        const int64_t e = idx_at(a, i);
        if (e < static_cast<int64_t>(e_lo) || e >= static_cast<int64_t>(e_lo + c.L)) continue;
        const uint32_t le = static_cast<uint32_t>(e - e_lo);
        atomicAdd(&s_total[le], 1u);
        if (i / c.K < t0) atomicAdd(&s_base[le], 1u);
      }
      __syncthreads();
      // s_base[le] += exclusive prefix of s_total: where this part's first slot of le is.
      if (warp_id() == 0) {
        uint32_t carry = 0;
        for (uint32_t b = 0; b < c.L; b += 32) {
          const uint32_t le = b + lane_id();
          const uint32_t v = le < c.L ? s_total[le] : 0;
          uint32_t incl = v;
#pragma unroll
          for (int o = 1; o < 32; o <<= 1) {
            const uint32_t n = __shfl_up_sync(kFull, incl, o);
            if (lane_id() >= static_cast<uint32_t>(o)) incl += n;
          }
          if (le < c.L) s_base[le] += carry + incl - v;
          carry += __shfl_sync(kFull, incl, 31);
        }
      }
      __syncthreads();
      for (uint64_t i0 = static_cast<uint64_t>(t0) * c.K; i0 < static_cast<uint64_t>(t1) * c.K;
           i0 += kChunk) {
        if (warp_id() == 0) {
          uint32_t n = 0;
          for (int sub = 0; sub < kChunk / 32; ++sub) {
            const uint64_t i = i0 + sub * 32 + lane_id();
            int32_t le = -1;
            if (i < static_cast<uint64_t>(t1) * c.K) {
              const int64_t e = idx_at(a, i);
              if (e >= static_cast<int64_t>(e_lo) && e < static_cast<int64_t>(e_lo + c.L))
                le = static_cast<int32_t>(e - e_lo);
            }
            const uint32_t hit = __ballot_sync(kFull, le >= 0);
            const uint32_t same = __match_any_sync(kFull, le);
            const uint32_t before = __popc(same & lanemask_lt());
            if (le >= 0) {
              const uint32_t pos = n + __popc(hit & lanemask_lt());
              s_t[pos] = static_cast<uint32_t>(i / c.K);
              s_k[pos] = static_cast<uint32_t>(i % c.K);
              s_slot[pos] = s_base[le] + before;
            }
            __syncwarp();
            // The lowest lane of each expert's group advances that expert's next slot.
            if (le >= 0 && before == 0) s_base[le] += __popc(same);
            __syncwarp();
            n += __popc(hit);
          }
          if (lane_id() == 0) s_n = n;
        }
        __syncthreads();
        const uint32_t n = s_n;
        for (uint32_t m = warp_id(); m < n; m += kWarps) {
          const uint64_t at = a.buf + ep_dispatch_recv_msg(&c.lay, a.set, c.me, s_slot[m]);
          if (peer != nullptr) {
            // P2P: quantise straight into d's receive slot.
            send_message<H, FP8>(peer + (at - a.buf), x, s_t[m], s_k[m], round_scale);
          } else {
            // IBGDA: the header inline, then the token's payload from the staging area
            // (cast there once by the stage kernel), both as WRITEs on d's queue. The
            // staging is not rewritten before every PE credited this call (wait_credits
            // of the stage kernel two calls later), so the WRITEs may complete late.
            const uint4 hdr = make_uint4(s_t[m], s_k[m], 0, 0);
            rshmem_putmem_nbi_warp(ep_comm::local(at), &hdr, EP_HEADER_BYTES, wpe(c, d));
            rshmem_putmem_nbi_warp(
                ep_comm::local(at + EP_HEADER_BYTES),
                ep_comm::local(a.buf + ep_dispatch_send_msg(&c.lay, a.set, s_t[m]) + EP_HEADER_BYTES),
                ep_payload_bytes(&c.lay), wpe(c, d));
          }
        }
        __syncthreads();
      }
    }
    // The last unit of d announces the counts (or the poison), one word per local expert:
    // after every unit's stores (P2P) or WQE reservations (IBGDA) for d (arrive_last).
    if (arrive_last(&c.ctl->dest_done[a.set][0][d], parts) && !gone) {
      for (uint32_t le = threadIdx.x; le < c.L; le += kThreads) {
        const uint64_t low = fault != 0 ? (fault & 0xffffffffu) : s_total[le];
        ep_comm::signal(wpe(c, d), a.buf + ep_dispatch_count_word(&c.lay, a.set, le, c.me),
                        c.wtag << 32 | low);
      }
    }
    __syncthreads();
  }
}

// Count of one dispatch count word, as the CPU reads it: poison → 0 (recorded), more
// than a source can send → 0 (recorded).
__device__ __forceinline__ uint32_t read_count(const Ctx &c, uint32_t set, uint64_t w,
                                               uint32_t src) {
  const uint64_t low = w & 0xffffffffu;
  if (low == EP_SHRUNK) return 0;  // shrink mode: nothing came (recv_word)
  if (low & EP_POISON) {
    record(c, set, EP_LL_STATUS_DISPATCH_PEER, static_cast<int32_t>(src), low, 0);
    return 0;
  }
  const uint64_t n = low & EP_COUNT_MASK;
  if (n > c.lay.slots_per_src) {
    record(c, set, EP_LL_STATUS_DISPATCH_CORRUPT, static_cast<int32_t>(src), n, 0);
    return 0;
  }
  return static_cast<uint32_t>(n);
}

__device__ __forceinline__ uint32_t warp_sum(uint32_t v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

template <int H, bool FP8>
__device__ void dispatch_recv(const ep_ll_args_t &a) {
  check_format<FP8>(a);
  const Ctx c = setup(a, H, FP8);
  const uint32_t lane = lane_id();
  const uint64_t units = static_cast<uint64_t>(c.L) * c.R;
  constexpr uint64_t kGroups = H / EP_FP8_GROUP;
  for (uint64_t u = blockIdx.x * static_cast<uint64_t>(kWarps) + warp_id(); u < units;
       u += static_cast<uint64_t>(gridDim.x) * kWarps) {
    const uint32_t le = static_cast<uint32_t>(u / c.R), s = static_cast<uint32_t>(u % c.R);
    const bool s_masked = masked_before(c, s);
    const bool last = s + 1 == c.R;
    uint32_t begin = 0, own = 0, total = 0, src_off = 0;
    // Items j < R: word (le, j); items R + le' (le' < le): word (le', s).
    const uint32_t items = s_masked ? (last ? c.R : 0) : c.R + le;
    if (c.shrink) {
      // Shrink mode: a source whose counts did not all come in this call (it died while
      // sending them) is left out of the call entirely: without its count for an earlier
      // local expert, where its later blocks start is unknown. So the lane of source j
      // reads all L of j's words (settled, so every unit sees the same ones) and counts
      // j only when none was given up on; for j = s it also sums s's offset.
      for (uint32_t j = lane; j < c.R && items != 0; j += 32) {
        if (masked_before(c, j) || (j > s && !last)) continue;
        // j's count for this unit's expert (n) and its offset before it (off), from the
        // L words `read` returns; false when one of them was given up on.
        uint32_t n = 0, off = 0;
        auto counts = [&](auto read) {
          bool all_came = true;
          n = off = 0;
          for (uint32_t l2 = 0; l2 < c.L; ++l2) {
            const uint64_t w = read(local_word(a, ep_dispatch_count_word(&c.lay, a.set, l2, j)),
                                    static_cast<int32_t>(c.me * c.L + l2));
            if ((w & 0xffffffffu) == EP_SHRUNK) all_came = false;
            const uint32_t cnt = read_count(c, a.set, w, j);
            if (l2 == le) n = cnt;
            if (l2 < le) off += cnt;
          }
          return all_came;
        };
        const bool complete = counts([&](uint64_t *w, int32_t expert) {
          return recv_word(c, w, j, expert,
                           "EP dispatch: waiting for PE's token count for this PE's expert");
        });
        // One decision per source for the whole call: a word that came only after
        // another unit settled it (a PE later than the whole bound) cannot make two
        // units disagree. Used though this lane saw a marker: every word has come
        // (whoever decided saw them all), so read them again.
        if (!decide(c, a.set, j, complete)) {
          n = off = 0;
        } else if (!complete) {
          counts([&](uint64_t *w, int32_t expert) {
            return ep_comm::wait_tag(w, c.wtag, wpe(c, j), expert,
                                     "EP dispatch (shrink): a count another unit saw", true);
          });
        }
        if (j < s) begin += n;
        if (j == s) {
          own = n;
          src_off = off;
        }
        total += n;
      }
    } else {
      for (uint32_t j = lane; j < items; j += 32) {
        if (j < c.R) {
          if (masked_before(c, j) || (j > s && !last)) continue;
          const uint64_t w = recv_word(
              c, local_word(a, ep_dispatch_count_word(&c.lay, a.set, le, j)), j,
              static_cast<int32_t>(c.me * c.L + le),
              "EP dispatch: waiting for PE's token count for this PE's expert");
          const uint32_t n = read_count(c, a.set, w, j);
          if (j < s) begin += n;
          if (j == s) own = n;
          total += n;
        } else {
          const uint32_t lp = j - c.R;
          const uint64_t w = recv_word(
              c, local_word(a, ep_dispatch_count_word(&c.lay, a.set, lp, s)), s,
              static_cast<int32_t>(c.me * c.L + lp),
              "EP dispatch: waiting for PE's token count for this PE's expert");
          src_off += read_count(c, a.set, w, s);
        }
      }
    }
    // Each lane acquired its own words; the warp barrier orders those acquires before
    // every lane's reads of the messages below (shuffles alone are not synchronisation).
    __syncwarp();
    begin = warp_sum(begin);
    own = warp_sum(own);
    total = warp_sum(total);
    src_off = warp_sum(src_off);
    if (s_masked) own = 0;
    if (own != 0 && (static_cast<uint64_t>(begin) + own > c.rows ||
                     static_cast<uint64_t>(src_off) + own > c.lay.slots_per_src)) {
      if (lane == 0) record(c, a.set, EP_LL_STATUS_DISPATCH_CORRUPT, static_cast<int32_t>(s), own, 0);
      own = 0;
    }
    for (uint32_t i = 0; i < own; ++i) {
      const uint8_t *msg =
          ep_comm::local(a.buf + ep_dispatch_recv_msg(&c.lay, a.set, s, src_off + i));
      const uint64_t row = static_cast<uint64_t>(le) * c.rows + begin + i;
      if (lane == 0) {
        // The combine writes this row back at (token, slot) in s's receive area: both
        // must be in range. A header that is not (a corrupt message) fails the call here,
        // with the CPU's words, and its row is filed at (0, 0) so that a combine of this
        // handle stays in bounds; before 2026-12-07 combine_send trapped on it.
        const int2 hdr = *reinterpret_cast<const int2 *>(msg);
        const bool ok = hdr.x >= 0 && static_cast<uint32_t>(hdr.x) < c.N && hdr.y >= 0 &&
                        static_cast<uint32_t>(hdr.y) < c.K;
        if (!ok)
          record(c, a.set, EP_LL_STATUS_DISPATCH_HEADER, static_cast<int32_t>(s),
                 static_cast<uint64_t>(static_cast<uint32_t>(hdr.x)) << 32 |
                     static_cast<uint32_t>(hdr.y),
                 0);
        reinterpret_cast<int32_t *>(a.src_info)[row] = ok ? hdr.x : 0;
        reinterpret_cast<int32_t *>(a.recv_topk_slot)[row] = ok ? hdr.y : 0;
      }
      const uint8_t *payload = msg + EP_HEADER_BYTES;
      if constexpr (FP8) {
        warp_copy16(reinterpret_cast<uint8_t *>(a.out) + row * H, payload, H);
        const uint32_t *sc = reinterpret_cast<const uint32_t *>(payload + H);
        uint32_t *dst = reinterpret_cast<uint32_t *>(a.recv_scales) + row * kGroups;
        for (uint32_t g = lane; g < kGroups; g += 32) dst[g] = sc[g];
      } else {
        warp_copy16(reinterpret_cast<uint8_t *>(a.out) + row * H * 2, payload,
                    static_cast<uint64_t>(H) * 2);
      }
    }
    if (lane == 0) {
      reinterpret_cast<int64_t *>(a.layout_range)[static_cast<uint64_t>(le) * c.R + s] =
          s_masked ? 0 : (static_cast<int64_t>(begin) << 32 | own);
      if (last) reinterpret_cast<int32_t *>(a.recv_count)[le] = static_cast<int32_t>(total);
    }
  }
  finish_receive(c, a, EP_LL_DISPATCH_RECV);
}

// ------------------------------------------------------------------------- combine

template <int H>
__device__ void combine_send(const ep_ll_args_t &a) {
  __shared__ unsigned long long s_rows;
  const Ctx c = setup(a, H, buffer_fp8(a));
  wait_credits(c, a);
  // The zero-copy guard (EP_LL_CREDITS_ONLY): the credits are what it waits for; the
  // combine's own launch waits for them again (at once) and does the rest. Uniform over
  // the block (an argument), after wait_credits' barrier.
  if ((a.flags & EP_LL_CREDITS_ONLY) != 0) return;
  uint64_t fault = send_fault(c, a, false);
  if (fault == 0) {
    // A handle whose dispatch met a corrupt header here has that row filed at (0, 0):
    // returning it would overwrite another row at its source while the right one got
    // nothing, with every count in agreement. Poison the combine instead (the CPU's
    // dispatch returns no handle then). The dispatch's record is on its set (call % 2 =
    // mark % 2, which a graph replay keeps), and it holds DISPATCH_HEADER only when the
    // latest dispatch on that set, the handle's, met one (finish_receive clears it
    // otherwise); written by an earlier kernel on this stream, so plain reads see it.
    const uint32_t mark = (a.flags >> EP_LL_MARK_SHIFT) & EP_LL_MARK_BITS;
    const ep_ll_status_t &d = c.ctl->status[mark & 1][0];
    if (d.kind == EP_LL_STATUS_DISPATCH_HEADER) fault = fault_word(EP_FAULT_DISPATCH_HEADER, 0);
  }
  if (fault != 0 && threadIdx.x == 0)
    record(c, a.set, EP_LL_STATUS_COMBINE_INPUT, c.me, fault & 0xffffffffu, 0);
  const uint32_t parts = gridDim.x / c.R > 0 ? gridDim.x / c.R : 1;
  const int64_t *lr = reinterpret_cast<const int64_t *>(a.layout_range);
  const int32_t *src_info = reinterpret_cast<const int32_t *>(a.src_info);
  const int32_t *slot_k = reinterpret_cast<const int32_t *>(a.recv_topk_slot);
  const uint8_t *out = reinterpret_cast<const uint8_t *>(a.x);
  constexpr uint64_t kRowBytes = static_cast<uint64_t>(H) * 2;
  // The expert outputs are this set's combine_send region (get_next_low_latency_combine_buffer).
  const bool zero_copy = out == ep_comm::local(a.buf + ep_combine_send_row(&c.lay, a.set, 0, 0));

  for (uint32_t u = blockIdx.x; u < c.R * parts; u += gridDim.x) {
    const uint32_t s = (c.me + 1 + u / parts) % c.R;
    const uint32_t part = u % parts;
    if (masked_before(c, s)) continue;  // block- and grid-uniform, as in dispatch_send
    const bool gone = c.shrink && block_masked(c, s);  // as in dispatch_send
    // s's mapped heap (P2P, or this PE), or nullptr: its queue (IBGDA).
    uint8_t *const peer = ep_comm::peer_ptr(wpe(c, s), a.buf);
    if (threadIdx.x == 0) s_rows = 0;
    __syncthreads();
    uint32_t mine = 0;
    for (uint32_t le = threadIdx.x; le < c.L; le += kThreads)
      mine += static_cast<uint32_t>(lr[static_cast<uint64_t>(le) * c.R + s] & 0xffffffff);
    atomicAdd(&s_rows, static_cast<unsigned long long>(mine));
    if (fault == 0 && !gone) {
      // Rows of s, flattened over (le, j); warp w of the P*kWarps warps of s takes every
      // row whose flat index is w modulo their number.
      const uint64_t W = static_cast<uint64_t>(parts) * kWarps;
      const uint64_t w = static_cast<uint64_t>(part) * kWarps + warp_id();
      uint64_t flat = 0;
      for (uint32_t le = 0; le < c.L; ++le) {
        const int64_t range = lr[static_cast<uint64_t>(le) * c.R + s];
        const uint64_t begin = static_cast<uint64_t>(range) >> 32, count = range & 0xffffffff;
        for (uint64_t j = (w + W - flat % W) % W; j < count; j += W) {
          const uint64_t row = static_cast<uint64_t>(le) * c.rows + begin + j;
          const int32_t t = src_info[row], k = slot_k[row];
          if (begin + j >= c.rows || t < 0 || static_cast<uint32_t>(t) >= c.N || k < 0 ||
              static_cast<uint32_t>(k) >= c.K)
            config_fail("EP combine: handle row outside [0, N) x [0, K) (wrong handle?)",
                        row, static_cast<uint64_t>(static_cast<uint32_t>(t)) << 32 |
                                 static_cast<uint32_t>(k));
          const uint64_t at = a.buf + ep_combine_recv_row(&c.lay, a.set, t, k);
          const uint8_t *src = out + row * kRowBytes;
          if (peer != nullptr) {
            warp_copy16(peer + (at - a.buf), src, kRowBytes);
          } else {
            // IBGDA: a WRITE from the heap. The zero-copy region is this set's staging
            // area already; any other source is copied there first (its row's own
            // place), so the caller may reuse it when the kernel ends. The staging is
            // rewritten only after every PE credited this call (wait_credits, two calls
            // later). __syncwarp orders the lanes' copies before lane 0's post (whose
            // fence.sc.sys publishes them to the queue's reader).
            if (!zero_copy) {
              uint8_t *stage = ep_comm::local(a.buf + ep_combine_send_row(&c.lay, a.set, le, begin + j));
              warp_copy16(stage, src, kRowBytes);
              __syncwarp();
              src = stage;
            }
            rshmem_putmem_nbi_warp(ep_comm::local(at), src, kRowBytes, wpe(c, s));
          }
        }
        flat += count;
      }
    }
    if (arrive_last(&c.ctl->dest_done[a.set][1][s], parts) && !gone) {
      if (threadIdx.x == 0) {
        // The row count (< 2^24: N * K <= 2^20 * 11) with the handle's mark in bits
        // 24..29, as the CPU's flags carry it.
        const uint64_t mark = (a.flags >> EP_LL_MARK_SHIFT) & EP_LL_MARK_BITS;
        const uint64_t low = fault != 0 ? (fault & 0xffffffffu)
                                        : ((s_rows & EP_COUNT_MASK) | mark << EP_LL_MARK_SHIFT);
        ep_comm::signal(wpe(c, s), a.buf + ep_combine_flag_word(&c.lay, a.set, c.me),
                        c.wtag << 32 | low);
      }
    }
    __syncthreads();
  }
}

template <int H>
__device__ void combine_recv(const ep_ll_args_t &a) {
  __shared__ uint32_t s_expected[EP_LL_MAX_PES];
  __shared__ uint32_t s_low[EP_LL_MAX_PES];
  // PEs whose rows this call leaves out: masked before it, or given up on (shrink mode:
  // the call's decision, the same in every block).
  __shared__ uint8_t s_out[EP_LL_MAX_PES];
  __shared__ float s_w[EP_MAX_TOPK];
  __shared__ uint32_t s_use[EP_MAX_TOPK];
  const Ctx c = setup(a, H, buffer_fp8(a));
  if (c.T > c.N) config_fail("EP combine: num_tokens > N (wrong handle?)", c.N, c.T);
  for (uint32_t p = threadIdx.x; p < c.R; p += kThreads) {
    s_expected[p] = 0;
    s_low[p] = 0;
    s_out[p] = masked_before(c, p);
    if (s_out[p]) continue;
    const uint64_t w = recv_word(c, local_word(a, ep_combine_flag_word(&c.lay, a.set, p)), p, -1,
                                 "EP combine: waiting for the expert outputs of PE's "
                                 "experts (its combine flag)");
    s_low[p] = static_cast<uint32_t>(w & 0xffffffffu);
    if (c.shrink && !decide(c, a.set, p, s_low[p] != EP_SHRUNK)) {
      s_out[p] = 1;  // left out by this call's decision (every block adopts it)
    } else if (s_low[p] == EP_SHRUNK) {
      // Another block saw the flag: it has come, read it again.
      s_low[p] = static_cast<uint32_t>(
          ep_comm::wait_tag(local_word(a, ep_combine_flag_word(&c.lay, a.set, p)), c.wtag,
                            wpe(c, p), -1,
                            "EP combine (shrink): a flag another block saw", true) &
          0xffffffffu);
    }
  }
  const bool bad_ids = first_bad_id(c, a) != ~0ull;  // has a __syncthreads
  const uint64_t TK = static_cast<uint64_t>(c.T) * c.K;
  for (uint64_t i = threadIdx.x; i < TK; i += kThreads) {
    const int64_t e = idx_at(a, i);
    if (e >= 0 && e < static_cast<int64_t>(c.E) && !s_out[e / c.L])
      atomicAdd(&s_expected[e / c.L], 1u);
  }
  __syncthreads();
  // The CPU's check, in PE order; every block finds the same answer.
  bool problem = a.fault != 0 || bad_ids;
  for (uint32_t p = 0; p < c.R && !problem; ++p) {
    if (s_out[p]) continue;
    const uint32_t low = s_low[p];
    const uint32_t mark = (a.flags >> EP_LL_MARK_SHIFT) & EP_LL_MARK_BITS;
    const uint32_t theirs = (low >> EP_LL_MARK_SHIFT) & EP_LL_MARK_BITS;
    if (low & EP_POISON) {
      problem = true;
      if (threadIdx.x == 0) record(c, a.set, EP_LL_STATUS_COMBINE_PEER, static_cast<int32_t>(p), low, 0);
    } else if (theirs != mark) {
      // The peer combined the handle of another dispatch (its rows are of another routing,
      // even when the counts agree): the CPU's check, since 2026-12-07 on the GPU too.
      problem = true;
      if (threadIdx.x == 0)
        record(c, a.set, EP_LL_STATUS_COMBINE_HANDLE, static_cast<int32_t>(p), theirs, mark);
    } else if ((low & EP_COUNT_MASK) != s_expected[p]) {
      problem = true;
      if (threadIdx.x == 0)
        record(c, a.set, EP_LL_STATUS_COMBINE_ROWS, static_cast<int32_t>(p), low & EP_COUNT_MASK,
               s_expected[p]);
    }
  }
  const float *weights = reinterpret_cast<const float *>(a.topk_weights);
  uint4 *outp = reinterpret_cast<uint4 *>(a.out);
  constexpr uint32_t kVecs = H / 8;  // 8 bf16 per 16 bytes
  for (uint32_t t = blockIdx.x; t < c.T; t += gridDim.x) {
    if (threadIdx.x < c.K) {
      const int64_t e = idx_at(a, static_cast<uint64_t>(t) * c.K + threadIdx.x);
      s_use[threadIdx.x] =
          !problem && e >= 0 && e < static_cast<int64_t>(c.E) && !s_out[e / c.L];
      s_w[threadIdx.x] = weights[static_cast<uint64_t>(t) * c.K + threadIdx.x];
    }
    __syncthreads();
    for (uint32_t v = threadIdx.x; v < kVecs; v += kThreads) {
      float acc[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
      for (uint32_t k = 0; k < c.K; ++k) {
        if (!s_use[k]) continue;
        const float w = s_w[k];
        const uint4 q = *reinterpret_cast<const uint4 *>(
            ep_comm::local(a.buf + ep_combine_recv_row(&c.lay, a.set, t, k)) + v * 16);
        const uint32_t bits[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[2 * j] = ep_combine_step(acc[2 * j], w, ep_bf16_to_f32(bits[j] & 0xffff));
          acc[2 * j + 1] = ep_combine_step(acc[2 * j + 1], w, ep_bf16_to_f32(bits[j] >> 16));
        }
      }
      uint32_t o[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        o[j] = static_cast<uint32_t>(ep_f32_to_bf16(acc[2 * j])) |
               static_cast<uint32_t>(ep_f32_to_bf16(acc[2 * j + 1])) << 16;
      outp[static_cast<uint64_t>(t) * kVecs + v] = make_uint4(o[0], o[1], o[2], o[3]);
    }
    __syncthreads();
  }
  finish_receive(c, a, EP_LL_COMBINE_RECV);
}

}  // namespace

// ------------------------------------------------------------------------- entry points

#define EP_LL_DISPATCH(H, NAME, FP8)                                                        \
  extern "C" __global__ void __launch_bounds__(EP_LL_THREADS, 1)                               \
      ep_ll_dispatch_stage_h##H##_##NAME(const ep_ll_args_t a) {                            \
    dispatch_stage<H, FP8>(a);                                                              \
  }                                                                                         \
  extern "C" __global__ void __launch_bounds__(EP_LL_THREADS, 1)                               \
      ep_ll_dispatch_send_h##H##_##NAME(const ep_ll_args_t a) {                             \
    dispatch_send<H, FP8>(a);                                                               \
  }                                                                                         \
  extern "C" __global__ void __launch_bounds__(EP_LL_THREADS, 1)                               \
      ep_ll_dispatch_recv_h##H##_##NAME(const ep_ll_args_t a) {                             \
    dispatch_recv<H, FP8>(a);                                                               \
  }

#define EP_LL_INSTANCES(H)                                                                  \
  EP_LL_DISPATCH(H, fp8, true)                                                              \
  EP_LL_DISPATCH(H, bf16, false)                                                            \
  extern "C" __global__ void __launch_bounds__(EP_LL_THREADS, 1)                               \
      ep_ll_combine_send_h##H(const ep_ll_args_t a) {                                       \
    combine_send<H>(a);                                                                     \
  }                                                                                         \
  extern "C" __global__ void __launch_bounds__(EP_LL_THREADS, 1)                               \
      ep_ll_combine_recv_h##H(const ep_ll_args_t a) {                                       \
    combine_recv<H>(a);                                                                     \
  }

EP_LL_INSTANCES(2048)
EP_LL_INSTANCES(2560)
EP_LL_INSTANCES(4096)
EP_LL_INSTANCES(5120)
EP_LL_INSTANCES(7168)
EP_LL_INSTANCES(8192)
