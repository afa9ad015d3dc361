//! Who waits for what: waiter lists, wake-ups, and the blocking driver ([`Net::block`]).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;
use std::task::Waker;
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::conn::ConnId;
use crate::signal::ReadSignal;
use crate::stack::Error;
use crate::sync::FxHashMap as HashMap;

use super::core::Core;
use super::event_loop::RETRY_FULL;
use super::{stack_err, Net, Try, WeakNet};

/// Most emptied waiter lists a net keeps for reuse.
const SPARE_LISTS: usize = 1024;

/// What waits for a key: a blocked thread, or a task's waker.
///
/// Tasks wait as tokio's tasks wait on a socket: a `poll_*` method keeps
/// the waker of the task that called it last ([`Waiter::Slot`], one per
/// key, as tokio keeps one per direction of a socket), and a future that
/// owns a [`WaitEntry`] keeps its own place until it is woken or dropped
/// ([`Waiter::Entry`], as tokio's `readable()` and `accept()` futures sit
/// in a socket's waiter list). Both bound the list without ever waking a
/// task before what it waits for happens: a slot by replacing, an entry
/// by leaving when its future goes.
#[derive(Debug)]
pub(crate) enum Waiter {
    /// A thread parked in a blocking call.
    Thread(Thread),
    /// The task that called a `poll_*` method for the key last.
    Slot(Waker),
    /// A future's place, by its [`WaitEntry`]'s id.
    Entry(u64, Waker),
    /// A waker leaving its list without a wake-up (replaced, or its
    /// future dropped): dropped outside the lock with the wake-ups, since
    /// dropping a task's last waker can run its code.
    Dropped(#[allow(dead_code)] Waker),
}

impl Waiter {
    fn wake(self) {
        match self {
            Waiter::Thread(t) => t.unpark(),
            Waiter::Slot(w) | Waiter::Entry(_, w) => w.wake(),
            Waiter::Dropped(_) => {}
        }
    }

    pub(super) fn is_task(&self) -> bool {
        matches!(self, Waiter::Slot(_) | Waiter::Entry(..))
    }
}

/// The waiters of one key.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    pub(super) list: Vec<Waiter>,
}

/// A future's place in the waiter list of what it waits for (the adapter
/// interface's `*_entry` methods): kept until that becomes ready, and
/// left when the future that owns it is dropped, so every waiting future
/// is woken once, when it should be, however many wait on one stream or
/// listener. (The plain `poll_*` methods keep only the last task's waker,
/// as `tokio::net::TcpStream::poll_read_ready` does.)
#[derive(Debug, Default)]
pub struct WaitEntry {
    /// The key and the entry's id, while it is (or may be) in a list.
    pub(super) at: Option<(Key, u64)>,
    /// The net whose list that is.
    net: Option<WeakNet>,
}

impl WaitEntry {
    /// Leaves the list of a net other than `net` (a listener that followed
    /// a restarted manager waits on a new net), before `net`'s lock is
    /// taken: one thread never holds two nets' locks.
    pub(super) fn leave_unless(&mut self, net: &Net) {
        let other = self
            .net
            .as_ref()
            .is_some_and(|w| !std::sync::Weak::ptr_eq(&w.0, &Arc::downgrade(&net.shared)));
        if other {
            self.leave();
        }
    }

    /// Leaves the list it is in, if any.
    fn leave(&mut self) {
        let (Some((key, id)), Some(net)) = (self.at.take(), self.net.take()) else {
            return;
        };
        let Some(net) = net.upgrade() else { return };
        if net.inherited() {
            return; // the parent's net: its lists are the parent's
        }
        let mut gone = Vec::new();
        net.lock().remove_entry(key, id, &mut gone);
        drop(gone);
    }
}

impl Drop for WaitEntry {
    fn drop(&mut self) {
        self.leave();
    }
}

/// What a waiter waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Read(ConnId),
    Write(ConnId),
    Connect(ConnId),
    Accept(SocketAddr),
    Poll,
}

impl Key {
    /// A stream's key: its connection's table index and which of its
    /// three places.
    fn conn_place(self) -> Option<(ConnId, usize)> {
        match self {
            Key::Read(c) => Some((c, 0)),
            Key::Write(c) => Some((c, 1)),
            Key::Connect(c) => Some((c, 2)),
            Key::Accept(_) | Key::Poll => None,
        }
    }
}

/// The waiter lists of a net, by key.
///
/// A stream's keys (read, write, connect) live in a vector by their
/// connection's table index: a task that waits registers there and its
/// wake-up takes it out, once per request at every connection, which as
/// a hash map's insert and remove was the largest part of the waiter
/// bookkeeping under tokio at many connections. A place holds the full
/// connection id with its list, so a later connection at the same index
/// never sees an earlier one's waiters; while a place is taken by another
/// id (a closed stream's list not yet gone), the key goes to the map,
/// which also holds the listeners' and the event loop's keys. A key is in
/// one of the two at most: the vector is used only when the map does not
/// hold it.
#[derive(Debug, Default)]
pub(super) struct WaiterMap {
    conns: Vec<[Option<(ConnId, Waiters)>; 3]>,
    /// How many places of `conns` hold a list.
    in_conns: usize,
    other: HashMap<Key, Waiters>,
}

impl WaiterMap {
    pub(super) fn is_empty(&self) -> bool {
        self.in_conns == 0 && self.other.is_empty()
    }

    /// The vector's place for `key`, if it is a stream's key and the place
    /// is its own (or free).
    fn place(&self, key: Key) -> Option<&Option<(ConnId, Waiters)>> {
        let (c, i) = key.conn_place()?;
        let p = &self.conns.get(c.index())?[i];
        match p {
            Some((id, _)) if *id != c => None,
            _ => Some(p),
        }
    }

    pub(super) fn get(&self, key: &Key) -> Option<&Waiters> {
        match self.place(*key) {
            Some(Some((_, ws))) => Some(ws),
            _ => self.other.get(key),
        }
    }

    pub(super) fn get_mut(&mut self, key: &Key) -> Option<&mut Waiters> {
        if let Some((c, i)) = key.conn_place() {
            if let Some(Some((id, ws))) = self.conns.get_mut(c.index()).map(|p| &mut p[i]) {
                if *id == c {
                    return Some(ws);
                }
            }
        }
        self.other.get_mut(key)
    }

    pub(super) fn contains_key(&self, key: &Key) -> bool {
        self.get(key).is_some()
    }

    pub(super) fn remove(&mut self, key: &Key) -> Option<Waiters> {
        if let Some((c, i)) = key.conn_place() {
            if let Some(p) = self.conns.get_mut(c.index()).map(|p| &mut p[i]) {
                if p.as_ref().is_some_and(|(id, _)| *id == c) {
                    self.in_conns -= 1;
                    return p.take().map(|(_, ws)| ws);
                }
            }
        }
        if self.other.is_empty() {
            return None;
        }
        self.other.remove(key)
    }

    /// `key`'s list, made with `new` if it has none.
    pub(super) fn get_or_insert_with(
        &mut self,
        key: Key,
        new: impl FnOnce() -> Waiters,
    ) -> &mut Waiters {
        if let Some((c, i)) = key.conn_place() {
            let in_map = !self.other.is_empty() && self.other.contains_key(&key);
            if !in_map {
                let at = c.index();
                if self.conns.len() <= at {
                    self.conns.resize_with(at + 1, Default::default);
                }
                let p = &mut self.conns[at][i];
                match p {
                    None => {
                        self.in_conns += 1;
                        return &mut p.insert((c, new())).1;
                    }
                    Some((id, _)) if *id == c => return &mut p.as_mut().expect("just seen").1,
                    Some(_) => {} // another id's place: the map
                }
            }
        }
        self.other.entry(key).or_insert_with(new)
    }

    /// Every key with its list, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (Key, &Waiters)> {
        let conns = self.conns.iter().flat_map(|places| {
            places.iter().enumerate().filter_map(|(i, p)| {
                let (c, ws) = p.as_ref()?;
                let key = match i {
                    0 => Key::Read(*c),
                    1 => Key::Write(*c),
                    _ => Key::Connect(*c),
                };
                Some((key, ws))
            })
        });
        // The vector is empty of lists most of the time it is walked
        // (a driver's death, the manager's): skip it then.
        let conns = (self.in_conns > 0).then_some(conns).into_iter().flatten();
        conns.chain(self.other.iter().map(|(k, ws)| (*k, ws)))
    }

    /// Every key, in no particular order.
    pub(super) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.iter().map(|(k, _)| k)
    }
}

impl Core {
    /// Moves the waiters of `key` to `wake`; true if nobody was parked on
    /// it (the driver may be the one waiting for it).
    pub(super) fn wake_key(&mut self, key: Key, wake: &mut Vec<Waiter>) -> bool {
        if let Key::Read(c) = key {
            if let Some(Some(s)) = self.signals.get(c.index()) {
                s.bump();
            }
        }
        // An event loop (`poll`) parks nobody on its streams: skip the
        // lookup that every readiness would pay.
        if self.waiters.is_empty() {
            return true;
        }
        match self.waiters.remove(&key) {
            Some(Waiters { list: mut ws, .. }) => {
                let threads = ws.iter().filter(|w| matches!(w, Waiter::Thread(_))).count();
                // Tasks only, as under an async runtime: no read-modify-write
                // of the shared count on every wake-up.
                if threads > 0 {
                    self.parked -= threads;
                    self.threads_woken += threads as u64;
                    self.waking.fetch_add(threads, AtomicOrdering::Relaxed);
                }
                wake.append(&mut ws);
                self.recycle(ws);
                false
            }
            None => true,
        }
    }

    /// Moves every task's waker (not the parked threads) to `wake`, with
    /// the retriers' (see [`Net::wake_tasks`]).
    pub(super) fn take_wakers(&mut self, wake: &mut Vec<Waiter>) {
        let keys: Vec<Key> = self
            .waiters
            .iter()
            .filter(|(_, ws)| ws.list.iter().any(Waiter::is_task))
            .map(|(k, _)| k)
            .collect();
        for key in keys {
            if let Key::Read(c) = key {
                // A reader whose waker leaves the list must not take the
                // lock-free `Pending` of `ReadSignal` on its next poll.
                if let Some(Some(s)) = self.signals.get(c.index()) {
                    s.bump();
                }
            }
            let Some(ws) = self.waiters.get_mut(&key) else {
                continue;
            };
            // Threads stay, in their order (`parked` counts only them).
            let mut i = 0;
            while i < ws.list.len() {
                if ws.list[i].is_task() {
                    wake.push(ws.list.remove(i));
                } else {
                    i += 1;
                }
            }
            if ws.list.is_empty() {
                if let Some(ws) = self.waiters.remove(&key) {
                    self.recycle(ws.list);
                }
            }
        }
        wake.extend(self.retry_waiters.drain(..).map(Waiter::Slot));
    }

    /// Keeps an emptied waiter list's allocation for the next key that
    /// gets a waiter: a read or write that waits registers one, and its
    /// wake-up removes it, so without this every wait cost a `malloc` and
    /// a `free`.
    pub(super) fn recycle(&mut self, ws: Vec<Waiter>) {
        if ws.capacity() > 0 && self.spare_lists.len() < SPARE_LISTS {
            self.spare_lists.push(ws);
        }
    }

    /// The waiter list of `key`, created from a spare allocation if new.
    fn waiters_of(&mut self, key: Key) -> &mut Waiters {
        let spare = &mut self.spare_lists;
        self.waiters.get_or_insert_with(key, || Waiters {
            list: spare.pop().unwrap_or_default(),
        })
    }

    fn add_waiter(&mut self, key: Key, w: Waiter) {
        self.waiters_of(key).list.push(w);
        self.parked += 1;
    }

    /// Takes a thread back from its key's waiters after it woke: if it was
    /// no longer there, someone woke it on purpose (and counted it in
    /// `waking`); if it still was, its park ended on its own (a timeout).
    fn remove_thread(&mut self, key: Key, t: &Thread) {
        let mut found = false;
        if let Some(ws) = self.waiters.get_mut(&key) {
            let ws = &mut ws.list;
            let before = ws.len();
            ws.retain(|w| !matches!(w, Waiter::Thread(x) if x.id() == t.id()));
            found = ws.len() < before;
            self.parked -= before - ws.len();
            if ws.is_empty() {
                if let Some(ws) = self.waiters.remove(&key) {
                    self.recycle(ws.list);
                }
            }
        }
        if !found {
            // Saturating: a count that erred low only lets a driver spin.
            let _ =
                self.waking
                    .fetch_update(AtomicOrdering::Relaxed, AtomicOrdering::Relaxed, |n| {
                        n.checked_sub(1)
                    });
        }
    }

    /// Any one parked thread, to take over driving.
    fn take_any_waiter(&mut self) -> Option<Waiter> {
        let key = self
            .waiters
            .iter()
            .find(|(_, ws)| ws.list.iter().any(|w| matches!(w, Waiter::Thread(_))))?
            .0;
        let ws = &mut self.waiters.get_mut(&key)?.list;
        let i = ws.iter().position(|w| matches!(w, Waiter::Thread(_)))?;
        let w = ws.swap_remove(i);
        if ws.is_empty() {
            if let Some(ws) = self.waiters.remove(&key) {
                self.recycle(ws.list);
            }
        }
        self.parked -= 1;
        self.threads_woken += 1;
        self.waking.fetch_add(1, AtomicOrdering::Relaxed);
        Some(w)
    }

    /// Registers a task's waker as `key`'s slot (see [`Waiter::Slot`]):
    /// it replaces the waker of the task that polled before, which goes
    /// to `wake` to be dropped outside the lock, unwoken.
    pub(super) fn add_waker(&mut self, key: Key, w: &Waker, wake: &mut Vec<Waiter>) {
        let ws = &mut self.waiters_of(key).list;
        for x in ws.iter_mut() {
            if let Waiter::Slot(y) = x {
                if !y.will_wake(w) {
                    wake.push(Waiter::Dropped(std::mem::replace(y, w.clone())));
                }
                return;
            }
        }
        ws.push(Waiter::Slot(w.clone()));
    }

    /// Registers a future's waker for `key` in its own place (see
    /// [`WaitEntry`]): the place it holds already (its waker brought up
    /// to date), or a new one. Its place for another key is left first.
    pub(super) fn add_entry(
        &mut self,
        net: &Net,
        key: Key,
        w: &Waker,
        e: &mut WaitEntry,
        wake: &mut Vec<Waiter>,
    ) {
        let id = match e.at {
            Some((k, id)) if k == key => id,
            at => {
                if let Some((k, id)) = at {
                    self.remove_entry(k, id, wake);
                }
                self.entries += 1;
                e.at = Some((key, self.entries));
                if e.net.is_none() {
                    e.net = Some(net.downgrade());
                }
                self.entries
            }
        };
        let ws = &mut self.waiters_of(key).list;
        for x in ws.iter_mut() {
            if let Waiter::Entry(i, y) = x {
                if *i == id {
                    if !y.will_wake(w) {
                        wake.push(Waiter::Dropped(std::mem::replace(y, w.clone())));
                    }
                    return;
                }
            }
        }
        // Not there: new, or woken since it was added (a wake-up takes
        // the list), and waiting again.
        ws.push(Waiter::Entry(id, w.clone()));
    }

    /// Takes entry `id` out of `key`'s list (its future is dropped, or
    /// waits for another key now); its waker goes to `wake`, unwoken.
    pub(super) fn remove_entry(&mut self, key: Key, id: u64, wake: &mut Vec<Waiter>) {
        let Some(ws) = self.waiters.get_mut(&key) else {
            return;
        };
        if let Some(i) = ws
            .list
            .iter()
            .position(|x| matches!(x, Waiter::Entry(j, _) if *j == id))
        {
            if let Waiter::Entry(_, w) = ws.list.remove(i) {
                wake.push(Waiter::Dropped(w));
            }
        }
        if ws.list.is_empty() {
            if let Some(ws) = self.waiters.remove(&key) {
                self.recycle(ws.list);
            }
        }
    }

    /// Records that `w` waits for `c`'s reads (registered just now), so
    /// its next polls may skip the lock (see [`ReadSignal`]).
    pub(super) fn park_reader(&mut self, c: ConnId, sig: &Arc<ReadSignal>, w: &Waker) {
        self.signal_reads(c, sig);
        sig.park(w);
    }

    /// Has the driver bump `sig`'s epoch when it wakes `c`'s readers.
    fn signal_reads(&mut self, c: ConnId, sig: &Arc<ReadSignal>) {
        let i = c.index();
        if self.signals.len() <= i {
            self.signals.resize(i + 1, None);
        }
        let slot = &mut self.signals[i];
        if !slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, sig)) {
            *slot = Some(sig.clone());
        }
    }

    /// After an event loop's non-blocking read attempt on `c` (`found`):
    /// if it left nothing to read, records that for the next read, which
    /// can then say `WouldBlock` without the lock. Only in an event loop:
    /// there `Net::poll` drains the rings and bumps the epoch; elsewhere a
    /// non-blocking read that finds nothing drains them itself.
    pub(super) fn note_read<R>(&mut self, c: ConnId, sig: &Arc<ReadSignal>, found: &Try<R>) {
        if self.track_ready
            && matches!(found, Try::Wait | Try::Done(Ok(_)))
            && !self.table.is_readable(c)
        {
            self.signal_reads(c, sig);
            sig.note_empty();
        }
    }

    pub(super) fn add_retry(&mut self, w: &Waker) {
        if self.retry_waiters.iter().any(|y| y.will_wake(w)) {
            return;
        }
        // The first retrier rings the doorbell: the adapter's driver may be
        // asleep on it with no timer, and only a `Drive` it makes sees
        // `retry` (and then retries every `RETRY`). Without the ring, tasks
        // that met a full ring waited for traffic that might never come.
        if self.retry_waiters.is_empty() {
            let _ = self.stack.ring_self();
        }
        self.retry_waiters.push(w.clone());
    }
}

pub(super) fn wake_all(wake: &mut Vec<Waiter>) {
    for w in wake.drain(..) {
        w.wake();
    }
}

impl Net {
    /// Runs one operation until it completes: the blocking driver. See the
    /// module docs for who waits how.
    pub(super) fn block<R>(
        &self,
        key: Key,
        nonblocking: bool,
        deadline: Option<Instant>,
        mut f: impl FnMut(&mut Core, &mut Vec<Waiter>) -> Try<R>,
    ) -> io::Result<R> {
        let mut wake = Vec::new();
        let mut g = self.lock();
        let mut backoff = 0u32;
        // First try with what the table holds: a read whose data is
        // queued, or a write with credit, needs no look at the rings.
        // After a wait, drain first.
        let mut waited = false;
        // An event loop (a net that has been polled) learns readiness from
        // `poll`, which drains the rings in batches: a non-blocking read or
        // write that finds nothing to do says WouldBlock without draining,
        // as a socket would. Draining there pulled in other connections'
        // messages in the middle of the loop's pass over its events, and
        // batch wake-up then lost to one descriptor per drain.
        let drain_first =
            !(nonblocking && g.track_ready && matches!(key, Key::Read(_) | Key::Write(_)));
        let r = loop {
            if waited && !g.driving {
                if let Err(e) = g.drain(&mut wake) {
                    break Err(e);
                }
            }
            let mut attempt = f(&mut g, &mut wake);
            if !waited && !matches!(attempt, Try::Done(_)) && !g.driving && drain_first {
                if let Err(e) = g.drain(&mut wake) {
                    break Err(e);
                }
                attempt = f(&mut g, &mut wake);
            }
            waited = true;
            let retry = match attempt {
                Try::Done(r) => break r,
                Try::Wait => false,
                Try::Retry => true,
            };
            // What the attempt asked of the table before it stopped (one
            // that finished ran it already): a write on a connection
            // within this net delivered to its reader (and wakes it)
            // before it ran out of credit, and a reader driving the net
            // sees nothing else; left queued, the two would wait for each
            // other.
            g.run_actions(&mut wake);
            if nonblocking {
                if let (true, Key::Write(c)) = (retry, key) {
                    g.note_retry_write(c);
                }
                break Err(io::ErrorKind::WouldBlock.into());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break Err(io::ErrorKind::TimedOut.into());
            }
            // About to wait: what a write batch holds must not wait with
            // us (it may be what the peer needs to answer).
            g.release_held();
            g.ring_unrung();
            if retry {
                // Nothing will ring for a full ring or an empty pool; drain
                // (our own rings may be what the peer waits on) and pause.
                drop(g);
                wake_all(&mut wake);
                backoff = backoff.saturating_add(1);
                match backoff {
                    0..64 => std::hint::spin_loop(),
                    64..128 => std::thread::yield_now(),
                    _ => std::thread::sleep(Duration::from_micros(20)),
                }
                g = self.lock();
                continue;
            }
            if !g.driving {
                g.driving = true;
                let reuse = g.probe.take();
                let mut probe = g.stack.probe(reuse);
                let until = if g.has_pending() || !g.retry_writes.is_empty() {
                    let r = Instant::now() + RETRY_FULL;
                    Some(deadline.map_or(r, |d| d.min(r)))
                } else {
                    deadline
                };
                drop(g);
                wake_all(&mut wake);
                // Threads woken and not yet back need a CPU, maybe this
                // one: a driver spinning here would keep them off it until
                // the scheduler preempts it, milliseconds later. So it
                // spins only while none is on its way.
                let waking = &*self.shared.waking;
                let res = probe.wait(until, &|| waking.load(AtomicOrdering::Relaxed) == 0);
                g = self.lock();
                g.stack.end_probe(&mut probe);
                g.probe = Some(probe);
                g.driving = false;
                // A reactor asleep on the doorbell left the rings to us
                // (`Net::drive`), and our wait disarmed its doorbell: the
                // futex sleep took the slot's word over, or a peer's ring
                // during our spin cleared it. Ring it, so it drives again
                // (draining what we leave, arming again) and hears the
                // peers once we are gone; else its tasks waited for good.
                g.ring_reactor();
                match res {
                    Ok(true) => g.force_ctrl = true,
                    Ok(false) | Err(Error::TimedOut) => {}
                    Err(e) => break Err(stack_err(e)),
                }
            } else {
                let me = std::thread::current();
                g.add_waiter(key, Waiter::Thread(me.clone()));
                // A poll reports writes that met a full ring or an empty
                // pool after a pause (nothing signals them): it looks
                // again then, as a driving poll does.
                let deadline = if key == Key::Poll && !g.retry_writes.is_empty() {
                    let r = Instant::now() + RETRY_FULL;
                    Some(deadline.map_or(r, |d| d.min(r)))
                } else {
                    deadline
                };
                drop(g);
                wake_all(&mut wake);
                match deadline {
                    Some(d) => {
                        std::thread::park_timeout(d.saturating_duration_since(Instant::now()))
                    }
                    None => std::thread::park(),
                }
                g = self.lock();
                g.remove_thread(key, &me);
            }
        };
        // Someone else still waits: hand over the driver's role.
        if !g.driving && g.parked > 0 {
            if let Some(w) = g.take_any_waiter() {
                wake.push(w);
            }
        }
        drop(g);
        wake_all(&mut wake);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(n: usize) -> Waiters {
        Waiters {
            list: (0..n)
                .map(|_| Waiter::Slot(Waker::noop().clone()))
                .collect(),
        }
    }

    /// Two connections at one table index (an earlier one's list still
    /// there when a later one waits) keep their lists apart, and a key is
    /// found where it went, whichever of the two places that was.
    #[test]
    fn a_later_connection_at_an_index_never_sees_an_earlier_ones_waiters() {
        let old = ConnId(7);
        let new = ConnId(7 | 1 << 20); // the same index, the next generation
        assert_eq!(old.index(), new.index());
        let mut m = WaiterMap::default();
        assert!(m.is_empty());
        m.get_or_insert_with(Key::Read(old), || list(1));
        // The place is the old one's: the new key goes to the map.
        m.get_or_insert_with(Key::Read(new), || list(2));
        assert_eq!(m.get(&Key::Read(old)).map(|w| w.list.len()), Some(1));
        assert_eq!(m.get(&Key::Read(new)).map(|w| w.list.len()), Some(2));
        // Another place of the index, and another key kind, are their own.
        m.get_or_insert_with(Key::Write(new), || list(3));
        m.get_or_insert_with(Key::Poll, || list(4));
        assert_eq!(m.keys().count(), 4);
        // The old one leaves; the new key, in the map, is not doubled by
        // a later insert that finds the place free.
        assert_eq!(m.remove(&Key::Read(old)).map(|w| w.list.len()), Some(1));
        assert!(m.get(&Key::Read(old)).is_none());
        m.get_or_insert_with(Key::Read(new), || list(9)).list.pop();
        assert_eq!(m.get(&Key::Read(new)).map(|w| w.list.len()), Some(1));
        assert_eq!(m.remove(&Key::Read(new)).map(|w| w.list.len()), Some(1));
        assert!(m.remove(&Key::Read(new)).is_none());
        assert!(m.contains_key(&Key::Write(new)) && m.contains_key(&Key::Poll));
        assert!(m.remove(&Key::Write(new)).is_some() && m.remove(&Key::Poll).is_some());
        assert!(m.is_empty());
        assert_eq!(m.iter().count(), 0);
    }
}
