//! The manager's thread registered as the pool's live manager: the
//! segment's liveness word made the one entry of the thread's robust futex
//! list, so the kernel marks it (and wakes a sleeper) however the thread
//! ends. The stacks' side, sleeping on the word and telling a death from
//! it, is [`crate::liveness`], whose docs say why and how.

#[cfg(not(loom))]
pub(crate) use real::Registration;

#[cfg(not(loom))]
mod real {
    use std::marker::PhantomData;

    use rustix::thread::futex::OWNER_DIED;

    use crate::liveness::TID_MASK;
    use crate::segment::Segment;
    use crate::sync::{fence, futex_wake, Ordering};

    /// `struct robust_list` of the kernel's ABI.
    #[repr(C)]
    struct RobustList {
        next: *const RobustList,
    }

    /// `struct robust_list_head` of the kernel's ABI.
    #[repr(C)]
    struct RobustListHead {
        list: RobustList,
        futex_offset: isize,
        list_op_pending: *const RobustList,
    }

    /// This thread's registration as the pool's live manager. Restores the
    /// thread's previous robust list and marks the manager gone when
    /// dropped; must be dropped on the thread that made it (it is not
    /// `Send`).
    pub(crate) struct Registration {
        /// Keeps the word mapped while the kernel may write it.
        seg: Segment,
        /// The registered thread's id, the word's value while it lives.
        tid: u32,
        /// The list the kernel walks: its head and its one entry, boxed so
        /// the addresses the kernel holds never move.
        _head: Box<RobustListHead>,
        _entry: Box<RobustList>,
        /// The thread's list before (the C library's), restored on drop.
        previous: (usize, usize),
        _not_send: PhantomData<*const ()>,
    }

    impl Registration {
        /// Registers the calling thread as the live manager of `seg`.
        /// `None` (sleepers keep their tick) if the kernel refuses.
        pub(crate) fn register(seg: &Segment) -> Option<Self> {
            let word = seg.manager_alive();
            let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
            if tid & !TID_MASK != 0 {
                return None;
            }
            let mut prev_head: usize = 0;
            let mut prev_len: usize = 0;
            // SAFETY: get_robust_list(0, ...) writes the calling thread's
            // list head pointer and its length into the two locals, which
            // are pointer-sized and writable.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_get_robust_list,
                    0,
                    &mut prev_head as *mut usize,
                    &mut prev_len as *mut usize,
                )
            };
            if r != 0 {
                return None;
            }
            let mut head = Box::new(RobustListHead {
                list: RobustList {
                    next: std::ptr::null(),
                },
                futex_offset: 0,
                list_op_pending: std::ptr::null(),
            });
            // A circular list of one: head -> entry -> head.
            let entry = Box::new(RobustList { next: &head.list });
            head.list.next = &*entry;
            // The kernel finds the word at `entry + futex_offset`.
            head.futex_offset = (word.as_ptr() as isize).wrapping_sub(&*entry as *const _ as isize);
            word.store(tid, Ordering::Release);
            // SAFETY: the head and the entry are heap allocations owned by
            // the returned registration, which gives the thread its
            // previous list back before freeing them; if the registration
            // is leaked they leak with it. The word they lead to stays
            // mapped as long as `seg` lives, also in the registration. The
            // kernel reads the list only when this thread exits or execs.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_set_robust_list,
                    &*head as *const RobustListHead,
                    std::mem::size_of::<RobustListHead>(),
                )
            };
            if r != 0 {
                word.store(0, Ordering::Release);
                return None;
            }
            Some(Self {
                seg: seg.clone(),
                tid,
                _head: head,
                _entry: entry,
                previous: (prev_head, prev_len),
                _not_send: PhantomData,
            })
        }
    }

    impl Registration {
        /// Puts the thread's id back in the liveness word if something else
        /// is there: the word is in memory every process of the pool can
        /// write, and the kernel marks it at this thread's death only if
        /// it holds the id. Stacks do not take the word's word for a
        /// death (they confirm it from their control socket), but one that
        /// stays forged would leave them sleeping on the tick, and deaths
        /// unmarked. True if it was repaired.
        pub(crate) fn repair(&self) -> bool {
            let word = self.seg.manager_alive();
            let w = word.load(Ordering::Acquire);
            if w & TID_MASK == self.tid && w & OWNER_DIED == 0 {
                return false;
            }
            word.store(self.tid, Ordering::Release);
            // Sleepers that saw the forged value look again.
            futex_wake(word);
            true
        }
    }

    impl Drop for Registration {
        fn drop(&mut self) {
            let (head, len) = self.previous;
            let len = if len == 0 {
                std::mem::size_of::<RobustListHead>()
            } else {
                len
            };
            // SAFETY: gives this thread (the registering one: the type is
            // not `Send`) the list it had before, which its owner (the C
            // library's thread descriptor) keeps alive; or none.
            unsafe { libc::syscall(libc::SYS_set_robust_list, head, len) };
            let word = self.seg.manager_alive();
            word.store(OWNER_DIED, Ordering::Release);
            futex_wake(word);
            // Stacks of this process do not wait on the word (see
            // `crate::liveness::sleep`): ring every sleeping stack, so they look. The
            // Dekker half of their sleep (they publish `sleeping`, then
            // read the word): the store above before the loads below.
            // (The futex_wake system call orders them too; this does not
            // lean on that.)
            fence(Ordering::SeqCst);
            for id in 1..=self.seg.max_stacks() as u16 {
                let s = &self.seg.stack_slot(id).sleeping;
                if s.load(Ordering::Relaxed) == crate::layout::SLEEP_FUTEX
                    && s.swap(0, Ordering::AcqRel) == crate::layout::SLEEP_FUTEX
                {
                    futex_wake(s);
                }
            }
        }
    }
}

/// Under loom: nothing to register.
#[cfg(loom)]
pub(crate) struct Registration;

#[cfg(loom)]
impl Registration {
    pub(crate) fn register(_: &crate::segment::Segment) -> Option<Self> {
        None
    }
    pub(crate) fn repair(&self) -> bool {
        false
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    use rustix::thread::futex::OWNER_DIED;

    use super::*;
    use crate::layout::PoolConfig;
    use crate::liveness::{died, sleep};
    use crate::segment::{Region, Segment};
    use crate::sync::Ordering;

    fn segment() -> Segment {
        let cfg = PoolConfig {
            classes: vec![(64, 4)],
            max_stacks: 4,
            max_channels: 2,
            ring_capacity: 8,
            quotas: Vec::new(),
        };
        let geo = cfg.geometry().unwrap();
        let region = Region::create_memfd("xio-liveness-test", geo.total_len as usize).unwrap();
        Segment::init(region, &cfg, &geo).unwrap()
    }

    /// The system call thread `tid` of this process is blocked in, if any.
    fn blocked_in(tid: i32) -> Option<i64> {
        let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
        s.split_whitespace().next()?.parse().ok()
    }

    /// A "manager" thread dies while registered (it never drops its
    /// registration, as when killed): both sleepers wake through the
    /// liveness word, the second because the first passes the wake-up on.
    /// Without the robust list they would sleep out the one-second tick and
    /// report `false`; without the hand-off, the second would sleep on
    /// (the watchdog fails the test).
    #[test]
    fn a_dead_managers_thread_wakes_every_sleeper() {
        let seg = segment();
        let registered = Arc::new(Barrier::new(2));
        let die = Arc::new(Barrier::new(2));
        let manager = std::thread::spawn({
            let (seg, registered, die) = (seg.clone(), registered.clone(), die.clone());
            move || {
                let reg = Registration::register(&seg).expect("robust list registered");
                registered.wait();
                die.wait();
                // Ends like a killed thread: the kernel, not `Drop`,
                // releases the word.
                std::mem::forget(reg);
            }
        });
        registered.wait();
        let (done_tx, done) = std::sync::mpsc::channel();
        let tids: Vec<i32> = (1..=2u16)
            .map(|id| {
                let (seg, done_tx) = (seg.clone(), done_tx.clone());
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    tx.send(rustix::thread::gettid().as_raw_nonzero().get())
                        .unwrap();
                    let word = &seg.stack_slot(id).sleeping;
                    word.store(1, Ordering::SeqCst);
                    let _ = done_tx.send(sleep(word, 1, seg.manager_alive(), true, None));
                });
                rx.recv().unwrap()
            })
            .collect();
        // Both in futex_waitv (a sleeper that came late would see the word
        // released, take the tick path and report `false`).
        for &tid in &tids {
            while blocked_in(tid) != Some(libc::SYS_futex_waitv) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        die.wait();
        manager.join().unwrap();
        for _ in &tids {
            // A watchdog, not a time bound: a sleeper nobody wakes sleeps on.
            let woke = done
                .recv_timeout(Duration::from_secs(60))
                .expect("a sleeper was never woken");
            assert!(woke, "a sleeper was not woken by the liveness word");
        }
        let w = seg.manager_alive().load(Ordering::Relaxed);
        assert_ne!(w & OWNER_DIED, 0, "word {w:#x}");
    }

    /// A manager that stops cleanly marks the word too, and gives its
    /// thread its previous robust list back.
    #[test]
    fn a_clean_stop_marks_the_word_and_restores_the_list() {
        let seg = segment();
        let list = || {
            let (mut head, mut len) = (0usize, 0usize);
            // SAFETY: writes this thread's list head and length into the locals.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_get_robust_list,
                    0,
                    &mut head as *mut usize,
                    &mut len as *mut usize,
                )
            };
            assert_eq!(r, 0);
            (head, len)
        };
        let before = list();
        let reg = Registration::register(&seg).unwrap();
        assert_ne!(list(), before);
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        assert_eq!(seg.manager_alive().load(Ordering::Relaxed), tid);
        drop(reg);
        assert_eq!(list(), before);
        let w = seg.manager_alive().load(Ordering::Relaxed);
        assert_ne!(w & OWNER_DIED, 0, "word {w:#x}");
        assert!(died(seg.manager_alive()));
        // A stray write with the bit set is not a death.
        seg.manager_alive()
            .store(OWNER_DIED | 0x1234, Ordering::Relaxed);
        assert!(!died(seg.manager_alive()));
        seg.manager_alive().store(OWNER_DIED, Ordering::Relaxed);
        // Sleeps after the manager's end take the tick path: a word that
        // stays rung returns at once.
        let word = &seg.stack_slot(1).sleeping;
        assert!(!sleep(word, 1, seg.manager_alive(), true, None));
    }
}
