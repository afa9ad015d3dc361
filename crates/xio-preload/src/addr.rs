//! `sockaddr` to and from `SocketAddr`.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{c_int, sockaddr, socklen_t};

/// The address at `addr` (`len` bytes), if it is an IPv4 or IPv6 one.
///
/// # Safety
///
/// `addr` is null or points to `len` readable bytes.
pub(crate) unsafe fn read_sockaddr(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family is readable (checked above).
    let family = c_int::from(unsafe { std::ptr::read_unaligned(&raw const (*addr).sa_family) });
    match family {
        libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: `len` covers a `sockaddr_in`.
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: `len` covers a `sockaddr_in6`.
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Writes `a` to `addr` as the kernel does: truncated to `*len`, with
/// `*len` set to the address's full size. Null `addr` or `len`: nothing.
/// Returns 0.
///
/// # Safety
///
/// `addr` is null or has `*len` writable bytes; `len` is null or valid.
pub(crate) unsafe fn write_sockaddr(
    a: &SocketAddr,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    if addr.is_null() || len.is_null() {
        return 0;
    }
    // SAFETY: all-zero is a valid `sockaddr_storage`.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let size = match a {
        SocketAddr::V4(v4) => {
            let s = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a `sockaddr_in` fits in a `sockaddr_storage`.
            unsafe { std::ptr::write_unaligned((&raw mut st).cast(), s) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let s = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: a `sockaddr_in6` fits in a `sockaddr_storage`.
            unsafe { std::ptr::write_unaligned((&raw mut st).cast(), s) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: the caller's contract: `*len` bytes are writable at `addr`.
    unsafe {
        let room = (*len as usize).min(size);
        std::ptr::copy_nonoverlapping((&raw const st).cast::<u8>(), addr.cast::<u8>(), room);
        *len = size as socklen_t;
    }
    0
}
