//! Everything that lives in the shared segment: `#[repr(C)]`, no pointers,
//! offsets and indices only, checked sizes.
//!
//! Segment layout (all offsets from the start of the mapping, which each
//! process places wherever the kernel likes):
//!
//! ```text
//! [SegmentHeader]                      magic, version, geometry, class table
//! [free-list heads]                    MAX_CLASSES x 128 B
//! [stack slots]                        max_stacks x StackSlot
//! [channel slots]                      max_channels x (ChannelHeader + 2 rings)
//! [buffers, per class]                  count x (16 B header + buf_size), page aligned per class
//! ```

// Part of the layout (and named with it where the layout is public).
pub use crate::sync::CachePadded;
use crate::sync::{AtomicU32, AtomicU64};

/// `b"XIO-SHM\x01"`: first eight bytes of every segment.
pub const MAGIC: u64 = u64::from_le_bytes(*b"XIO-SHM\x01");
/// Bumped on any change of the layout below, or of the descriptor kinds
/// (v4: [`kind::SYN4`]; v6: up to [`SLOT_DESCS`] descriptors per ring slot;
/// v7: the sender of a buffer in flight in its header word, see [`bufword`];
/// v8: per-class quotas in [`ClassInfo`], charge counters in [`StackSlot`],
/// and the sender kept in a received buffer's word; v9: a slot's generation
/// in [`StackSlot`], and in the control messages that name a stack).
pub const LAYOUT_VERSION: u32 = 9;
/// Most size classes a pool can have.
pub const MAX_CLASSES: usize = 8;
/// Class value of a descriptor that carries no buffer (control kinds).
// Part of the layout's definition; the code checks class bounds instead.
#[allow(dead_code)]
pub const NO_CLASS: u8 = 0xff;
/// Stack id 0 means "nobody" (the manager, or a free buffer).
#[allow(dead_code)]
pub const NO_STACK: u16 = 0;

/// Marker for types that may be placed in the shared segment.
///
/// # Safety
/// The type must be `#[repr(C)]`, valid for the all-zero bit pattern (a fresh
/// memfd is zeroed), contain no pointers, references or file descriptors
/// (processes map the segment at different addresses), and be sound to access
/// concurrently from several processes through its own atomics.
pub unsafe trait ShmSafe {}

/// A descriptor: what travels through a ring. The payload stays in the pool.
///
/// Every field is untrusted when read from a ring; see
/// [`crate::backend::shm::PoolView::accept`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Descriptor {
    /// Buffer index within its class.
    pub index: u32,
    /// Bytes of payload.
    pub len: u32,
    /// Connection id (socket layer) or user tag (zero-copy layer).
    pub conn: u32,
    /// Size class, or [`NO_CLASS`].
    pub class: u8,
    /// What the descriptor means; see [`kind`].
    pub kind: u8,
    /// Low 16 bits of the buffer's generation when it was sent.
    pub gen: u16,
}

impl Descriptor {
    /// The descriptor as two words, to pass it in registers: a push of one
    /// descriptor built field by field and read back as a whole from
    /// memory waits for every store before it to reach the cache (a
    /// store-to-load forward of several narrower stores fails).
    #[inline]
    pub fn to_words(self) -> (u64, u64) {
        (
            u64::from(self.index) | u64::from(self.len) << 32,
            u64::from(self.conn)
                | u64::from(self.class) << 32
                | u64::from(self.kind) << 40
                | u64::from(self.gen) << 48,
        )
    }

    /// The descriptor of [`Descriptor::to_words`].
    #[inline]
    pub fn from_words((lo, hi): (u64, u64)) -> Self {
        Self {
            index: lo as u32,
            len: (lo >> 32) as u32,
            conn: hi as u32,
            class: (hi >> 32) as u8,
            kind: (hi >> 40) as u8,
            gen: (hi >> 48) as u16,
        }
    }
}

/// Backends, as recorded in [`SegmentHeader::backend`].
pub mod backend {
    /// Buffers and rings in this segment (the default).
    pub const SHM: u32 = 0;
    /// Buffers in DPDK mempools and rings in DPDK rings of the same prefix;
    /// this segment keeps the stack slots and channel states (its class
    /// table gives the buffer sizes, its buffer area is unused).
    pub const DPDK: u32 = 1;
}

/// Descriptor kinds.
pub mod kind {
    /// A buffer of payload (the zero-copy interface; `conn` is the tag).
    pub const DATA: u8 = 0;
    /// Socket layer: open a connection. Carries a buffer naming the target
    /// and source addresses; `conn` is the initiator's connection id. The
    /// receiver ignores the source (the sender's word) and derives it from
    /// the sending stack and `conn`, as for [`SYN4`].
    pub const SYN: u8 = 1;
    /// Socket layer: accept a connection. `conn` is the initiator's id,
    /// `index` the acceptor's. No buffer.
    pub const SYN_ACK: u8 = 2;
    /// Socket layer: stream bytes for the receiver's connection `conn`.
    pub const STREAM: u8 = 3;
    /// Socket layer: no more bytes from the sender on `conn`. No buffer.
    pub const FIN: u8 = 4;
    /// Socket layer: `conn` is reset (refused, closed with unread data).
    /// No buffer. `index` is [`RST_ENDS`] or 0 (the receiver need not
    /// look).
    pub const RST: u8 = 5;
    /// A [`RST`]'s `index` when it ends a connection its receiver still
    /// holds (closed with unread data, never accepted, forgotten while
    /// closing), and so must never be dropped; 0 when it answers input
    /// that names no connection (refused, stale or forged), which a
    /// sender may drop for a peer that does not drain its ring.
    pub const RST_ENDS: u32 = 1;
    /// Socket layer: the receiver of `conn` consumed `index` more bytes of
    /// buffer capacity; the sender may send that much more. No buffer.
    pub const CREDIT: u8 = 6;
    /// Socket layer: open a connection to an IPv4 address, without a
    /// buffer. `conn` is the initiator's connection id, `index` the target
    /// address (`u32::from(Ipv4Addr)`), `len` the target port. The source
    /// address is not sent: it is the initiator's client address, which
    /// the receiver derives from the sender's stack id and `conn`. (IPv6
    /// targets use [`SYN`].)
    pub const SYN4: u8 = 7;

    /// Flag on STREAM, FIN and RST sent before the SYN-ACK came back: `conn`
    /// is then the *sender's* id (the one its SYN carried), which the
    /// receiver maps to its own. Lets a client send at once after its SYN
    /// (one round trip for connect + request + reply, as TCP Fast Open).
    pub const EARLY: u8 = 0x80;

    /// The kind without the [`EARLY`] flag.
    pub fn base(k: u8) -> u8 {
        k & !EARLY
    }

    /// Whether descriptors of kind `k` carry a pool buffer: a known kind
    /// whose base carries one. A buffer kind with a flag it may not have
    /// (`DATA | EARLY`, `SYN | EARLY`) is unknown, and so corrupt.
    pub fn carries_buffer(k: u8) -> bool {
        matches!(k, DATA | SYN | STREAM) || k == STREAM | EARLY
    }

    /// Whether `k` is a kind this version knows.
    pub fn is_known(k: u8) -> bool {
        let b = base(k);
        b <= SYN4 && (k & EARLY == 0 || matches!(b, STREAM | FIN | RST))
    }
}

// SAFETY: repr(C), plain integers, zero is valid.
unsafe impl ShmSafe for Descriptor {}
const _: () = assert!(core::mem::size_of::<Descriptor>() == 16);

/// One size class, written once by the manager before anyone attaches.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct ClassInfo {
    /// Bytes per buffer.
    pub buf_size: u32,
    /// Number of buffers.
    pub count: u32,
    /// Most buffers of the class one stack may have charged to it at once
    /// (the stack that allocated a buffer, until whoever holds it last frees
    /// it): its quota, from [`PoolConfig::quotas`]. A stack reads it once,
    /// at attach.
    pub quota: u32,
    /// Reserved (zero).
    pub _reserved: u32,
    /// Offset of the first buffer (its header; the payload follows).
    pub data_off: u64,
    /// Offset of the `count` magazines (see `Magazine`).
    pub mag_off: u64,
}

/// The segment header. Written by the manager before the segment fd is
/// handed to anyone; read-only afterwards, except `manager_alive`.
#[derive(Debug)]
#[repr(C)]
pub struct SegmentHeader {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub version: u32,
    /// Number of valid entries in `classes`.
    pub n_classes: u32,
    /// Total bytes of the segment.
    pub total_len: u64,
    /// Stack slots (ids 1..=max_stacks).
    pub max_stacks: u32,
    /// Channel slots.
    pub max_channels: u32,
    /// Slots per ring (a power of two); a slot holds one to three
    /// descriptors of one push.
    pub ring_capacity: u32,
    /// Bytes per channel slot (header plus both rings).
    pub channel_stride: u32,
    /// Where buffers and rings live: [`backend::SHM`] or [`backend::DPDK`].
    pub backend: u32,
    /// The manager's liveness word, a robust futex: the thread id of the
    /// thread serving the pool, which the kernel marks `FUTEX_OWNER_DIED`
    /// when that thread dies (see `crate::liveness`). Zero until it serves.
    pub manager_alive: AtomicU32,
    /// Offset of the free-list heads.
    pub free_heads_off: u64,
    /// Offset of the stack slots.
    pub stacks_off: u64,
    /// Offset of the channel slots.
    pub channels_off: u64,
    /// The size classes, smallest first.
    pub classes: [ClassInfo; MAX_CLASSES],
}
// SAFETY: repr(C), plain integers, zero is valid.
unsafe impl ShmSafe for SegmentHeader {}

/// A class's free lists. Free buffers travel in *magazines* (Bonwick's
/// term): fixed arrays of up to [`MAG_SIZE`] buffer indices, so a stack
/// takes or returns a whole batch with one CAS and two cache lines, instead
/// of chasing a linked list through remote lines. Two Treiber stacks of
/// magazines: full (holding free buffers) and empty. Heads are
/// `(tag << 32) | (magazine + 1)`, 0 in the low half meaning empty; the tag
/// counts every change and defeats ABA.
#[derive(Debug, Default)]
#[repr(C)]
pub struct FreeHead {
    /// Stack of magazines holding free buffers. In a DPDK segment, which
    /// has no free lists, the lock that makes the class mempool's
    /// operations one at a time (see `dpdk::DpdkPool::mempool_op`).
    pub head: CachePadded<AtomicU64>,
    /// Stack of empty magazines.
    pub empty: CachePadded<AtomicU64>,
    /// Non-zero while the manager reconciles the list after a crash; stacks
    /// stay off the list meanwhile (see `pool::PoolView::global_op`).
    pub gate: CachePadded<AtomicU32>,
}
// SAFETY: repr(C) atomic, zero is the empty list.
unsafe impl ShmSafe for FreeHead {}

/// Buffers per magazine.
pub const MAG_SIZE: usize = 30;

/// A magazine of free buffer indices (one per buffer of the class exists,
/// so an empty one is always at hand when a stack has buffers to return).
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub struct Magazine {
    /// Next magazine on its stack (+1, 0 = end).
    pub next: AtomicU32,
    /// Indices held.
    pub len: AtomicU32,
    /// The buffer indices.
    pub idx: [AtomicU32; MAG_SIZE],
}
// SAFETY: repr(C) atomics, zero is an empty magazine.
unsafe impl ShmSafe for Magazine {}
#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<Magazine>() == 128);

/// Per-buffer header, at the start of the buffer's own first cache line,
/// just before the payload: a receiver checking ownership then reads the
/// line that holds the first 48 payload bytes too, so validating a small
/// message costs no extra cache miss (measured: see docs/design.md).
#[derive(Debug, Default)]
#[repr(C)]
pub struct BufHeader {
    /// `state | owner << 8 | from << 24 | gen << 40`; see [`bufword`].
    pub word: AtomicU64,
    /// Reserved (zero).
    pub next: AtomicU32,
    /// Reserved.
    pub _pad: u32,
}
// SAFETY: repr(C) atomics, zero is "free, no owner, generation 0".
unsafe impl ShmSafe for BufHeader {}
#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<BufHeader>() == BUF_HEADROOM as usize);

/// Bytes before each buffer's payload: its [`BufHeader`].
pub const BUF_HEADROOM: u64 = 16;

/// Distance between consecutive buffers of a class of `buf_size` bytes:
/// header plus payload, rounded up to a cache line.
pub const fn buf_stride(buf_size: u32) -> u64 {
    (BUF_HEADROOM + buf_size as u64 + 63) & !63
}

/// Packing of [`BufHeader::word`]: `state | owner << 8 | from << 24 |
/// gen << 40`, one word so a reader sees all four consistently and a send
/// stamps them with one store.
pub mod bufword {
    /// On the shared free list.
    pub const FREE: u8 = 0;
    /// In a stack's private cache (owner set).
    pub const CACHED: u8 = 1;
    /// A writable `BufMut` of the owner.
    pub const ALLOCATED: u8 = 2;
    /// In a ring, on its way to the owner (the receiver); `from` is the
    /// sender.
    pub const INFLIGHT: u8 = 3;
    /// A received, read-only `Buf` of the owner; `from` is the sender
    /// (charged for it until it is freed or reused).
    pub const HELD: u8 = 4;

    /// Bits of the generation kept in the word (descriptors carry its low
    /// 16); it wraps at `1 << GEN_BITS`.
    pub const GEN_BITS: u32 = 24;

    /// Packs a header word of a buffer that is not in flight (no sender).
    #[inline]
    pub const fn pack(state: u8, owner: u16, gen: u32) -> u64 {
        pack_from(state, owner, 0, gen)
    }
    /// Packs a header word with a sender: [`INFLIGHT`] from stack `from`
    /// to `owner`. The manager needs the sender to find buffers stamped
    /// for a live receiver by a process that died before pushing them.
    #[inline]
    pub const fn pack_from(state: u8, owner: u16, from: u16, gen: u32) -> u64 {
        state as u64 | (owner as u64) << 8 | (from as u64) << 24 | (gen as u64) << 40
    }
    /// State byte.
    #[inline]
    pub const fn state(w: u64) -> u8 {
        w as u8
    }
    /// Owner stack id.
    #[inline]
    pub const fn owner(w: u64) -> u16 {
        (w >> 8) as u16
    }
    /// Sender stack id of a buffer in flight or received (0 otherwise).
    #[inline]
    pub const fn from(w: u64) -> u16 {
        (w >> 24) as u16
    }
    /// The stack a buffer counts against (its quota): the one that
    /// allocated it, until whoever holds it last frees it or takes it over
    /// (reuse). So a sender pays for what it sent and its receivers did
    /// not consume yet, and one that floods a peer that does not read
    /// stops at its quota, not at the end of the pool. `None` for a buffer
    /// that is free or in a private cache.
    #[inline]
    pub const fn charged_to(w: u64) -> Option<u16> {
        match state(w) {
            ALLOCATED => Some(owner(w)),
            INFLIGHT | HELD if from(w) != 0 => Some(from(w)),
            INFLIGHT | HELD => Some(owner(w)),
            _ => None,
        }
    }
    /// Generation ([`GEN_BITS`] bits).
    #[inline]
    pub const fn gen(w: u64) -> u32 {
        ((w >> 40) & ((1 << GEN_BITS) - 1)) as u32
    }
}

/// [`StackSlot::sleeping`]: asleep in `futex(FUTEX_WAIT)` on the word.
pub const SLEEP_FUTEX: u32 = 1;
/// [`StackSlot::sleeping`]: asleep polling the doorbell eventfd.
pub const SLEEP_EVENTFD: u32 = 2;

/// Stack slot states.
pub mod slot_state {
    /// Unused.
    pub const FREE: u32 = 0;
    /// A registered, live stack.
    pub const ACTIVE: u32 = 1;
    /// Died; being reclaimed by the manager.
    pub const DEAD: u32 = 2;
}

/// Per-stack shared state: the doorbell's sleeping flag, where the stack
/// runs, and what pool operation it is in the middle of (for reclamation).
#[derive(Debug, Default)]
#[repr(C)]
pub struct StackSlot {
    /// Non-zero while the stack is (about to be) asleep: [`SLEEP_FUTEX`]
    /// (on this word) or [`SLEEP_EVENTFD`] (on its doorbell, for reactors).
    /// A producer wakes it only when it swaps the word back to 0.
    pub sleeping: CachePadded<AtomicU32>,
    /// `CLOCK_MONOTONIC` ns when the doorbell was last rung, for measuring
    /// what a wake-up costs.
    pub rung_at: CachePadded<AtomicU64>,
    /// CPU the stack's waiter last ran on (+1; 0 = unknown).
    pub cpu: AtomicU32,
    /// [`slot_state`]; written by the manager.
    pub state: AtomicU32,
    /// Process id, for status output.
    pub pid: AtomicU32,
    /// The slot's generation, for status output: bumped by the manager at
    /// each registration (never 0). The manager keeps its own copy and the
    /// stacks learn theirs and their peers' from its messages, so a
    /// forged word here misleads only the status.
    pub generation: AtomicU32,
    /// Bumped by the manager each time it queues a control message for
    /// this stack, so the data path notices without a syscall.
    pub ctrl_seq: AtomicU32,
    /// Free-list operation in progress; see `pool::intent`.
    pub intent: AtomicU64,
    /// Descriptors rejected as corrupt by this stack.
    pub corrupt: AtomicU64,
    /// Times this stack's waiter went to sleep.
    pub sleeps: AtomicU64,
    /// Allocations refused because the class was empty (each attempt of a
    /// waiting allocation counts).
    pub pool_empty: AtomicU64,
    /// Allocations refused because the stack was at its quota of the class
    /// (each attempt counts).
    pub quota_full: AtomicU64,
    /// Sends that found the ring to the peer full (each attempt counts).
    pub ring_full: AtomicU64,
    /// Per class: buffers charged to this stack so far (allocated, or
    /// received and kept to write into), counted by the stack alone. Its
    /// use is this less [`StackSlot::credited`]. A line of its own: the
    /// stack writes it on every allocation.
    pub charged: CachePadded<[AtomicU32; MAX_CLASSES]>,
    /// Per class: buffers charged to this stack that were given back by
    /// whoever held them last, added by the other stacks in batches. A
    /// line of its own: written by others, read by this stack when it
    /// allocates.
    pub credited: CachePadded<[AtomicU32; MAX_CLASSES]>,
}
// SAFETY: repr(C) atomics, zero is a free slot.
unsafe impl ShmSafe for StackSlot {}

/// Channel slot states.
pub mod chan_state {
    /// Unused.
    pub const FREE: u32 = 0;
    /// Both ends live.
    pub const ACTIVE: u32 = 1;
    /// One end died or closed; the other must stop using it.
    pub const CLOSED: u32 = 2;
}

/// Header of a channel slot; two rings follow it: `a -> b`, then `b -> a`.
#[derive(Debug, Default)]
#[repr(C)]
pub struct ChannelHeader {
    /// [`chan_state`].
    pub state: CachePadded<AtomicU32>,
    /// Stack id of end `a` (the one that asked for the channel).
    pub stack_a: u32,
    /// Stack id of end `b`.
    pub stack_b: u32,
}
// SAFETY: repr(C), atomics and integers, zero is a free slot.
unsafe impl ShmSafe for ChannelHeader {}

/// Header of one SPSC ring; `capacity` [`RingSlot`]s follow it.
///
/// There is no shared producer index: each slot carries its own sequence
/// number, so a consumer polling for the next descriptor touches only the
/// slot's line, the one the producer just wrote (FastForward's insight).
#[derive(Debug, Default)]
#[repr(C)]
pub struct RingHeader {
    /// Consumer index (next slot to read); written only by the consumer,
    /// read by the producer only when its cached copy says the ring is full.
    pub head: CachePadded<AtomicU32>,
}

/// Descriptors one [`RingSlot`] holds at most.
pub const SLOT_DESCS: usize = 3;

/// One ring slot: up to [`SLOT_DESCS`] descriptors of one push and the
/// sequence number that publishes them (`position + 1` of the write that
/// filled it). A burst fills slots three descriptors at a time, so it moves
/// a third of the cache lines one descriptor per slot would; a lone push
/// takes a slot of its own.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct RingSlot {
    /// The descriptors (written before `seq`, read after it); the first
    /// `count` are meaningful.
    pub(crate) desc: [crate::sync::UnsafeCell<Descriptor>; SLOT_DESCS],
    /// `position + 1` once the slot at `position` is written.
    pub seq: AtomicU32,
    /// Descriptors in `desc`, `1..=SLOT_DESCS` (written before `seq`;
    /// untrusted: anything else makes the ring corrupt).
    pub(crate) count: crate::sync::UnsafeCell<u32>,
    /// Pads the slot to a cache line: with two slots per line the producer
    /// writing one and the consumer polling the next fought over the line
    /// (one-way throughput fell six-fold).
    pub _pad: [u32; 2],
}
// SAFETY: repr(C), descriptors, a count and atomics; zero is "never written".
unsafe impl ShmSafe for RingSlot {}
#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<RingSlot>() == 64);

/// The sequence number slot `k` of a fresh ring holds: "written one lap
/// before position 0", which matches no position until the slot is written.
/// (Zero would not do: it is what position `u32::MAX` publishes.)
pub fn initial_seq(k: u32, cap: u32) -> u32 {
    k.wrapping_add(1).wrapping_sub(cap)
}

/// Bytes of a ring of `cap` slots, header included.
pub fn ring_bytes(cap: u32) -> u64 {
    core::mem::size_of::<RingHeader>() as u64 + cap as u64 * core::mem::size_of::<RingSlot>() as u64
}
// SAFETY: repr(C) atomics, zero is an empty ring.
unsafe impl ShmSafe for RingHeader {}

/// Geometry of a pool, chosen when the manager starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// `(buffer size, count)` per class, smallest first.
    pub classes: Vec<(u32, u32)>,
    /// How many stacks may be registered at once.
    pub max_stacks: u32,
    /// How many channels may exist at once.
    pub max_channels: u32,
    /// Slots per ring, a power of two. A slot takes one push of up to
    /// three descriptors: a lone write takes a slot, a burst three a slot.
    pub ring_capacity: u32,
    /// `(buffer size, most buffers)`: the quota of the class of that size,
    /// the most of its buffers one stack may have charged to it at once: a
    /// buffer is charged to the stack that allocated it until whoever holds
    /// it last frees it or takes it over to write into, so a writer pays
    /// for what its readers have not read yet. A class not listed gets half its
    /// buffers (rounded up), so one service can never take a class from
    /// everyone; a quota of the class's whole count turns the cap off.
    pub quotas: Vec<(u32, u32)>,
}

impl Default for PoolConfig {
    /// 2 KiB x 8192, 64 KiB x 512, 1 MiB x 32 (about 80 MiB, touched lazily),
    /// 64 stacks, 256 channels, 1024-descriptor rings.
    fn default() -> Self {
        Self {
            classes: vec![(2 << 10, 8192), (64 << 10, 512), (1 << 20, 32)],
            max_stacks: 64,
            max_channels: 256,
            ring_capacity: 1024,
            quotas: Vec::new(),
        }
    }
}

/// Where everything is, computed from a [`PoolConfig`].
#[derive(Clone, Debug)]
pub struct Geometry {
    /// Header to write at offset 0 (atomics excluded).
    pub classes: Vec<ClassInfo>,
    /// Free heads offset.
    pub free_heads_off: u64,
    /// Stack slots offset.
    pub stacks_off: u64,
    /// Channel slots offset.
    pub channels_off: u64,
    /// Bytes per channel slot.
    pub channel_stride: u32,
    /// Total length.
    pub total_len: u64,
}

/// Errors in a pool configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// No class, or more than `MAX_CLASSES` (8).
    #[error("a pool needs 1 to {MAX_CLASSES} size classes, got {0}")]
    ClassCount(usize),
    /// Sizes must grow strictly and be multiples of 64; counts positive.
    #[error("size classes must be increasing multiples of 64 bytes with a positive count: {0:?}")]
    BadClass((u32, u32)),
    /// Ring capacity must be a power of two from 2 to 2^20.
    #[error("ring capacity must be a power of two between 2 and 1048576, got {0}")]
    RingCapacity(u32),
    /// Stack ids are 16 bits (0 reserved).
    #[error("max_stacks must be 1..=65534, got {0}")]
    MaxStacks(u32),
    /// At least one channel.
    #[error("max_channels must be at least 1, got {0}")]
    MaxChannels(u32),
    /// A class with more than 2^31 buffers or a segment over 64 GiB.
    #[error("pool too large")]
    TooLarge,
    /// A quota names a size no class has, or is zero.
    #[error("quota {}:{}: the size must be one of the classes' sizes and the count at least 1", .0.0, .0.1)]
    BadQuota((u32, u32)),
}

/// Largest segment a configuration may ask for.
const MAX_SEGMENT: u64 = 64 << 30;

const fn align_up(v: u64, a: u64) -> u64 {
    (v + a - 1) & !(a - 1)
}

impl PoolConfig {
    /// Checks the configuration and lays the segment out.
    pub fn geometry(&self) -> Result<Geometry, ConfigError> {
        if self.classes.is_empty() || self.classes.len() > MAX_CLASSES {
            return Err(ConfigError::ClassCount(self.classes.len()));
        }
        let mut prev = 0;
        for &(size, count) in &self.classes {
            if size <= prev || size % 64 != 0 || count == 0 {
                return Err(ConfigError::BadClass((size, count)));
            }
            if count > 1 << 31 {
                return Err(ConfigError::TooLarge);
            }
            prev = size;
        }
        let cap = self.ring_capacity;
        if !cap.is_power_of_two() || !(2..=1 << 20).contains(&cap) {
            return Err(ConfigError::RingCapacity(cap));
        }
        if self.max_stacks == 0 || self.max_stacks > 65534 {
            return Err(ConfigError::MaxStacks(self.max_stacks));
        }
        if self.max_channels == 0 {
            return Err(ConfigError::MaxChannels(self.max_channels));
        }
        let mut off = align_up(core::mem::size_of::<SegmentHeader>() as u64, 128);
        let free_heads_off = off;
        off += (MAX_CLASSES * core::mem::size_of::<FreeHead>()) as u64;
        let stacks_off = align_up(off, 128);
        // Slot 0 is never used (id 0 = nobody) but keeping it makes id == index.
        off = stacks_off + (self.max_stacks as u64 + 1) * core::mem::size_of::<StackSlot>() as u64;
        let channels_off = align_up(off, 128);
        let ring_bytes = ring_bytes(cap);
        let channel_stride = align_up(
            core::mem::size_of::<ChannelHeader>() as u64 + 2 * align_up(ring_bytes, 128),
            128,
        );
        off = channels_off + channel_stride * self.max_channels as u64;
        let mut classes: Vec<ClassInfo> = self
            .classes
            .iter()
            .map(|&(size, count)| ClassInfo {
                buf_size: size,
                count,
                quota: self
                    .quotas
                    .iter()
                    .rev()
                    .find(|q| q.0 == size)
                    .map_or(count.div_ceil(2), |q| q.1.min(count)),
                ..Default::default()
            })
            .collect();
        for &q in &self.quotas {
            if q.1 == 0 || !self.classes.iter().any(|c| c.0 == q.0) {
                return Err(ConfigError::BadQuota(q));
            }
        }
        for (c, &(_, count)) in classes.iter_mut().zip(&self.classes) {
            off = align_up(off, 128);
            c.mag_off = off;
            off += count as u64 * core::mem::size_of::<Magazine>() as u64;
        }
        for (c, &(size, count)) in classes.iter_mut().zip(&self.classes) {
            // Checked class by class: one class is at most 2^63 bytes
            // (2^32 a buffer, 2^31 buffers), but eight of them overflowed.
            if off > MAX_SEGMENT {
                return Err(ConfigError::TooLarge);
            }
            off = align_up(off, 4096);
            c.data_off = off;
            off += buf_stride(size) * count as u64;
        }
        let total_len = align_up(off.min(MAX_SEGMENT + 1), 4096);
        if total_len > MAX_SEGMENT {
            return Err(ConfigError::TooLarge);
        }
        Ok(Geometry {
            classes,
            free_heads_off,
            stacks_off,
            channels_off,
            channel_stride: u32::try_from(channel_stride).map_err(|_| ConfigError::TooLarge)?,
            total_len,
        })
    }
}

/// Offset of ring `dir` (0: a->b, 1: b->a) within a channel slot.
pub fn ring_offset(ring_capacity: u32, dir: usize) -> u64 {
    let ring_bytes = ring_bytes(ring_capacity);
    align_up(core::mem::size_of::<ChannelHeader>() as u64, 128)
        + dir as u64 * align_up(ring_bytes, 128)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn descriptor_words_round_trip_every_field() {
        for d in [
            Descriptor::default(),
            Descriptor {
                index: u32::MAX,
                len: u32::MAX,
                conn: u32::MAX,
                class: u8::MAX,
                kind: u8::MAX,
                gen: u16::MAX,
            },
            Descriptor {
                index: 1,
                len: 2,
                conn: 3,
                class: 4,
                kind: 5,
                gen: 6,
            },
        ] {
            assert_eq!(Descriptor::from_words(d.to_words()), d);
        }
    }

    /// Classes each within bounds whose buffers together pass the end of
    /// a `u64`: too large, not an arithmetic overflow (a panic in a debug
    /// build, a wrapped and wrong layout in a release one).
    #[test]
    fn classes_whose_sum_overflows_are_too_large() {
        let cfg = PoolConfig {
            classes: vec![(0xFFFF_FF80, 1 << 31), (0xFFFF_FFC0, 1 << 31)],
            ..PoolConfig::default()
        };
        assert_eq!(cfg.geometry().err(), Some(ConfigError::TooLarge));
    }
}
