//! Control-socket I/O: `SOCK_SEQPACKET` Unix sockets carrying [`Msg`]s and
//! file descriptors (`SCM_RIGHTS`).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::proto::{Msg, ProtoError, MAX_MSG};

/// Most fds one message carries.
pub const MAX_FDS: usize = 4;

/// A received packet that was not a valid message.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The peer closed the socket.
    #[error("control socket closed by the peer")]
    Closed,
    /// The bytes were not a valid message.
    #[error(transparent)]
    Proto(#[from] ProtoError),
}

/// Sends `msg` with `fds`.
pub fn send(sock: BorrowedFd<'_>, msg: &Msg, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    send_with(sock, msg, fds, SendFlags::NOSIGNAL)
}

/// [`send`], failing with `WouldBlock` instead of waiting for room in
/// the socket's buffer (a peer that stopped reading).
pub fn send_nowait(sock: BorrowedFd<'_>, msg: &Msg, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    send_with(sock, msg, fds, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)
}

fn send_with(
    sock: BorrowedFd<'_>,
    msg: &Msg,
    fds: &[BorrowedFd<'_>],
    flags: SendFlags,
) -> io::Result<()> {
    let bytes = msg.encode();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !anc.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let iov = [io::IoSlice::new(&bytes)];
    let n = rustix::net::sendmsg(sock, &iov, &mut anc, flags)?;
    if n != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short control write",
        ));
    }
    Ok(())
}

/// Receives one packet: its bytes (raw, for the caller to decode) and fds.
/// Packets longer than [`MAX_MSG`] are truncated, which makes them fail to
/// decode (the length field no longer matches), as does an empty packet:
/// [`RecvError::Closed`] is the end of file only.
pub fn recv_raw(
    sock: BorrowedFd<'_>,
    nonblocking: bool,
) -> Result<(Vec<u8>, Vec<OwnedFd>), RecvError> {
    let mut buf = vec![0u8; MAX_MSG];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    if nonblocking {
        flags |= RecvFlags::DONTWAIT;
    }
    let r = match rustix::net::recvmsg(sock, &mut iov, &mut anc, flags) {
        Ok(r) => r,
        // The peer closed with our packets unread: a Unix socket then
        // says ECONNRESET once, before what the peer sent ahead of its
        // close, then the end of file. What it sent last is often why it
        // closed (the manager's error reply to a bad message, a refused
        // Hello): it is read now, not lost to a bare "closed". Nothing
        // more can come, so there is no waiting for it.
        Err(rustix::io::Errno::CONNRESET) => {
            let flags = RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT;
            match rustix::net::recvmsg(sock, &mut iov, &mut anc, flags) {
                Ok(r) => r,
                Err(rustix::io::Errno::CONNRESET | rustix::io::Errno::AGAIN) => {
                    return Err(RecvError::Closed)
                }
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        Err(e) => return Err(io::Error::from(e).into()),
    };
    let mut fds = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    // On a seqpacket socket nothing read is either the end of file or an
    // empty packet, which a peer may send and live on: taken for the end,
    // it made the manager drop a live stack as gone (and a stack its live
    // manager). Only the end has the peer's end shut, for good once it is:
    // an empty packet, returned empty, decodes as malformed. (One followed
    // by the shutdown before this looks reads as the end: the peer is
    // done sending either way.)
    if r.bytes == 0 && peer_shut(sock) {
        return Err(RecvError::Closed);
    }
    buf.truncate(r.bytes);
    Ok((buf, fds))
}

/// Whether the peer of `sock` shut its end for writing (or closed it).
fn peer_shut(sock: BorrowedFd<'_>) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut p = [PollFd::new(&sock, PollFlags::RDHUP)];
    let now = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    loop {
        match poll(&mut p, Some(&now)) {
            Ok(_) => {
                return p[0]
                    .revents()
                    .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
            }
            Err(rustix::io::Errno::INTR) => {}
            // Cannot tell: the end, as before (the caller stops reading).
            Err(_) => return true,
        }
    }
}

/// Receives and decodes one message.
pub fn recv(sock: BorrowedFd<'_>, nonblocking: bool) -> Result<(Msg, Vec<OwnedFd>), RecvError> {
    let (b, fds) = recv_raw(sock, nonblocking)?;
    Ok((Msg::decode(&b)?, fds))
}

/// Receives and decodes one message, waiting until `deadline` at most
/// (`TimedOut` then; `None`: no limit). For replies from a manager that
/// may have stopped answering (SIGSTOP, a debugger, a hang) without dying.
pub fn recv_until(
    sock: BorrowedFd<'_>,
    deadline: Option<std::time::Instant>,
) -> Result<(Msg, Vec<OwnedFd>), RecvError> {
    use rustix::event::{poll, PollFd, PollFlags};
    loop {
        let ts = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(io::Error::from(io::ErrorKind::TimedOut).into());
                }
                Some(rustix::time::Timespec {
                    tv_sec: left.as_secs().min(i64::MAX as u64) as _,
                    tv_nsec: left.subsec_nanos() as _,
                })
            }
            None => None,
        };
        let mut p = [PollFd::new(&sock, PollFlags::IN)];
        match poll(&mut p, ts.as_ref()) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
        match recv(sock, true) {
            Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// A new seqpacket socket.
pub fn socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Connects to a manager's socket at `path`.
#[cfg(any(test, feature = "test-support"))]
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let s = socket()?;
    rustix::net::connect(&s, &SocketAddrUnix::new(path)?)?;
    Ok(s)
}

/// [`connect`], waiting at most `timeout` (at least a microsecond) for
/// room in the listener's queue, then `TimedOut`. A manager that is
/// stopped accepts nothing: once its queue is full, a plain connect to it
/// waits for ever. The limit stays on the socket's sends.
pub fn connect_within(path: &Path, timeout: std::time::Duration) -> io::Result<OwnedFd> {
    use rustix::net::sockopt::{set_socket_timeout, Timeout};
    let s = socket()?;
    // A Unix socket's connect waits for room at most its send timeout.
    let t = timeout.max(std::time::Duration::from_micros(1));
    let addr = SocketAddrUnix::new(path)?;
    let deadline = std::time::Instant::now().checked_add(t);
    let mut left = t;
    loop {
        set_socket_timeout(&s, Timeout::Send, Some(left))?;
        match rustix::net::connect(&s, &addr) {
            Ok(()) => break,
            // What a blocking connect says when its time ran out.
            Err(rustix::io::Errno::AGAIN) => return Err(io::ErrorKind::TimedOut.into()),
            // A signal: with a timeout set, even SA_RESTART gives EINTR.
            // A Unix socket's interrupted connect left it unconnected, so
            // it is asked again, for what is left of the time.
            Err(rustix::io::Errno::INTR) => {
                left = match deadline {
                    Some(d) => d.saturating_duration_since(std::time::Instant::now()),
                    None => t,
                };
                if left.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    // The limit stays on the socket's sends: the whole of it.
    set_socket_timeout(&s, Timeout::Send, Some(t))?;
    Ok(s)
}

/// Binds and listens at `path`.
pub fn listen(path: &Path) -> io::Result<OwnedFd> {
    let s = socket()?;
    rustix::net::bind(&s, &SocketAddrUnix::new(path)?)?;
    rustix::net::listen(&s, 128)?;
    Ok(s)
}

/// Accepts a connection (non-blocking listener: `WouldBlock` when none).
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    Ok(rustix::net::accept_with(listener, SocketFlags::CLOEXEC)?)
}

/// Who is at the other end of a Unix socket, as the kernel recorded it
/// at `connect` (or, for a listener's side, at `listen`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Its process id, `None` when that process is in a pid namespace
    /// this one cannot see (the kernel reports 0 then).
    pub pid: Option<u32>,
    /// Its effective user id.
    pub uid: u32,
    /// Its effective group id.
    pub gid: u32,
}

/// The kernel's record of a Unix socket's peer (`SO_PEERCRED`).
///
/// Not rustix's `socket_peercred`: its `UCred` holds the pid as a
/// non-zero type, and the kernel reports pid 0 for a peer in a pid
/// namespace this process cannot see (a container's stack talking to a
/// manager outside it, or the other way round).
pub fn peer_cred(sock: impl AsFd) -> io::Result<PeerCred> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` is a writable `ucred` of `len` bytes, the size
    // SO_PEERCRED fills; the fd is borrowed for the call.
    let r = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: u32::try_from(c.pid).ok().filter(|&p| p != 0),
        uid: c.uid,
        gid: c.gid,
    })
}

/// The supplementary groups of a Unix socket's peer, as the kernel
/// recorded them at `connect` (`SO_PEERGROUPS`, Linux 4.13 and later).
pub fn peer_groups(sock: impl AsFd) -> io::Result<Vec<u32>> {
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = std::mem::size_of_val(groups.as_slice()) as libc::socklen_t;
        // SAFETY: `groups` is a writable array of `len` bytes; the kernel
        // writes at most `len` bytes and sets `len` to what it wrote (or,
        // with ERANGE, to what it needs). The fd is borrowed for the call.
        let r = unsafe {
            libc::getsockopt(
                sock.as_fd().as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if r == 0 {
            groups.truncate(len as usize / std::mem::size_of::<libc::gid_t>());
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        let need = len as usize / std::mem::size_of::<libc::gid_t>();
        // The kernel caps a process's groups at 65,536 (NGROUPS_MAX).
        if e.raw_os_error() == Some(libc::ERANGE) && need > groups.len() && need <= 1 << 16 {
            groups.resize(need, 0);
            continue;
        }
        return Err(e);
    }
}

/// Sets a socket's blocking mode.
pub fn set_nonblocking(fd: impl AsFd, on: bool) -> io::Result<()> {
    let mut fl = rustix::fs::fcntl_getfl(&fd)?;
    fl.set(rustix::fs::OFlags::NONBLOCK, on);
    rustix::fs::fcntl_setfl(&fd, fl)?;
    Ok(())
}

/// A memfd holding `bytes`, sealed against any change: for what does not
/// fit in a packet (a long status report), sent alongside as its fd.
pub fn sealed_memfd(name: &str, bytes: &[u8]) -> io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    let mut done = 0;
    while done < bytes.len() {
        match rustix::io::write(&fd, &bytes[done..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?;
    Ok(fd)
}

/// Reads a memfd a peer sent, made by [`sealed_memfd`]: it must be sealed
/// against changes and hold exactly `len` bytes (`InvalidData` if not).
pub fn read_sealed_memfd(fd: BorrowedFd<'_>, len: usize) -> io::Result<Vec<u8>> {
    use rustix::fs::SealFlags;
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_owned());
    // Only a memfd has seals: anything else the peer sent fails here.
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|_| bad("not a memfd"))?;
    if !seals.contains(SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW) {
        return Err(bad("memfd not sealed"));
    }
    if rustix::fs::fstat(fd)?.st_size as u64 != len as u64 {
        return Err(bad("memfd size does not match its message"));
    }
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match rustix::io::pread(fd, &mut buf[done..], done as u64) {
            Ok(0) => return Err(bad("memfd shorter than its size")),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_memfds_round_trip_and_anything_else_is_refused() {
        let text = "status ".repeat(2000);
        let fd = sealed_memfd("t", text.as_bytes()).unwrap();
        assert_eq!(
            read_sealed_memfd(fd.as_fd(), text.len()).unwrap(),
            text.as_bytes()
        );
        // Its length must be the one the message says.
        for len in [0, text.len() - 1, text.len() + 1] {
            let e = read_sealed_memfd(fd.as_fd(), len).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{len}: {e}");
        }
        // A memfd that could still change, or another kind of fd.
        let open = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::io::write(&open, b"abc").unwrap();
        assert!(read_sealed_memfd(open.as_fd(), 3).is_err());
        let sock = socket().unwrap();
        assert!(read_sealed_memfd(sock.as_fd(), 0).is_err());
    }
}
