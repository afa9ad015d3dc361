//! The name and option calls on moved streams: `getpeername`,
//! `getsockname`, `setsockopt` and `getsockopt`, answered as a TCP socket
//! would (options a program sets read back as set; the rest go to the
//! pair's socket).

use std::ffi::{c_int, c_void};
use std::io;
use std::time::Duration;

use libc::{sockaddr, socklen_t};
use xio_core::net::XioStream;

use crate::addr::write_sockaddr;
use crate::{errno_of, fail, local_of, peer_of, real, set_errno, stream_of, with_stream};

/// `getpeername(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(s) = stream_of(fd) {
        return match with_stream(&s, peer_of) {
            // SAFETY: the caller's contract.
            Ok(p) => unsafe { write_sockaddr(&p, addr, len) },
            Err(e) => fail(&e, true),
        };
    }
    // SAFETY: passed on.
    unsafe { real::getpeername(fd, addr, len) }
}

/// `getsockname(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(s) = stream_of(fd) {
        return match with_stream(&s, local_of) {
            // SAFETY: the caller's contract.
            Ok(p) => unsafe { write_sockaddr(&p, addr, len) },
            Err(e) => fail(&e, true),
        };
    }
    // SAFETY: passed on.
    unsafe { real::getsockname(fd, addr, len) }
}

/// `setsockopt(2)`: on a moved stream, TCP's options and the socket-level
/// ones a program sets are accepted (timeouts take effect); the rest go
/// to the pair's socket.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if let Some(s) = stream_of(fd) {
        let int = || {
            if val.is_null() || (len as usize) < size_of::<c_int>() {
                None
            } else {
                // SAFETY: the caller gave `len` (at least an int's) bytes.
                Some(unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) })
            }
        };
        let done = |r: io::Result<()>| match r {
            Ok(()) => 0,
            Err(e) => fail(&e, true),
        };
        let ttl = (level == libc::IPPROTO_IP && name == libc::IP_TTL)
            || (level == libc::IPPROTO_IPV6 && name == libc::IPV6_UNICAST_HOPS);
        if (level == libc::IPPROTO_TCP && name == libc::TCP_NODELAY) || ttl {
            let Some(v) = int() else {
                set_errno(libc::EINVAL);
                return -1;
            };
            return done(with_stream(&s, |s| {
                if ttl {
                    // -1: the default, as Linux has it.
                    s.set_ttl(if v == -1 {
                        64
                    } else {
                        u32::try_from(v).unwrap_or(0)
                    })
                } else {
                    s.set_nodelay(v != 0)
                }
            }));
        }
        if level == libc::IPPROTO_TCP {
            return 0;
        }
        if level == libc::SOL_SOCKET && (name == libc::SO_RCVTIMEO || name == libc::SO_SNDTIMEO) {
            if (len as usize) < size_of::<libc::timeval>() || val.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: the caller gave a `timeval` (`len` checked above).
            let tv = unsafe { std::ptr::read_unaligned(val.cast::<libc::timeval>()) };
            let d = Duration::from_secs(tv.tv_sec.max(0) as u64)
                + Duration::from_micros(tv.tv_usec.max(0) as u64);
            let t = (!d.is_zero()).then_some(d);
            let r = with_stream(&s, |s| {
                if name == libc::SO_RCVTIMEO {
                    s.set_read_timeout(t)
                } else {
                    s.set_write_timeout(t)
                }
            });
            return match r {
                Ok(()) => 0,
                Err(e) => fail(&e, true),
            };
        }
        if level == libc::SOL_SOCKET
            && matches!(
                name,
                libc::SO_KEEPALIVE | libc::SO_REUSEADDR | libc::SO_REUSEPORT | libc::SO_LINGER
            )
        {
            return 0;
        }
    }
    // SAFETY: passed on.
    unsafe { real::setsockopt(fd, level, name, val, len) }
}

/// `getsockopt(2)`: on a moved stream, what a TCP socket would answer for
/// its type, domain and pending error.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if let Some(s) = stream_of(fd) {
        let int = |v: c_int| -> c_int {
            if val.is_null() || len.is_null() {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: the caller gave `*len` writable bytes at `val`.
            unsafe {
                if (*len as usize) < size_of::<c_int>() {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                std::ptr::write_unaligned(val.cast::<c_int>(), v);
                *len = size_of::<c_int>() as socklen_t;
            }
            0
        };
        if level == libc::SOL_SOCKET {
            match name {
                libc::SO_TYPE => return int(libc::SOCK_STREAM),
                libc::SO_DOMAIN => {
                    let v6 = with_stream(&s, |s| s.local_addr().is_ok_and(|a| a.is_ipv6()));
                    return int(if v6 { libc::AF_INET6 } else { libc::AF_INET });
                }
                libc::SO_PROTOCOL => return int(libc::IPPROTO_TCP),
                libc::SO_ERROR => {
                    let e = with_stream(&s, XioStream::take_error);
                    return int(match e {
                        Ok(None) => 0,
                        Ok(Some(e)) | Err(e) => errno_of(&e),
                    });
                }
                libc::SO_ACCEPTCONN => return int(0),
                libc::SO_RCVTIMEO | libc::SO_SNDTIMEO => {
                    let t = with_stream(&s, |s| {
                        if name == libc::SO_RCVTIMEO {
                            s.read_timeout()
                        } else {
                            s.write_timeout()
                        }
                    });
                    let t = t.ok().flatten().unwrap_or_default();
                    if val.is_null() || len.is_null() {
                        set_errno(libc::EFAULT);
                        return -1;
                    }
                    // SAFETY: the caller gave `*len` writable bytes at
                    // `val` (checked against a timeval's size).
                    unsafe {
                        if (*len as usize) < size_of::<libc::timeval>() {
                            set_errno(libc::EINVAL);
                            return -1;
                        }
                        let tv = libc::timeval {
                            tv_sec: t.as_secs() as libc::time_t,
                            tv_usec: t.subsec_micros() as libc::suseconds_t,
                        };
                        std::ptr::write_unaligned(val.cast::<libc::timeval>(), tv);
                        *len = size_of::<libc::timeval>() as socklen_t;
                    }
                    return 0;
                }
                _ => {}
            }
        }
        if level == libc::IPPROTO_TCP && name == libc::TCP_NODELAY {
            return match with_stream(&s, XioStream::nodelay) {
                Ok(on) => int(c_int::from(on)),
                Err(e) => fail(&e, true),
            };
        }
        if (level == libc::IPPROTO_IP && name == libc::IP_TTL)
            || (level == libc::IPPROTO_IPV6 && name == libc::IPV6_UNICAST_HOPS)
        {
            return match with_stream(&s, XioStream::ttl) {
                Ok(t) => int(t as c_int),
                Err(e) => fail(&e, true),
            };
        }
    }
    // SAFETY: passed on.
    unsafe { real::getsockopt(fd, level, name, val, len) }
}
