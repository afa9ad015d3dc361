//! Attaching: [`StackBuilder`]'s options, the connect to the manager's
//! control socket (bounded, and only to a manager of this user's), the
//! `Hello` / `Welcome` exchange that gives the stack its id, segment and
//! doorbell, and mapping the pool.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{AnyPool, Backend, EventFdDoorbell};
use crate::ctrl::{self, RecvError};
use crate::layout::Descriptor;
use crate::paths;
use crate::proto::Msg;
use crate::segment::{Region, Segment};
use crate::sync::{FxHashMap, Ordering};
use crate::wait::{AdaptiveSpin, WaitMode};

use super::error::recv_err;
use super::{Error, Stack, BURST, REFS_KEPT};

/// Options for attaching.
#[derive(Clone, Debug)]
pub struct StackBuilder {
    prefix: String,
    name: String,
    mode: WaitMode,
    backend: Option<Backend>,
    /// `None`: `$XIO_CONTROL_TIMEOUT_MS`, else 5 s, read at attach.
    ctrl_timeout: Option<Duration>,
    copy_on_receive: bool,
}

impl StackBuilder {
    /// The service name shown by `xio-manager status`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How blocking calls wait (default: [`WaitMode::Adaptive`]).
    pub fn wait_mode(mut self, mode: WaitMode) -> Self {
        self.mode = mode;
        self
    }

    /// How long a request to the manager (attach, bind, a connect to an
    /// address not resolved yet) waits for its answer before failing with
    /// [`Error::ManagerUnresponsive`] (`TimedOut`). Default 5 s, or
    /// `$XIO_CONTROL_TIMEOUT_MS` (milliseconds, 1 or more; another value
    /// makes the attach fail with [`Error::BadEnv`]). A manager answers
    /// in microseconds; this bounds the wait on one that is stopped or
    /// stuck, during which the caller (and, in the socket layer, its net)
    /// waits.
    pub fn control_timeout(mut self, timeout: Duration) -> Self {
        self.ctrl_timeout = Some(timeout);
        self
    }

    /// Copies every message this stack receives out of the pool into its
    /// own memory, freeing the pool buffer at once (default: off, the
    /// receiver reads the sender's buffer in place). For receivers that
    /// must not trust their senders: what they read cannot change under
    /// them, as a sender (or any process that can write the pool) could
    /// change a buffer it sent. Costs a copy per message. See also
    /// [`Stack::set_copy_on_receive`].
    pub fn copy_on_receive(mut self, on: bool) -> Self {
        self.copy_on_receive = on;
        self
    }

    /// Refuses to attach unless the pool uses `backend` (by default a
    /// stack follows whatever backend its manager chose): for services
    /// that must share hugepage memory with DPDK programs, say.
    pub fn require_backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Registers with the pool's manager and maps the pool.
    ///
    /// Only with a manager it trusts: one running as this process's user
    /// or root, or, to join another user's security domain, as the owner
    /// of the directory `$XIO_RUN_DIR` names when no one else can write
    /// in it ([`Error::UntrustedManager`] otherwise). The manager in turn
    /// admits this process only if its user or groups are in the pool's
    /// domain ([`ErrorCode::PermissionDenied`] otherwise).
    ///
    /// [`ErrorCode::PermissionDenied`]: crate::proto::ErrorCode::PermissionDenied
    pub fn attach(self) -> Result<Stack, Error> {
        paths::check_prefix(&self.prefix)?;
        let ctrl_timeout = match self.ctrl_timeout {
            Some(t) => t,
            None => default_control_timeout()?,
        };
        let path = paths::socket_path(&self.prefix);
        // Bounded: a stopped manager accepts nothing, and once its
        // listen queue is full a plain connect waits for it for good.
        let sock = match ctrl::connect_within(&path, ctrl_timeout) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(Error::ManagerUnresponsive(ctrl_timeout))
            }
            Err(err) => {
                return Err(Error::NoManager {
                    prefix: self.prefix.clone(),
                    path: path.display().to_string(),
                    err,
                })
            }
        };
        // The timeout was for the connect; sends on the socket wait as
        // before.
        rustix::net::sockopt::set_socket_timeout(&sock, rustix::net::sockopt::Timeout::Send, None)
            .map_err(io::Error::from)?;
        // Only a manager this user trusts: whoever answers gets every
        // byte this stack sends, and a run dir can be shared.
        let cred = ctrl::peer_cred(&sock)?;
        let me = rustix::process::geteuid().as_raw();
        if !trusted_manager(cred.uid, me) {
            return Err(Error::UntrustedManager {
                path: path.display().to_string(),
                uid: cred.uid,
                me,
            });
        }
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        let manager_here = cred.pid == Some(pid);
        let hello = Msg::Hello {
            pid,
            name: self.name.clone(),
        };
        if let Err(e) = ctrl::send(sock.as_fd(), &hello, &[]) {
            // A manager that refuses this process (outside its security
            // domain, too many of its connections) says why and closes,
            // often before the Hello goes: the reason is still queued.
            if let Ok((Msg::Error { code, message }, _)) = ctrl::recv(sock.as_fd(), true) {
                return Err(Error::Refused { code, message });
            }
            return Err(e.into());
        }
        let answer = ctrl::recv_until(sock.as_fd(), Instant::now().checked_add(ctrl_timeout));
        let (msg, mut fds) = match answer {
            Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(Error::ManagerUnresponsive(ctrl_timeout))
            }
            r => r.map_err(recv_err)?,
        };
        let (id, generation) = match msg {
            Msg::Welcome {
                stack_id,
                generation,
            } if fds.len() == 2 => (stack_id, generation),
            Msg::Error { code, message } => return Err(Error::Refused { code, message }),
            other => return Err(Error::Protocol(format!("expected Welcome, got {other:?}"))),
        };
        let bell = EventFdDoorbell::from_fd(fds.pop().expect("two fds"));
        let seg_fd = fds.pop().expect("two fds");
        let region = Region::map_fd(seg_fd).map_err(|e| Error::Protocol(e.to_string()))?;
        let seg = Segment::open(region).map_err(|e| Error::Protocol(e.to_string()))?;
        if id == 0 || u32::from(id) > seg.max_stacks() {
            return Err(Error::Protocol(format!("stack id {id} out of range")));
        }
        let backend = match seg.backend() {
            crate::layout::backend::DPDK => Backend::Dpdk,
            _ => Backend::Shm,
        };
        if let Some(want) = self.backend.filter(|&w| w != backend) {
            return Err(Error::WrongBackend {
                prefix: self.prefix.clone(),
                has: backend,
                wanted: want,
            });
        }
        let pool = AnyPool::attach(&self.prefix, &seg, id, sock)?;
        let slot_seq = seg.stack_slot(id).ctrl_seq.load(Ordering::Acquire);
        Ok(Stack {
            id,
            generation,
            seg,
            pool,
            bell,
            channels: Vec::new(),
            by_peer: FxHashMap::default(),
            resolved: HashMap::new(),
            ctrl_seen: slot_seq,
            mode: self.mode,
            spin: AdaptiveSpin::default(),
            inbox: VecDeque::new(),
            scratch: [Descriptor::default(); BURST],
            burst_raws: Vec::new(),
            refs: std::cell::RefCell::new(Vec::with_capacity(REFS_KEPT)),
            rr: 0,
            corrupt: 0,
            private: self
                .copy_on_receive
                .then(|| Arc::new(super::private::PrivatePool::default())),
            manager_gone: false,
            deferred: None,
            manager_here,
            ctrl_timeout,
            unanswered: VecDeque::new(),
            awaited: Vec::new(),
            answered: Vec::new(),
            unsent: Vec::new(),
            unsent_due: None,
            busy_tick_due: None,
            forged_liveness: None,
            next_request: 0,
            epoch: Arc::new(AtomicU64::new(0)),
            born: crate::fork::Birth::now(),
        })
    }
}

/// The control timeout unless set: `$XIO_CONTROL_TIMEOUT_MS`, else 5 s.
/// A value that is not a whole number of milliseconds from 1 up is an
/// error, not ignored: 0 would fail every request at once, and a typo
/// would quietly give the default.
/// Whether a manager running as `uid` may have this stack's traffic: one
/// of this user's or root's; or, to join another user's security domain,
/// the owner of the run dir `$XIO_RUN_DIR` names, when only that user (or
/// root) can write in it. Only a run dir named on purpose: the default
/// ones are this user's, and a default dir found owned by another user
/// was squatted, never chosen.
fn trusted_manager(uid: u32, me: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    if uid == me || uid == 0 {
        return true;
    }
    let Some(dir) = std::env::var_os("XIO_RUN_DIR") else {
        return false;
    };
    // Followed, as the socket's path is; and every parent too would be
    // the same question, which a run dir named by its user answers.
    std::fs::metadata(dir).is_ok_and(|m| m.uid() == uid && m.mode() & 0o022 == 0)
}

pub(crate) fn default_control_timeout() -> Result<Duration, Error> {
    const VAR: &str = "XIO_CONTROL_TIMEOUT_MS";
    let Some(v) = std::env::var_os(VAR) else {
        return Ok(Duration::from_secs(5));
    };
    match v.to_str().and_then(|v| v.trim().parse::<u64>().ok()) {
        Some(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(Error::BadEnv {
            var: VAR,
            value: v.to_string_lossy().into_owned(),
            expected: "a whole number of milliseconds, 1 or more",
        }),
    }
}

impl Stack {
    /// Attaches to pool `prefix` with default options.
    pub fn attach(prefix: &str) -> Result<Stack, Error> {
        Self::builder(prefix).attach()
    }

    /// Options for attaching to pool `prefix`.
    pub fn builder(prefix: &str) -> StackBuilder {
        let name = std::env::args().next().unwrap_or_default();
        let name = name.rsplit('/').next().unwrap_or("").to_owned();
        StackBuilder {
            prefix: prefix.to_owned(),
            name,
            mode: WaitMode::default(),
            backend: None,
            ctrl_timeout: None,
            copy_on_receive: false,
        }
    }
}
