//! Wildcard addresses: a service bound to `0.0.0.0:port` or `[::]:port`
//! answers for that port on every address of this node, as a TCP listener
//! does, so the usual `bind("0.0.0.0:3000")` is reached by a client that
//! dials `127.0.0.1:3000` or `localhost:3000`.
//!
//! *This node's* addresses are the loopback and unspecified ones and those
//! of its network interfaces. Only they reach a wildcard binding: an
//! address of another machine is left unresolved, so a connector with a
//! TCP fallback still dials that machine instead of a local service that
//! happens to use the same port. A binding to the exact address takes
//! precedence over a wildcard one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The names a binding on exactly `addr` may have: `addr` itself, and for
/// an IPv4-mapped IPv6 address (`[::ffff:127.0.0.1]`) its IPv4 form.
pub fn exact_names(addr: SocketAddr) -> impl Iterator<Item = SocketAddr> {
    let v4 = match addr {
        SocketAddr::V6(v6) => v6
            .ip()
            .to_ipv4_mapped()
            .map(|ip| SocketAddr::new(ip.into(), addr.port())),
        SocketAddr::V4(_) => None,
    };
    std::iter::once(addr).chain(v4)
}

/// The wildcard bindings that could answer for `addr`, most specific
/// first: for an IPv4 address (or an IPv4-mapped IPv6 one) `0.0.0.0:port`
/// then `[::]:port` (a dual-stack listener, as Linux's default); for IPv6
/// `[::]:port`.
pub fn wildcards(addr: SocketAddr) -> impl Iterator<Item = SocketAddr> {
    let port = addr.port();
    let any4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
    let any6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
    let v4 = addr.ip().to_canonical().is_ipv4();
    v4.then_some(any4).into_iter().chain([any6])
}

/// Whether `ip` is one of this node's addresses: loopback, unspecified
/// (which TCP also takes for "this host"), or assigned to one of its
/// interfaces (looked up each call: only a connect that misses every
/// exact binding and finds a wildcard one asks).
pub fn is_this_node(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || ip.is_unspecified() || interface_addrs().contains(&ip)
}

/// The addresses of this node's interfaces (empty if the kernel will not
/// list them).
fn interface_addrs() -> Vec<IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a pointer to a list it allocated into
    // `list`, which is a valid out-pointer; on failure it writes nothing.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is an entry of the list getifaddrs returned, which
        // stays allocated until the `freeifaddrs` below.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: a non-null `ifa_addr` points to a socket address
            // whose family field says which struct it is; each is read
            // only as the struct its family names.
            let ip = unsafe {
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                        Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))))
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                        Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
                    }
                    _ => None,
                }
            };
            out.extend(ip);
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once; no entry is
    // used after this.
    unsafe { libc::freeifaddrs(list) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_ipv4_address_may_reach_both_wildcards_an_ipv6_one_only_its_own() {
        let w: Vec<_> = wildcards(a("127.0.0.1:3000")).collect();
        assert_eq!(w, [a("0.0.0.0:3000"), a("[::]:3000")]);
        let w: Vec<_> = wildcards(a("[::ffff:127.0.0.1]:3000")).collect();
        assert_eq!(w, [a("0.0.0.0:3000"), a("[::]:3000")]);
        let w: Vec<_> = wildcards(a("[::1]:80")).collect();
        assert_eq!(w, [a("[::]:80")]);
        let n: Vec<_> = exact_names(a("[::ffff:127.0.0.2]:3000")).collect();
        assert_eq!(n, [a("[::ffff:127.0.0.2]:3000"), a("127.0.0.2:3000")]);
        let n: Vec<_> = exact_names(a("[::1]:80")).collect();
        assert_eq!(n, [a("[::1]:80")]);
    }

    #[test]
    fn loopback_and_interface_addresses_are_this_node_others_are_not() {
        for ip in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "0.0.0.0",
            "::",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_this_node(ip.parse().unwrap()), "{ip}");
        }
        // Every interface address the kernel lists (at least loopback's).
        let addrs = interface_addrs();
        assert!(
            addrs.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{addrs:?}"
        );
        for ip in addrs {
            assert!(is_this_node(ip), "{ip}");
        }
        // Documentation ranges (RFC 5737, RFC 3849): never a host's own.
        for ip in ["192.0.2.7", "203.0.113.1", "2001:db8::1"] {
            assert!(!is_this_node(ip.parse().unwrap()), "{ip}");
        }
    }
}
