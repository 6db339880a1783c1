//! OpenSHMEM 1.5 team collectives on CPU PEs: broadcast, fcollect, alltoall and the
//! reductions (`shmem_TYPE_OP_reduce`).
//!
//! Every call first runs `agree_in` over the team: each member must pass the same
//! arguments (operation, element size, counts, root, reduction, and the symmetric offsets
//! of dest and source), else every member gets the same `CollectiveMismatch` error naming
//! each PE's arguments. That exchange also synchronises the team, so every member's source
//! is ready and its dest is free before any data moves. Data moves with the RMA layer
//! (p2p, proxy or fabric, whatever reaches each peer), and the call ends with a
//! `team_barrier` (quiet + sync): on return dest holds the result on every member, and the
//! sources may be reused. Simple push (or, for reductions, pull) algorithms: correct on
//! any transport, not tuned.
use crate::error::{Error, Result};
use crate::pe::Pe;
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
}

impl Coll {
    fn name(self) -> &'static str {
        match self {
            Coll::Broadcast => "broadcast",
            Coll::Fcollect => "fcollect",
            Coll::Alltoall => "alltoall",
            Coll::Reduce => "reduce",
        }
    }
}

/// A zero-filled local buffer (every bit pattern of an `Element` is a value).
fn zeroed<T: Element>(n: usize) -> Vec<T> {
    // SAFETY: Element types are primitive numbers; all-zero bytes are a valid value.
    vec![unsafe { std::mem::zeroed::<T>() }; n]
}

impl Pe {
    /// The common prologue: agreement on the arguments (and so a synchronisation of the
    /// team), then the length checks, which every member makes alike.
    #[allow(clippy::too_many_arguments)]
    fn coll_begin<T: Element>(
        &self,
        team: &Team,
        coll: Coll,
        dest: SymPtr<T>,
        dest_need: usize,
        source: SymPtr<T>,
        source_need: usize,
        root: usize,
        op: u64,
    ) -> Result<()> {
        // The element type by name (FNV-1a), so that i32 and f32 differ too.
        let ty = std::any::type_name::<T>();
        let ty_code = ty.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        let args = [
            coll as u64,
            ty_code,
            std::mem::size_of::<T>() as u64,
            dest_need as u64,
            source_need as u64,
            root as u64,
            op,
            dest.offset() as u64,
            dest.len() as u64,
            source.offset() as u64,
            source.len() as u64,
        ];
        self.agree_in(team, coll.name(), &args, |v| {
            format!(
                "type {:#x} ({} B), count {} / {}, root {}, op {}, dest {} elems at {:#x}, \
                 source {} elems at {:#x}",
                v[1], v[2], v[3], v[4], v[5], v[6], v[8], v[7], v[10], v[9]
            )
        })?;
        // Every member passed the same lengths (agreed above), so these errors are the
        // same on every member.
        let short = |what: &str, have: usize, need: usize| {
            Error::InvalidArgument(format!(
                "{}: {what} has {have} elements, the call needs {need}",
                coll.name()
            ))
        };
        if dest.len() < dest_need {
            return Err(short("dest", dest.len(), dest_need));
        }
        if source.len() < source_need {
            return Err(short("source", source.len(), source_need));
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
        self.coll_begin(team, Coll::Broadcast, dest, nelems, source, nelems, root, 0)?;
        let n = team.n_pes();
        if root >= n {
            return Err(Error::InvalidArgument(format!(
                "broadcast: root {root} is not a member index of a team of {n} PEs"
            )));
        }
        if team.my_pe() == root && nelems > 0 {
            let mut data = zeroed::<T>(nelems);
            self.get(&mut data, source.slice(0..nelems), self.my_pe())?;
            for i in 0..n {
                let pe = team.world_pe(i).expect("member index below n_pes");
                self.put_nbi(dest.slice(0..nelems), &data, pe)?;
            }
        }
        self.team_barrier(team)
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
        let n = team.n_pes();
        let total = n.checked_mul(nelems).ok_or_else(|| {
            Error::InvalidArgument(format!("fcollect: {n} x {nelems} elements overflow"))
        })?;
        self.coll_begin(team, Coll::Fcollect, dest, total, source, nelems, 0, 0)?;
        if nelems > 0 {
            let mut data = zeroed::<T>(nelems);
            self.get(&mut data, source.slice(0..nelems), self.my_pe())?;
            let at = team.my_pe() * nelems;
            for i in 0..n {
                let pe = team.world_pe(i).expect("member index below n_pes");
                self.put_nbi(dest.slice(at..at + nelems), &data, pe)?;
            }
        }
        self.team_barrier(team)
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
        let n = team.n_pes();
        let total = n.checked_mul(nelems).ok_or_else(|| {
            Error::InvalidArgument(format!("alltoall: {n} x {nelems} elements overflow"))
        })?;
        self.coll_begin(team, Coll::Alltoall, dest, total, source, total, 0, 0)?;
        if nelems > 0 {
            let mut data = zeroed::<T>(total);
            self.get(&mut data, source.slice(0..total), self.my_pe())?;
            let at = team.my_pe() * nelems;
            // Start with the next member, so the members do not all write to member 0 first.
            for k in 1..=n {
                let j = (team.my_pe() + k) % n;
                let pe = team.world_pe(j).expect("member index below n_pes");
                let block = &data[j * nelems..(j + 1) * nelems];
                self.put_nbi(dest.slice(at..at + nelems), block, pe)?;
            }
        }
        self.team_barrier(team)
    }

    /// `dest[i] = source[i] op source[i] op ...` over every member's `source`, on every
    /// member (OpenSHMEM `shmem_TYPE_OP_reduce`). `dest` and `source` may be the same
    /// array. Integer sum and prod wrap; floats are combined in team order, so every
    /// member gets the same bits.
    pub fn reduce<T: Reducible>(
        &self,
        team: &Team,
        dest: SymPtr<T>,
        source: SymPtr<T>,
        nreduce: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.coll_begin(team, Coll::Reduce, dest, nreduce, source, nreduce, 0, op.code())?;
        let type_name = std::any::type_name::<T>();
        let zero = zeroed::<T>(1)[0];
        if T::combine(zero, zero, op).is_none() {
            return Err(Error::InvalidArgument(format!(
                "reduce: {} is not defined on {type_name} (bitwise reductions take integer types)",
                op.name()
            )));
        }
        let mut acc = zeroed::<T>(nreduce);
        if nreduce > 0 {
            let mut theirs = zeroed::<T>(nreduce);
            for i in 0..team.n_pes() {
                let pe = team.world_pe(i).expect("member index below n_pes");
                let into = if i == 0 { &mut acc } else { &mut theirs };
                self.get(into, source.slice(0..nreduce), pe)?;
                if i > 0 {
                    for (a, &b) in acc.iter_mut().zip(theirs.iter()) {
                        *a = T::combine(*a, b, op).expect("checked above");
                    }
                }
            }
        }
        // Every member has read every source before any dest (which may be a source) is
        // written.
        self.sync_team(team)?;
        if nreduce > 0 {
            self.put(dest.slice(0..nreduce), &acc, self.my_pe())?;
        }
        self.team_barrier(team)
    }
}
