//! A stack's session with the manager: its registration (the `Hello` of a
//! new connection answered with an id, the segment and a doorbell), and
//! its end: cut off when its socket ends, fails or brings a message it has
//! no business sending; a death once its process closed the socket, else
//! only a leave while the process may still use its buffers.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io;
use std::os::fd::AsFd;

use rustix::event::{PollFd, PollFlags};

use crate::backend::{Doorbell, EventFdDoorbell};
use crate::ctrl::{self, RecvError};
use crate::fork::CloseOnFork;
use crate::layout::slot_state;
use crate::proto::{ErrorCode, Msg};
use crate::sync::Ordering;

use super::{Manager, StackEntry};

/// Whether the process behind a registered stack's control socket `sock`
/// has exited, its end of file not handled yet: the socket hung up. A
/// process's descriptors close after its memory is released (`do_exit`:
/// `exit_mm` before `exit_files`), and a live stack's pool handle keeps its
/// socket open, so once hung up nothing of it touches the free lists.
pub(super) fn hung_up_now(sock: &impl AsFd) -> bool {
    // No events asked for: a hang-up or error is reported anyway.
    poll_now(sock, PollFlags::empty()).intersects(PollFlags::HUP | PollFlags::ERR)
}

/// Whether `sock` has something to read now, or hung up (one poll, no
/// wait).
pub(super) fn readable_now(sock: &impl AsFd) -> bool {
    !poll_now(sock, PollFlags::IN).is_empty()
}

/// What `sock` reports of `events` (and of a hang-up or error) now.
fn poll_now(sock: &impl AsFd, events: PollFlags) -> PollFlags {
    let mut fds = [PollFd::new(sock, events)];
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match rustix::event::poll(&mut fds, Some(&now)) {
        Ok(n) if n > 0 => fds[0].revents(),
        _ => PollFlags::empty(),
    }
}

impl Manager {
    pub(super) fn register(&mut self, sock: CloseOnFork, claimed_pid: u32, name: String) {
        // The name is the stack's to choose and goes into the logs and the
        // status report: no control characters, so it cannot forge lines
        // there or send escape sequences to a terminal.
        let name: String = name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        // None for a stack in a pid namespace the manager cannot see.
        let cred = ctrl::peer_cred(&sock).ok().and_then(|c| c.pid);
        let pid = cred.unwrap_or(claimed_pid);
        // Only a pid the kernel vouched for: a claimed one may name anyone.
        let pidfd = cred
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
            .and_then(|p| {
                rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
            });
        if let Some(p) = cred {
            let n = self.stacks.values().filter(|e| e.pid == p).count();
            if n >= self.max_stacks_per_process as usize {
                self.refuse(
                    &sock,
                    ErrorCode::NoSpace,
                    format!(
                        "process {p} has {n} stacks, the most one process may have \
                             (the manager's max_stacks_per_process)"
                    ),
                );
                return;
            }
        }
        let max = self.seg.max_stacks();
        let free = (1..=max)
            .map(|k| ((u32::from(self.last_id) + k - 1) % max + 1) as u16)
            .find(|&id| {
                !self.stacks.contains_key(&id)
                    && !self.dead.contains_key(&id)
                    && !self.unswept.contains_key(&id)
                    && self.seg.stack_slot(id).state.load(Ordering::Acquire) == slot_state::FREE
            });
        let Some(id) = free else {
            self.refuse(&sock, ErrorCode::NoSpace, "no free stack slot".into());
            return;
        };
        let bell = match EventFdDoorbell::new() {
            Ok(b) => b,
            Err(e) => {
                // Out of fds, most likely: say so, rather than leave the
                // stack to find a closed socket.
                tracing::error!(error = %e, "eventfd for a new stack");
                self.refuse(
                    &sock,
                    ErrorCode::NoSpace,
                    format!("the manager could not make a doorbell: {e}"),
                );
                return;
            }
        };
        let slot = self.seg.stack_slot(id);
        slot.sleeping.store(0, Ordering::Relaxed);
        slot.cpu.store(0, Ordering::Relaxed);
        slot.intent.store(0, Ordering::Relaxed);
        // The counters the status report shows are the newcomer's own,
        // not those of the stack that had the id before.
        slot.sleeps.store(0, Ordering::Relaxed);
        slot.pool_empty.store(0, Ordering::Relaxed);
        slot.quota_full.store(0, Ordering::Relaxed);
        slot.ring_full.store(0, Ordering::Relaxed);
        slot.corrupt.store(0, Ordering::Relaxed);
        slot.rung_at.store(0, Ordering::Relaxed);
        // Its quotas start empty. A peer's late credit for the stack that
        // had the id before may still land; the newcomer's count takes it
        // as none (see `StackPool::charged_now`).
        for (c, d) in slot.charged.iter().zip(slot.credited.iter()) {
            c.store(0, Ordering::Relaxed);
            d.store(0, Ordering::Relaxed);
        }
        let generation = match self.generations[id as usize].wrapping_add(1) {
            0 => 1,
            g => g,
        };
        self.generations[id as usize] = generation;
        slot.generation
            .store(u32::from(generation), Ordering::Relaxed);
        slot.pid.store(pid, Ordering::Relaxed);
        slot.state.store(slot_state::ACTIVE, Ordering::Release);
        let seg_fd = self.seg.region().fd().expect("manager segments are memfds");
        // A new socket's buffer is empty: this does not find it full.
        if let Err(e) = ctrl::send_nowait(
            sock.as_fd(),
            &Msg::Welcome {
                stack_id: id,
                generation,
            },
            &[seg_fd, bell.fd()],
        ) {
            tracing::warn!(error = %e, "could not answer Hello");
            slot.state.store(slot_state::FREE, Ordering::Release);
            return;
        }
        tracing::info!(stack = id, generation, pid, name = %name, "stack registered");
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .attaches += 1;
        self.last_id = id;
        self.stacks.insert(
            id,
            StackEntry {
                sock,
                generation,
                pid,
                name,
                bell,
                pidfd,
                addrs: BTreeSet::new(),
                peers: HashMap::new(),
                outbox: VecDeque::new(),
                outbox_fds: 0,
                stalled: false,
                left: false,
                bad: false,
                drained: false,
            },
        );
    }

    /// Stops serving registered stack `id`, whose socket ended (or failed,
    /// or brought a message it had no business sending). Its death if its
    /// process has closed the socket; otherwise the process lives on, may
    /// hold buffers of the stack and be inside a free-list operation, so
    /// it only leaves ([`Self::on_leave`]) until the socket closes. (A
    /// malformed message used to end it as a death at once: its buffers,
    /// still in use, went back to the pool, and the sweep rebuilt the free
    /// lists without waiting for its operations.)
    pub(super) fn cut_off(&mut self, id: u16) {
        if hung_up_now(&self.stacks[&id].sock) {
            let e = self.stacks.remove(&id).expect("present");
            self.on_death(id, e);
        } else {
            self.on_leave(id);
        }
    }

    /// [`Self::cut_off`] for a malformed or unexpected message, noted for
    /// the status report (which otherwise shows a stack that left).
    pub(super) fn cut_off_for_bad_message(&mut self, id: u16) {
        if let Some(e) = self.stacks.get_mut(&id) {
            e.bad = true;
        }
        self.cut_off(id);
    }

    /// Reads and drops what stack `id`, which left (or was cut off) while
    /// its process holds its socket, sent since: nothing of it is acted
    /// on, but left unread, a packet's fds stay open, and one may be the
    /// stack's own socket, which would then never hang up once its
    /// process closes it (its slot taken until the manager stops).
    /// `shut`: its end is shut for writing, so nothing more comes once
    /// the end of file is read. Once its end is shut, an empty packet
    /// reads as the end of file too: one sent before more packets, then
    /// the shutdown, leaves those unread, as a process may keep its socket
    /// open; a stack never sends one. The reads are bounded per pass (the
    /// loop serves the others).
    pub(super) fn discard_from_left(&mut self, id: u16, shut: bool) {
        const MOST: usize = 256;
        let Some(e) = self.stacks.get_mut(&id) else {
            return;
        };
        for _ in 0..MOST {
            match ctrl::recv_raw(e.sock.as_fd(), true) {
                // Dropped, fds and all.
                Ok(_) | Err(RecvError::Proto(_)) => {}
                Err(RecvError::Closed) if shut => {
                    e.drained = true;
                    return;
                }
                // An end of file that came after the poll: the next one
                // reports the shutdown.
                Err(RecvError::Closed) => {}
                Err(RecvError::Io(err)) if err.kind() == io::ErrorKind::Interrupted => {}
                // Nothing waits (or the socket failed: its hang-up follows).
                Err(RecvError::Io(_)) => return,
            }
        }
    }
}
