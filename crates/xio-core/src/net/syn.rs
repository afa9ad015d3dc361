//! The SYN payload and the addresses of connections.

use std::net::SocketAddr;

use crate::buf::BufMut;
use crate::conn::ConnId;
use crate::stack::PeerId;

/// Bytes of a SYN's payload: version, then target and source addresses.
pub(super) const SYN_LEN: usize = 1 + 2 * ADDR_LEN;
pub(super) const ADDR_LEN: usize = 1 + 16 + 2;

pub(super) fn put_addr(out: &mut [u8], a: &SocketAddr) {
    match a {
        SocketAddr::V4(v) => {
            out[0] = 4;
            out[1..5].copy_from_slice(&v.ip().octets());
            out[5..17].fill(0);
        }
        SocketAddr::V6(v) => {
            out[0] = 6;
            out[1..17].copy_from_slice(&v.ip().octets());
        }
    }
    out[17..19].copy_from_slice(&a.port().to_le_bytes());
}

fn get_addr(b: &[u8]) -> Option<SocketAddr> {
    let port = u16::from_le_bytes([b[17], b[18]]);
    match b[0] {
        4 => {
            let ip: [u8; 4] = b[1..5].try_into().ok()?;
            Some(SocketAddr::from((ip, port)))
        }
        6 => {
            let ip: [u8; 16] = b[1..17].try_into().ok()?;
            Some(SocketAddr::from((ip, port)))
        }
        _ => None,
    }
}

pub(super) fn encode_syn(buf: &mut BufMut, target: &SocketAddr, source: &SocketAddr) {
    buf.set_len(SYN_LEN);
    buf[0] = 1;
    put_addr(&mut buf[1..1 + ADDR_LEN], target);
    put_addr(&mut buf[1 + ADDR_LEN..], source);
}

pub(super) fn decode_syn(b: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    if b.len() != SYN_LEN || b[0] != 1 {
        return None;
    }
    Some((
        get_addr(&b[1..1 + ADDR_LEN])?,
        get_addr(&b[1 + ADDR_LEN..])?,
    ))
}

/// The address a connecting stream gets: X-IO clients do not bind, so it
/// is made from the stack and connection ids, unique on the machine
/// among live connections (`127.88.<stack>:<port>`; a process's
/// connections past the first 64,512 ports go on in 127.89 to 127.104,
/// so the 2^20 a table holds never share one). Of `target`'s family, as
/// a TCP connection's two ends are: to an IPv6 address, the same address
/// IPv4-mapped (`[::ffff:127.88.<stack>]:<port>`). Both ends make it
/// from the ids and the target, so they agree.
pub(super) fn client_addr(stack: PeerId, c: ConnId, target: &SocketAddr) -> SocketAddr {
    const PORTS: u32 = 65536 - 1024;
    let [hi, lo] = stack.slot().to_be_bytes();
    let index = c.index() as u32;
    let block = (index / PORTS) as u8;
    let port = 1024 + index % PORTS;
    let ip = std::net::Ipv4Addr::new(127, 88 + block, hi, lo);
    match target {
        SocketAddr::V4(_) => SocketAddr::from((ip, port as u16)),
        SocketAddr::V6(_) => SocketAddr::from((ip.to_ipv6_mapped(), port as u16)),
    }
}

/// Whether `ip`, the target of a peer's SYN that found only a wildcard
/// listener, is one of this node's ([`crate::addr::is_this_node`]), with
/// the interface addresses found before kept in `known`: a service bound
/// to `0.0.0.0` and reached at an interface's address would otherwise
/// take the process-wide listing's lock at every connection (and list
/// the interfaces again when it is old). (An address removed from its
/// interface since stays known: it was this node's when a peer was sent
/// to it.)
pub(super) fn this_node(known: &mut Vec<std::net::IpAddr>, ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    if ip.is_loopback() || ip.is_unspecified() || known.contains(&ip) {
        return true;
    }
    let ours = crate::addr::is_this_node(ip);
    if ours {
        known.push(ip);
    }
    ours
}
