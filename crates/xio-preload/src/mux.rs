//! `epoll` and `poll` over moved and kernel fds mixed.
//!
//! An epoll set keeps its kernel fds in the kernel; its moved streams
//! are kept here, with their events and data, and the net's poll fd joins
//! the kernel set under a marker (as libvma adds its own fds), so a
//! sleeping `epoll_wait` wakes when X-IO has something. A moved
//! listener is registered with the kernel (its kernel side) and here (its
//! X-IO side). A wait reports the moved sockets ready now (level
//! triggered: `EPOLLET` is reported as level, which a program reading to
//! `EAGAIN` cannot tell apart; `EPOLLONESHOT` disarms), then the kernel's
//! without sleeping if there were any, else sleeps in the kernel set and
//! looks again when the marker fires.

use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libc::epoll_event;

use crate::accept::xio_listener;
use crate::ready::{self, ERR, HUP};
use crate::{bell, intr};
use crate::{errno, lookup, net, real, set_errno, Kind, Sock};

/// The data the net's poll fd carries in a program's epoll set.
const MARK: u64 = 0x5849_4f5f_4d41_524b; // "XIO_MARK"

/// The data a thread's bell carries in an epoll set: this tag, and the
/// bell's id in the low 32 bits (a thread drains its own bell only).
const BELL: u64 = 0x5849_4f42_0000_0000; // "XIOB"
const BELL_MASK: u64 = 0xffff_ffff_0000_0000;

fn bell_data(id: u64) -> u64 {
    BELL | (id & !BELL_MASK)
}

/// A moved member of an epoll set.
#[derive(Clone, Copy)]
struct Member {
    events: u32,
    data: u64,
    /// For `EPOLLET`: the socket's read and write edge counts at the last
    /// report (`u64::MAX`: none since ADD or MOD). A ready direction is
    /// reported again only after the net reported an edge for it (data
    /// came, room came back), as the kernel wakes an edge-triggered set
    /// once per arrival: an idle connection's standing writability would
    /// otherwise wake its loop at every wait.
    seen: (u64, u64),
}

/// The moved members of one epoll set.
#[derive(Default)]
pub(crate) struct Set {
    moved: HashMap<RawFd, Member>,
    /// Fresh TCP sockets (see [`FRESH`]) registered in the kernel set:
    /// what they asked for, to carry over if a `connect` moves them.
    fresh: HashMap<RawFd, Member>,
    /// Whether the net's poll fd is in the kernel set.
    marked: bool,
    /// The threads' bells in the kernel set (see `bell`), by id.
    bells: std::collections::HashSet<u64>,
}

static SETS: Mutex<Option<HashMap<RawFd, Set>>> = Mutex::new(None);

/// TCP sockets made by `socket` and not connected or listening yet, by
/// fd (a bit each; fds past the map are not followed). An event loop may
/// register a socket in its epoll set before it connects it (nginx's
/// upstream connections are): if the `connect` then moves it, the
/// kernel's registration dies with the kernel socket, and the set must
/// go on reporting the moved one.
static FRESH: [AtomicU64; 1024] = [const { AtomicU64::new(0) }; 1024];

/// Notes `fd` as a fresh TCP socket (`on`), or not.
pub(crate) fn set_fresh(fd: RawFd, on: bool) {
    let Some(w) = usize::try_from(fd).ok().and_then(|f| FRESH.get(f / 64)) else {
        return;
    };
    let bit = 1u64 << (fd % 64);
    if on {
        w.fetch_or(bit, Ordering::Relaxed);
    } else if w.load(Ordering::Relaxed) & bit != 0 {
        w.fetch_and(!bit, Ordering::Relaxed);
    }
}

/// Ends `fd`'s freshness as its number is closed or replaced: its
/// kernel registrations died with it.
pub(crate) fn end_fresh(fd: RawFd) {
    if is_fresh(fd) {
        set_fresh(fd, false);
        sets(|s| {
            for set in s.values_mut() {
                set.fresh.remove(&fd);
            }
        });
    }
}

fn is_fresh(fd: RawFd) -> bool {
    usize::try_from(fd)
        .ok()
        .and_then(|f| FRESH.get(f / 64))
        .is_some_and(|w| w.load(Ordering::Relaxed) & (1u64 << (fd % 64)) != 0)
}

/// After a `connect` moved fresh socket `fd`: the sets it was registered
/// in (in the kernel) now follow it here, with the events and data the
/// program gave.
pub(crate) fn moved_by_connect(fd: RawFd) {
    if !is_fresh(fd) {
        return;
    }
    set_fresh(fd, false);
    let sets_of: Vec<RawFd> = sets(|s| {
        s.iter_mut()
            .filter_map(|(&epfd, set)| {
                let m = set.fresh.remove(&fd)?;
                set.moved.insert(fd, m);
                Some(epfd)
            })
            .collect()
    });
    for epfd in sets_of {
        mark(epfd);
    }
}

fn sets<R>(f: impl FnOnce(&mut HashMap<RawFd, Set>) -> R) -> R {
    let mut g = SETS.lock().unwrap_or_else(|e| e.into_inner());
    let m = g.get_or_insert_with(HashMap::new);
    let r = f(m);
    SET_COUNT.store(m.len(), Ordering::Relaxed);
    r
}

/// Whether any epoll set is known (then a `close` must look: it may be
/// one, or a member of one).
pub(crate) fn any_sets() -> bool {
    SET_COUNT.load(Ordering::Relaxed) > 0
}

/// How many sets `SETS` holds.
static SET_COUNT: AtomicUsize = AtomicUsize::new(0);

/// [`forget`] for every fd in `first..=last`.
pub(crate) fn forget_range(first: u32, last: u32) {
    if !any_sets() {
        return;
    }
    let fds: Vec<RawFd> = sets(|s| {
        let mut fds: Vec<RawFd> = s
            .iter()
            .flat_map(|(&e, set)| {
                std::iter::once(e)
                    .chain(set.moved.keys().copied())
                    .chain(set.fresh.keys().copied())
            })
            .filter(|&fd| (first..=last).contains(&(fd as u32)))
            .collect();
        fds.sort_unstable();
        fds.dedup();
        fds
    });
    for fd in fds {
        forget(fd);
    }
}

/// Forgets `fd` as an epoll set, and as a member of any (the kernel drops
/// a closed fd from its sets).
pub(crate) fn forget(fd: RawFd) {
    sets(|s| {
        s.remove(&fd);
        for set in s.values_mut() {
            set.moved.remove(&fd);
            set.fresh.remove(&fd);
        }
    });
}

/// The sets, held across a `fork` (see `fork.rs`).
pub(crate) fn lock_for_fork() -> std::sync::MutexGuard<'static, Option<HashMap<RawFd, Set>>> {
    SETS.lock().unwrap_or_else(|e| e.into_inner())
}

/// In a forked child, with the sets held: the net's poll fd in each set
/// is the parent's, so each set takes the child's at its next use.
pub(crate) fn child_sets(g: &mut Option<HashMap<RawFd, Set>>) {
    for set in g.iter_mut().flat_map(|m| m.values_mut()) {
        set.marked = false;
        set.bells.clear();
    }
}

/// Hands moved member `fd` of every set to the kernel (it is a kernel
/// socket now, see `fork.rs`): registered there with the events and data
/// the program gave.
pub(crate) fn to_kernel(fd: RawFd) {
    let members: Vec<(RawFd, Member)> = sets(|s| {
        s.iter_mut()
            .filter_map(|(&epfd, set)| Some((epfd, set.moved.remove(&fd)?)))
            .collect()
    });
    for (epfd, m) in members {
        let mut ev = epoll_event {
            events: m.events,
            u64: m.data,
        };
        // SAFETY: `ev` is a valid event for the call.
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }
}

/// Puts the net's poll fd in kernel set `epfd`, once.
fn mark(epfd: RawFd) -> bool {
    let Some(net) = net() else { return false };
    let Some(pfd) = ready::poll_fd(&net) else {
        return false;
    };
    if sets(|s| s.entry(epfd).or_default().marked) {
        return true;
    }
    let mut ev = epoll_event {
        events: ready::IN,
        u64: MARK,
    };
    // SAFETY: `ev` is a valid event for the call.
    let r = unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, pfd, &mut ev) };
    let ok = r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST);
    if ok {
        sets(|s| s.entry(epfd).or_default().marked = true);
    }
    ok
}

/// `epoll_ctl(2)`.
///
/// # Safety
///
/// As libc's: `ev` is valid for `ADD` and `MOD`.
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    let Some(sock) = lookup(fd) else {
        // SAFETY: passed on.
        let r = unsafe { real::epoll_ctl(epfd, op, fd, ev) };
        if r == 0 && is_fresh(fd) {
            let want = (op != libc::EPOLL_CTL_DEL && !ev.is_null()).then(|| {
                // SAFETY: the caller's contract for ADD and MOD.
                let e = unsafe { std::ptr::read_unaligned(ev) };
                Member {
                    events: e.events,
                    data: e.u64,
                    seen: (u64::MAX, u64::MAX),
                }
            });
            sets(|s| {
                let set = s.entry(epfd).or_default();
                match want {
                    Some(m) => set.fresh.insert(fd, m),
                    None => set.fresh.remove(&fd),
                }
            });
        }
        return r;
    };
    let want = if op == libc::EPOLL_CTL_DEL || ev.is_null() {
        None
    } else {
        // SAFETY: the caller's contract for ADD and MOD.
        let e = unsafe { std::ptr::read_unaligned(ev) };
        Some((e.events, e.u64))
    };
    if let Kind::Listener { addr, xio } = &sock.kind {
        // Its X-IO side listens from now: the program waits for
        // connections here rather than in `accept`.
        let _ = xio_listener(xio, *addr);
        // SAFETY: passed on: the kernel listener is the kernel's.
        let r = unsafe { real::epoll_ctl(epfd, op, fd, ev) };
        if r == 0 {
            track(epfd, op, fd, want);
            mark(epfd);
        }
        return r;
    }
    if (op == libc::EPOLL_CTL_ADD || op == libc::EPOLL_CTL_MOD) && want.is_none() {
        set_errno(libc::EFAULT);
        return -1;
    }
    let known = sets(|s| s.get(&epfd).is_some_and(|set| set.moved.contains_key(&fd)));
    let err = match op {
        libc::EPOLL_CTL_ADD if known => Some(libc::EEXIST),
        libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL if !known => Some(libc::ENOENT),
        libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL => None,
        _ => Some(libc::EINVAL),
    };
    if let Some(e) = err {
        set_errno(e);
        return -1;
    }
    if op != libc::EPOLL_CTL_DEL && !mark(epfd) {
        set_errno(libc::ENOMEM);
        return -1;
    }
    track(epfd, op, fd, want);
    0
}

fn track(epfd: RawFd, op: c_int, fd: RawFd, want: Option<(u32, u64)>) {
    sets(|s| {
        let set = s.entry(epfd).or_default();
        match (op, want) {
            (libc::EPOLL_CTL_DEL, _) | (_, None) => {
                set.moved.remove(&fd);
            }
            (_, Some((events, data))) => {
                // ADD and MOD both re-arm: what is ready is reported once
                // more, as the kernel does.
                set.moved.insert(
                    fd,
                    Member {
                        events,
                        data,
                        seen: (u64::MAX, u64::MAX),
                    },
                );
            }
        }
    });
}

/// The moved members of `epfd` ready now, written to `out` (at most
/// `max`); `EPOLLONESHOT` ones disarmed, `EPOLLET` ones as edges.
fn collect(epfd: RawFd, out: *mut epoll_event, max: usize) -> usize {
    const ONESHOT: u32 = libc::EPOLLONESHOT as u32;
    const ET: u32 = libc::EPOLLET as u32;
    let members: Vec<(RawFd, Member, Arc<Sock>)> = sets(|s| {
        s.get(&epfd).map_or_else(Vec::new, |set| {
            set.moved
                .iter()
                .filter(|(_, m)| m.events & !(ONESHOT | ET) != 0)
                .filter_map(|(&fd, &m)| Some((fd, m, lookup(fd)?)))
                .collect()
        })
    });
    let mut n = 0;
    let mut seen = Vec::new();
    for (fd, m, sock) in members {
        if n == max {
            break;
        }
        let now = ready::readiness(&sock) & (m.events | ERR | HUP);
        let edges = (
            sock.bits.read_edges.load(Ordering::Relaxed),
            sock.bits.write_edges.load(Ordering::Relaxed),
        );
        let r = if m.events & ET != 0 {
            let mut r = now;
            if edges.0 == m.seen.0 {
                r &= !(ready::IN | ready::RDHUP | ERR | HUP);
            }
            if edges.1 == m.seen.1 {
                r &= !ready::OUT;
            }
            r
        } else {
            now
        };
        if r == 0 {
            continue;
        }
        if m.events & ET != 0 {
            seen.push((fd, edges, false));
        }
        // SAFETY: `out` has room for `max` events (the caller's contract).
        unsafe {
            out.add(n).write_unaligned(epoll_event {
                events: r,
                u64: m.data,
            })
        };
        n += 1;
        if m.events & ONESHOT != 0 {
            seen.push((fd, edges, true));
        }
    }
    if !seen.is_empty() {
        sets(|s| {
            if let Some(set) = s.get_mut(&epfd) {
                for (fd, edges, disarm) in seen {
                    if let Some(m) = set.moved.get_mut(&fd) {
                        m.seen = edges;
                        if disarm {
                            m.events = ONESHOT;
                        }
                    }
                }
            }
        });
    }
    n
}

fn has_moved(epfd: RawFd) -> bool {
    sets(|s| {
        s.get(&epfd)
            .is_some_and(|set| set.marked || !set.moved.is_empty())
    })
}

fn remaining(deadline: Option<Instant>) -> c_int {
    match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            // Rounded up: a wait never ends early.
            c_int::try_from(left.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX)
        }
    }
}

unsafe fn wait(
    epfd: c_int,
    out: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    sigmask: *const libc::sigset_t,
) -> c_int {
    if max <= 0 || out.is_null() || !has_moved(epfd) {
        // SAFETY: passed on.
        return unsafe { real::epoll_pwait(epfd, out, max, timeout, sigmask) };
    }
    // errno is set here, after the wait's locks are let go (a contended
    // lock's futex call would overwrite it).
    // SAFETY: the same contract.
    match unsafe { wait_moved(epfd, out, max as usize, timeout, sigmask) } {
        Ok(n) => n as c_int,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `epoll_wait` on a set with moved members: the number of events, or
/// the errno to fail with.
unsafe fn wait_moved(
    epfd: c_int,
    out: *mut epoll_event,
    max: usize,
    timeout: c_int,
    sigmask: *const libc::sigset_t,
) -> Result<usize, c_int> {
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    let mut spun = false;
    // On the sleepers' list from the look before a sleep until it ends.
    let mut asleep = None;
    // A handler that runs while this call spins or looks (not asleep in
    // the kernel) still ends it with EINTR, as it would the kernel's.
    let signals = intr::delivered();
    loop {
        ready::pump();
        let mut n = collect(epfd, out, max);
        if n == 0 && intr::delivered() != signals {
            return Err(libc::EINTR);
        }
        if n == 0 && timeout != 0 && !spun {
            spun = true;
            let k = spin(epfd, out, max, sigmask, signals)?;
            if k > 0 {
                return Ok(k);
            }
            // Once per wait: a second registration's end would take the
            // first off the list with it.
            if asleep.is_none() {
                asleep = bell::Asleep::new();
            }
            if let Some(a) = &asleep {
                bell_in(epfd, a);
            }
            continue;
        }
        spun = false;
        if n < max {
            let t = if n > 0 { 0 } else { remaining(deadline) };
            // SAFETY: `out[n..max]` is the caller's room.
            let k = unsafe { real::epoll_pwait(epfd, out.add(n), (max - n) as c_int, t, sigmask) };
            let err = (k < 0).then(errno);
            // Drop the markers' events (they only woke us), keep the rest.
            let (kept, rang) = drop_marks(out, n, k.max(0) as usize, asleep.as_ref());
            if let Some(a) = &asleep {
                a.drain(rang);
            }
            if let Some(e) = err {
                return if n > 0 { Ok(n) } else { Err(e) };
            }
            n += kept;
        }
        if n > 0 {
            return Ok(n);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(0);
        }
        // The kernel woke us for the marker alone: X-IO has something.
    }
}

/// Puts this thread's bell in kernel set `epfd`, once.
fn bell_in(epfd: RawFd, a: &bell::Asleep) {
    if !sets(|s| s.entry(epfd).or_default().bells.insert(a.id())) {
        return;
    }
    let mut ev = epoll_event {
        events: ready::IN,
        u64: bell_data(a.id()),
    };
    // SAFETY: `ev` is a valid event for the call.
    unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, a.fd(), &mut ev) };
}

/// Before a wait sleeps in the kernel: watches the rings (lock-free, the
/// doorbell off) for the adaptive budget, which is zero unless a peer is
/// awake on another core, looking at the kernel set now and then. A
/// wake-up from sleep costs tens of microseconds on a VM; a request that
/// comes within the budget costs none. Returns the kernel's events found
/// meanwhile (written to `out`), or 0 (then look at X-IO again), or the
/// errno of a failed look (`EINTR`: a signal the caller's `sigmask` let
/// in).
fn spin(
    epfd: c_int,
    out: *mut epoll_event,
    max: usize,
    sigmask: *const libc::sigset_t,
    signals: u64,
) -> Result<usize, c_int> {
    let Some(net) = net() else { return Ok(0) };
    let mut w = net.watch_begin();
    let budget = net.spin_budget();
    let start = Instant::now();
    let mut looks = 0u32;
    let mut found = 0;
    let mut hit = false;
    loop {
        if w.has_input() {
            hit = true;
            break;
        }
        looks = looks.wrapping_add(1);
        if looks % 64 == 0 {
            if start.elapsed() >= budget || intr::delivered() != signals {
                break;
            }
            // SAFETY: `out` has room for `max` events.
            let k = unsafe { real::epoll_pwait(epfd, out, max as c_int, 0, sigmask) };
            if k < 0 {
                let e = errno();
                net.watch_end(w, hit, start.elapsed());
                return Err(e);
            }
            // (A bell found here rings again in the wait that follows,
            // which reads it.)
            let (kept, _) = drop_marks(out, 0, k as usize, None);
            if kept > 0 {
                found = kept;
                // The doorbell was off while watching: take in what came
                // meanwhile, for the threads asleep on it (see `bell`).
                ready::pump();
                break;
            }
        }
        std::hint::spin_loop();
    }
    net.watch_end(w, hit, start.elapsed());
    Ok(found)
}

/// Removes the markers' events (the poll fd's and the bells') from
/// `out[from..from + k]`, keeping the others in order; returns how many
/// are kept, and whether `mine`'s bell was among them. The poll fd's is
/// noted for the next pump (`ready::note_rung`).
fn drop_marks(
    out: *mut epoll_event,
    from: usize,
    k: usize,
    mine: Option<&bell::Asleep>,
) -> (usize, bool) {
    let own = mine.map(|a| bell_data(a.id()));
    let mut kept = from;
    let mut rang = false;
    for i in from..from + k {
        // SAFETY: the kernel wrote `k` events from `out[from]`.
        let e = unsafe { out.add(i).read_unaligned() };
        rang |= Some(e.u64) == own;
        if e.u64 == MARK {
            ready::note_rung();
        }
        if e.u64 != MARK && e.u64 & BELL_MASK != BELL {
            // SAFETY: `kept <= i`, in the same buffer.
            unsafe { out.add(kept).write_unaligned(e) };
            kept += 1;
        }
    }
    (kept - from, rang)
}

/// `epoll_wait(2)`.
///
/// # Safety
///
/// As libc's: `out` has room for `max` events.
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    out: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    // SAFETY: the same contract.
    unsafe { wait(epfd, out, max, timeout, std::ptr::null()) }
}

/// `epoll_pwait(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    out: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    sigmask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the same contract.
    unsafe { wait(epfd, out, max, timeout, sigmask) }
}

/// `poll(2)` over moved and kernel fds.
///
/// # Safety
///
/// As libc's: `fds` has `n` entries.
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    // SAFETY: the same contract.
    unsafe { poll_until(fds, n, deadline, std::ptr::null()) }
}

/// `__poll_chk`, what `poll` becomes under `_FORTIFY_SOURCE`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
    _fdslen: usize,
) -> c_int {
    // SAFETY: the same contract.
    unsafe { poll(fds, n, timeout) }
}

/// `__ppoll_chk`, what `ppoll` becomes under `_FORTIFY_SOURCE`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
    _fdslen: usize,
) -> c_int {
    // SAFETY: the same contract.
    unsafe { ppoll(fds, n, timeout, sigmask) }
}

/// `ppoll(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let deadline = if timeout.is_null() {
        None
    } else {
        // SAFETY: the caller's timespec.
        let t = unsafe { *timeout };
        Some(
            Instant::now()
                + Duration::new(
                    t.tv_sec.max(0) as u64,
                    t.tv_nsec.clamp(0, 999_999_999) as u32,
                ),
        )
    };
    // SAFETY: the same contract.
    unsafe { poll_until(fds, n, deadline, sigmask) }
}

unsafe fn poll_until(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    deadline: Option<Instant>,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let list: &mut [libc::pollfd] = if n == 0 || fds.is_null() {
        &mut []
    } else {
        // SAFETY: the caller's `n` entries.
        unsafe { std::slice::from_raw_parts_mut(fds, n as usize) }
    };
    let moved: Vec<Option<Arc<Sock>>> = list.iter().map(|p| lookup(p.fd)).collect();
    // Without a moved socket in the set, libc's own, at once: no net.
    let pfd = if moved.iter().all(Option::is_none) {
        None
    } else {
        net().and_then(|n| ready::poll_fd(&n))
    };
    if pfd.is_none() {
        let t = remaining_ts(deadline);
        // SAFETY: passed on.
        return unsafe {
            real::ppoll(
                fds,
                n,
                t.as_ref().map_or(std::ptr::null(), |t| t as *const _),
                sigmask,
            )
        };
    }
    let pfd = pfd.expect("checked");
    // A listener's X-IO side listens from now (the program waits here
    // rather than in `accept`); its kernel side is polled as the kernel's.
    let kernel_side = |m: &Option<Arc<Sock>>| match m.as_deref() {
        None => true,
        Some(Sock {
            kind: Kind::Listener { addr, xio },
            ..
        }) => {
            let _ = xio_listener(xio, *addr);
            true
        }
        Some(_) => false,
    };
    let polled: Vec<bool> = moved.iter().map(kernel_side).collect();
    // The kernel's members, then the net's poll fd.
    let mut kernel: Vec<libc::pollfd> = list
        .iter()
        .zip(&polled)
        .filter(|(_, k)| **k)
        .map(|(p, _)| libc::pollfd {
            fd: p.fd,
            events: p.events,
            revents: 0,
        })
        .collect();
    // On the sleepers' list before the first look (see `bell`), its bell
    // polled with the rest; a handler run meanwhile ends the call (EINTR).
    let asleep = bell::Asleep::new();
    let signals = intr::delivered();
    for fd in std::iter::once(pfd).chain(asleep.as_ref().map(bell::Asleep::fd)) {
        kernel.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }
    loop {
        ready::pump();
        let mut count = 0;
        for (p, m) in list.iter_mut().zip(&moved) {
            p.revents = 0;
            if let Some(s) = m {
                let r = ready::readiness(s) as libc::c_short
                    & (p.events | libc::POLLERR | libc::POLLHUP);
                p.revents = r;
                if r != 0 {
                    count += 1;
                }
            }
        }
        if count == 0 && intr::delivered() != signals {
            // Off the sleepers' list first: its lock may set errno.
            drop(asleep);
            set_errno(libc::EINTR);
            return -1;
        }
        let t = if count > 0 {
            Some(libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            })
        } else {
            remaining_ts(deadline)
        };
        for k in kernel.iter_mut() {
            k.revents = 0;
        }
        // SAFETY: `kernel` holds `kernel.len()` entries.
        let r = unsafe {
            real::ppoll(
                kernel.as_mut_ptr(),
                kernel.len() as libc::nfds_t,
                t.as_ref().map_or(std::ptr::null(), |t| t as *const _),
                sigmask,
            )
        };
        let err = errno();
        // The poll fd and the bell are the last entries.
        let tail = kernel.len() - 1 - usize::from(asleep.is_some());
        if r > 0 && kernel[tail].revents != 0 {
            ready::note_rung();
        }
        if let (Some(a), Some(b)) = (&asleep, kernel.last()) {
            a.drain(r > 0 && b.revents != 0);
        }
        if r < 0 {
            if count > 0 {
                return count;
            }
            drop(asleep);
            set_errno(err);
            return -1;
        }
        let mut ki = 0;
        for (p, k) in list.iter_mut().zip(&polled) {
            if *k {
                // A listener's X-IO readiness (set above) and its kernel's.
                let had = p.revents != 0;
                p.revents |= kernel[ki].revents;
                if p.revents != 0 && !had {
                    count += 1;
                }
                ki += 1;
            }
        }
        if count > 0 {
            return count;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
    }
}

fn remaining_ts(deadline: Option<Instant>) -> Option<libc::timespec> {
    deadline.map(|d| {
        let left = d.saturating_duration_since(Instant::now());
        libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        }
    })
}

/// `select(2)` over moved and kernel fds: as `poll` (the sets turned
/// into a poll list and back); the time left is written back, as
/// Linux's `select` does.
///
/// # Safety
///
/// As libc's: each set is null or a valid `fd_set`.
#[no_mangle]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    // SAFETY: the caller's sets.
    if !unsafe { any_moved(n, [r, w, e]) } {
        // SAFETY: passed on.
        return unsafe { real::select(n, r, w, e, t) };
    }
    let deadline = (!t.is_null()).then(|| {
        // SAFETY: the caller's timeval.
        let tv = unsafe { *t };
        Instant::now()
            + Duration::from_secs(tv.tv_sec.max(0) as u64)
            + Duration::from_micros(tv.tv_usec.clamp(0, 999_999) as u64)
    });
    // SAFETY: the caller's sets.
    let rc = unsafe { select_until(n, [r, w, e], deadline, std::ptr::null()) };
    if let (Some(left), false) = (remaining_ts(deadline), t.is_null()) {
        // SAFETY: the caller's timeval, written back.
        unsafe {
            (*t).tv_sec = left.tv_sec;
            (*t).tv_usec = (left.tv_nsec / 1000) as libc::suseconds_t;
        }
    }
    rc
}

/// `pselect(2)`: [`select`] with a `timespec` and a signal mask for the
/// wait.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's sets.
    if !unsafe { any_moved(n, [r, w, e]) } {
        // SAFETY: passed on.
        return unsafe { real::pselect(n, r, w, e, t, sigmask) };
    }
    let deadline = (!t.is_null()).then(|| {
        // SAFETY: the caller's timespec.
        let ts = unsafe { *t };
        Instant::now()
            + Duration::new(
                ts.tv_sec.max(0) as u64,
                ts.tv_nsec.clamp(0, 999_999_999) as u32,
            )
    });
    // SAFETY: the caller's sets.
    unsafe { select_until(n, [r, w, e], deadline, sigmask) }
}

/// The fds below `n` (at most `FD_SETSIZE`) in any of `sets`.
///
/// # Safety
///
/// Each set is null or a valid `fd_set`.
unsafe fn members(n: c_int, sets: [*mut libc::fd_set; 3]) -> impl Iterator<Item = RawFd> {
    let n = n.clamp(0, libc::FD_SETSIZE as c_int);
    (0..n).filter(move |&fd| {
        sets.iter()
            // SAFETY: the caller's sets, `fd` below FD_SETSIZE.
            .any(|&s| !s.is_null() && unsafe { libc::FD_ISSET(fd, s) })
    })
}

/// Whether any fd in `sets` is a moved socket.
///
/// # Safety
///
/// As [`members`].
unsafe fn any_moved(n: c_int, sets: [*mut libc::fd_set; 3]) -> bool {
    // SAFETY: the caller's contract.
    crate::MOVED.load(Ordering::Acquire) > 0
        && unsafe { members(n, sets) }.any(|fd| lookup(fd).is_some())
}

/// # Safety
///
/// As [`members`].
unsafe fn select_until(
    n: c_int,
    sets: [*mut libc::fd_set; 3],
    deadline: Option<Instant>,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let [r, w, e] = sets;
    // SAFETY: the caller's sets, each fd below FD_SETSIZE.
    let has = |s: *mut libc::fd_set, fd| !s.is_null() && unsafe { libc::FD_ISSET(fd, s) };
    // SAFETY: the caller's contract.
    let mut list: Vec<libc::pollfd> = unsafe { members(n, sets) }
        .map(|fd| {
            let mut events = 0;
            if has(r, fd) {
                events |= libc::POLLIN;
            }
            if has(w, fd) {
                events |= libc::POLLOUT;
            }
            if has(e, fd) {
                events |= libc::POLLPRI;
            }
            libc::pollfd {
                fd,
                events,
                revents: 0,
            }
        })
        .collect();
    // SAFETY: `list` holds `list.len()` entries.
    let rc = unsafe {
        poll_until(
            list.as_mut_ptr(),
            list.len() as libc::nfds_t,
            deadline,
            sigmask,
        )
    };
    if rc < 0 {
        return rc;
    }
    if list.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        set_errno(libc::EBADF);
        return -1;
    }
    for s in sets.into_iter().filter(|s| !s.is_null()) {
        // SAFETY: the caller's set.
        unsafe { libc::FD_ZERO(s) };
    }
    let mut count = 0;
    for p in &list {
        let ready = [
            (
                r,
                libc::POLLIN,
                libc::POLLIN | libc::POLLHUP | libc::POLLERR,
            ),
            (w, libc::POLLOUT, libc::POLLOUT | libc::POLLERR),
            (e, libc::POLLPRI, libc::POLLPRI),
        ];
        for (s, asked, seen) in ready {
            if !s.is_null() && p.events & asked != 0 && p.revents & seen != 0 {
                // SAFETY: the caller's set, `p.fd` below FD_SETSIZE.
                unsafe { libc::FD_SET(p.fd, s) };
                count += 1;
            }
        }
    }
    count
}
