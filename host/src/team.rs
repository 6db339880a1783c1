//! Teams: ordered subsets of the world's PEs with their own numbering and barrier
//! (OpenSHMEM 1.5 teams: world, node-shared, `split_strided`, `translate_pe`).
//!
//! Each team owns a barrier *slot* in the runtime region of every member's heap; the slot
//! index is agreed at creation (the lowest slot free on every member), so teams that share
//! PEs never share counters. Barriers among node-local members are dissemination barriers
//! over those counters (p2p atomics); teams with members on other nodes fall back to the
//! bootstrap.

use crate::atomic::AtomicWord;
use crate::bootstrap::Group;
use crate::error::{Error, Result};
use crate::heap::{psync_offset, PSYNC_WORDS, TEAM_SLOTS};
use crate::pe::{describe_records, fnv, le_u64, Pe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A team handle. Cheap to clone; all clones are the same team.
#[derive(Clone, Debug)]
pub struct Team {
    inner: Arc<TeamInner>,
}

#[derive(Debug)]
struct TeamInner {
    uid: u64,
    /// World ranks of the members, in team order.
    members: Vec<u32>,
    /// This PE's index in `members`, if it is a member.
    my_index: usize,
    slot: usize,
    /// Barriers this PE has entered on this team (dissemination epoch).
    epoch: AtomicU64,
    /// Teams split from this one so far (names children deterministically).
    splits: AtomicU64,
    /// Agreements (`Pe::agree_in`) this PE has made on this team over the heap.
    agreements: AtomicU64,
    /// All members' heaps are mapped here: barriers can use p2p counters.
    p2p: AtomicBool,
    /// The PE this handle belongs to (`Pe::team_owner`): with PEs as threads of one
    /// process a handle could reach another PE, whose calls would then count as this
    /// PE's on the team's shared counters.
    owner: u64,
    /// `team_destroy` ran on some clone of this handle.
    destroyed: AtomicBool,
    /// Set by the first barrier or collective on this team that failed on this PE in a
    /// way that leaves the members' counters out of step (a timeout, a transport error):
    /// what failed. Every later barrier or collective on the team is refused with it
    /// (docs/runtime.md, "Teams"); splits and `team_destroy` still work.
    broken: std::sync::OnceLock<String>,
}

impl Team {
    pub(crate) fn new(
        uid: u64,
        members: Vec<u32>,
        world_rank: usize,
        slot: usize,
        p2p: bool,
        owner: u64,
    ) -> Team {
        let my_index = members
            .iter()
            .position(|&m| m as usize == world_rank)
            .expect("a team is only built on its members");
        Team {
            inner: Arc::new(TeamInner {
                uid,
                members,
                my_index,
                slot,
                epoch: AtomicU64::new(0),
                splits: AtomicU64::new(0),
                agreements: AtomicU64::new(0),
                p2p: AtomicBool::new(p2p),
                owner,
                destroyed: AtomicBool::new(false),
                broken: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Whether every member's heap is mapped here (barriers and agreements use the heap).
    pub(crate) fn p2p(&self) -> bool {
        // Relaxed: written once during init, before the Pe is shared.
        self.inner.p2p.load(Ordering::Relaxed)
    }

    /// The sequence number of this PE's next agreement on the team (1, 2, ...): every
    /// member counts the same sequence, as they make the same collective calls.
    pub(crate) fn next_agreement(&self) -> u64 {
        // Relaxed: a counter of this PE's own calls (collectives are made by one thread
        // at a time per PE); the barrier orders what the records hold.
        self.inner.agreements.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn set_p2p(&self, p2p: bool) {
        // Relaxed: written once during init, before the Pe is shared.
        self.inner.p2p.store(p2p, Ordering::Relaxed);
    }

    /// This PE's number in the team.
    pub fn my_pe(&self) -> usize {
        self.inner.my_index
    }
    /// Number of PEs in the team.
    pub fn n_pes(&self) -> usize {
        self.inner.members.len()
    }
    /// World ranks of the members, in team order.
    pub fn members(&self) -> &[u32] {
        &self.inner.members
    }
    /// World rank of team member `i`.
    pub fn world_pe(&self, i: usize) -> Option<usize> {
        self.inner.members.get(i).map(|&m| m as usize)
    }
    /// The team's unique id (0 for the world team).
    pub fn uid(&self) -> u64 {
        self.inner.uid
    }
    /// Barrier slot in the runtime region.
    pub fn slot(&self) -> usize {
        self.inner.slot
    }

    pub(crate) fn group(&self) -> Group {
        Group {
            uid: self.inner.uid,
            members: self.inner.members.clone(),
        }
    }

    /// Number `pe` of team `self`, as numbered in team `dest` (OpenSHMEM
    /// `shmem_team_translate_pe`); None when it is not a member of `dest` or out of range.
    pub fn translate_pe(&self, pe: usize, dest: &Team) -> Option<usize> {
        let w = *self.inner.members.get(pe)?;
        dest.inner.members.iter().position(|&m| m == w)
    }
}

/// First word of a team split's record, so that a split meeting another bootstrap
/// agreement (the other split; an allocation's agreement on a team whose agreements go
/// through the bootstrap) on the same parent is a mismatch on every member rather than
/// arguments read from the wrong record. (On p2p teams allocations agree through the
/// heap, so a split meeting one is not seen by either side: both time out.) (Before 2026-12-07 a strided split
/// meeting a 2-D split could pass on one side with the other's words as its arguments.)
const SPLIT_STRIDED: u64 = u64::from_le_bytes(*b"tsplit-s");
const SPLIT_2D: u64 = u64::from_le_bytes(*b"tsplit-2");
const ANOTHER_CALL: &str = "another collective call (not this split)";

/// A split's record: its tag, then `words`.
fn split_record(tag: u64, words: &[u64]) -> Vec<u8> {
    std::iter::once(tag)
        .chain(words.iter().copied())
        .flat_map(u64::to_le_bytes)
        .collect()
}

/// Each member's words, when its record is exactly a `tag` record of `W` words; None for a
/// record of another call.
fn split_records<const W: usize>(all: &[Vec<u8>], tag: u64) -> Vec<Option<[u64; W]>> {
    all.iter()
        .map(|b| {
            if b.len() != 8 * (W + 1) || le_u64(&b[..8]) != tag {
                return None;
            }
            let mut a = [0u64; W];
            for (i, c) in b[8..].chunks_exact(8).enumerate() {
                a[i] = le_u64(c);
            }
            Some(a)
        })
        .collect()
}

impl Pe {
    /// Collective over `parent`: a new team of the parent's PEs `start, start+stride, ...`
    /// (`size` of them). Every parent member must pass the same arguments. Members get
    /// `Some(team)`, the other parent PEs `None` (OpenSHMEM's SHMEM_TEAM_INVALID).
    pub fn team_split_strided(
        &self,
        parent: &Team,
        start: usize,
        stride: usize,
        size: usize,
    ) -> Result<Option<Team>> {
        self.usable_team(parent, "team_split_strided")?;
        let free_mask = !*self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mine = [start as u64, stride as u64, size as u64, free_mask];
        let all = self
            .boot()
            .allgather(&parent.group(), &split_record(SPLIT_STRIDED, &mine));
        // A split that timed out met members at another call of the parent (a barrier or
        // agreement whose signals may then satisfy this PE's next one): out of step.
        let all = self.note_team_failure(parent, "team_split_strided", all)?;
        let got = split_records::<4>(&all, SPLIT_STRIDED);
        if got.iter().any(|v| v.is_none_or(|v| v[..3] != mine[..3])) {
            let args: Vec<Option<[u64; 3]>> =
                got.iter().map(|v| v.map(|v| [v[0], v[1], v[2]])).collect();
            let detail = describe_records(parent.members(), &args, |v| match v {
                Some(v) => format!("start {} stride {} size {}", v[0], v[1], v[2]),
                None => ANOTHER_CALL.to_string(),
            });
            return Err(Error::CollectiveMismatch {
                op: "team_split_strided",
                detail,
            });
        }
        let vals: Vec<[u64; 4]> = got.into_iter().flatten().collect();
        let n = parent.n_pes();
        let last = size
            .checked_sub(1)
            .and_then(|s| s.checked_mul(stride))
            .and_then(|x| x.checked_add(start));
        if size == 0 || stride == 0 || last.is_none_or(|l| l >= n) {
            return Err(Error::InvalidArgument(format!(
                "team_split_strided(start {start}, stride {stride}, size {size}) does not fit a \
                 parent team of {n} PEs (needs size >= 1, stride >= 1, start + (size-1)*stride < {n})"
            )));
        }
        let idx: Vec<usize> = (0..size).map(|i| start + i * stride).collect();
        let mask = idx.iter().fold(u64::MAX, |m, &i| m & vals[i][3]);
        // Every parent PE advances the parent's split counter, members or not, so that the
        // next split's uid agrees everywhere.
        let nth = parent.inner.splits.fetch_add(1, Ordering::Relaxed);
        if mask == 0 {
            return Err(Error::InvalidArgument(format!(
                "team_split_strided: all {TEAM_SLOTS} team slots are in use on some member; \
                 destroy unused teams"
            )));
        }
        let slot = mask.trailing_zeros() as usize;
        let members: Vec<u32> = idx.iter().map(|&i| parent.members()[i]).collect();
        if !members.contains(&(self.my_pe() as u32)) {
            return Ok(None);
        }
        *self.slots.lock().unwrap_or_else(|e| e.into_inner()) |= 1u64 << slot;
        Ok(Some(self.child_team(parent, &[nth], members, slot)))
    }

    /// A team split from `parent` (this PE among `members`): its uid derives from the
    /// parent's uid and `key` (the split's number, then what tells its teams apart), so
    /// every member computes the same without exchanging it.
    fn child_team(&self, parent: &Team, key: &[u64], members: Vec<u32>, slot: usize) -> Team {
        let bytes: Vec<u8> = std::iter::once(parent.uid())
            .chain(key.iter().copied())
            .flat_map(u64::to_le_bytes)
            .collect();
        let uid = fnv(&bytes) & !(1 << 63) | 1; // never 0 (world) nor a node-team uid
        let p2p = members.iter().all(|&m| self.is_local(m as usize));
        Team::new(uid, members, self.my_pe(), slot, p2p, self.team_owner)
    }

    /// Refuses a team handle this PE cannot use: another PE's (PEs as threads of one
    /// process), or one that `team_destroy` released (through any of its clones).
    pub(crate) fn usable_team(&self, team: &Team, op: &str) -> Result<()> {
        if team.inner.owner != self.team_owner {
            return Err(Error::InvalidArgument(format!(
                "{op}: PE {} passed a handle of team {:#x} that belongs to another PE (world PE \
                 {}): each PE uses its own handle of a team",
                self.my_pe(),
                team.uid(),
                team.inner.members[team.inner.my_index]
            )));
        }
        // Acquire: pairs with team_destroy's swap.
        if team.inner.destroyed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(format!(
                "{op}: team {:#x} was destroyed",
                team.uid()
            )));
        }
        Ok(())
    }

    /// [`Pe::usable_team`] for a barrier or collective: also refused once an earlier one
    /// broke the team on this PE ([`Pe::note_team_failure`]).
    pub(crate) fn intact_team(&self, team: &Team, op: &str) -> Result<()> {
        self.usable_team(team, op)?;
        match team.inner.broken.get() {
            None => Ok(()),
            Some(cause) => Err(Error::TeamBroken {
                op: op.to_string(),
                team: team.uid(),
                cause: cause.clone(),
                predefined: team.slot() < 2,
            }),
        }
    }

    /// Passes `r` through; an error that leaves `team`'s counters out of step between its
    /// members ([`Error::breaks_team`]) first marks the team broken on this PE, once (the
    /// first cause is kept). A team of one has nobody to be out of step with.
    pub(crate) fn note_team_failure<R>(&self, team: &Team, op: &str, r: Result<R>) -> Result<R> {
        mark_broken_if(team, op, r, Error::breaks_team)
    }

    /// [`Pe::note_team_failure`] for an error from inside a p2p barrier or exchange, after
    /// this PE's counters moved on (its epoch or agreement number taken, signals sent):
    /// any error leaves the team out of step there, a peer's death or an unreachable
    /// peer included.
    pub(crate) fn note_out_of_step<R>(&self, team: &Team, op: &str, r: Result<R>) -> Result<R> {
        mark_broken_if(team, op, r, |_| true)
    }

    /// Collective over `parent`: splits it into a 2-D grid of `xrange` columns, parent
    /// member i at x = i % xrange, y = i / xrange, and returns this PE's two teams
    /// (OpenSHMEM `shmem_team_split_2d`): the x-axis team (the PEs of its row, numbered by
    /// x) and the y-axis team (the PEs of its column, numbered by y). When the parent's
    /// size is not a multiple of `xrange` the last row is shorter, and so are the columns
    /// past its end; an `xrange` above the parent's size is taken as its size (one row).
    /// Every parent member must pass the same `xrange`; the teams take two barrier slots
    /// (the same two in every row and column).
    pub fn team_split_2d(&self, parent: &Team, xrange: usize) -> Result<(Team, Team)> {
        self.usable_team(parent, "team_split_2d")?;
        let free_mask = !*self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mine = [xrange as u64, free_mask];
        let all = self
            .boot()
            .allgather(&parent.group(), &split_record(SPLIT_2D, &mine));
        // As in team_split_strided.
        let all = self.note_team_failure(parent, "team_split_2d", all)?;
        let got = split_records::<2>(&all, SPLIT_2D);
        if got.iter().any(|v| v.is_none_or(|v| v[0] != mine[0])) {
            let args: Vec<Option<u64>> = got.iter().map(|v| v.map(|v| v[0])).collect();
            let detail = describe_records(parent.members(), &args, |v| match v {
                Some(v) => format!("xrange {v}"),
                None => ANOTHER_CALL.to_string(),
            });
            return Err(Error::CollectiveMismatch {
                op: "team_split_2d",
                detail,
            });
        }
        let vals: Vec<[u64; 2]> = got.into_iter().flatten().collect();
        // Every parent PE advances the parent's split counter, as team_split_strided does.
        let nth = parent.inner.splits.fetch_add(1, Ordering::Relaxed);
        if xrange == 0 {
            return Err(Error::InvalidArgument(
                "team_split_2d: xrange must be at least 1".into(),
            ));
        }
        let n = parent.n_pes();
        let xr = xrange.min(n);
        let mask = vals.iter().fold(u64::MAX, |m, v| m & v[1]);
        if mask.count_ones() < 2 {
            return Err(Error::InvalidArgument(format!(
                "team_split_2d: needs two team slots free on every member of the parent, \
                 and {} of {TEAM_SLOTS} are; destroy unused teams",
                mask.count_ones()
            )));
        }
        let xslot = mask.trailing_zeros() as usize;
        let yslot = (mask & !(1u64 << xslot)).trailing_zeros() as usize;
        let me = parent.my_pe();
        let (x, y) = (me % xr, me / xr);
        let row: Vec<u32> = (y * xr..((y + 1) * xr).min(n))
            .map(|i| parent.members()[i])
            .collect();
        let column: Vec<u32> = (x..n).step_by(xr).map(|i| parent.members()[i]).collect();
        *self.slots.lock().unwrap_or_else(|e| e.into_inner()) |= (1u64 << xslot) | (1u64 << yslot);
        Ok((
            self.child_team(parent, &[nth, 0, y as u64], row, xslot),
            self.child_team(parent, &[nth, 1, x as u64], column, yslot),
        ))
    }

    /// The number in `dest` of the PE numbered `pe` in `src` (OpenSHMEM
    /// `shmem_team_translate_pe`); None when it is not a member of `dest`.
    pub fn team_translate_pe(&self, src: &Team, pe: usize, dest: &Team) -> Option<usize> {
        src.translate_pe(pe, dest)
    }

    /// Collective over `team`: releases its barrier slot. The world and node teams cannot
    /// be destroyed.
    pub fn team_destroy(&self, team: Team) -> Result<()> {
        if team.slot() < 2 {
            return Err(Error::InvalidArgument(
                "the world and node teams cannot be destroyed".into(),
            ));
        }
        self.usable_team(&team, "team_destroy")?;
        // Marked first, so a second destroy through a clone is refused rather than
        // releasing a slot a newer team may hold (AcqRel: the mark is seen by every later
        // use of a clone). A destroy whose barrier fails leaves the team marked: a member
        // is gone, and the team is not usable anyway.
        if team.inner.destroyed.swap(true, Ordering::AcqRel) {
            return Err(Error::InvalidArgument(format!(
                "team_destroy: team {:#x} was destroyed",
                team.uid()
            )));
        }
        // Complete this PE's signals first (through the proxy a late barrier's signal may
        // still be in flight), so none lands on a member after it reset the slot below.
        let quiet = self.try_quiet();
        // Everyone has left every barrier of this team once this returns (an allgather of
        // the quiets' outcomes, as a barrier)... On a team broken here the wait is twice
        // the timeout: this PE was refused at once, and a member may still be waiting out
        // its own timeout in the call this PE was refused (docs/runtime.md, "Teams").
        let within = if team.inner.broken.get().is_some() {
            self.timeout().saturating_mul(2)
        } else {
            self.timeout()
        };
        let all = self.boot().allgather_tagged(
            &team.group(),
            *b"destroy\0",
            &[quiet.is_ok() as u8],
            within,
        );
        quiet?;
        // A member whose quiet failed may still have a signal on its way to any member's
        // counters of this slot: then every member keeps the slot (not reset, not reused;
        // splits pick slots free on all their members).
        if all?.iter().any(|r| r.first() != Some(&1)) {
            return Ok(());
        }
        // ...so no member will signal our counters again: reset them for the next owner.
        for round in 0..PSYNC_WORDS {
            let w = self.runtime_word(self.my_pe(), psync_offset(team.slot(), round))?;
            // SAFETY: a word of our own runtime region; Relaxed suffices because the slot
            // is only reused after a later collective (team creation) orders it.
            unsafe { u64::store(w, 0, Ordering::Relaxed) };
        }
        let mut s = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        *s &= !(1u64 << team.slot());
        Ok(())
    }

    /// Barrier over `team` that also completes this PE's outstanding RMA (quiet + sync).
    /// On a team whose heaps are all mapped here (p2p), a PE whose quiet fails returns its
    /// error without the sync, so the other members do not pass the barrier believing its
    /// puts landed: they time out, the ones whose dissemination partner it is naming it,
    /// the others naming a partner stuck waiting for it (in teams of 3 or more). (Syncing
    /// anyway, tried on 2026-12-07, let them go on with data that never arrived.) After
    /// such an error the team's barrier counters are out of step, so this PE marks the
    /// team broken and refuses later barriers and collectives on it (`Error::TeamBroken`):
    /// docs/runtime.md, "Teams". Through the bootstrap (other teams) the barrier carries
    /// each member's quiet outcome: a failed quiet fails the barrier on every member at
    /// once (its own error there, `CollectiveFailed` naming it elsewhere), in step.
    pub fn team_barrier(&self, team: &Team) -> Result<()> {
        self.intact_team(team, "barrier")?;
        let quiet = self.try_quiet();
        if !team.p2p() && team.n_pes() > 1 {
            // Skipping the bootstrap barrier would leave this PE's bootstrap sequence on
            // the team one behind the others', pairing every later call with another.
            // Tagged: a member already in the team's destroy (this call refused on it,
            // the team broken there) fails this barrier instead of passing it.
            let all = self.boot().allgather_tagged(
                &team.group(),
                *b"barrier\0",
                &[quiet.is_ok() as u8],
                self.timeout(),
            );
            quiet?;
            return failed_members(team, "barrier (its quiet)", &all?);
        }
        // A quiet that fails skips the sync: the other members' barrier counters move on
        // without this PE's, so the team is out of step, whatever the error (a peer's
        // death included: a death tolerated later, as EP shrink mode does, is not sticky).
        self.note_out_of_step(team, "barrier", quiet)?;
        self.sync_team(team)
    }

    /// Synchronisation over `team` without completing RMA (OpenSHMEM `shmem_team_sync`).
    /// With p2p every put is already complete, so this differs from `team_barrier` only
    /// in the missing quiet fence; through the proxy, puts may still be in flight.
    pub fn sync_team(&self, team: &Team) -> Result<()> {
        self.sync_team_as(team, "barrier")
    }

    /// [`Pe::sync_team`], its timeout naming `what` (a collective's agreement).
    pub(crate) fn sync_team_as(&self, team: &Team, what: &str) -> Result<()> {
        self.intact_team(team, what)?;
        let r = self.sync_team_unchecked(team, what);
        if team.p2p() {
            self.note_out_of_step(team, what, r)
        } else {
            // Through the bootstrap: the root keys every call by team and sequence and
            // keeps a late member's part, so a timed-out barrier still pairs with the same
            // call of the late member (team_barrier also enters it after a failed quiet).
            // gather_in's bootstrap path is marked for another reason: after a failed
            // agreement a late member goes on into the collective's data phase.
            r
        }
    }

    fn sync_team_unchecked(&self, team: &Team, what: &str) -> Result<()> {
        let n = team.n_pes();
        if n <= 1 {
            return Ok(());
        }
        if !team.inner.p2p.load(Ordering::Relaxed) {
            return self.boot().barrier(&team.group());
        }
        // Dissemination barrier: in round r, signal member (i + 2^r) mod n and wait for
        // member (i - 2^r) mod n. Counters only grow; barrier number e waits for >= e.
        let epoch = team.inner.epoch.fetch_add(1, Ordering::Relaxed) + 1;
        let me = team.my_pe();
        let (mut dist, mut round) = (1usize, 0usize);
        while dist < n {
            let to = team.inner.members[(me + dist) % n] as usize;
            let from = team.inner.members[(me + n - dist % n) % n] as usize;
            // Release increment (p2p) or a fenced fetch-add WQE (proxy): what this PE
            // wrote before the barrier is visible to the partner that observes it.
            self.runtime_signal(to, psync_offset(team.slot(), round))?;
            let mine = self.runtime_word(self.my_pe(), psync_offset(team.slot(), round))?;
            self.wait_internal(mine, epoch, from, || {
                format!(
                    "{what} on team {:#x} (round {round}, barrier #{epoch}): the signal from PE {from}",
                    team.uid()
                )
            })?;
            dist <<= 1;
            round += 1;
        }
        Ok(())
    }

    /// `quiet` + barrier over all PEs (OpenSHMEM `shmem_barrier_all`).
    pub fn barrier_all(&self) -> Result<()> {
        self.team_barrier(self.world())
    }

    /// Barrier over all PEs without completing RMA (OpenSHMEM `shmem_sync_all`).
    pub fn sync_all(&self) -> Result<()> {
        self.sync_team(self.world())
    }
}

/// `CollectiveFailed` naming the members of `team` whose record (one per member, in team
/// order) does not start with 1, each member's "my part succeeded"; Ok when none.
pub(crate) fn failed_members<T: Copy + PartialEq + From<u8>>(
    team: &Team,
    op: &'static str,
    all: &[Vec<T>],
) -> Result<()> {
    let failed: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, r)| r.first() != Some(&T::from(1)))
        .map(|(i, _)| team.world_pe(i).expect("member index below n_pes"))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::CollectiveFailed { op, failed })
    }
}

/// Marks `team` broken on this PE (the first failure wins) when `r` is an error that
/// `breaks` and the team has other members; returns `r`.
fn mark_broken_if<R>(
    team: &Team,
    op: &str,
    r: Result<R>,
    breaks: impl Fn(&Error) -> bool,
) -> Result<R> {
    if let Err(e) = &r {
        if breaks(e) && team.n_pes() > 1 {
            let _ = team.inner.broken.set(format!("{op} failed here: {e}"));
        }
    }
    r
}
