//! [`NetBuilder`]: options for attaching a [`Net`].

use std::io;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::conn::Table;
use crate::stack::Stack;
use crate::sync::FxHashMap as HashMap;
use crate::wait::WaitMode;

use super::core::Core;
use super::data::SPARE_MAX;
use super::exit::close_at_exit_register;
use super::syn::SYN_LEN;
#[cfg(doc)]
use super::XioStream;
use super::{Net, Shared};

/// Options for [`Net`].
#[derive(Clone, Debug)]
pub struct NetBuilder {
    prefix: String,
    mode: WaitMode,
    window: Option<usize>,
    batch: bool,
    ctrl_timeout: Option<Duration>,
    strict: Option<bool>,
    copy_on_receive: bool,
}

/// The strict-addresses default: `$XIO_STRICT_ADDRESSES` (`1` on, `0` or
/// unset off). Another value is an error, not ignored.
fn default_strict() -> io::Result<bool> {
    const VAR: &str = "XIO_STRICT_ADDRESSES";
    match std::env::var_os(VAR) {
        None => Ok(false),
        Some(v) if v == "1" => Ok(true),
        Some(v) if v == "0" || v.is_empty() => Ok(false),
        Some(v) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "${VAR} is {:?}: expected 1 (strict) or 0",
                v.to_string_lossy()
            ),
        )),
    }
}

impl NetBuilder {
    /// Strict addresses: a listener may bind only addresses of this node
    /// (loopback, unspecified, or an interface's), and binding another
    /// fails with `AddrNotAvailable`, as a TCP bind does. Off by default:
    /// X-IO addresses are service names, so a service may be reached at
    /// `10.0.0.2:80` on any node. On for code that relies on the check;
    /// `$XIO_STRICT_ADDRESSES=1` turns it on for nets built without this
    /// call (the process-wide one among them).
    pub fn strict_addresses(mut self, on: bool) -> Self {
        self.strict = Some(on);
        self
    }

    /// How blocking calls wait ([`WaitMode::Adaptive`] by default;
    /// [`WaitMode::BusyPoll`] for latency-critical users with a core to
    /// spare). Per-socket non-blocking mode is
    /// [`XioStream::set_nonblocking`].
    pub fn wait_mode(mut self, mode: WaitMode) -> Self {
        self.mode = mode;
        self
    }

    /// Bytes of buffer capacity a connection may have unread at the
    /// receiver (at least twice the largest buffer class; 2 MiB by
    /// default, or more with larger classes).
    pub fn window(mut self, bytes: usize) -> Self {
        self.window = Some(bytes);
        self
    }

    /// Batch wake-up (on by default): one drain of the rings wakes every
    /// connection that became ready. Off, a drain takes one descriptor at a
    /// time (for comparison, as the paper's X-IO-no-batch).
    pub fn batch_wakeup(mut self, on: bool) -> Self {
        self.batch = on;
        self
    }

    /// Copy on receive (FABLE's safe mode; see
    /// [`crate::stack::StackBuilder::copy_on_receive`]): a buffer taken
    /// with [`XioStream::recv_buf`] is a copy in this process's memory,
    /// not the pool buffer its sender wrote, so nothing the sender (or any
    /// process that can write the pool) does afterwards changes it. Off by
    /// default. Reads into the caller's memory (`read` and the like) copy
    /// in either mode.
    pub fn copy_on_receive(mut self, on: bool) -> Self {
        self.copy_on_receive = on;
        self
    }

    /// How long attaching, binding and connecting to an address not
    /// resolved yet wait for the manager's answer before failing with
    /// `TimedOut` (see [`crate::stack::StackBuilder::control_timeout`];
    /// 5 s by default, or `$XIO_CONTROL_TIMEOUT_MS`). The net's other
    /// users wait while one of its calls waits for the manager.
    pub fn control_timeout(mut self, timeout: Duration) -> Self {
        self.ctrl_timeout = Some(timeout);
        self
    }

    /// Attaches to the pool's manager.
    pub fn attach(self) -> io::Result<Net> {
        let strict = match self.strict {
            Some(on) => on,
            None => default_strict()?,
        };
        let mut b = Stack::builder(&self.prefix)
            .wait_mode(self.mode)
            .copy_on_receive(self.copy_on_receive);
        if let Some(t) = self.ctrl_timeout {
            b = b.control_timeout(t);
        }
        let stack = b.attach().map_err(io::Error::from)?;
        let classes: Vec<usize> = stack
            .segment()
            .classes()
            .iter()
            .map(|c| c.buf_size as usize)
            .collect();
        let max_buf = classes.last().copied().unwrap_or(0);
        if max_buf < SYN_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the pool's buffers are too small for the socket layer",
            ));
        }
        // Every net of the pool has at least this window (its peers
        // may choose larger ones: see `Table::set_window_floor`).
        let floor = (2 * max_buf).min(u32::MAX as usize / 2);
        let window = self
            .window
            .unwrap_or(2 << 20)
            .max(floor)
            .min(u32::MAX as usize / 2);
        let waking = Arc::new(AtomicUsize::new(0));
        let batch_owner = Arc::new(AtomicUsize::new(0));
        let seg = stack.segment().clone();
        let spare_max = stack.keep_aside(SPARE_MAX);
        let net = Net {
            shared: Arc::new(Shared {
                core: Mutex::new(Core {
                    waking: waking.clone(),
                    batch_owner: batch_owner.clone(),
                    threads_woken: 0,
                    stack,
                    table: {
                        let mut t = Table::new(window);
                        t.set_window_floor(floor);
                        t
                    },
                    driving: false,
                    probe: None,
                    waiters: Default::default(),
                    entries: 0,
                    signals: Vec::new(),
                    spare_lists: Vec::new(),
                    parked: 0,
                    pending: HashMap::default(),
                    force_ctrl: false,
                    batch: self.batch,
                    ready: Vec::new(),
                    track_ready: false,
                    ready_conn: Vec::new(),
                    ready_seen: Vec::new(),
                    user_tokens: Vec::new(),
                    binding: Vec::new(),
                    node_ips: Vec::new(),
                    syn_buf: None,
                    spare: Vec::with_capacity(SPARE_MAX),
                    spare_max,
                    spare_size: classes[0],
                    unrung: Vec::new(),
                    held: Vec::new(),
                    held_run: Vec::new(),
                    held_rest: Vec::new(),
                    refused_peers: Vec::new(),
                    rst_dropped: 0,
                    retry_waiters: Vec::new(),
                    missed: None,
                    retry_writes: Vec::new(),
                    retries_reported: 0,
                    last_liveness: 0,
                    manager_watch: None,
                    loop_fd: None,
                    retry_timer: None,
                    retry_armed: None,
                    #[cfg(test)]
                    fail_drive: false,
                    poll_error: None,
                    told_gone: false,
                    bell_out: false,
                    draining: false,
                    data_drains: 0,
                    data_seen: (0, 0),
                }),
                classes,
                strict,
                copy_on_receive: self.copy_on_receive,
                waking,
                seg,
                batch_owner,
                born: crate::fork::Birth::now(),
            }),
        };
        close_at_exit_register(&net);
        Ok(net)
    }
}

impl Net {
    /// Options for attaching to pool `prefix`.
    pub fn builder(prefix: &str) -> NetBuilder {
        NetBuilder {
            prefix: prefix.to_owned(),
            mode: WaitMode::default(),
            window: None,
            batch: true,
            ctrl_timeout: None,
            strict: None,
            copy_on_receive: false,
        }
    }

    /// Attaches to pool `prefix` with default options.
    pub fn attach(prefix: &str) -> io::Result<Net> {
        Self::builder(prefix).attach()
    }
}
