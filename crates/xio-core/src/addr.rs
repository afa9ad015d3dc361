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
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// Every binding that could answer for `addr`: its exact names, then the
/// wildcards ([`exact_names`], [`wildcards`]).
pub fn bindings_for(addr: SocketAddr) -> impl Iterator<Item = SocketAddr> {
    exact_names(addr).chain(wildcards(addr))
}

/// Whether `ip` is one of this node's addresses: loopback, unspecified
/// (which TCP also takes for "this host"), or assigned to one of its
/// interfaces. Asked for every connect or SYN that misses every exact
/// binding and finds a wildcard one, with whatever address the peer
/// chose: the interfaces are listed at most once per 100 ms (`REFRESH`; a
/// listing is a netlink dump), and an address added to an interface, or
/// taken from it, is seen within that time.
pub fn is_this_node(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    static LISTING: Mutex<Listing> = Mutex::new(Listing {
        addrs: Vec::new(),
        at: None,
    });
    let mut l = LISTING.lock().unwrap_or_else(|e| e.into_inner());
    l.contains(ip, Instant::now(), interface_addrs)
}

/// How long a listing of the interfaces' addresses answers for them.
const REFRESH: Duration = Duration::from_millis(100);

/// The interfaces' addresses as last listed, and when.
struct Listing {
    addrs: Vec<IpAddr>,
    at: Option<Instant>,
}

impl Listing {
    /// Whether `ip` is in the listing, listed again with `list` first if
    /// it is older than [`REFRESH`] at `now`.
    fn contains(&mut self, ip: IpAddr, now: Instant, list: impl FnOnce() -> Vec<IpAddr>) -> bool {
        let stale = self
            .at
            .is_none_or(|at| now.saturating_duration_since(at) >= REFRESH);
        if stale {
            self.addrs = list();
            self.at = Some(now);
        }
        self.addrs.contains(&ip)
    }
}

#[cfg(test)]
thread_local! {
    /// How many times this thread listed the interfaces (tests only).
    static LISTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The addresses of this node's interfaces (empty if the kernel will not
/// list them).
fn interface_addrs() -> Vec<IpAddr> {
    #[cfg(test)]
    LISTED.with(|n| n.set(n.get() + 1));
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

    /// A peer may name any address in its SYNs or connects: each one that
    /// finds a wildcard binding asks whether it is this node's. Those
    /// answers must not list the interfaces each time (a netlink dump per
    /// SYN), however many different addresses are asked about.
    #[test]
    fn asking_about_many_other_addresses_lists_the_interfaces_rarely() {
        // Benchmarking addresses (RFC 2544), less those this node has.
        let ours = interface_addrs();
        let others: Vec<IpAddr> = (0..1000u32)
            .map(|i| IpAddr::from(Ipv4Addr::from(0xc612_0000 + i)))
            .filter(|ip| !ours.contains(ip))
            .collect();
        let asked = others.len();
        let before = LISTED.with(|n| n.get());
        let start = Instant::now();
        for ip in others {
            assert!(!is_this_node(ip), "{ip}");
        }
        let elapsed = start.elapsed();
        // At most one listing per refresh interval, whatever the speed.
        let most = elapsed.as_nanos() / REFRESH.as_nanos() + 1;
        let listed = LISTED.with(|n| n.get()) - before;
        assert!(
            u128::from(listed) <= most,
            "{listed} listings for {asked} addresses in {elapsed:?}"
        );
    }

    /// An address added to an interface (or taken from it) is seen once
    /// the listing is [`REFRESH`] old, not before.
    #[test]
    fn a_listing_answers_until_it_is_refresh_old() {
        let t0 = Instant::now();
        let new: IpAddr = "198.18.0.1".parse().unwrap();
        let mut l = Listing {
            addrs: Vec::new(),
            at: None,
        };
        let listed = std::cell::Cell::new(0);
        let list = |addrs: Vec<IpAddr>| {
            let listed = &listed;
            move || {
                listed.set(listed.get() + 1);
                addrs
            }
        };
        assert!(!l.contains(new, t0, list(vec![])));
        // Added now: not seen until the listing is old enough.
        assert!(!l.contains(new, t0 + REFRESH / 2, list(vec![new])));
        assert_eq!(listed.get(), 1);
        assert!(l.contains(new, t0 + REFRESH, list(vec![new])));
        // Taken away: seen at the next listing.
        assert!(l.contains(new, t0 + REFRESH + REFRESH / 2, list(vec![])));
        assert!(!l.contains(new, t0 + REFRESH * 2, list(vec![])));
        assert_eq!(listed.get(), 3);
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
        for &ip in &addrs {
            assert!(is_this_node(ip), "{ip}");
        }
        // Documentation ranges (RFC 5737, RFC 3849), less any this host
        // does have (sandboxes give their guests such addresses: this
        // one's eth0 was 192.0.2.2).
        for ip in ["192.0.2.7", "198.51.100.9", "203.0.113.1", "2001:db8::1"] {
            let ip: IpAddr = ip.parse().unwrap();
            if !addrs.contains(&ip) {
                assert!(!is_this_node(ip), "{ip}");
            }
        }
    }
}
