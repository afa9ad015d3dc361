//! `sendmsg`, `recvmsg` and `sendfile` on moved streams: the calls that
//! carry more than one buffer, or a file. Ancillary data is not carried
//! (a TCP stream carries none a program relies on): a `sendmsg` with some
//! fails with `EOPNOTSUPP`, a `recvmsg` returns none.

use std::ffi::c_int;
use std::io::{self, IoSlice, Write};

use libc::{msghdr, off_t, size_t, ssize_t};

use crate::{iovecs, op, read_iovecs, real, recv_into, ret_len, send_from, stream_of, wrote};

/// `sendmsg(2)`.
///
/// # Safety
///
/// As libc's: `msg` points to a valid `msghdr`.
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let Some(sock) = stream_of(fd) else {
        // SAFETY: passed on.
        return unsafe { real::sendmsg(fd, msg, flags) };
    };
    if msg.is_null() {
        return ret_len(Err(io::Error::from_raw_os_error(libc::EFAULT)), true);
    }
    // SAFETY: the caller's msghdr.
    let m = unsafe { &*msg };
    if m.msg_controllen > 0 {
        return ret_len(Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)), true);
    }
    // SAFETY: the caller's iovecs (`msg_iovlen` of them).
    let v = unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) };
    let slices: Vec<IoSlice<'_>> = v
        .iter()
        .filter(|b| b.iov_len > 0)
        .map(|b| {
            // SAFETY: each iovec names `iov_len` readable bytes.
            IoSlice::new(unsafe { std::slice::from_raw_parts(b.iov_base.cast::<u8>(), b.iov_len) })
        })
        .collect();
    if slices.is_empty() {
        return 0;
    }
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    let r = wrote(
        &sock,
        op(&sock, dontwait, true, |mut s| s.write_vectored(&slices)),
    );
    ret_len(r, flags & libc::MSG_NOSIGNAL != 0)
}

/// `recvmsg(2)`: into the buffers in order (with `MSG_WAITALL`, until all
/// are full or the stream ends); no address and no ancillary data, as
/// from a TCP socket.
///
/// # Safety
///
/// As libc's: `msg` points to a valid `msghdr`.
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let Some(sock) = stream_of(fd) else {
        // SAFETY: passed on.
        return unsafe { real::recvmsg(fd, msg, flags) };
    };
    if msg.is_null() {
        return ret_len(Err(io::Error::from_raw_os_error(libc::EFAULT)), true);
    }
    // SAFETY: the caller's msghdr.
    let m = unsafe { &mut *msg };
    // SAFETY: the caller's iovecs.
    let v = unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) };
    let waitall = flags & libc::MSG_WAITALL != 0 && flags & libc::MSG_DONTWAIT == 0;
    let r = if waitall || flags & libc::MSG_PEEK != 0 {
        // One buffer at a time: each filled (MSG_WAITALL) before the next;
        // a peek looks at the front, so only into the first.
        let mut got = 0usize;
        let mut result = Ok(0);
        for b in v.iter().filter(|b| b.iov_len > 0) {
            match recv_into(&sock, b.iov_base, b.iov_len, flags) {
                Ok(n) => {
                    got += n;
                    if n < b.iov_len || flags & libc::MSG_PEEK != 0 {
                        break;
                    }
                }
                Err(e) => {
                    if got == 0 {
                        result = Err(e);
                    }
                    break;
                }
            }
        }
        result.map(|_: usize| got)
    } else {
        read_iovecs(&sock, v, flags)
    };
    if r.is_ok() {
        // No address, as Linux's TCP gives none.
        m.msg_namelen = 0;
        m.msg_controllen = 0;
        m.msg_flags = 0;
    }
    ret_len(r, true)
}

/// `sendfile(2)` to a moved stream: the file's bytes read into a buffer
/// and written to the stream (from `*offset`, advanced, or from the
/// file's position, which ends after what was written).
///
/// # Safety
///
/// As libc's: `offset` is null or points to an `off_t`.
#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    input: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    let Some(sock) = stream_of(out) else {
        // SAFETY: passed on.
        return unsafe { real::sendfile(out, input, offset, count) };
    };
    // As Linux, at most this much in one call (it is 0x7ffff000).
    const MOST: usize = 0x7fff_f000;
    const CHUNK: usize = 256 * 1024;
    let mut buf = vec![0u8; count.min(CHUNK)];
    let mut sent = 0usize;
    let want = count.min(MOST);
    while sent < want {
        let n = (want - sent).min(buf.len());
        // SAFETY: `buf` has `n` writable bytes; `offset`, if not null, is
        // the caller's.
        let r = unsafe {
            if offset.is_null() {
                real::read(input, buf.as_mut_ptr().cast(), n)
            } else {
                libc::pread(input, buf.as_mut_ptr().cast(), n, *offset)
            }
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if sent > 0 {
                sent as ssize_t
            } else {
                ret_len(Err(e), false)
            };
        }
        let r = r as usize;
        if r == 0 {
            break;
        }
        let mut w = 0;
        let mut failed = None;
        while w < r {
            match send_from(&sock, buf[w..].as_ptr().cast(), r - w, 0) {
                Ok(k) => w += k,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if offset.is_null() {
            if w < r {
                // The file's position ends after what was sent.
                // SAFETY: a plain lseek on the caller's fd.
                unsafe { libc::lseek(input, -((r - w) as off_t), libc::SEEK_CUR) };
            }
        } else {
            // SAFETY: the caller's offset.
            unsafe { *offset += w as off_t };
        }
        sent += w;
        if let Some(e) = failed {
            return if sent > 0 {
                sent as ssize_t
            } else {
                ret_len(Err(e), false)
            };
        }
    }
    sent as ssize_t
}

/// `sendfile64`, glibc's name for `sendfile` with a 64-bit offset (the
/// same on 64-bit targets).
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    input: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: the same contract.
    unsafe { sendfile(out, input, offset, count) }
}
