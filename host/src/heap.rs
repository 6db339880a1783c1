//! Symmetric heap on host memory: the shared-memory segment behind each CPU PE's heap, and
//! the deterministic allocator that makes collective allocations land at the same offset on
//! every PE.
//!
//! Layout of every PE's segment (the same on all PEs):
//!
//! ```text
//! 0                    RESERVED_BYTES                                    size
//! | runtime region      | user allocations (Allocator)                    |
//! | team psync slots,   |                                                 |
//! | assist table        |                                                 |
//! ```
//!
//! The runtime region holds the barrier counters of the teams ([`TEAM_SLOTS`] slots of
//! [`PSYNC_WORDS`] words each) and the table through which a waiting PE helps copy the
//! large puts other PEs make into its heap ([`ASSIST_OFFSET`], `assist.rs`). User code
//! cannot address it: RMA on it is rejected as out of bounds.
//!
//! Segments are files in `/dev/shm` named `rshmem-<job id>-pe<rank>`: created by their owner,
//! opened by every PE of the node, and unlinked by the owner once all have mapped it, so that
//! nothing is left behind even if the job crashes later. The launcher removes any leftover of
//! a crash inside that short window by the job-id prefix. Where /dev/shm cannot hold the
//! node's heaps, a segment is a memfd instead, opened by peers as `/proc/<pid>/fd/<fd>`
//! ([`create_node_segment`]); peers check the (device, inode) they opened.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

/// Number of team barrier slots in the runtime region (world and node teams use 0 and 1).
pub const TEAM_SLOTS: usize = 64;
/// 64-bit words per slot: the dissemination rounds' counters, then agreement records
/// ([`AGREE_WORD0`]).
pub const PSYNC_WORDS: usize = 64;
/// Bytes reserved at the start of every heap for the runtime.
pub const RESERVED_BYTES: usize = 64 << 10;
/// Largest alignment a symmetric allocation may ask for.
pub const MAX_ALIGN: usize = 4096;

/// Offset of the assist table of large p2p puts (`assist.rs`), after the psync slots.
pub const ASSIST_OFFSET: usize = TEAM_SLOTS * PSYNC_WORDS * 8;

const _: () = assert!(ASSIST_OFFSET + 4096 <= RESERVED_BYTES);

/// The rounds of a team barrier use the first words of the slot (a 2^32-PE team needs 32);
/// the words from here hold the team's agreement records (`Pe::agree_in` on a team whose
/// heaps are all mapped): two halves of [`AGREE_WORDS`] words, used by turns.
pub const AGREE_WORD0: usize = 32;
/// Words of one agreement record: the call's sequence number, the argument count and up
/// to `AGREE_WORDS - 2` arguments.
pub const AGREE_WORDS: usize = 16;

const _: () = assert!(AGREE_WORD0 + 2 * AGREE_WORDS <= PSYNC_WORDS);

/// Offset of the psync counters of team slot `slot`, round `round`.
pub const fn psync_offset(slot: usize, round: usize) -> usize {
    (slot * PSYNC_WORDS + round) * 8
}

/// Path of the segment of PE `rank` in job `job_id`.
pub fn segment_path(job_id: &str, rank: usize) -> String {
    format!("/dev/shm/rshmem-{job_id}-pe{rank}")
}

/// Largest placement skew of a segment mapping (see [`mapping_skew`]).
pub const MAX_SKEW: usize = 16 << 20;

/// Where, inside its address-space reservation, the mapping of PE `rank`'s segment starts:
/// a rank-dependent multiple of 4 KiB below [`MAX_SKEW`].
///
/// Why: the kernel places large mappings at 2 MiB (or larger) alignment, so without a skew
/// the same symmetric offset in two PEs' heaps has the same virtual address bits 12..27 in
/// every mapping. AMD Zen cores tag L1 lines with a hash of exactly those linear-address
/// bits; a core that alternates between two such lines (polling its own flag, writing the
/// peer's — a ping-pong) conflicts on the tag every time. Measured on this project's EPYC
/// VMs: 8-byte ping-pong 0.075 µs with aligned mappings, 0.055 µs with skewed ones.
pub fn mapping_skew(rank: usize) -> usize {
    // A multiplicative hash spreads consecutive ranks over bits 12..23.
    ((rank as u64).wrapping_mul(0x9E37_79B9) as usize % ((MAX_SKEW >> 12) - 1)) << 12
}

/// A shared-memory segment mapped into this process.
#[derive(Debug)]
pub struct Segment {
    base: NonNull<u8>,
    len: usize,
    /// The whole address range reserved for the mapping (skew included): unmapped on drop.
    reserved: NonNull<u8>,
    reserved_len: usize,
    path: String,
}

// SAFETY: the mapping is plain shared memory owned by this value; concurrent access to its
// bytes is governed by the RMA layer (atomics for synchronisation words), not by Segment.
unsafe impl Send for Segment {}
// SAFETY: as above; Segment only hands out the base pointer.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates the segment file (exclusively, mode 0600), sizes it and maps it `skew` bytes
    /// into a fresh reservation (see [`mapping_skew`]).
    pub fn create(path: &str, len: usize, skew: usize) -> Result<Segment> {
        let shm_err = |op, source| Error::Shm {
            op,
            path: path.to_string(),
            size: len,
            source,
        };
        check_shm_space(path, len)?;
        let c = CString::new(path).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        // SAFETY: `c` is a valid NUL-terminated path; the flags create a new file or fail.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(shm_err("create", io::Error::last_os_error()));
        }
        // SAFETY: fd is the file we just opened.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: fd is open; c names the file we created.
            unsafe {
                libc::close(fd);
                libc::unlink(c.as_ptr());
            }
            return Err(shm_err("resize", e));
        }
        let seg = Self::map_fd(fd, path, len, skew);
        // SAFETY: the mapping (if any) keeps its own reference to the file.
        unsafe { libc::close(fd) };
        if seg.is_err() {
            unlink(path);
        }
        seg
    }

    /// Creates an anonymous segment (`memfd_create`), sized `len` and mapped like
    /// [`Segment::create`]. Node peers open it through the returned name's
    /// [`SegmentName::locator`] (`/proc/<pid>/fd/<fd>`) for as long as the name lives.
    /// `label` names it in `/proc/<pid>/maps` and in errors.
    pub fn create_memfd(label: &str, len: usize, skew: usize) -> Result<(Segment, SegmentName)> {
        let err = |op, source| Error::Shm {
            op,
            path: format!("memfd:{label}"),
            size: len,
            source,
        };
        let c = CString::new(label).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        // SAFETY: `c` is a valid NUL-terminated name; the result is checked below.
        let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(err("create", io::Error::last_os_error()));
        }
        // SAFETY: fd was just returned by memfd_create and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: fd is an open memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(err("resize", io::Error::last_os_error()));
        }
        let seg = Self::map_fd(fd.as_raw_fd(), &format!("memfd:{label}"), len, skew)?;
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let locator = format!("/proc/{pid}/fd/{}", fd.as_raw_fd());
        let identity = file_identity(&locator)?;
        Ok((
            seg,
            SegmentName {
                locator,
                identity,
                memfd: Some(fd),
            },
        ))
    }

    /// Opens and maps an existing segment created by another PE of this node, `skew` bytes
    /// into a fresh reservation.
    pub fn open(path: &str, len: usize, skew: usize) -> Result<Segment> {
        Self::open_inner(path, len, skew, None)
    }

    fn open_inner(
        path: &str,
        len: usize,
        skew: usize,
        identity: Option<(u64, u64)>,
    ) -> Result<Segment> {
        let c = CString::new(path).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        // SAFETY: valid path; opening an existing file read-write.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(Error::Shm {
                op: "open",
                path: path.to_string(),
                size: len,
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: libc::stat is plain old data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and st is a valid out-pointer.
        let r = unsafe { libc::fstat(fd, &mut st) };
        let found = (st.st_dev as u64, st.st_ino as u64);
        let refused = if r != 0 || (st.st_size as usize) < len {
            Some(format!("segment is {} bytes, expected {len}", st.st_size))
        } else {
            identity.filter(|&id| id != found).map(|id| {
                format!(
                    "this is not the owner's segment (device/inode {found:?}, the owner's \
                     {id:?}): PEs with one node id must share /dev/shm and the pid namespace \
                     (/proc); give PEs in other containers another RSHMEM_NODE_ID"
                )
            })
        };
        if let Some(why) = refused {
            // SAFETY: fd is open.
            unsafe { libc::close(fd) };
            return Err(Error::Shm {
                op: "open",
                path: path.to_string(),
                size: len,
                source: io::Error::new(io::ErrorKind::InvalidData, why),
            });
        }
        let seg = Self::map_fd(fd, path, len, skew);
        // SAFETY: fd is open; the mapping holds its own reference.
        unsafe { libc::close(fd) };
        seg
    }

    fn map_fd(fd: libc::c_int, path: &str, len: usize, skew: usize) -> Result<Segment> {
        let err = |op, source: io::Error| Error::Shm {
            op,
            path: path.to_string(),
            size: len,
            source: with_map_count(source),
        };
        let skew = skew.min(MAX_SKEW - 4096) & !4095;
        // Always reserve the full slack: the kernel hands out reservations top-down, so a
        // reservation of `len + skew` would end where the previous one began and cancel the
        // skew.
        let reserved_len = len + MAX_SKEW;
        // SAFETY: reserving address space only (no access, no memory committed); the result
        // is checked below.
        let r = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(err("reserve", io::Error::last_os_error()));
        }
        // SAFETY: maps `len` bytes of a file at least that long, shared, over the tail of
        // the reservation we own (MAP_FIXED replaces only our own PROT_NONE pages).
        let p = unsafe {
            libc::mmap(
                r.cast::<u8>().add(skew).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: r..r+reserved_len is the reservation made above.
            unsafe { libc::munmap(r, reserved_len) };
            return Err(err("map", e));
        }
        Ok(Segment {
            base: NonNull::new(p.cast()).expect("mmap never returns null on success"),
            len,
            reserved: NonNull::new(r.cast()).expect("mmap never returns null on success"),
            reserved_len,
            path: path.to_string(),
        })
    }

    /// Base address of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Where the mapping starts in its reservation.
    fn skew(&self) -> usize {
        self.base.as_ptr() as usize - self.reserved.as_ptr() as usize
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a segment has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file the segment was mapped from.
    pub fn path(&self) -> &str {
        &self.path
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: reserved/reserved_len describe the reservation (with the file mapping in
        // it) created by map_fd and not unmapped elsewhere.
        unsafe { libc::munmap(self.reserved.as_ptr().cast(), self.reserved_len) };
    }
}

/// What lets node peers open a PE's segment while they map it: a file in `/dev/shm` (its
/// path; removed on drop) or, where `/dev/shm` cannot hold the heap, an open memfd (opened by
/// peers as `/proc/<pid>/fd/<fd>`; closed on drop). Dropping the name never unmaps anything:
/// every mapping keeps its own reference to the memory.
#[derive(Debug)]
pub struct SegmentName {
    /// The path a node peer opens.
    locator: String,
    /// (device, inode) of the segment's file: a peer checks that the locator opened this
    /// very file (`/proc/<pid>/fd/<fd>` names another process's fd, or a wrong one, in a
    /// peer that runs in another pid namespace).
    identity: (u64, u64),
    /// The memfd, for a segment that is one.
    memfd: Option<OwnedFd>,
}

impl SegmentName {
    /// The path a node peer opens to map the segment.
    pub fn locator(&self) -> &str {
        &self.locator
    }

    /// What a node peer needs to map the segment ([`open_node_segment`]): the identity
    /// (device, inode; little-endian) and the locator.
    pub fn record(&self) -> Vec<u8> {
        let mut r = self.identity.0.to_le_bytes().to_vec();
        r.extend(self.identity.1.to_le_bytes());
        r.extend(self.locator.as_bytes());
        r
    }
}

/// (st_dev, st_ino) of the file at `path` (links followed).
fn file_identity(path: &str) -> Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| Error::Shm {
        op: "stat",
        path: path.to_string(),
        size: 0,
        source: e,
    })?;
    Ok((m.dev(), m.ino()))
}

impl Drop for SegmentName {
    fn drop(&mut self) {
        // A memfd closes with its OwnedFd.
        if self.memfd.is_none() {
            unlink(&self.locator);
        }
    }
}

/// Maps the segment a node peer published as `record` ([`SegmentName::record`]), `skew`
/// bytes into a fresh reservation; refuses a file whose (device, inode) is not the owner's.
/// Where this process maps that file already (its owner, or another PE, is a thread of this
/// process), that mapping is shared instead ([`shared_segment`]).
pub fn open_node_segment(record: &[u8], len: usize, skew: usize) -> Result<Arc<Segment>> {
    if record.len() < 16 {
        return Err(Error::InvalidArgument(format!(
            "a heap locator record of {} bytes (at least 16)",
            record.len()
        )));
    }
    let id = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let identity = (id(&record[..8]), id(&record[8..16]));
    let at = String::from_utf8_lossy(&record[16..]);
    shared_segment((identity, at.to_string()), len, skew, || {
        Segment::open_inner(&at, len, skew, Some(identity))
    })
}

/// The node segments this process maps, by the (device, inode) of their file and the path
/// their owner published (`SegmentName::locator`: the job id and rank in `/dev/shm`, or the
/// owner's pid and fd for a memfd). PEs that are threads of one process share one mapping
/// of each heap: one mapping per PE heap, where each PE mapping every node peer's heap
/// itself took n² of them (about 3·n² with the reservations' ends, so `vm.max_map_count`
/// capped a process at about 147 PEs). The locator is in the key because an inode number
/// alone may repeat while both files live (tmpfs without `inode64` wraps at 2³²). Weak:
/// the PEs (`Pe::peers`) own the mappings; an entry whose mapping is gone is never reused.
type MappedKey = ((u64, u64), String);
static MAPPED: Mutex<BTreeMap<MappedKey, Weak<Segment>>> = Mutex::new(BTreeMap::new());

/// The mapping of the segment `key` that this process holds, when it has one of `len`
/// bytes at `skew` (every PE maps a segment at its owner's skew, so they agree); otherwise
/// `make`'s, which is remembered for the next PE of this process. The lock is held while
/// `make` maps, so two PEs that open one segment at once map it once.
fn shared_segment(
    key: MappedKey,
    len: usize,
    skew: usize,
    make: impl FnOnce() -> Result<Segment>,
) -> Result<Arc<Segment>> {
    let mut mapped = MAPPED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(seg) = mapped.get(&key).and_then(Weak::upgrade) {
        if seg.len == len && seg.skew() == skew {
            return Ok(seg);
        }
    }
    Ok(remember(&mut mapped, key, Arc::new(make()?)))
}

/// Records `seg` as this process's mapping of `key` (replacing any other) and returns it.
fn remember(
    mapped: &mut BTreeMap<MappedKey, Weak<Segment>>,
    key: MappedKey,
    seg: Arc<Segment>,
) -> Arc<Segment> {
    // Entries whose mappings are gone (finished PEs, earlier jobs of this process) go now.
    mapped.retain(|_, w| w.strong_count() > 0);
    mapped.insert(key, Arc::downgrade(&seg));
    seg
}

/// A segment this PE has just created, recorded for the other PEs of this process: never
/// looked up (the new file is the owner's heap, whatever else is mapped).
fn created(seg: Segment, name: &SegmentName) -> Arc<Segment> {
    let mut mapped = MAPPED.lock().unwrap_or_else(|p| p.into_inner());
    let key = (name.identity, name.locator.clone());
    remember(&mut mapped, key, Arc::new(seg))
}

/// Creates PE `rank`'s segment of job `job_id` for its node peers to map: the file
/// [`segment_path`] in `/dev/shm`, or, when that cannot be made (no room in `/dev/shm`, as
/// in a container's default 64 MiB, or no `/dev/shm` at all), an anonymous memfd, which
/// only memory limits. `node_pes`: the PEs of this node, which all create theirs now
/// (tmpfs reserves nothing at creation, so /dev/shm must hold all of them, or a later
/// touch dies of SIGBUS). Fails only when both fail, with both reasons.
pub fn create_node_segment(
    job_id: &str,
    rank: usize,
    len: usize,
    skew: usize,
    node_pes: usize,
) -> Result<(Arc<Segment>, SegmentName)> {
    let path = segment_path(job_id, rank);
    let file = check_shm_space(&path, len.saturating_mul(node_pes.max(1)))
        .and_then(|()| Segment::create(&path, len, skew));
    let file_err = match file {
        Ok(seg) => {
            let mut name = SegmentName {
                identity: (0, 0),
                locator: path,
                memfd: None,
            };
            // Dropped on an error, the name removes the file.
            name.identity = file_identity(&name.locator)?;
            return Ok((created(seg, &name), name));
        }
        Err(e) => e,
    };
    // A memfd is limited by memory only, and only when touched: heaps the node cannot
    // back would be made, and the first large calloc would end in the OOM killer (the
    // /dev/shm path refuses them above, with an error).
    let (seg, name) = memfd_fits(len, node_pes, node_memory_bytes())
        .and_then(|()| Segment::create_memfd(&format!("rshmem-{job_id}-pe{rank}"), len, skew))
        .map_err(|m| {
            // Both reasons, without repeating the size and the path in each.
            let why = |e: &Error| match e {
                Error::Shm { op, source, .. } => format!("{op}: {source}"),
                e => e.to_string(),
            };
            Error::Shm {
                op: "create",
                path: format!("{path} (then a memfd)"),
                size: len,
                source: io::Error::other(format!("{}; memfd {}", why(&file_err), why(&m))),
            }
        })?;
    Ok((created(seg, &name), name))
}

/// Memory mappings a PE that is a thread of a process adds to it, about: its heap's mapping
/// and the two PROT_NONE ends of its reservation ([`Segment`]'s skew), its thread's stack and
/// guard, and its share of the allocator's arenas and buffers (measured: 17–19 per PE from 8
/// to 2048 PEs over p2p, and at 128 PEs over the proxy). Node peers' heaps add none: the PEs
/// of a process share one mapping of each ([`open_node_segment`]).
pub const MAPPINGS_PER_THREAD_PE: usize = 24;

/// `vm.max_map_count`, and the memory mappings this process holds now (None where
/// unreadable).
fn map_limit_and_count() -> (Option<usize>, Option<usize>) {
    let max = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok());
    let now = std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().count())
        .ok();
    (max, now)
}

/// Refuses `n` PEs as threads of this process when their mappings
/// ([`MAPPINGS_PER_THREAD_PE`] each, and through the proxy one per pair of PEs) would pass
/// what `vm.max_map_count` leaves this process: past it a mapping, or any allocation, fails
/// mid-run (`bench ep --pes 1025` aborted in malloc when every PE mapped every PE's heap).
/// `proxy`: PEs reach each other through the soft HCA, where each keeps a queue pair per
/// peer it reaches with a 1 MiB staging buffer, which the allocator may map on its own
/// (measured: merged with their neighbours, at 128 PEs; not counted on).
pub fn check_thread_pes_mappings(n: usize, proxy: bool) -> Result<()> {
    let (Some(max), Some(now)) = map_limit_and_count() else {
        return Ok(());
    };
    thread_pes_mapping_check(n, proxy, max, now)
}

/// Mappings `n` PEs as threads need ([`check_thread_pes_mappings`]).
fn thread_pes_mappings(n: usize, proxy: bool) -> usize {
    let pairs = if proxy {
        n.saturating_mul(n.saturating_sub(1))
    } else {
        0
    };
    n.saturating_mul(MAPPINGS_PER_THREAD_PE)
        .saturating_add(pairs)
}

/// [`check_thread_pes_mappings`] given the limit and the mappings the process has now.
fn thread_pes_mapping_check(n: usize, proxy: bool, max: usize, now: usize) -> Result<()> {
    let need = thread_pes_mappings(n, proxy);
    let budget = max.saturating_sub(now);
    if need <= budget {
        return Ok(());
    }
    // The most that fit (the need grows with n).
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if thread_pes_mappings(mid, proxy) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let how = if proxy {
        format!(
            ", {MAPPINGS_PER_THREAD_PE} per PE and one per pair of PEs through the proxy \
             (a queue pair's staging buffer)"
        )
    } else {
        format!(", {MAPPINGS_PER_THREAD_PE} per PE")
    };
    Err(Error::InvalidArgument(format!(
        "{n} PEs as threads of one process need about {need} memory mappings{how}, but \
         vm.max_map_count ({max}) leaves this process {budget}: run at most {lo} PEs per \
         process, start them as processes (rshmem run -n {n} -- ...), or raise \
         vm.max_map_count"
    )))
}

/// An mmap's ENOMEM is often the process's mapping count reaching `vm.max_map_count`
/// rather than memory: a process maps every PE heap of its node (3 mappings each), and each
/// PE that is a thread of it adds about 15 more ([`MAPPINGS_PER_THREAD_PE`]). Says so when
/// near.
fn with_map_count(e: io::Error) -> io::Error {
    if e.raw_os_error() != Some(libc::ENOMEM) {
        return e;
    }
    let (max, now) = map_limit_and_count();
    map_count_hint(e, max, now)
}

/// [`with_map_count`] given the limit and the count.
fn map_count_hint(e: io::Error, max: Option<usize>, now: Option<usize>) -> io::Error {
    match (max, now) {
        (Some(max), Some(now)) if e.raw_os_error() == Some(libc::ENOMEM) && now + 64 >= max => {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!(
                    "{e}: this process holds {now} memory mappings, vm.max_map_count is {max} \
                     (each heap of the node takes 3 and each PE run as a thread here about \
                     15 more: start fewer PEs per process, or raise vm.max_map_count)"
                ),
            )
        }
        _ => e,
    }
}

/// Whether the node's memory can back `node_pes` heaps of `len` bytes in memfds (`mem`:
/// [`node_memory_bytes`]; unknown is not refused).
fn memfd_fits(len: usize, node_pes: usize, mem: Option<u128>) -> Result<()> {
    let need = len as u128 * node_pes.max(1) as u128;
    match mem {
        Some(mem) if need > mem => Err(Error::Shm {
            op: "size",
            path: "a memfd".into(),
            size: len,
            source: io::Error::other(format!(
                "the node's {} PE heap(s) of {len} bytes ({need} bytes) exceed the memory \
                 that can back them ({mem} bytes: RAM plus swap under this process's cgroup \
                 limits); lower RSHMEM_SYMMETRIC_SIZE",
                node_pes.max(1)
            )),
        }),
        _ => Ok(()),
    }
}

/// The memory that can back this node's shared memory: RAM plus swap, each capped by the
/// lowest cgroup v2 limit (`memory.max`, `memory.swap.max`) on the path from this
/// process's group to the root. None where `/proc/meminfo` cannot be read.
pub fn node_memory_bytes() -> Option<u128> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    node_memory_from(&read)
}

/// [`node_memory_bytes`] over a file reader (tests give it a made-up tree).
fn node_memory_from(read: &dyn Fn(&str) -> Option<String>) -> Option<u128> {
    let meminfo = read("/proc/meminfo")?;
    let field = |name: &str| -> Option<u128> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        let kib: u128 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    };
    let mut ram = field("MemTotal:")?;
    let mut swap = field("SwapTotal:").unwrap_or(0);
    // cgroup v2: the line "0::/path" names this process's group; "max" parses as no limit.
    const ROOT: &str = "/sys/fs/cgroup";
    let group = read("/proc/self/cgroup").and_then(|c| {
        c.lines()
            .find_map(|l| l.strip_prefix("0::"))
            .map(String::from)
    });
    let mut dir = group.map(|g| format!("{ROOT}{}", g.trim_end_matches('/')));
    // The root group has no limit files in cgroup v2: it is not read.
    while let Some(d) = dir.filter(|d| d != ROOT) {
        let limit =
            |file: &str| -> Option<u128> { read(&format!("{d}/{file}"))?.trim().parse().ok() };
        if let Some(l) = limit("memory.max") {
            ram = ram.min(l);
        }
        if let Some(l) = limit("memory.swap.max") {
            swap = swap.min(l);
        }
        dir = match d.rsplit_once('/') {
            Some((parent, _)) if parent.starts_with(ROOT) => Some(parent.to_string()),
            _ => None,
        };
    }
    Some(ram + swap)
}

/// Removes a segment file; missing files are fine.
pub fn unlink(path: &str) {
    let _ = std::fs::remove_file(path);
}

/// Refuses to create a segment that /dev/shm cannot back: writing past a full tmpfs would
/// kill the process with SIGBUS instead of giving an error.
fn check_shm_space(path: &str, len: usize) -> Result<()> {
    let dir = std::path::Path::new(path)
        .parent()
        .and_then(|p| p.to_str())
        .unwrap_or("/dev/shm");
    let c = CString::new(dir).map_err(|e| Error::InvalidArgument(e.to_string()))?;
    // SAFETY: libc::statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Ok(()); // cannot tell; creation itself will report real failures
    }
    let free = st.f_bavail as u128 * st.f_frsize as u128;
    if (len as u128) > free {
        return Err(Error::Shm {
            op: "create",
            path: path.to_string(),
            size: len,
            source: io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!(
                    "{dir} has only {free} bytes ({}) free; lower RSHMEM_SYMMETRIC_SIZE or \
                     enlarge {dir}",
                    crate::doctor::human_bytes_wide(free)
                ),
            ),
        });
    }
    Ok(())
}

/// First-fit allocator over `[start, end)` with coalescing of free neighbours.
///
/// It is deterministic: the same sequence of calls gives the same offsets, which is what
/// makes collective allocation symmetric once all PEs agree on the arguments.
/// [`Allocator::free`] of an offset that is not the start of a live allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("offset {0:#x} is not the start of a live symmetric allocation")]
pub struct NotAllocated(pub usize);

#[derive(Debug, Clone)]
pub struct Allocator {
    start: usize,
    end: usize,
    /// offset → length of each free block; blocks never touch (they are merged).
    free: BTreeMap<usize, usize>,
    /// offset handed out → (block start, block length) actually reserved.
    used: BTreeMap<usize, (usize, usize)>,
}

impl Allocator {
    pub fn new(start: usize, end: usize) -> Allocator {
        let mut free = BTreeMap::new();
        if end > start {
            free.insert(start, end - start);
        }
        Allocator {
            start,
            end,
            free,
            used: BTreeMap::new(),
        }
    }

    /// Reserves `size` bytes (at least 1) aligned to `align` (a power of two ≤ MAX_ALIGN).
    /// Returns the offset, or None when no free block fits.
    pub fn alloc(&mut self, size: usize, align: usize) -> Option<usize> {
        debug_assert!(align.is_power_of_two() && align <= MAX_ALIGN);
        // Round sizes to 16 bytes so that neighbours never share a 16-byte atom.
        let size = size.max(1).checked_add(15)? & !15;
        let align = align.max(16);
        let (block, blen, off) = self.free.iter().find_map(|(&b, &l)| {
            let off = b.checked_add(align - 1)? & !(align - 1);
            (off.checked_add(size)? <= b + l).then_some((b, l, off))
        })?;
        self.free.remove(&block);
        if off > block {
            self.free.insert(block, off - block);
        }
        let tail = off + size;
        if tail < block + blen {
            self.free.insert(tail, block + blen - tail);
        }
        self.used.insert(off, (off, size));
        Some(off)
    }

    /// Returns the block at `offset` to the free list; fails if `offset` is not the start
    /// of a live allocation (nothing changes then).
    pub fn free(&mut self, offset: usize) -> std::result::Result<(), NotAllocated> {
        let (mut b, mut l) = self.used.remove(&offset).ok_or(NotAllocated(offset))?;
        // Merge with the following free block.
        if let Some(nl) = self.free.remove(&(b + l)) {
            l += nl;
        }
        // Merge with the preceding free block.
        if let Some((&pb, &pl)) = self.free.range(..b).next_back() {
            if pb + pl == b {
                self.free.remove(&pb);
                b = pb;
                l += pl;
            }
        }
        self.free.insert(b, l);
        Ok(())
    }

    /// Shrinks the allocation at `offset` in place to `size` bytes (rounded to 16 as
    /// [`Allocator::alloc`] does), returning its tail to the free list; false (nothing
    /// changes) when `offset` is not an allocation or `size` is not smaller.
    pub fn shrink(&mut self, offset: usize, size: usize) -> bool {
        let Some(&(b, l)) = self.used.get(&offset) else {
            return false;
        };
        let Some(size) = size.max(1).checked_add(15).map(|s| s & !15) else {
            return false;
        };
        let keep = offset - b + size;
        if keep >= l {
            return false;
        }
        self.used.insert(offset, (b, keep));
        // The tail [b + keep, b + l) becomes free, merged with a free block right after it
        // (nothing free can end where the tail starts: that is inside the kept block).
        let (t, mut tl) = (b + keep, l - keep);
        if let Some(nl) = self.free.remove(&(t + tl)) {
            tl += nl;
        }
        self.free.insert(t, tl);
        true
    }

    /// Usable size of the allocation at `offset`, if it is one.
    pub fn size_of(&self, offset: usize) -> Option<usize> {
        self.used.get(&offset).map(|&(_, l)| l)
    }

    /// Total free bytes.
    pub fn free_bytes(&self) -> usize {
        self.free.values().sum()
    }

    /// Largest free block.
    pub fn largest_free(&self) -> usize {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// The managed range.
    pub fn range(&self) -> (usize, usize) {
        (self.start, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrink_in_place_frees_the_tail_and_merges_it() {
        let mut a = Allocator::new(4096, 4096 + 1024);
        let x = a.alloc(512, 16).unwrap();
        let y = a.alloc(256, 16).unwrap();
        assert_eq!((x, y), (4096, 4096 + 512));
        // y's tail merges with the free block after it; x's tail stands alone.
        assert!(a.shrink(y, 100));
        assert_eq!(a.size_of(y), Some(112));
        assert_eq!(a.largest_free(), 1024 - 512 - 112);
        assert!(a.shrink(x, 16));
        assert_eq!(a.size_of(x), Some(16));
        assert_eq!(a.free_bytes(), 1024 - 16 - 112);
        // Not smaller, or not an allocation: nothing changes.
        assert!(!a.shrink(x, 16));
        assert!(!a.shrink(x, 4000));
        assert!(!a.shrink(x + 16, 1));
        // Freeing both coalesces everything back.
        a.free(x).unwrap();
        a.free(y).unwrap();
        assert_eq!(a.largest_free(), 1024);
    }

    #[test]
    fn first_fit_reuse_and_coalesce() {
        let mut a = Allocator::new(4096, 4096 + 1024);
        let x = a.alloc(100, 16).unwrap();
        let y = a.alloc(100, 16).unwrap();
        let z = a.alloc(100, 16).unwrap();
        assert_eq!((x, y, z), (4096, 4096 + 112, 4096 + 224));
        assert_eq!(a.free_bytes(), 1024 - 336);
        a.free(y).unwrap();
        // Reuse after free: the hole is taken first.
        assert_eq!(a.alloc(50, 16), Some(4096 + 112));
        a.free(4096 + 112).unwrap();
        a.free(x).unwrap();
        a.free(z).unwrap();
        // Everything coalesced back into one block.
        assert_eq!(a.free_bytes(), 1024);
        assert_eq!(a.largest_free(), 1024);
        assert_eq!(a.alloc(1024, 16), Some(4096));
        assert_eq!(a.alloc(1, 16), None);
    }

    #[test]
    fn alignment_up_to_page() {
        let mut a = Allocator::new(65536, 65536 * 4);
        let _ = a.alloc(24, 8).unwrap();
        for align in [16, 64, 256, 1024, 4096] {
            let o = a.alloc(8, align).unwrap();
            assert_eq!(o % align, 0, "align {align}");
        }
        // The gaps left by alignment are still usable.
        let small = a.alloc(16, 16).unwrap();
        assert!(small < 65536 + 4096, "gap reused: {small:#x}");
    }

    #[test]
    fn double_free_and_foreign_offsets_are_rejected() {
        let mut a = Allocator::new(0, 1 << 20);
        let x = a.alloc(64, 16).unwrap();
        assert_eq!(a.free(x + 16), Err(NotAllocated(x + 16)));
        a.free(x).unwrap();
        assert_eq!(a.free(x), Err(NotAllocated(x)));
    }

    #[test]
    fn deterministic_across_instances() {
        let ops: Vec<(bool, usize, usize)> = (0..500)
            .map(|i| (i % 3 != 2, (i * 7919) % 5000 + 1, 1 << (i % 13)))
            .collect();
        let run = || {
            let mut a = Allocator::new(65536, 8 << 20);
            let mut live = Vec::new();
            let mut trace = Vec::new();
            for &(is_alloc, size, align) in &ops {
                if is_alloc || live.is_empty() {
                    let o = a.alloc(size, align.min(MAX_ALIGN));
                    trace.push(o);
                    if let Some(o) = o {
                        live.push(o);
                    }
                } else {
                    let o = live.remove(size % live.len());
                    a.free(o).unwrap();
                }
            }
            trace
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn skews_differ_for_neighbouring_ranks() {
        let s: Vec<usize> = (0..64).map(mapping_skew).collect();
        for (i, a) in s.iter().enumerate() {
            assert_eq!(a % 4096, 0);
            assert!(*a < MAX_SKEW);
            for b in &s[i + 1..] {
                assert_ne!(a, b, "ranks share a skew");
            }
        }
    }

    #[test]
    fn segment_create_open_unlink() {
        let path = format!("/dev/shm/rshmem-unittest-{}-pe0", std::process::id());
        let s = Segment::create(&path, 1 << 20, mapping_skew(0)).unwrap();
        let o = Segment::open(&path, 1 << 20, mapping_skew(1)).unwrap();
        assert_eq!(s.base() as usize % 4096, 0);
        assert_ne!(s.base() as usize % MAX_SKEW, o.base() as usize % MAX_SKEW);
        // SAFETY: both map the same 1 MiB file; offsets are in range; single thread.
        unsafe {
            s.base().add(12345).write(0xAB);
            assert_eq!(o.base().add(12345).read(), 0xAB);
        }
        assert!(Segment::create(&path, 4096, 0).is_err(), "exclusive create");
        unlink(&path);
        assert!(!std::path::Path::new(&path).exists());
        // Still mapped after unlink.
        // SAFETY: mapping alive; in range.
        unsafe { assert_eq!(o.base().add(12345).read(), 0xAB) };
        let e = Segment::open(&path, 4096, 0).unwrap_err();
        assert!(e.to_string().contains(&path), "{e}");
    }

    /// RAM and swap, each capped by the lowest limit of the process's cgroup and its
    /// parents ("max" is no limit); a cgroup v1 machine (no limit files) gets meminfo's.
    #[test]
    fn node_memory_takes_the_lowest_cgroup_limits() {
        let tree = |files: &'static [(&'static str, &'static str)]| {
            move |p: &str| {
                files
                    .iter()
                    .find(|(k, _)| *k == p)
                    .map(|(_, v)| v.to_string())
            }
        };
        let plain = tree(&[
            (
                "/proc/meminfo",
                "MemTotal:       1000 kB\nSwapTotal:       300 kB\n",
            ),
            ("/proc/self/cgroup", "4:memory:/x\n0::/\n"),
        ]);
        assert_eq!(node_memory_from(&plain), Some(1300 * 1024));
        let nested = tree(&[
            (
                "/proc/meminfo",
                "MemTotal:       1000 kB\nMemFree: 5 kB\nSwapTotal:       300 kB\n",
            ),
            ("/proc/self/cgroup", "0::/pod/job\n"),
            ("/sys/fs/cgroup/pod/job/memory.max", "max\n"),
            ("/sys/fs/cgroup/pod/job/memory.swap.max", "0\n"),
            ("/sys/fs/cgroup/pod/memory.max", "204800\n"),
            // cgroup v2's root has no such file: a value there is not read.
            ("/sys/fs/cgroup/memory.max", "1\n"),
        ]);
        // The pod's 200 KiB and the job's zero swap.
        assert_eq!(node_memory_from(&nested), Some(200 * 1024));
        assert_eq!(node_memory_from(&tree(&[])), None);
    }

    #[test]
    fn memfd_heaps_past_the_nodes_memory_are_refused() {
        let g = 1usize << 30;
        assert!(memfd_fits(g, 4, Some(4 << 30)).is_ok());
        assert!(memfd_fits(g, 4, None).is_ok());
        let e = memfd_fits(g, 5, Some(4 << 30)).unwrap_err().to_string();
        assert!(
            e.contains("5 PE heap(s)") && e.contains("RSHMEM_SYMMETRIC_SIZE"),
            "{e}"
        );
        // A 1 TiB heap on a 64 GiB node, one PE.
        assert!(memfd_fits(1 << 40, 1, Some(64 << 30)).is_err());
    }

    /// PEs as threads: refused by name where their heap mappings pass the mapping limit,
    /// with the most that fit.
    #[test]
    fn thread_pes_past_the_mapping_limit_are_refused() {
        assert!(thread_pes_mapping_check(1024, false, 65530, 500).is_ok());
        let e = thread_pes_mapping_check(3000, false, 65530, 500)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "invalid argument: 3000 PEs as threads of one process need about 72000 memory \
             mappings, 24 per PE, but vm.max_map_count (65530) leaves this process 65030: run \
             at most 2709 PEs per process, start them as processes (rshmem run -n 3000 -- \
             ...), or raise vm.max_map_count"
        );
        // The most that fit is the most said: 2709 · 24 = 65016, 2710 · 24 = 65040.
        assert!(thread_pes_mapping_check(2709, false, 65530, 500).is_ok());
        assert!(thread_pes_mapping_check(2710, false, 65530, 500).is_err());
        // Through the proxy a pair of PEs adds one: 243 · 24 + 243 · 242 = 64638,
        // 244 · 24 + 244 · 243 = 65148.
        let e = thread_pes_mapping_check(300, true, 65530, 500)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "invalid argument: 300 PEs as threads of one process need about 96900 memory \
             mappings, 24 per PE and one per pair of PEs through the proxy (a queue pair's \
             staging buffer), but vm.max_map_count (65530) leaves this process 65030: run at \
             most 243 PEs per process, start them as processes (rshmem run -n 300 -- ...), \
             or raise vm.max_map_count"
        );
        assert!(thread_pes_mapping_check(243, true, 65530, 500).is_ok());
        assert!(thread_pes_mapping_check(244, true, 65530, 500).is_err());
        assert!(thread_pes_mapping_check(usize::MAX, false, 65530, 500).is_err());
        assert!(thread_pes_mapping_check(usize::MAX, true, 65530, 500).is_err());
    }

    /// ENOMEM near vm.max_map_count names the limit and the cure; other errors and an
    /// ENOMEM far from the limit stay as they are.
    #[test]
    fn mapping_count_hint() {
        let enomem = || io::Error::from_raw_os_error(libc::ENOMEM);
        let s = map_count_hint(enomem(), Some(65530), Some(65500)).to_string();
        assert_eq!(
            s,
            format!(
                "{}: this process holds 65500 memory mappings, vm.max_map_count is 65530 \
                 (each heap of the node takes 3 and each PE run as a thread here about 15 \
                 more: start fewer PEs per process, or raise vm.max_map_count)",
                enomem()
            )
        );
        let far = map_count_hint(enomem(), Some(65530), Some(1000));
        assert_eq!(far.raw_os_error(), Some(libc::ENOMEM));
        let other = map_count_hint(
            io::Error::from_raw_os_error(libc::EACCES),
            Some(10),
            Some(10),
        );
        assert_eq!(other.raw_os_error(), Some(libc::EACCES));
        assert_eq!(
            map_count_hint(enomem(), None, Some(1 << 20)).raw_os_error(),
            Some(libc::ENOMEM)
        );
    }

    /// PEs of one process share one mapping of each node segment: opening a segment this
    /// process maps already (at the same skew) returns that mapping, which stays usable when
    /// its creator has dropped it and its file is gone; another skew maps it again.
    #[test]
    fn node_segments_are_mapped_once_per_process() {
        let job = format!("unittest-share-{}", std::process::id());
        let (own, name) = create_node_segment(&job, 0, 1 << 20, mapping_skew(0), 1).unwrap();
        let again = open_node_segment(&name.record(), 1 << 20, mapping_skew(0)).unwrap();
        assert!(Arc::ptr_eq(&own, &again));
        let skewed = open_node_segment(&name.record(), 1 << 20, mapping_skew(5)).unwrap();
        assert_ne!(own.base(), skewed.base());
        // SAFETY: all three map the same 1 MiB file; offsets are in range; single thread.
        unsafe {
            own.base().add(4321).write(0x6B);
            assert_eq!(skewed.base().add(4321).read(), 0x6B);
        }
        let base = own.base();
        drop(own);
        drop(name);
        assert!(!std::path::Path::new(&segment_path(&job, 0)).exists());
        assert_eq!(again.base(), base);
        // SAFETY: `again` keeps the mapping; in range.
        unsafe { assert_eq!(again.base().add(4321).read(), 0x6B) };
    }

    #[test]
    fn memfd_segment_opens_through_its_locator_while_named() {
        let (s, name) = Segment::create_memfd("rshmem-unittest-memfd", 1 << 20, 0).unwrap();
        let at = name.locator().to_string();
        assert!(
            at.starts_with(&format!("/proc/{}/fd/", std::process::id())),
            "{at}"
        );
        let o = Segment::open(&at, 1 << 20, mapping_skew(3)).unwrap();
        // SAFETY: both map the same 1 MiB memfd; offsets are in range; single thread.
        unsafe {
            s.base().add(777).write(0x5A);
            assert_eq!(o.base().add(777).read(), 0x5A);
            o.base().add((1 << 20) - 1).write(0xC3);
            assert_eq!(s.base().add((1 << 20) - 1).read(), 0xC3);
        }
        // A peer expecting a larger heap is refused with both sizes.
        let e = Segment::open(&at, 2 << 20, 0).unwrap_err().to_string();
        assert!(
            e.contains("segment is 1048576 bytes, expected 2097152"),
            "{e}"
        );
        // The owner's identity opens it; another file's (a peer in another pid namespace
        // reaching a different process's fd by the same path) is refused.
        let (_t, other) = Segment::create_memfd("rshmem-unittest-other", 1 << 20, 0).unwrap();
        open_node_segment(&name.record(), 1 << 20, 0).unwrap();
        let mut wrong = other.record();
        wrong.truncate(16);
        wrong.extend(at.as_bytes());
        let e = open_node_segment(&wrong, 1 << 20, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("this is not the owner's segment"), "{e}");
        // Closing the name leaves the mappings (another test may reuse the fd number at
        // once, so what the locator opens afterwards is not checked).
        drop(name);
        // SAFETY: mappings alive; in range.
        unsafe { assert_eq!(o.base().add(777).read(), 0x5A) };
    }
}
