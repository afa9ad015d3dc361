//! Waiting for input: the waiting policy (spin while a peer is awake on
//! another CPU, then sleep on the futex; see [`crate::wait`]) over the
//! rings, for a stack ([`Stack::wait`]) or for a driver thread that waits
//! without holding it ([`Probe`]); the eventfd doorbell a reactor polls;
//! and the backoff where no doorbell exists (a full ring, an exhausted
//! pool).

use std::io;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Doorbell, RingWatch};
use crate::layout::{StackSlot, SLEEP_EVENTFD, SLEEP_FUTEX};
use crate::segment::Segment;
use crate::sync::{fence, futex_wake, spin_hint, AtomicU32, Ordering};
use crate::wait::{now_ns, AdaptiveSpin, WaitMode};

use super::{Chan, Error, Stack};

impl Stack {
    /// Waits until something may be ready, per the waiting mode.
    pub(super) fn wait(&mut self, deadline: Option<Instant>) -> Result<(), Error> {
        // Waits that never sleep get no liveness tick: with the manager
        // dead they look at the control socket themselves (before a
        // non-blocking wait fails), and what that closes ends the wait.
        if self.never_sleeps_tick() {
            self.poll_ctrl()?;
            if !self.inbox.is_empty() {
                return Ok(());
            }
        }
        let mut view = StackView {
            inbox: !self.inbox.is_empty(),
            seg: &self.seg,
            ctrl_seen: self.ctrl_seen,
            id: self.id,
            channels: &mut self.channels,
        };
        let woken = wait_on(
            self.seg.stack_slot(self.id),
            self.seg.manager_alive(),
            !self.manager_here,
            self.mode,
            &mut self.spin,
            &mut view,
            deadline,
            &|| true,
        )?;
        if woken == Woken::Tick {
            self.poll_ctrl()?;
        }
        Ok(())
    }

    /// A [`Probe`] on this stack's rings, for a driver that waits without
    /// holding the stack (another thread may send meanwhile). `reuse` is
    /// the previous probe, kept if the channels did not change. Give it
    /// back with [`Stack::end_probe`].
    /// Boxed: a probe holds the segment (~340 bytes), and it moves in and
    /// out of its owner at every wait.
    pub(crate) fn probe(&mut self, reuse: Option<Box<Probe>>) -> Box<Probe> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let mut p = match reuse {
            Some(p) if p.epoch_seen == epoch => p,
            _ => Box::new(Probe {
                seg: self.seg.clone(),
                id: self.id,
                ctrl_seen: 0,
                watches: self.ring_watches(),
                epoch: self.epoch.clone(),
                epoch_seen: epoch,
                mode: self.mode,
                spin: AdaptiveSpin::default(),
                born: self.born,
                manager_here: self.manager_here,
            }),
        };
        p.ctrl_seen = self.ctrl_seen;
        p.mode = self.mode;
        p.spin = std::mem::take(&mut self.spin);
        p
    }

    /// Brings a probe that stays out up to date after a drain: what the
    /// control socket said is seen, and new channels are watched. Counts
    /// a hit for the adaptive policy.
    pub(crate) fn refresh_probe(&mut self, p: &mut Probe) {
        let epoch = self.epoch.load(Ordering::Acquire);
        if p.epoch_seen != epoch {
            p.watches = self.ring_watches();
            p.epoch_seen = epoch;
        }
        p.ctrl_seen = self.ctrl_seen;
        p.spin.on_spin_start();
        p.spin.on_spin_hit();
    }

    /// A watch of every channel's receive ring, for a probe.
    fn ring_watches(&self) -> Vec<(u16, Box<dyn RingWatch>)> {
        self.channels
            .iter()
            .map(|c| (c.peer, c.rx.watch()))
            .collect()
    }

    /// Takes back what a probe learned (the adaptive policy's state).
    pub(crate) fn end_probe(&mut self, p: &mut Probe) {
        self.spin = std::mem::take(&mut p.spin);
    }

    /// Asks peers to ring the eventfd doorbell (not the futex) when they
    /// send: what a reactor that polls [`Stack::doorbell_fd`] needs. The
    /// Dekker half of `notify`: publish, then look at the rings. Returns
    /// false (and leaves the doorbell unarmed) when something is already
    /// there to drain.
    pub(crate) fn arm_doorbell(&mut self) -> bool {
        if self.forked() {
            return false; // not our slot: the caller drains, and fails
        }
        let slot = self.seg.stack_slot(self.id);
        slot.sleeping.store(SLEEP_EVENTFD, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let ready = !self.inbox.is_empty()
            || slot.ctrl_seq.load(Ordering::Acquire) != self.ctrl_seen
            || self.channels.iter_mut().any(|c| c.rx.has_data());
        if ready {
            slot.sleeping.store(0, Ordering::Relaxed);
        }
        !ready
    }

    /// Whether anything waits to be drained (shared loads only).
    pub(crate) fn has_input(&mut self) -> bool {
        !self.inbox.is_empty()
            || self.slot().ctrl_seq.load(Ordering::Acquire) != self.ctrl_seen
            || self.channels.iter_mut().any(|c| c.rx.has_data())
    }

    /// How long a waiter should watch the rings before sleeping now, per
    /// the adaptive policy (0 unless a peer is awake on another CPU).
    pub(crate) fn spin_budget_now(&mut self) -> u64 {
        if self.mode != WaitMode::Adaptive {
            return if self.mode == WaitMode::BusyPoll {
                u64::MAX
            } else {
                0
            };
        }
        let my_cpu = rustix::thread::sched_getcpu() as u32 + 1;
        let slot = self.seg.stack_slot(self.id);
        if slot.cpu.load(Ordering::Relaxed) != my_cpu {
            slot.cpu.store(my_cpu, Ordering::Relaxed);
        }
        let worth = peers_worth_spinning(&self.seg, self.channels.iter().map(|c| c.peer), my_cpu);
        self.spin.spin_for(worth)
    }

    /// Undoes [`Stack::arm_doorbell`] (peers stop ringing) while a thread
    /// watches the rings itself.
    pub(crate) fn disarm_doorbell(&mut self) {
        if self.forked() {
            return;
        }
        let slot = self.seg.stack_slot(self.id);
        let _ =
            slot.sleeping
                .compare_exchange(SLEEP_EVENTFD, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// The adaptive policy, to report a gap measured outside `wait`.
    pub(crate) fn spin_mut(&mut self) -> &mut AdaptiveSpin {
        &mut self.spin
    }

    /// Consumes a ring of the eventfd doorbell.
    pub(crate) fn clear_doorbell(&self) {
        if !self.forked() {
            self.bell.drain(); // the parent's rings, otherwise
        }
    }

    /// Makes the doorbell fd readable (an external loop must come back).
    pub(crate) fn ring_self(&self) -> io::Result<()> {
        if self.forked() {
            return Err(Error::Forked.into());
        }
        self.bell.ring()
    }

    /// Ends the wait of a driver thread (see [`Probe`]) at once: something
    /// local became ready that its rings will not show. The Dekker pair of
    /// the sleep in `wait_on`: bump what the probe checks, then look at
    /// `sleeping`.
    pub(crate) fn kick(&self) {
        if self.forked() {
            return;
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let s = self.slot();
        if s.sleeping.load(Ordering::Relaxed) == SLEEP_FUTEX
            && s.sleeping.swap(0, Ordering::AcqRel) == SLEEP_FUTEX
        {
            futex_wake(&s.sleeping);
        }
    }
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Woken {
    /// Something looked ready (seen while spinning or before sleeping), or
    /// a peer rang.
    Ready,
    /// The liveness tick: nobody rang; look at the control socket.
    Tick,
}

/// What a waiter looks at while it waits.
trait WaitView {
    /// Whether anything could be ready (shared loads only).
    fn ready(&mut self) -> bool;
    /// Whether spinning can pay: some peer awake on another CPU.
    fn worth_spinning(&self, my_cpu: u32) -> bool;
}

fn peers_worth_spinning(seg: &Segment, peers: impl Iterator<Item = u16>, my_cpu: u32) -> bool {
    peers.into_iter().any(|p| {
        let s = seg.stack_slot(p);
        s.sleeping.load(Ordering::Relaxed) == 0 && s.cpu.load(Ordering::Relaxed) != my_cpu
    })
}

struct StackView<'a> {
    inbox: bool,
    seg: &'a Segment,
    ctrl_seen: u32,
    id: u16,
    channels: &'a mut [Chan],
}

impl WaitView for StackView<'_> {
    fn ready(&mut self) -> bool {
        self.inbox
            || self
                .seg
                .stack_slot(self.id)
                .ctrl_seq
                .load(Ordering::Acquire)
                != self.ctrl_seen
            || self.channels.iter_mut().any(|c| c.rx.has_data())
    }
    fn worth_spinning(&self, my_cpu: u32) -> bool {
        peers_worth_spinning(self.seg, self.channels.iter().map(|c| c.peer), my_cpu)
    }
}

/// A stack's rings seen from a driver thread that waits without holding
/// the stack: the socket layer's sockets share one stack behind a lock,
/// and its driver must not hold that lock while it spins or sleeps, or no
/// other thread could send. Watches every ring, the control sequence and
/// the channel set (a channel added meanwhile ends the wait, since its
/// ring is not watched).
pub(crate) struct Probe {
    seg: Segment,
    id: u16,
    ctrl_seen: u32,
    watches: Vec<(u16, Box<dyn RingWatch>)>,
    epoch: Arc<AtomicU64>,
    epoch_seen: u64,
    mode: WaitMode,
    spin: AdaptiveSpin,
    /// The attaching process's fork generation (see [`crate::fork`]).
    born: crate::fork::Birth,
    /// See [`Stack`]'s field: do not wait on the manager's liveness word.
    manager_here: bool,
}

impl WaitView for Probe {
    fn ready(&mut self) -> bool {
        self.seg
            .stack_slot(self.id)
            .ctrl_seq
            .load(Ordering::Acquire)
            != self.ctrl_seen
            || self.epoch.load(Ordering::Relaxed) != self.epoch_seen
            || self.watches.iter().any(|(_, w)| w.has_data())
    }
    fn worth_spinning(&self, my_cpu: u32) -> bool {
        peers_worth_spinning(&self.seg, self.watches.iter().map(|(p, _)| *p), my_cpu)
    }
}

impl Probe {
    /// Whether anything may be ready now (shared loads only, no waiting).
    pub(crate) fn ready_now(&mut self) -> bool {
        self.ready()
    }

    /// Waits per the mode until something may be ready or `deadline`
    /// ([`Error::TimedOut`]). True if the wait ended on the liveness tick.
    /// An adaptive wait spins only while `may_spin` says so (asked before
    /// and during the spin): the socket layer's driver must not spin while
    /// threads it woke wait for a CPU, maybe this one.
    pub(crate) fn wait(
        &mut self,
        deadline: Option<Instant>,
        may_spin: &dyn Fn() -> bool,
    ) -> Result<bool, Error> {
        if self.born.forked() {
            return Err(Error::Forked); // the slot and rings are the parent's
        }
        let slot: *const StackSlot = self.seg.stack_slot(self.id);
        // SAFETY: the slot lies in the segment's mapping, which `self.seg`
        // keeps mapped for the whole call (a `Segment` holds the mapping's
        // `Arc`, and nothing here drops it); it is shared memory reached only
        // through atomics, so a shared reference is sound. The raw pointer
        // only detaches the borrow from `self`, which `wait_on` needs as the
        // view (cloning the segment instead copied ~340 bytes per wait).
        let slot = unsafe { &*slot };
        let alive: *const AtomicU32 = self.seg.manager_alive();
        // SAFETY: as for `slot`: the segment's header word, kept mapped by
        // `self.seg` for the whole call, reached only atomically.
        let alive = unsafe { &*alive };
        let mut spin = std::mem::take(&mut self.spin);
        let watch = !self.manager_here;
        let r = wait_on(
            slot, alive, watch, self.mode, &mut spin, self, deadline, may_spin,
        );
        self.spin = spin;
        Ok(r? == Woken::Tick)
    }
}

/// The waiting policy (see [`crate::wait`]) over any [`WaitView`].
/// `alive`: the manager's liveness word (see [`crate::liveness`]), waited
/// on unless the manager runs in this process (`watch` false).
#[allow(clippy::too_many_arguments)]
fn wait_on(
    slot: &StackSlot,
    alive: &AtomicU32,
    watch: bool,
    mode: WaitMode,
    spin: &mut AdaptiveSpin,
    view: &mut impl WaitView,
    deadline: Option<Instant>,
    may_spin: &dyn Fn() -> bool,
) -> Result<Woken, Error> {
    let check_deadline = || match deadline {
        Some(d) if Instant::now() >= d => Err(Error::TimedOut),
        _ => Ok(Woken::Ready),
    };
    match mode {
        WaitMode::NonBlocking => return Err(Error::WouldBlock),
        WaitMode::BusyPoll => {
            for _ in 0..64 {
                if view.ready() {
                    return Ok(Woken::Ready);
                }
                spin_hint();
            }
            return check_deadline();
        }
        WaitMode::Adaptive | WaitMode::Blocking => {}
    }
    let my_cpu = rustix::thread::sched_getcpu() as u32 + 1;
    if slot.cpu.load(Ordering::Relaxed) != my_cpu {
        slot.cpu.store(my_cpu, Ordering::Relaxed);
    }
    // The clock feeds only the adaptive policy; blocking mode skips it
    // (three clock reads a sleep, on the critical path of each hop).
    let adaptive = mode == WaitMode::Adaptive;
    let clock = || if adaptive { now_ns() } else { 0 };
    let start = clock();
    if adaptive {
        let budget = spin.spin_for(may_spin() && view.worth_spinning(my_cpu));
        if budget > 0 {
            spin.on_spin_start();
            let mut i = 0u32;
            loop {
                if view.ready() {
                    spin.on_spin_hit();
                    return Ok(Woken::Ready);
                }
                spin_hint();
                i = i.wrapping_add(1);
                if i % 256 == 0 {
                    let now = now_ns();
                    if now - start >= budget || !may_spin() || !view.worth_spinning(my_cpu) {
                        break;
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Error::TimedOut);
                    }
                }
            }
        }
    }
    // Sleep. Dekker with `notify`: we store `sleeping` then load the
    // rings; a producer stores its slot then loads `sleeping`. The
    // SeqCst fences on both sides make at least one see the other.
    slot.sleeping.store(SLEEP_FUTEX, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    if view.ready() {
        slot.sleeping.store(0, Ordering::Relaxed);
        return Ok(Woken::Ready);
    }
    let timeout = match deadline {
        Some(d) => {
            let now = Instant::now();
            if now >= d {
                slot.sleeping.store(0, Ordering::Relaxed);
                return Err(Error::TimedOut);
            }
            Some(d - now)
        }
        None => None,
    };
    let slept_from = clock();
    // Only this stack writes its counter: no locked instruction needed.
    slot.sleeps
        .store(slot.sleeps.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    // One system call to sleep and one (the waker's) to wake, as with a
    // socket. The futex returns at once if a producer already swapped
    // the word back to 0. The manager wakes us the same way after
    // queueing a control message (and bumping `ctrl_seq`). A dead
    // manager ends the sleep through its liveness word, with no timer
    // armed (see `crate::liveness`; where that cannot work, a one-second
    // tick): then, as when nobody rang, we look at the control socket.
    let manager_woke = crate::liveness::sleep(&slot.sleeping, SLEEP_FUTEX, alive, watch, timeout);
    let rung = slot.sleeping.swap(0, Ordering::AcqRel) == 0 && !manager_woke;
    if adaptive {
        let woke = now_ns();
        let rung_at = slot.rung_at.load(Ordering::Relaxed);
        let wake = (rung && rung_at >= slept_from).then(|| woke.saturating_sub(rung_at));
        spin.on_sleep(slept_from - start, woke - slept_from, wake);
    }
    Ok(if rung { Woken::Ready } else { Woken::Tick })
}

/// Waits a little longer each time: spin, then yield, then short sleeps.
/// Used where no doorbell exists (a full ring, an exhausted pool).
pub(super) fn backoff_wait(step: &mut u32, mode: WaitMode) {
    *step = step.saturating_add(1);
    match mode {
        WaitMode::BusyPoll => spin_hint(),
        _ if *step < 64 => spin_hint(),
        _ if *step < 128 => std::thread::yield_now(),
        _ => std::thread::sleep(Duration::from_micros(20)),
    }
}
