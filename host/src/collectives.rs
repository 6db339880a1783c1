//! OpenSHMEM 1.5 team collectives on CPU PEs: broadcast, fcollect, collect, alltoall and the
//! reductions (`shmem_TYPE_OP_reduce`).
//!
//! Every call has the same frame, so that an error anywhere reaches every member and no
//! member is left waiting:
//! 1. Prepare locally: quiet (puts made before the call, a put to itself through the
//!    proxy included, complete first), then take a copy of this member's source when it
//!    overlaps dest, so that it cannot be overwritten before it is read.
//! 2. Agree over the team (`agree_in`, a bootstrap allgather, which also synchronises):
//!    the operation, element type, counts, root, operator, the symmetric offsets of dest
//!    and source, whether each is long enough, and whether step 1 succeeded. A difference
//!    is a `CollectiveMismatch` on every member naming each PE's arguments; then every
//!    member alike refuses short buffers, a root outside the team, a bitwise reduction on
//!    floats. After this step every member's source is ready and its dest free (a small
//!    call reads its source before: see "Small calls").
//! 3. Move the data with the RMA layer (p2p, proxy or fabric, whatever reaches each
//!    peer): the root pushes (broadcast), every member pushes its blocks (fcollect,
//!    alltoall); reduce is a reduce-scatter then an allgather (member i reads chunk i of
//!    every source, combines it and pushes it to every member, in pieces of at most
//!    `REDUCE_PIECE_BYTES` through two buffers its thread keeps).
//! 4. Quiet and exchange each member's outcome (another allgather): on success dest holds
//!    the result on every member and sources may be reused; a member that failed returns
//!    its error and the others a `CollectiveFailed` naming it.
//!
//! `collect` (counts that differ per member) exchanges instead of agreeing in step 2.
//!
//! Simple algorithms (O(n) messages per member), correct on any transport, not tuned;
//! two exchanges per call (over the heap when every member's heap is mapped here).
//!
//! # Small calls
//! On a team whose heaps are all mapped here, a broadcast, fcollect, alltoall or reduce
//! whose part per member (what it sends: the root's source, a member's block, its whole
//! alltoall source, its reduce source) is at most [`SMALL_CALL_BYTES`] runs steps 2–4 as
//! one exchange of the team's agreement records (`Pe::exchange_polled`). A record holds a
//! 128-bit digest of the member's arguments (the words step 2 agrees on, its step-1
//! outcome included) and its part, read after the quiet. When every record carries the
//! same digest, each member computes the result from the parts and stores it into its
//! *own* dest (members write no one else's; stores to its own memory, which cannot fail
//! once the arguments agree): no completion exchange is needed. On return this member's
//! dest holds the result and its source may be reused — OpenSHMEM's guarantee for the
//! local PE; other members may still be writing theirs (the large path happens to return
//! only once every member's dest is written). A member reads its own source when it
//! enters the call, after its own quiet but before the others have entered: a put another
//! PE made into it just before that PE's own call is not seen unless a synchronisation
//! ordered the two, as OpenSHMEM requires (the large path reads sources after the
//! agreement, and saw it). When the digests differ and every member made a small call at
//! this agreement, all of them (they read the same records) run the full agreement of
//! step 2 to name the arguments that differ, exactly as a large call would; when a member
//! made a large call instead (different counts), the error names it and shows the small
//! calls by collective and size. A small call that meets a plain barrier (`sync_team`) on
//! another member — which writes no record — ends both at their timeout, each naming what
//! it waited for (an agreement there met the barrier and failed at once). 8-byte
//! collectives at 2 PEs took two team barriers (0.5 µs); one exchange is docs/bench-cpu.md's
//! "Session 36".
use crate::error::{Error, Result};
use crate::heap::AGREE_WORDS;
use crate::pe::{Pe, SMALL_RECORD};
use crate::team::Team;
use crate::types::{Element, SymPtr};

/// The reduction operators of OpenSHMEM 1.5 (`shmem_TYPE_OP_reduce`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    And,
    Or,
    Xor,
    Max,
    Min,
    Sum,
    Prod,
}

impl ReduceOp {
    fn code(self) -> u64 {
        self as u64
    }

    /// The OpenSHMEM name (`shmem_int_sum_reduce` → "sum").
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::And => "and",
            ReduceOp::Or => "or",
            ReduceOp::Xor => "xor",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
        }
    }
}

/// Element types of the reductions: the integers (every operator; sum and prod wrap) and
/// the floats (max, min, sum, prod; the bitwise operators are refused, as OpenSHMEM
/// defines them on integer types only).
pub trait Reducible: Element {
    /// `a op b`, or None when `op` is not defined on this type.
    fn combine(a: Self, b: Self, op: ReduceOp) -> Option<Self>;
}

macro_rules! reducible_int {
    ($($t:ty),*) => { $(
        impl Reducible for $t {
            fn combine(a: Self, b: Self, op: ReduceOp) -> Option<Self> {
                Some(match op {
                    ReduceOp::And => a & b,
                    ReduceOp::Or => a | b,
                    ReduceOp::Xor => a ^ b,
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                })
            }
        }
    )* };
}
reducible_int!(i8, i16, i32, i64, u8, u16, u32, u64, isize, usize);

macro_rules! reducible_float {
    ($($t:ty),*) => { $(
        impl Reducible for $t {
            fn combine(a: Self, b: Self, op: ReduceOp) -> Option<Self> {
                match op {
                    ReduceOp::Max => Some(a.max(b)),
                    ReduceOp::Min => Some(a.min(b)),
                    ReduceOp::Sum => Some(a + b),
                    ReduceOp::Prod => Some(a * b),
                    ReduceOp::And | ReduceOp::Or | ReduceOp::Xor => None,
                }
            }
        }
    )* };
}
reducible_float!(f32, f64);

/// Which collective (the first agreed argument).
#[derive(Clone, Copy)]
enum Coll {
    Broadcast = 1,
    Fcollect = 2,
    Alltoall = 3,
    Reduce = 4,
    Collect = 5,
    Alltoalls = 6,
}

impl Coll {
    fn from_code(c: u64) -> &'static str {
        match c {
            1 => "broadcast",
            2 => "fcollect",
            3 => "alltoall",
            4 => "reduce",
            5 => "collect",
            6 => "alltoalls",
            _ => "another call",
        }
    }

    /// The name of step 4's exchange, for a member found at another exchange there.
    fn completion(self) -> &'static str {
        match self {
            Coll::Broadcast => "broadcast (completion)",
            Coll::Fcollect => "fcollect (completion)",
            Coll::Alltoall => "alltoall (completion)",
            Coll::Reduce => "reduce (completion)",
            Coll::Collect => "collect (completion)",
            Coll::Alltoalls => "alltoalls (completion)",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Coll::Broadcast => "broadcast",
            Coll::Fcollect => "fcollect",
            Coll::Alltoall => "alltoall",
            Coll::Reduce => "reduce",
            Coll::Collect => "collect",
            Coll::Alltoalls => "alltoalls",
        }
    }
}

/// What a member sends in a collective (`Pe::snapshot`): a copy of its source, or the
/// source in its own heap when no member writes there during the call.
enum Snapshot<T> {
    Copy(Vec<T>),
    /// `len` elements at this address of this PE's own mapped heap.
    Heap(*mut T, usize),
}

impl<T> std::ops::Deref for Snapshot<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Snapshot::Copy(v) => v,
            // SAFETY: `len` elements of this PE's own heap (mapped for the Pe's life,
            // which outlives the call), which no member writes during the collective
            // (they do not overlap its dest; see `Pe::snapshot`). Element types are plain
            // numbers.
            Snapshot::Heap(p, len) => unsafe { std::slice::from_raw_parts(*p, *len) },
        }
    }
}

/// A collective's arguments as step 2 agrees on them.
struct Call<T> {
    coll: Coll,
    dest: SymPtr<T>,
    dest_need: usize,
    source: SymPtr<T>,
    source_need: usize,
    root: usize,
    op: u64,
    /// Element strides of dest and source (`alltoalls`; 1 and 1 elsewhere).
    strides: (usize, usize),
}

/// Words of [`Call::args`].
const ARGS: usize = 14;

impl<T: Element> Call<T> {
    /// The words every member must pass alike (`show_args` renders them), with this
    /// member's step-1 outcome.
    fn args(&self, ready: bool) -> [u64; ARGS] {
        [
            self.coll as u64,
            type_code::<T>(),
            std::mem::size_of::<T>() as u64,
            self.dest_need as u64,
            self.source_need as u64,
            self.root as u64,
            self.op,
            self.dest.offset() as u64,
            (self.dest.len() >= self.dest_need) as u64,
            self.source.offset() as u64,
            (self.source.len() >= self.source_need) as u64,
            ready as u64,
            self.strides.0 as u64,
            self.strides.1 as u64,
        ]
    }

    /// The checks every member makes alike once the arguments agree.
    fn check(&self, team: &Team) -> Result<()> {
        let name = self.coll.name();
        let short = |what: &str, have: usize, need: usize| {
            Error::InvalidArgument(format!(
                "{name}: {what} has {have} elements, the call needs {need}"
            ))
        };
        if self.dest.len() < self.dest_need {
            return Err(short("dest", self.dest.len(), self.dest_need));
        }
        if self.source.len() < self.source_need {
            return Err(short("source", self.source.len(), self.source_need));
        }
        if self.root >= team.n_pes() {
            return Err(Error::InvalidArgument(format!(
                "{name}: root {} is not a member index of a team of {} PEs",
                self.root,
                team.n_pes()
            )));
        }
        Ok(())
    }
}

/// A record in a collective's mismatch: a collective's arguments ([`show_args`]) when it
/// has their number of words, else another agreement (an allocation, a team, `collect`).
fn show_record(words: &[u64]) -> String {
    match words.len() {
        ARGS => show_args(words),
        n => format!("another kind of call ({n} words: an allocation, a team split, collect, ...)"),
    }
}

/// One member's [`Call::args`] in a mismatch error.
fn show_args(v: &[u64]) -> String {
    let a = |i: usize| v.get(i).copied().unwrap_or(u64::MAX);
    format!(
        "{} of type {:#x} ({} B), counts {} / {}, root {}, op {}, dest at {:#x} \
         (long enough: {}), source at {:#x} (long enough: {}), ready: {}, strides \
         {} / {}",
        Coll::from_code(a(0)),
        a(1),
        a(2),
        a(3),
        a(4),
        a(5),
        a(6),
        a(7),
        a(8) == 1,
        a(9),
        a(10) == 1,
        a(11) == 1,
        a(12),
        a(13)
    )
}

/// The most bytes a member's part of a small call may have ("Small calls" in the module
/// comment): a record's words after its header and the digest.
pub const SMALL_CALL_BYTES: usize = (AGREE_WORDS - 2 - 2) * 8;

/// What a small call's record says about it in a mismatch error, from its count word; None
/// for a large call's record.
pub(crate) fn small_call(count: u64) -> Option<String> {
    (count & SMALL_RECORD != 0).then(|| {
        format!(
            "a small {} ({} bytes per member; the other arguments are not listed)",
            Coll::from_code((count >> 32) & 0xff),
            (count >> 16) & 0xffff
        )
    })
}

/// A 128-bit digest of a call's arguments (two independent 64-bit multiply-xorshift
/// chains over the words, each finished with splitmix64's mixer), carried by a small
/// call's record in their place: members whose digests agree passed the same arguments
/// (unless 128 bits collide). Word-wise, so that it costs about as much as a cache miss
/// (FNV-1a over the bytes took a third of an 8-byte reduce).
fn digest(args: &[u64; ARGS]) -> [u64; 2] {
    let (mut a, mut b) = (0x243f_6a88_85a3_08d3u64, 0x1319_8a2e_0370_7344u64);
    for &w in args {
        a = (a ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        a ^= a >> 29;
        b = (b.rotate_left(23) ^ w).wrapping_mul(0xd6e8_feb8_6659_fd93);
        b ^= b >> 32;
    }
    [crate::pe::mix64(a), crate::pe::mix64(b ^ ARGS as u64)]
}

/// The element type by name (FNV-1a), so that i32 and f32 differ too.
fn type_code<T>() -> u64 {
    crate::pe::fnv(std::any::type_name::<T>().as_bytes())
}

/// Bytes of each of the two buffers a reduce combines through: a member's chunk is read,
/// combined and pushed in pieces of at most this size, so the buffers stay in cache and
/// are reused across calls. Buffers of the whole chunk, allocated per call, cost a page
/// fault per 4 KiB on every call once glibc had given them back to the kernel (1 MiB
/// reduced by 2 processes: 720 µs a call, 159 µs with glibc told to keep its memory).
const REDUCE_PIECE_BYTES: usize = 128 << 10;

thread_local! {
    /// The two reduce buffers of this thread (`with_reduce_scratch`), u128 words so that
    /// every built-in `Element` type is aligned in them.
    static REDUCE_SCRATCH: std::cell::RefCell<Vec<u128>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with two reduce buffers of the same length (at least one element, at most
/// `REDUCE_PIECE_BYTES` unless one element is larger): this thread's kept pair
/// (allocated at its first reduce), or a fresh pair when those do not fit `T` (a
/// user-defined `Element` aligned past 16 bytes, zero-sized or larger than a piece) or
/// are not available (already lent, or the thread's locals being torn down).
fn with_reduce_scratch<T: Element, R>(f: impl FnOnce(&mut [T], &mut [T]) -> R) -> R {
    const WORDS: usize = 2 * REDUCE_PIECE_BYTES / std::mem::size_of::<u128>();
    let size = std::mem::size_of::<T>();
    let fits = size != 0
        && size <= REDUCE_PIECE_BYTES
        && std::mem::align_of::<T>() <= std::mem::align_of::<u128>();
    let fresh = |f: &mut dyn FnMut(&mut [T], &mut [T]) -> R| {
        let per = REDUCE_PIECE_BYTES.checked_div(size).unwrap_or(1).max(1);
        f(&mut zeroed::<T>(per), &mut zeroed::<T>(per))
    };
    let mut f = Some(f);
    let mut call = |a: &mut [T], b: &mut [T]| (f.take().expect("called once"))(a, b);
    if !fits {
        return fresh(&mut call);
    }
    let kept = REDUCE_SCRATCH.try_with(|cell| {
        let Ok(mut store) = cell.try_borrow_mut() else {
            return None;
        };
        if store.len() < WORDS {
            store.resize(WORDS, 0);
        }
        let per = REDUCE_PIECE_BYTES / size;
        let base = store.as_mut_ptr().cast::<T>();
        // SAFETY: `store` holds 2 * REDUCE_PIECE_BYTES bytes, initialised (zeros) and
        // borrowed mutably for the whole call; the two slices are disjoint (per elements
        // of T each, 2 * per * size <= 2 * REDUCE_PIECE_BYTES). u128 storage is aligned
        // for T (checked in `fits`), and every bit pattern is a valid Element (the trait's
        // contract).
        let (a, b) = unsafe {
            (
                std::slice::from_raw_parts_mut(base, per),
                std::slice::from_raw_parts_mut(base.add(per), per),
            )
        };
        Some(call(a, b))
    });
    match kept {
        Ok(Some(r)) => r,
        _ => fresh(&mut call),
    }
}

/// reduce's checks once the arguments agree (every member makes them alike): dest may be
/// source itself, not a part of it (members write their chunks of dest while others still
/// read source); the operator must be defined on T.
fn reduce_checks<T: Reducible>(
    dest: SymPtr<T>,
    source: SymPtr<T>,
    nreduce: usize,
    op: ReduceOp,
) -> Result<()> {
    // Saturating: hand-made pointers near the end of the address space are refused by the
    // bounds checks later, not overflowed here.
    let bytes = nreduce.saturating_mul(std::mem::size_of::<T>());
    let (d, s) = (dest.offset(), source.offset());
    if d != s && d < s.saturating_add(bytes) && s < d.saturating_add(bytes) {
        return Err(Error::InvalidArgument(format!(
            "reduce: dest (offset {d:#x}) and source (offset {s:#x}) overlap without being \
             the same array ({nreduce} elements of {} bytes): OpenSHMEM allows dest == \
             source only",
            std::mem::size_of::<T>()
        )));
    }
    let zero = zeroed::<T>(1)[0];
    if T::combine(zero, zero, op).is_none() {
        return Err(Error::InvalidArgument(format!(
            "reduce: {} is not defined on {} (bitwise reductions take integer types)",
            op.name(),
            std::any::type_name::<T>()
        )));
    }
    Ok(())
}

/// `acc[i] = acc[i] op other[i]`; `op` is defined on T (`reduce_checks` passed).
fn combine_into<T: Reducible>(acc: &mut [T], other: &[T], op: ReduceOp) {
    for (a, &b) in acc.iter_mut().zip(other) {
        *a = T::combine(*a, b, op).expect("checked by reduce_checks");
    }
}

/// Whether a call whose part per member is `elems` elements of T runs as a small call
/// ("Small calls" in the module comment). Every member decides alike: from arguments the
/// call then agrees on, and whether the team's heaps are all mapped here (the same on
/// every member).
fn is_small<T: Element>(team: &Team, elems: usize) -> bool {
    let size = std::mem::size_of::<T>();
    team.p2p()
        && size != 0
        && std::mem::align_of::<T>() <= std::mem::align_of::<u64>()
        && elems
            .checked_mul(size)
            .is_some_and(|b| b <= SMALL_CALL_BYTES)
}

/// The first `n` elements of T in `words` (a record's part).
fn as_elems<T: Element>(words: &[u64], n: usize) -> &[T] {
    assert!(
        std::mem::align_of::<T>() <= std::mem::align_of::<u64>()
            && n * std::mem::size_of::<T>() <= std::mem::size_of_val(words)
    );
    // SAFETY: `words` holds at least n * size_of::<T>() initialised bytes, aligned for T
    // (checked above); every bit pattern is a valid Element (the trait's contract).
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<T>(), n) }
}

/// [`as_elems`], mutable.
fn as_elems_mut<T: Element>(words: &mut [u64], n: usize) -> &mut [T] {
    assert!(
        std::mem::align_of::<T>() <= std::mem::align_of::<u64>()
            && n * std::mem::size_of::<T>() <= std::mem::size_of_val(words)
    );
    // SAFETY: as in `as_elems`; the slice borrows `words` mutably, so nothing aliases it.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<T>(), n) }
}

/// A zero-filled local buffer (every bit pattern of an `Element` is a value).
fn zeroed<T: Element>(n: usize) -> Vec<T> {
    // SAFETY: Element types are primitive numbers; all-zero bytes are a valid value.
    vec![unsafe { std::mem::zeroed::<T>() }; n]
}

/// Collectives count elements in bytes: a zero-sized element type (`[T; 0]`) has no
/// bytes to move and turns the element counts into unchecked sums, so it is refused (on
/// every member alike: each refuses before any agreement).
fn zero_sized<T>(op: &str) -> Result<()> {
    if std::mem::size_of::<T>() == 0 {
        return Err(Error::InvalidArgument(format!(
            "{op}: the element type {} has size 0",
            std::any::type_name::<T>()
        )));
    }
    Ok(())
}

impl Pe {
    /// Step 2 of the frame (module comment): agreement, then the checks every member makes
    /// alike. `ready` is step 1's outcome, its quiet included ([`Pe::snapshot`]).
    fn coll_agree<T: Element>(&self, team: &Team, call: &Call<T>, ready: Result<()>) -> Result<()> {
        let args = call.args(ready.is_ok());
        let agreed = self.agree_in(team, call.coll.name(), &args, show_record);
        // A member whose own step 1 failed reports that; the others the mismatch.
        ready?;
        agreed?;
        call.check(team)
    }

    /// A small call ("Small calls" in the module comment): steps 2–4 in one exchange.
    /// `ready` is step 1's outcome, its quiet included. `elems` elements of T are this
    /// member's part, which `part` reads (only when step 1 succeeded; its error is a step-1
    /// failure); with every record alike, `finish` gets every member's part in team order
    /// and writes this member's dest. Only for calls that [`is_small`] admits.
    fn coll_small<T: Element>(
        &self,
        team: &Team,
        call: &Call<T>,
        elems: usize,
        ready: Result<()>,
        part: impl FnOnce(&mut [T]) -> Result<()>,
        finish: impl FnOnce(&[&[T]]) -> Result<()>,
    ) -> Result<()> {
        let name = call.coll.name();
        if let Err(e) = self.intact_team(team, name) {
            // Step 1's own error (a quiet's, taken already) first, as coll_agree does.
            ready?;
            return Err(e);
        }
        let bytes = elems * std::mem::size_of::<T>();
        let words = bytes.div_ceil(8);
        let mut rec = [0u64; AGREE_WORDS - 2];
        // This member's dest is checked here, before the exchange, so that writing it
        // after the records agree cannot fail (an out-of-heap dest is a step-1 failure,
        // named on every member like any other).
        let written = call.dest.len().min(call.dest_need);
        let ready = ready
            .and_then(|()| {
                let d = call.dest.slice(0..written);
                self.own_heap(d.offset(), d.bytes()).map(drop)
            })
            .and_then(|()| part(as_elems_mut(&mut rec[2..2 + words], elems)));
        let args = call.args(ready.is_ok());
        rec[..2].copy_from_slice(&digest(&args));
        // The count word: the small-call bit, the collective's code (bits 32..40) and the
        // part's bytes (bits 16..32) over the number of words after the header, as an
        // agreement's count is (`record_words`); `small_call` reads it back.
        let count =
            SMALL_RECORD | ((call.coll as u64) << 32) | ((bytes as u64) << 16) | (2 + words) as u64;
        let (seq, all) = self.exchange_polled(team, name, count, &rec[..2 + words])?;
        if all.iter().any(|r| r[..4] != [seq, count, rec[0], rec[1]]) {
            // Every member read these same records and decides alike.
            if all.iter().all(|r| r[1] & SMALL_RECORD != 0) {
                // The full agreement names what differs, as in a large call.
                let agreed = self.agree_in(team, name, &args, show_record);
                ready?;
                agreed?;
                return Err(Error::CollectiveMismatch {
                    op: name,
                    detail: "the members' digests of their arguments differ although the \
                             arguments agree (a bug in rshmem)"
                        .into(),
                });
            }
            // A member at a large call waits in its agreement's barrier: this member joins
            // it, then each reports the mismatch from the records.
            let joined = self.sync_team_as(team, name);
            ready?;
            joined?;
            return Err(crate::pe::heap_mismatch(team, name, seq, &all, |r| {
                small_call(r[1]).unwrap_or_else(|| show_record(crate::pe::record_words(r)))
            }));
        }
        ready?;
        call.check(team)?;
        let parts: Vec<&[T]> = all.iter().map(|r| as_elems(&r[4..], elems)).collect();
        finish(&parts)
    }

    /// A small call's last step: each `(at, data)` block into this PE's own `dest` from
    /// element `at` on, stored straight into its mapped heap (under `--transport proxy`
    /// too, where a put to itself would go through the soft HCA): a store to this PE's own
    /// memory cannot fail, so no member can fail after the records agreed.
    fn finish_small<T: Element>(&self, dest: SymPtr<T>, blocks: &[(usize, &[T])]) -> Result<()> {
        for &(at, data) in blocks {
            if data.is_empty() {
                continue;
            }
            let d = dest.slice(at..at + data.len());
            // Inside the range `coll_small` checked before the exchange (the call's checks
            // passed, so dest holds dest_need elements): this cannot fail.
            let p = self.own_heap(d.offset(), d.bytes())?;
            // SAFETY: p..p + d.bytes() is this PE's own mapped heap (validated by
            // `own_heap`); `data` was copied out of the agreement records (or computed from
            // them), never the user's heap, so they do not overlap. Byte-wise: a `SymPtr`
            // made with `cast` may be misaligned for T. Plain stores: this PE reads its
            // dest itself, and other PEs only after a later synchronisation, whose Release
            // orders these stores.
            unsafe { crate::copy::copy_bytes(data.as_ptr().cast(), p, d.bytes()) };
        }
        Ok(())
    }

    /// Step 4: quiet, then every member's outcome exchanged. A member whose part failed
    /// returns its own error, the others a `CollectiveFailed` naming every such member.
    fn coll_status(&self, team: &Team, coll: Coll, done: Result<()>) -> Result<()> {
        let done = done.and(self.try_quiet());
        let all = self.gather_in(team, coll.completion(), &[done.is_ok() as u64], |v| {
            match v.first() {
                Some(1) => "completed",
                _ => "failed",
            }
            .to_string()
        });
        done?;
        crate::team::failed_members(team, coll.name(), &all?)
    }

    /// This member's first `n` elements of `source` as step 3 sends them (step 1): when
    /// they overlap the first `dest_need` elements of `dest` (which members write during
    /// the call), a
    /// copy read before any member may write; otherwise the heap itself, which no member
    /// writes during the call (members write only dest, at the same offsets everywhere),
    /// so the large copy is skipped. Step 1's quiet comes first, so this PE's earlier puts
    /// (one to its own source through the proxy included) are complete when the source is
    /// read. On failure an empty snapshot and the error, which step 2 reports.
    fn snapshot<T: Element>(
        &self,
        coll: Coll,
        source: SymPtr<T>,
        n: usize,
        dest: SymPtr<T>,
        dest_need: usize,
    ) -> (Snapshot<T>, Result<()>) {
        if let Err(e) = self.try_quiet() {
            return (Snapshot::Copy(Vec::new()), Err(e));
        }
        if n == 0 {
            return (Snapshot::Copy(Vec::new()), Ok(()));
        }
        if source.len() < n {
            let e = Error::InvalidArgument(format!(
                "{}: source has {} elements, the call needs {n}",
                coll.name(),
                source.len()
            ));
            return (Snapshot::Copy(Vec::new()), Err(e));
        }
        let s = source.slice(0..n);
        let (s_lo, s_hi) = (s.offset(), s.offset().saturating_add(s.bytes()));
        let d_lo = dest.offset();
        let d_hi = d_lo.saturating_add(dest_need.saturating_mul(size_of::<T>()));
        if s_hi <= d_lo || d_hi <= s_lo {
            // A slice of T needs an aligned address: a source made with `cast` at an odd
            // offset is copied instead.
            if let Some(p) = self.ptr(s, self.my_pe()).filter(|p| p.is_aligned()) {
                return (Snapshot::Heap(p, n), Ok(()));
            }
        }
        // The range is checked before the copy's buffer is allocated: a hand-made SymPtr
        // of 2^40 elements failed the allocation (an abort) before the get could refuse it.
        if let Err(e) = self.own_heap(s.offset(), s.bytes()) {
            return (Snapshot::Copy(Vec::new()), Err(e));
        }
        let mut data = zeroed::<T>(n);
        match self.get(&mut data, s, self.my_pe()) {
            Ok(()) => (Snapshot::Copy(data), Ok(())),
            Err(e) => (Snapshot::Copy(Vec::new()), Err(e)),
        }
    }

    /// Step 3 of fcollect, alltoall, collect and reduce: `block(j)` goes to member `j`'s
    /// `dest` (the range this member writes, the same on every member), starting with the
    /// next member so that the members do not all write to member 0 first.
    fn push_blocks<'a, T: Element>(
        &self,
        team: &Team,
        dest: SymPtr<T>,
        block: impl Fn(usize) -> &'a [T],
    ) -> Result<()> {
        if dest.is_empty() {
            return Ok(());
        }
        let (n, me) = (team.n_pes(), team.my_pe());
        for k in 1..=n {
            let j = (me + k) % n;
            let pe = team.world_pe(j).expect("member index below n_pes");
            self.put_nbi(dest, block(j), pe)?;
        }
        Ok(())
    }

    /// Copies `nelems` elements of `source` on team member `root` to `dest` on every
    /// member, the root included (OpenSHMEM 1.5 `shmem_broadcast` on a team).
    pub fn broadcast<T: Element>(
        &self,
        team: &Team,
        dest: SymPtr<T>,
        source: SymPtr<T>,
        nelems: usize,
        root: usize,
    ) -> Result<()> {
        zero_sized::<T>("broadcast")?;
        let is_root = team.my_pe() == root;
        // A source shorter than nelems is refused by `Call::check` on every member alike
        // once the arguments agree (they carry "source long enough"); the root does not
        // take the snapshot then, so its readiness matches the others' (before 2026-12-07
        // the root's snapshot failed, and every other member got a CollectiveMismatch
        // about arguments that did not differ).
        let (data, ready) = self.snapshot(
            Coll::Broadcast,
            source,
            if is_root && source.len() >= nelems {
                nelems
            } else {
                0
            },
            dest,
            nelems,
        );
        let call = Call {
            coll: Coll::Broadcast,
            dest,
            dest_need: nelems,
            source,
            source_need: nelems,
            root,
            op: 0,
            strides: (1, 1),
        };
        if is_small::<T>(team, nelems) {
            return self.coll_small(
                team,
                &call,
                nelems,
                ready,
                |part| {
                    // A root whose source is short took no snapshot: the call is refused
                    // alike on every member after the exchange (`Call::check`).
                    if is_root && data.len() == part.len() {
                        part.copy_from_slice(&data);
                    }
                    Ok(())
                },
                |parts| self.finish_small(dest, &[(0, parts[root])]),
            );
        }
        self.coll_agree(team, &call, ready)?;
        let moved = (|| {
            if is_root && nelems > 0 {
                for i in 0..team.n_pes() {
                    let pe = team.world_pe(i).expect("member index below n_pes");
                    self.put_nbi(dest.slice(0..nelems), &data, pe)?;
                }
            }
            Ok(())
        })();
        self.coll_status(team, Coll::Broadcast, moved)
    }

    /// Concatenates every member's `nelems`-element `source` into `dest` on every member,
    /// in team order (`dest` holds `n_pes * nelems` elements; OpenSHMEM `shmem_fcollect`).
    pub fn fcollect<T: Element>(
        &self,
        team: &Team,
        dest: SymPtr<T>,
        source: SymPtr<T>,
        nelems: usize,
    ) -> Result<()> {
        zero_sized::<T>("fcollect")?;
        self.exchange_blocks(Coll::Fcollect, team, dest, source, nelems)
    }

    /// Block `j` (of `nelems` elements) of `source` goes to member `j`'s `dest` at block
    /// `my index` (OpenSHMEM `shmem_alltoall`): both hold `n_pes * nelems` elements.
    pub fn alltoall<T: Element>(
        &self,
        team: &Team,
        dest: SymPtr<T>,
        source: SymPtr<T>,
        nelems: usize,
    ) -> Result<()> {
        zero_sized::<T>("alltoall")?;
        self.exchange_blocks(Coll::Alltoall, team, dest, source, nelems)
    }

    /// [`Pe::alltoall`] with strides (OpenSHMEM `shmem_alltoalls`; in elements, at least
    /// 1): element `k` of the block for member `j` is `source[(j * nelems + k) * sst]`,
    /// and it lands in member `j`'s `dest[(i * nelems + k) * dst]`, `i` being this
    /// member's index. `source` needs `(n_pes * nelems - 1) * sst + 1` elements, `dest`
    /// `(n_pes * nelems - 1) * dst + 1`; the elements of `dest` between the strides are
    /// left as they were.
    pub fn alltoalls<T: Element>(
        &self,
        team: &Team,
        dest: SymPtr<T>,
        source: SymPtr<T>,
        dst: usize,
        sst: usize,
        nelems: usize,
    ) -> Result<()> {
        zero_sized::<T>("alltoalls")?;
        let coll = Coll::Alltoalls;
        let total = team.n_pes().saturating_mul(nelems);
        // Elements a side spans; usize::MAX (never long enough) when it overflows.
        let span = |stride: usize| match total {
            0 => 0,
            t => (t - 1)
                .checked_mul(stride)
                .and_then(|x| x.checked_add(1))
                .unwrap_or(usize::MAX),
        };
        let (dest_need, source_need) = (span(dst), span(sst));
        // Step 1: the source's whole span (copied first when it overlaps dest).
        let (whole, ready) = if dst == 0 || sst == 0 {
            let e = Error::InvalidArgument(format!(
                "alltoalls: strides must be at least 1 element (dest stride {dst}, source \
                 stride {sst})"
            ));
            (Snapshot::Copy(Vec::new()), Err(e))
        } else {
            self.snapshot(coll, source, source_need, dest, dest_need)
        };
        let call = Call {
            coll,
            dest,
            dest_need,
            source,
            source_need,
            root: 0,
            op: 0,
            strides: (dst, sst),
        };
        self.coll_agree(team, &call, ready)?;
        // Every sst-th element of the snapshot, taken after step 1's quiet (this PE's
        // earlier puts to its own source, through the proxy, land only then).
        let picked: Vec<T>;
        let data: &[T] = if sst == 1 {
            &whole
        } else {
            picked = whole.iter().step_by(sst).copied().collect();
            &picked
        };
        let block = |j: usize| &data[j * nelems..(j + 1) * nelems];
        let at = team.my_pe() * nelems;
        let moved = if nelems == 0 {
            Ok(())
        } else if dst == 1 {
            self.push_blocks(team, dest.slice(at..at + nelems), block)
        } else {
            // Strided: one element at a time (iput), from the next member on as in
            // `push_blocks`.
            let from = dest.slice(at * dst..dest_need);
            let (n, me) = (team.n_pes(), team.my_pe());
            (1..=n).try_for_each(|k| {
                let j = (me + k) % n;
                let pe = team.world_pe(j).expect("member index below n_pes");
                self.iput(from, block(j), dst, 1, nelems, pe)
            })
        };
        self.coll_status(team, coll, moved)
    }

    /// Concatenates every member's `nelems` elements of `source` into `dest` on every
    /// member, in team order; unlike [`Pe::fcollect`], `nelems` may differ between members
    /// (OpenSHMEM `shmem_collect`). `dest` needs the sum of every member's `nelems`.
    pub fn collect<T: Element>(
        &self,
        team: &Team,
        dest: SymPtr<T>,
        source: SymPtr<T>,
        nelems: usize,
    ) -> Result<()> {
        zero_sized::<T>("collect")?;
        let coll = Coll::Collect;
        // Step 1. The total is known only after step 2, so the whole dest counts as
        // written when deciding whether the source must be copied first.
        let (data, ready) = self.snapshot(coll, source, nelems, dest, dest.len());
        // Step 2: an exchange, not an agreement: the counts differ by design. The first
        // four words must agree; the rest is each member's own.
        let args = [
            coll as u64,
            type_code::<T>(),
            size_of::<T>() as u64,
            dest.offset() as u64,
            dest.len() as u64,
            source.offset() as u64,
            nelems as u64,
            ready.is_ok() as u64,
        ];
        let show = |v: &[u64]| {
            let a = |i: usize| v.get(i).copied().unwrap_or(u64::MAX);
            format!(
                "{} of type {:#x} ({} B), dest at {:#x} ({} elements), source at {:#x}, \
                 nelems {}, ready: {}",
                Coll::from_code(a(0)),
                a(1),
                a(2),
                a(3),
                a(4),
                a(5),
                a(6),
                a(7) == 1
            )
        };
        let all = self.gather_in(team, coll.name(), &args, show);
        ready?;
        let all = all?;
        if all.iter().any(|r| r[..4] != args[..4] || r[7] != 1) {
            return Err(crate::pe::mismatch(team, coll.name(), &all, |r| show(r)));
        }
        // Every member computes the same offsets and the same verdicts from the same records.
        let counts: Vec<usize> = all.iter().map(|r| r[6] as usize).collect();
        let total = counts
            .iter()
            .try_fold(0usize, |t, &c| t.checked_add(c))
            .unwrap_or(usize::MAX);
        if let Some((i, r)) = all
            .iter()
            .enumerate()
            .find(|(_, r)| (r[4] as usize) < total)
        {
            return Err(Error::InvalidArgument(format!(
                "collect: dest on PE {} has {} elements, the members' nelems ({}) sum to {total}",
                team.world_pe(i).expect("member index below n_pes"),
                r[4],
                counts
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(" + ")
            )));
        }
        let me = team.my_pe();
        let at: usize = counts[..me].iter().sum();
        let moved = self.push_blocks(team, dest.slice(at..at + nelems), |_| &data[..]);
        self.coll_status(team, coll, moved)
    }

    /// fcollect (every member gets this member's one source block) and alltoall (member j
    /// gets source block j): the frame, with block `my index` of every dest written.
    fn exchange_blocks<T: Element>(
        &self,
        coll: Coll,
        team: &Team,
        dest: SymPtr<T>,
        source: SymPtr<T>,
        nelems: usize,
    ) -> Result<()> {
        let total = team.n_pes().saturating_mul(nelems);
        let per_member = matches!(coll, Coll::Alltoall);
        let source_need = if per_member { total } else { nelems };
        let (data, ready) = self.snapshot(coll, source, source_need, dest, total);
        let call = Call {
            coll,
            dest,
            dest_need: total,
            source,
            source_need,
            root: 0,
            op: 0,
            strides: (1, 1),
        };
        let me = team.my_pe();
        if is_small::<T>(team, source_need) {
            return self.coll_small(
                team,
                &call,
                source_need,
                ready,
                |part| {
                    part.copy_from_slice(&data);
                    Ok(())
                },
                |parts| {
                    let from = if per_member { me * nelems } else { 0 };
                    let blocks: Vec<(usize, &[T])> = parts
                        .iter()
                        .enumerate()
                        .map(|(j, p)| (j * nelems, &p[from..from + nelems]))
                        .collect();
                    self.finish_small(dest, &blocks)
                },
            );
        }
        self.coll_agree(team, &call, ready)?;
        let at = me * nelems;
        let moved = self.push_blocks(team, dest.slice(at..at + nelems), |j| {
            if per_member {
                &data[j * nelems..(j + 1) * nelems]
            } else {
                &data[..]
            }
        });
        self.coll_status(team, coll, moved)
    }

    /// `dest[i] = source[i] op source[i] op ...` over every member's `source`, on every
    /// member (OpenSHMEM `shmem_TYPE_OP_reduce`). `dest` and `source` may be the same
    /// array. Integer sum and prod wrap. Floats are combined in team order, so every
    /// member computes the same bits; max/min follow Rust's `f64::max` (a NaN operand is
    /// ignored unless both are NaN), which OpenSHMEM leaves unspecified.
    pub fn reduce<T: Reducible>(
        &self,
        team: &Team,
        dest: SymPtr<T>,
        source: SymPtr<T>,
        nreduce: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let call = Call {
            coll: Coll::Reduce,
            dest,
            dest_need: nreduce,
            source,
            source_need: nreduce,
            root: 0,
            op: op.code(),
            strides: (1, 1),
        };
        if is_small::<T>(team, nreduce) {
            // This member's source, read after the quiet (a short one is refused alike
            // by every member once the arguments agree).
            return self.coll_small(
                team,
                &call,
                nreduce,
                self.try_quiet(),
                |part| match source.len() >= nreduce {
                    true => self.get(part, source.slice(0..nreduce), self.my_pe()),
                    false => Ok(()),
                },
                |parts| {
                    reduce_checks::<T>(dest, source, nreduce, op)?;
                    // In team order from member 0, as the large path combines.
                    let mut acc = parts[0].to_vec();
                    for p in &parts[1..] {
                        combine_into(&mut acc, p, op);
                    }
                    self.finish_small(dest, &[(0, &acc)])
                },
            );
        }
        self.coll_agree(team, &call, self.try_quiet())?;
        reduce_checks::<T>(dest, source, nreduce, op)?;
        // Reduce-scatter then allgather: member `me` combines chunk `me` of every source (in
        // team order, so every element gets the same bits as a full pull would), then
        // pushes that chunk into every member's dest. Each member reads and writes
        // nreduce elements in all, instead of reading n * nreduce. The chunk goes through
        // in pieces of at most `REDUCE_PIECE_BYTES`, in two buffers this thread keeps.
        let (n, me) = (team.n_pes(), team.my_pe());
        // In u128: nreduce is not yet known to fit the heap (the reads check that).
        let chunk = |m: usize| (m as u128 * nreduce as u128 / n as u128) as usize;
        let (lo, hi) = (chunk(me), chunk(me + 1));
        // Element i of every source is read only by the member whose chunk holds i, and it
        // has read all of them before it writes dest[i] anywhere: dest may be source with
        // no agreement between the reads and the writes. A member whose read failed writes
        // no more pieces and reports the failure in the completion exchange (dest is then
        // undefined on every member).
        let written = with_reduce_scratch::<T, _>(|acc_buf, theirs_buf| {
            let mut at = lo;
            while at < hi {
                let end = (at + acc_buf.len()).min(hi);
                let (acc, theirs) = (&mut acc_buf[..end - at], &mut theirs_buf[..end - at]);
                let piece = (|| {
                    for i in 0..n {
                        let pe = team.world_pe(i).expect("member index below n_pes");
                        let into = if i == 0 { &mut *acc } else { &mut *theirs };
                        self.get(into, source.slice(at..end), pe)?;
                        if i > 0 {
                            combine_into(acc, theirs, op);
                        }
                    }
                    self.push_blocks(team, dest.slice(at..end), |_| &acc[..])
                })();
                // put_nbi may read its source until the next quiet (today every transport
                // copies it before returning): the next piece overwrites the buffer, and
                // after a failure the caller may free it (a fresh pair) or lend it again.
                piece.and(self.try_quiet())?;
                at = end;
            }
            Ok(())
        });
        self.coll_status(team, Coll::Reduce, written)
    }
}

#[cfg(test)]
mod tests {
    use super::Coll;
    use crate::config::Settings;
    use crate::error::Error;
    use crate::pe::run_threads;

    /// Step 4 on a team of the odd world PEs (1, 3, 5) of 6: members 1 and 5 report a
    /// failed data phase; each returns its own error, member 3 a `CollectiveFailed` naming
    /// world PEs 1 and 5; the even PEs, not in the team, take no part.
    #[test]
    fn a_failed_data_phase_is_named_on_every_member() {
        let settings = Settings::from_lookup(|_| None).expect("default settings");
        let out = run_threads(6, settings, |pe| {
            let world = pe.world().clone();
            let odds = pe.team_split_strided(&world, 1, 2, 3)?;
            let Some(odds) = odds else {
                return Ok(None);
            };
            let done = match pe.my_pe() {
                1 | 5 => Err(Error::InvalidArgument(format!("part of PE {}", pe.my_pe()))),
                _ => Ok(()),
            };
            let r = pe.coll_status(&odds, Coll::Fcollect, done);
            pe.team_destroy(odds)?;
            Ok(Some(r))
        })
        .expect("threads ran");
        for (p, r) in out.into_iter().enumerate() {
            let r = r.expect("PE ran");
            match (p, r) {
                (0 | 2 | 4, None) => {}
                (1 | 5, Some(Err(Error::InvalidArgument(m)))) => {
                    assert_eq!(m, format!("part of PE {p}"))
                }
                (3, Some(Err(e @ Error::CollectiveFailed { .. }))) => {
                    assert!(
                        matches!(&e, Error::CollectiveFailed { op: "fcollect", failed } if failed == &[1, 5])
                    );
                    assert_eq!(
                        e.to_string(),
                        "collective fcollect failed on PEs 1 and 5: moving its data failed \
                         there (each returns its own error); dest is undefined on every member"
                    );
                }
                (p, r) => panic!("PE {p}: unexpected {r:?}"),
            }
        }
    }

    /// A member's chunk larger than a reduce piece goes through in several pieces, with
    /// exact results out of place and in place, for 8- and 1-byte elements (each both ways)
    /// and counts the members do not divide.
    #[test]
    fn reduce_over_several_pieces_is_exact() {
        use super::{ReduceOp, REDUCE_PIECE_BYTES};
        let mut settings = Settings::from_lookup(|_| None).expect("default settings");
        settings.symmetric_size = 32 << 20;
        let n = 3;
        // Each member's chunk: about 2.4 pieces of u64.
        let count = n * (REDUCE_PIECE_BYTES / 8) * 12 / 5 + 1;
        // Each member's chunk: about 1.2 pieces of u8.
        let bytes = n * REDUCE_PIECE_BYTES * 6 / 5 + 2;
        let v64 = |p: usize, i: usize| {
            (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((p as u64) << 40)
        };
        let v8 = |p: usize, i: usize| (v64(p, i) >> 17) as u8;
        let out = run_threads(n, settings, |pe| {
            let world = pe.world().clone();
            let me = pe.my_pe();
            let (src, dst) = (pe.calloc::<u64>(count)?, pe.calloc::<u64>(count)?);
            let mine: Vec<u64> = (0..count).map(|i| v64(me, i)).collect();
            pe.put(src, &mine, me)?;
            pe.reduce(&world, dst, src, count, ReduceOp::Sum)?;
            let mut sum = vec![0u64; count];
            pe.get(&mut sum, dst, me)?;
            // In place: dest is the source.
            pe.reduce(&world, src, src, count, ReduceOp::Xor)?;
            let mut xor = vec![0u64; count];
            pe.get(&mut xor, src, me)?;
            let (a, b) = (pe.calloc::<u8>(bytes)?, pe.calloc::<u8>(bytes)?);
            let mine: Vec<u8> = (0..bytes).map(|i| v8(me, i)).collect();
            pe.put(a, &mine, me)?;
            pe.reduce(&world, b, a, bytes, ReduceOp::Max)?;
            let mut max = vec![0u8; bytes];
            pe.get(&mut max, b, me)?;
            // In place, u8: the max again from `a` into `a`.
            pe.reduce(&world, a, a, bytes, ReduceOp::Max)?;
            let mut max_in_place = vec![0u8; bytes];
            pe.get(&mut max_in_place, a, me)?;
            assert_eq!(max_in_place, max, "PE {me}: u8 max in place");
            Ok((sum, xor, max))
        })
        .expect("threads ran");
        for (p, r) in out.into_iter().enumerate() {
            let (sum, xor, max) = r.expect("PE ran");
            for i in 0..count {
                let want = (0..n).fold(0u64, |s, q| s.wrapping_add(v64(q, i)));
                assert_eq!(sum[i], want, "PE {p}: sum element {i}");
                let want = (0..n).fold(0u64, |s, q| s ^ v64(q, i));
                assert_eq!(xor[i], want, "PE {p}: in-place xor element {i}");
            }
            for (i, &m) in max.iter().enumerate() {
                let want = (0..n).map(|q| v8(q, i)).max().unwrap();
                assert_eq!(m, want, "PE {p}: u8 max element {i}");
            }
        }
    }

    /// A user-defined element aligned past the kept buffers' 16 bytes goes through fresh
    /// buffers, with exact sums.
    #[test]
    fn reduce_of_a_32_byte_aligned_element_is_exact() {
        use super::{ReduceOp, Reducible};
        #[derive(Clone, Copy, Debug, PartialEq)]
        #[repr(C, align(32))]
        struct Wide([u64; 4]);
        // SAFETY: four u64 words (32 bytes, no padding); every bit pattern is a value.
        unsafe impl crate::types::Element for Wide {}
        impl Reducible for Wide {
            fn combine(a: Self, b: Self, op: ReduceOp) -> Option<Self> {
                (op == ReduceOp::Sum)
                    .then(|| Wide(std::array::from_fn(|i| a.0[i].wrapping_add(b.0[i]))))
            }
        }
        let settings = Settings::from_lookup(|_| None).expect("default settings");
        let w = |p: usize, i: usize| Wide(std::array::from_fn(|k| (p * 1000 + i * 10 + k) as u64));
        let count = 11;
        let out = run_threads(3, settings, |pe| {
            let me = pe.my_pe();
            let (src, dst) = (pe.calloc::<Wide>(count)?, pe.calloc::<Wide>(count)?);
            let mine: Vec<Wide> = (0..count).map(|i| w(me, i)).collect();
            pe.put(src, &mine, me)?;
            pe.reduce(pe.world(), dst, src, count, ReduceOp::Sum)?;
            let mut got = vec![Wide([0; 4]); count];
            pe.get(&mut got, dst, me)?;
            Ok(got)
        })
        .expect("threads ran");
        for (p, r) in out.into_iter().enumerate() {
            let got = r.expect("PE ran");
            for (i, g) in got.iter().enumerate() {
                let want = Wide(std::array::from_fn(|k| (0..3).map(|q| w(q, i).0[k]).sum()));
                assert_eq!(*g, want, "PE {p}: element {i}");
            }
        }
    }

    /// Every member completed: Ok on every member.
    #[test]
    fn a_completed_data_phase_is_ok_everywhere() {
        let settings = Settings::from_lookup(|_| None).expect("default settings");
        let out = run_threads(3, settings, |pe| {
            pe.coll_status(pe.world(), Coll::Broadcast, Ok(()))
        })
        .expect("threads ran");
        for r in out {
            r.expect("completed on every member");
        }
    }
}
