//! Starting a manager: [`ManagerBuilder`]'s options, and binding its
//! prefix: a run dir no other user could write to, the prefix's lock file
//! (so one manager runs per pool), the control socket (bound under a
//! temporary name and renamed into place once it listens), and the pool.
//! The files are removed when the manager stops.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::backend::{Backend, EventFdDoorbell, ManagerBackend};
use crate::ctrl;
use crate::fork::CloseOnFork;
use crate::layout::PoolConfig;
use crate::paths;
use crate::segment::SegmentError;

use super::domain::Domain;
use super::error::io_err;
use super::outbox::OUTBOX_FDS_SHARE;
use super::{Manager, ManagerError, Snapshot};

/// Options for a manager.
#[derive(Clone, Debug)]
pub struct ManagerBuilder {
    prefix: String,
    pool: PoolConfig,
    backend: Backend,
    max_stacks_per_process: Option<u32>,
    allow_uids: Vec<u32>,
    allow_gids: Vec<u32>,
}

impl ManagerBuilder {
    /// Where buffers and rings live (default [`Backend::Shm`]).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// The pool geometry (default: [`PoolConfig::default`]).
    pub fn pool(mut self, pool: PoolConfig) -> Self {
        self.pool = pool;
        self
    }

    /// The most stacks one process may have registered at once (by the
    /// kernel's word for its pid). Default: the pool's `max_stacks` less an
    /// eighth (at most 8) kept for other processes, so one process that
    /// attaches in a loop cannot take every slot. A process over it is
    /// refused with an error that says so.
    pub fn max_stacks_per_process(mut self, n: u32) -> Self {
        self.max_stacks_per_process = Some(n.max(1));
        self
    }

    /// Admits processes of user `uid` to the pool, besides the manager's
    /// own user and root (the default domain). Repeat for more users.
    /// Whoever attaches can read and write every buffer of the pool: allow
    /// only users whose services may see each other's traffic. See
    /// docs/operations.md, "Security domains".
    pub fn allow_uid(mut self, uid: u32) -> Self {
        self.allow_uids.push(uid);
        self
    }

    /// Admits processes whose effective group or one of whose
    /// supplementary groups is `gid`. Repeat for more groups.
    pub fn allow_gid(mut self, gid: u32) -> Self {
        self.allow_gids.push(gid);
        self
    }

    /// Creates the pool and takes the prefix: after this returns, stacks can
    /// connect (their requests are served once [`Manager::run`] runs).
    pub fn bind(self) -> Result<Manager, ManagerError> {
        Manager::bind(self)
    }
}

impl Manager {
    /// Options for a manager of pool `prefix`.
    pub fn builder(prefix: &str) -> ManagerBuilder {
        ManagerBuilder {
            prefix: prefix.to_owned(),
            pool: PoolConfig::default(),
            backend: Backend::default(),
            max_stacks_per_process: None,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
        }
    }

    fn bind(b: ManagerBuilder) -> Result<Manager, ManagerError> {
        paths::check_prefix(&b.prefix)?;
        let geo = b.pool.geometry().map_err(SegmentError::from)?;
        let domain = Domain::new(
            rustix::process::geteuid().as_raw(),
            b.allow_uids.clone(),
            b.allow_gids.clone(),
        );
        let dir = paths::run_dir();
        // Made private (only what is missing): the socket in it is one
        // every stack of the user trusts.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&dir)
            .map_err(io_err(format!("create {}", dir.display())))?;
        check_run_dir(&dir)?;
        if domain.shared() {
            open_run_dir(&dir)?;
        }
        let lock_path = paths::lock_path(&b.prefix);
        let Some(lock) = LockFile::acquire(&lock_path)
            .map_err(io_err(format!("lock {}", lock_path.display())))?
        else {
            let pid = std::fs::read_to_string(&lock_path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            return Err(ManagerError::AlreadyRunning {
                prefix: b.prefix,
                pid,
                lock: lock_path.display().to_string(),
            });
        };
        let _ = rustix::fs::ftruncate(&lock.fd, 0);
        let _ = rustix::io::pwrite(&lock.fd, format!("{}\n", std::process::id()).as_bytes(), 0);
        let sock_path = paths::socket_path(&b.prefix);
        // We hold the lock, so socket files left here are a dead manager's.
        let _ = std::fs::remove_file(&sock_path);
        // The socket is bound under a temporary name and renamed into place
        // once it listens and the pool exists: whoever waits for the file
        // to appear (a script, a test, a stack retrying) can connect as
        // soon as it does, never in the gap between bind and listen, where
        // a connect is refused.
        let staged = Staged(sock_path.with_extension("sock.new"));
        let _ = std::fs::remove_file(&staged.0);
        let listener =
            ctrl::listen(&staged.0).map_err(io_err(format!("listen on {}", staged.0.display())))?;
        ctrl::set_nonblocking(&listener, true).map_err(io_err("set listener non-blocking"))?;
        // Anyone allowed must be able to connect (the credential check
        // decides); no one else need.
        let mode = if domain.shared() { 0o666 } else { 0o600 };
        std::fs::set_permissions(&staged.0, std::fs::Permissions::from_mode(mode))
            .map_err(io_err(format!("chmod {}", staged.0.display())))?;
        let (seg, pool, backend) = ManagerBackend::start(b.backend, &b.prefix, &b.pool, &geo)?;
        let stop = Arc::new(EventFdDoorbell::new().map_err(io_err("eventfd"))?);
        // The rename keeps the inode: what the path names until someone
        // else's file replaces it.
        let bound = rustix::fs::stat(&staged.0)
            .map_err(|e| io_err(format!("stat {}", staged.0.display()))(e.into()))?;
        staged.publish(&sock_path)?;
        let sock = SocketFile {
            path: sock_path,
            bound: Some(bound),
            born: crate::fork::Birth::now(),
        };
        tracing::info!(
            prefix = %b.prefix,
            socket = %sock.path.display(),
            segment_mib = seg.region().len() >> 20,
            backend = ?b.backend,
            classes = ?b.pool.classes,
            domain = %domain.describe(),
            "manager ready"
        );
        Ok(Manager {
            prefix: b.prefix,
            sock,
            _lock: lock,
            listener: CloseOnFork::new(listener),
            channels: (0..seg.max_channels()).map(|_| None).collect(),
            seg,
            pool,
            backend,
            stop,
            pending: Vec::new(),
            max_stacks_per_process: b.max_stacks_per_process.unwrap_or_else(|| {
                let max = b.pool.max_stacks;
                (max - (max / 8).min(8)).max(1)
            }),
            stacks: HashMap::new(),
            dead: HashMap::new(),
            unswept: BTreeMap::new(),
            sweep_retry: None,
            audit_due: std::time::Instant::now() + super::sweep::AUDIT_EVERY,
            waiting_rings: HashMap::new(),
            last_id: 0,
            generations: vec![0; b.pool.max_stacks as usize + 1],
            bindings: HashMap::new(),
            outbox_fd_budget: {
                let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
                (lim.current.unwrap_or(1 << 20) / OUTBOX_FDS_SHARE) as usize
            },
            snapshot: Arc::new(Mutex::new(Snapshot::default())),
            domain,
            accept_paused: None,
            accept_failing: false,
        })
    }

    /// The control socket's path.
    pub fn socket_path(&self) -> &std::path::Path {
        &self.sock.path
    }
}

/// Refuses a run dir another user could write to: one owned by another
/// user than this one or root (anyone can make `/tmp/xio-<uid>` before
/// the user does), or one every user may write to without the sticky bit.
/// Either could swap the manager's socket (or its lock) for its own, and
/// take every stack that attaches.
fn check_run_dir(dir: &std::path::Path) -> Result<(), ManagerError> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let mut why = None;
    for md in [std::fs::symlink_metadata(dir), std::fs::metadata(dir)] {
        let md = md.map_err(io_err(format!("stat {}", dir.display())))?;
        if md.uid() != me && md.uid() != 0 {
            why = Some(format!(
                "owned by uid {}, not by this user (uid {me}) or root",
                md.uid()
            ));
        } else if !md.file_type().is_symlink() && md.mode() & 0o1002 == 0o002 {
            why = Some("writable by every user (and not sticky)".into());
        }
        if why.is_some() {
            break;
        }
    }
    match why {
        None => Ok(()),
        Some(why) => Err(ManagerError::Io {
            what: format!(
                "run dir {}: {why}; another user could replace the manager's socket \
                 (set XIO_RUN_DIR to a directory of this user's)",
                dir.display()
            ),
            err: io::Error::from(io::ErrorKind::PermissionDenied),
        }),
    }
}

/// Gives the users of a shared domain search permission on the run dir
/// (`o+x`, `g+x`): they must reach the socket in it. Only on a dir of the
/// manager's own user; one root or an operator made is left as it is (its
/// maker chose who reaches it). Never read or write permission: the names
/// in it are not listed, and no one else can add one.
fn open_run_dir(dir: &std::path::Path) -> Result<(), ManagerError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let md = std::fs::metadata(dir).map_err(io_err(format!("stat {}", dir.display())))?;
    if md.uid() != rustix::process::geteuid().as_raw() {
        return Ok(());
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o011 != 0o011 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o011))
            .map_err(io_err(format!("chmod {}", dir.display())))?;
    }
    Ok(())
}

/// A manager's hold on its pool's lock file, `<run dir>/<prefix>.lock`: an
/// exclusive `flock` on the file the path names. Dropped in the process
/// that took it, it unlinks the file while still holding the lock, so a
/// clean stop leaves no file behind (each prefix ever run left one).
///
/// Unlinking a lock file is safe only because taking it checks, once the
/// lock is held, that the path still names the file locked (the dev and
/// inode of the fd and of the path match), and starts over if not: a
/// starter that opened the file just before a stopping manager unlinked
/// it would otherwise lock the unlinked file while a third starter locks
/// the new one, and two managers would run.
pub(super) struct LockFile {
    fd: CloseOnFork,
    path: PathBuf,
    born: crate::fork::Birth,
}

impl LockFile {
    /// Takes the lock of `path` (creating the file), or `None` when another
    /// manager holds it.
    pub(super) fn acquire(path: &std::path::Path) -> io::Result<Option<LockFile>> {
        use rustix::fs::{FlockOperation, Mode, OFlags};
        loop {
            let fd = rustix::fs::open(
                path,
                OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )?;
            match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            let held = rustix::fs::fstat(&fd)?;
            match rustix::fs::stat(path) {
                Ok(named) if same_file(&held, &named) => {
                    return Ok(Some(LockFile {
                        fd: CloseOnFork::new(fd),
                        path: path.to_owned(),
                        born: crate::fork::Birth::now(),
                    }))
                }
                // Unlinked (or replaced) by a manager that stopped between
                // our open and our lock: the lock guards nothing; take the
                // one of the file the path names now.
                Ok(_) | Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn same_file(a: &rustix::fs::Stat, b: &rustix::fs::Stat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

impl Drop for LockFile {
    fn drop(&mut self) {
        // A forked child's copy: the lock is the parent's (the child's fd
        // was pointed at an inert socket, if it was registered).
        if self.born.forked() {
            return;
        }
        // Unlinked while the lock is still held (it is released when the
        // fd closes, after this): a starter that opened this file finds,
        // once it gets the lock, that the path no longer names it. Only if
        // the path still names our file: never another manager's.
        if let (Ok(held), Ok(named)) = (rustix::fs::fstat(&self.fd), rustix::fs::stat(&self.path)) {
            if same_file(&held, &named) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// A started manager's control socket, `<run dir>/<prefix>.sock`: unlinked
/// when it stops ([`Manager::run`] returns) or is dropped without running,
/// so neither leaves a file nobody listens on, which whoever waits for the
/// socket to appear (a script, a test, a stack retrying) would take for a
/// running manager. As [`LockFile`], only if the path still names the file
/// it bound (dev and inode), and not in a forked child.
pub(super) struct SocketFile {
    path: PathBuf,
    /// The bound file's `stat`; `None` once removed.
    bound: Option<rustix::fs::Stat>,
    born: crate::fork::Birth,
}

impl SocketFile {
    pub(super) fn remove(&mut self) {
        // A forked child's copy: the socket is the parent's.
        if self.born.forked() {
            return;
        }
        let Some(bound) = self.bound.take() else {
            return;
        };
        if rustix::fs::stat(&self.path).is_ok_and(|named| same_file(&bound, &named)) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A listening socket's temporary path: removed if the manager fails to
/// start, renamed to the real path once it has.
struct Staged(std::path::PathBuf);

impl Staged {
    fn publish(self, to: &std::path::Path) -> Result<(), ManagerError> {
        let r = std::fs::rename(&self.0, to).map_err(io_err(format!(
            "rename {} to {}",
            self.0.display(),
            to.display()
        )));
        // Renamed, the drop finds nothing to remove; failed, it cleans up.
        drop(self);
        r
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
