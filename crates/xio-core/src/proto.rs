//! The control protocol between stacks and the manager: versioned,
//! length-checked binary messages over a `SOCK_SEQPACKET` Unix socket (one
//! message per packet, so framing is the kernel's job). This module only
//! encodes and decodes; it does no I/O.
//!
//! Every message starts with an 8-byte header: `b"XI"`, the protocol version,
//! the message type, and the body length (u32 LE), which must equal the
//! packet's remaining bytes. Decoding a body checks its exact length, every
//! enum value and every string; anything else is a [`ProtoError`], which the
//! manager answers with an error reply and a closed socket, never a panic.
//!
//! Both sides speak exactly one version: a packet of another is refused
//! ([`ProtoError::Version`]). Version 2 added [`Msg::StatusReplyFd`]: a
//! status report longer than a packet travels in a memfd.
//!
//! A new [`ErrorCode`] does not change the version: a side that does not
//! know a code decodes the [`Msg::Error`] carrying it as malformed, and a
//! stack takes a malformed reply as its request's failure (a protocol
//! error), keeping its later replies matched. So an older library under
//! a newer manager sees that one request fail, with a less precise error,
//! and goes on; a new version would instead have refused every packet
//! between the two. [`ErrorCode::Busy`] (8) and
//! [`ErrorCode::PermissionDenied`] (9) came this way.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Version of this protocol.
pub const PROTO_VERSION: u8 = 2;
/// Largest packet either side sends or accepts.
pub const MAX_MSG: usize = 4096;
/// Longest status report sent inline ([`Msg::StatusReply`]); a longer one
/// goes in a memfd ([`Msg::StatusReplyFd`]).
pub const MAX_STATUS_INLINE: usize = MAX_MSG - HDR - 2;
/// Longest status report either side sends or accepts (in a memfd).
pub const MAX_STATUS: usize = 16 << 20;
/// Longest service name.
pub const MAX_NAME: usize = 64;
const MAGIC: [u8; 2] = *b"XI";
const HDR: usize = 8;

/// A malformed or unexpected message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// Shorter than a header, wrong magic, or length mismatch.
    #[error("malformed message: {0}")]
    Malformed(&'static str),
    /// Another protocol version.
    #[error("protocol version {0} not supported (this side speaks {PROTO_VERSION})")]
    Version(u8),
    /// Unknown message type.
    #[error("unknown message type {0}")]
    UnknownType(u8),
}

/// Error codes a manager answers with (in its `Error` message); stable
/// numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// The request could not be decoded.
    BadMessage = 1,
    /// Protocol version mismatch.
    Version = 2,
    /// The address is already bound by another service.
    AddrInUse = 3,
    /// No service is bound to the address.
    ConnectionRefused = 4,
    /// No free stack or channel slot.
    NoSpace = 5,
    /// A request before registration, or a second registration.
    Unexpected = 6,
    /// Anything else.
    Internal = 7,
    /// A `Connect` to an address that another stack binds, refused
    /// because that stack is not reading its control socket (no new
    /// channel to it until it reads). Not [`ErrorCode::ConnectionRefused`]:
    /// the manager also refuses so an address it resolves to the asking
    /// stack itself (a wildcard binding of its own), and a stack takes
    /// that refusal to mean its own wildcard listener may take the
    /// connection; this one never means that. Added without a new
    /// protocol version (see the module's docs): an older stack fails the
    /// connect with a protocol error instead.
    Busy = 8,
    /// The connecting process is not in the manager's security domain
    /// (its uid and groups are not among those the manager allows; see
    /// `xio-manager --allow-uid` / `--allow-gid`). Added without a new
    /// protocol version, as [`ErrorCode::Busy`].
    PermissionDenied = 9,
}

impl ErrorCode {
    fn from_u16(v: u16) -> Option<Self> {
        use ErrorCode::*;
        Some(match v {
            1 => BadMessage,
            2 => Version,
            3 => AddrInUse,
            4 => ConnectionRefused,
            5 => NoSpace,
            6 => Unexpected,
            7 => Internal,
            8 => Busy,
            9 => PermissionDenied,
            _ => return None,
        })
    }
}

/// A control message. Which side sends which is noted on each variant;
/// fds travel alongside as `SCM_RIGHTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Stack -> manager: register.
    Hello {
        /// The stack's process id (checked against SO_PEERCRED).
        pid: u32,
        /// Human-readable name for status output.
        name: String,
    },
    /// Manager -> stack: registered. Fds: segment memfd, own doorbell.
    Welcome {
        /// Assigned stack id (a slot of the pool).
        stack_id: u16,
        /// The slot's generation: bumped at each registration (never 0),
        /// so a stack that takes a dead one's slot is not taken for it.
        generation: u16,
    },
    /// Stack -> manager: bind an address.
    Bind {
        /// The address.
        addr: SocketAddr,
    },
    /// Stack -> manager: release an address.
    Unbind {
        /// The address.
        addr: SocketAddr,
    },
    /// Stack -> manager: open (or find) the channel to whoever bound `addr`.
    Connect {
        /// The address.
        addr: SocketAddr,
    },
    /// Manager -> stack: reply to `Connect`: the channel to `peer`. Fd: the
    /// peer's doorbell, unless `existing` (the stack already has it).
    Connected {
        /// Channel slot.
        channel: u32,
        /// Which ring this stack produces into (0: a->b, 1: b->a).
        dir: u8,
        /// The other end.
        peer: u16,
        /// The other end's generation (see `Welcome`).
        generation: u16,
        /// The channel existed before this request.
        existing: bool,
    },
    /// Manager -> stack, unprompted: another stack opened a channel to this
    /// one. Fd: the peer's doorbell.
    ChannelUp {
        /// Channel slot.
        channel: u32,
        /// Which ring this stack produces into (0: a->b, 1: b->a).
        dir: u8,
        /// The other end.
        peer: u16,
        /// The other end's generation (see `Welcome`).
        generation: u16,
    },
    /// Manager -> stack: the peer on `channel` died or left; stop using it,
    /// then answer `ChannelReleased`.
    PeerDown {
        /// Channel slot.
        channel: u32,
        /// The peer that went away.
        peer: u16,
    },
    /// Stack -> manager: done with a channel. A closed one is then freed;
    /// a live one (its ring was found corrupt, or the stack could not set
    /// it up) is closed for the other end too, which gets `PeerDown`.
    ChannelReleased {
        /// Channel slot.
        channel: u32,
    },
    /// Either way: success with nothing to report.
    Ok,
    /// Manager -> stack: a request failed.
    Error {
        /// What went wrong.
        code: ErrorCode,
        /// Details for humans.
        message: String,
    },
    /// Anyone -> manager: ask for a status report (needs no registration).
    Status,
    /// Manager -> client: a status report (UTF-8 text) of at most
    /// [`MAX_STATUS_INLINE`] bytes (longer text is cut when encoded).
    StatusReply {
        /// The report.
        text: String,
    },
    /// Manager -> client: a status report longer than a packet. Fd: a
    /// sealed memfd holding exactly `len` bytes of UTF-8 text.
    StatusReplyFd {
        /// The report's length in bytes, at most [`MAX_STATUS`].
        len: u32,
    },
}

mod ty {
    pub const HELLO: u8 = 1;
    pub const WELCOME: u8 = 2;
    pub const BIND: u8 = 3;
    pub const UNBIND: u8 = 4;
    pub const CONNECT: u8 = 5;
    pub const CHANNEL_UP: u8 = 6;
    pub const PEER_DOWN: u8 = 7;
    pub const CHANNEL_RELEASED: u8 = 8;
    pub const OK: u8 = 9;
    pub const ERROR: u8 = 10;
    pub const STATUS: u8 = 11;
    pub const STATUS_REPLY: u8 = 12;
    pub const CONNECTED: u8 = 13;
    pub const STATUS_REPLY_FD: u8 = 14;
}

fn put_addr(out: &mut Vec<u8>, a: &SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.to_ipv6_mapped().octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&a.port().to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str, max: usize) {
    let b = &s.as_bytes()[..s.len().min(max)];
    // Cut on a char boundary.
    let mut n = b.len();
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..n]);
}

impl Msg {
    /// Encodes into one packet.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        let t = match self {
            Msg::Hello { pid, name } => {
                b.extend_from_slice(&pid.to_le_bytes());
                put_str(&mut b, name, MAX_NAME);
                ty::HELLO
            }
            Msg::Welcome {
                stack_id,
                generation,
            } => {
                b.extend_from_slice(&stack_id.to_le_bytes());
                b.extend_from_slice(&generation.to_le_bytes());
                ty::WELCOME
            }
            Msg::Bind { addr } => {
                put_addr(&mut b, addr);
                ty::BIND
            }
            Msg::Unbind { addr } => {
                put_addr(&mut b, addr);
                ty::UNBIND
            }
            Msg::Connect { addr } => {
                put_addr(&mut b, addr);
                ty::CONNECT
            }
            Msg::ChannelUp {
                channel,
                dir,
                peer,
                generation,
            } => {
                b.extend_from_slice(&channel.to_le_bytes());
                b.push(*dir);
                b.extend_from_slice(&peer.to_le_bytes());
                b.extend_from_slice(&generation.to_le_bytes());
                ty::CHANNEL_UP
            }
            Msg::Connected {
                channel,
                dir,
                peer,
                generation,
                existing,
            } => {
                b.extend_from_slice(&channel.to_le_bytes());
                b.push(*dir);
                b.extend_from_slice(&peer.to_le_bytes());
                b.extend_from_slice(&generation.to_le_bytes());
                b.push(u8::from(*existing));
                ty::CONNECTED
            }
            Msg::PeerDown { channel, peer } => {
                b.extend_from_slice(&channel.to_le_bytes());
                b.extend_from_slice(&peer.to_le_bytes());
                ty::PEER_DOWN
            }
            Msg::ChannelReleased { channel } => {
                b.extend_from_slice(&channel.to_le_bytes());
                ty::CHANNEL_RELEASED
            }
            Msg::Ok => ty::OK,
            Msg::Error { code, message } => {
                b.extend_from_slice(&(*code as u16).to_le_bytes());
                put_str(&mut b, message, 1024);
                ty::ERROR
            }
            Msg::Status => ty::STATUS,
            Msg::StatusReply { text } => {
                put_str(&mut b, text, MAX_STATUS_INLINE);
                ty::STATUS_REPLY
            }
            Msg::StatusReplyFd { len } => {
                b.extend_from_slice(&len.to_le_bytes());
                ty::STATUS_REPLY_FD
            }
        };
        let mut out = Vec::with_capacity(HDR + b.len());
        out.extend_from_slice(&MAGIC);
        out.push(PROTO_VERSION);
        out.push(t);
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(&b);
        out
    }

    /// Decodes one packet. Never panics, whatever the bytes.
    pub fn decode(p: &[u8]) -> Result<Msg, ProtoError> {
        if p.len() < HDR {
            return Err(ProtoError::Malformed("shorter than a header"));
        }
        if p[..2] != MAGIC {
            return Err(ProtoError::Malformed("bad magic"));
        }
        if p[2] != PROTO_VERSION {
            return Err(ProtoError::Version(p[2]));
        }
        let len = u32::from_le_bytes([p[4], p[5], p[6], p[7]]) as usize;
        let body = &p[HDR..];
        if body.len() != len {
            return Err(ProtoError::Malformed(
                "length field does not match the packet",
            ));
        }
        let mut r = Reader { b: body };
        let m = match p[3] {
            ty::HELLO => Msg::Hello {
                pid: r.u32()?,
                name: r.str(MAX_NAME)?,
            },
            ty::WELCOME => Msg::Welcome {
                stack_id: r.u16()?,
                generation: r.u16()?,
            },
            ty::BIND => Msg::Bind { addr: r.addr()? },
            ty::UNBIND => Msg::Unbind { addr: r.addr()? },
            ty::CONNECT => Msg::Connect { addr: r.addr()? },
            ty::CHANNEL_UP => {
                let channel = r.u32()?;
                let dir = r.u8()?;
                if dir > 1 {
                    return Err(ProtoError::Malformed("ring direction"));
                }
                Msg::ChannelUp {
                    channel,
                    dir,
                    peer: r.u16()?,
                    generation: r.u16()?,
                }
            }
            ty::CONNECTED => {
                let channel = r.u32()?;
                let dir = r.u8()?;
                if dir > 1 {
                    return Err(ProtoError::Malformed("ring direction"));
                }
                let peer = r.u16()?;
                let generation = r.u16()?;
                let existing = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(ProtoError::Malformed("flag")),
                };
                Msg::Connected {
                    channel,
                    dir,
                    peer,
                    generation,
                    existing,
                }
            }
            ty::PEER_DOWN => Msg::PeerDown {
                channel: r.u32()?,
                peer: r.u16()?,
            },
            ty::CHANNEL_RELEASED => Msg::ChannelReleased { channel: r.u32()? },
            ty::OK => Msg::Ok,
            ty::ERROR => {
                let code =
                    ErrorCode::from_u16(r.u16()?).ok_or(ProtoError::Malformed("error code"))?;
                Msg::Error {
                    code,
                    message: r.str(1024)?,
                }
            }
            ty::STATUS => Msg::Status,
            ty::STATUS_REPLY => Msg::StatusReply {
                text: r.str(MAX_STATUS_INLINE)?,
            },
            ty::STATUS_REPLY_FD => {
                let len = r.u32()?;
                if len as usize > MAX_STATUS {
                    return Err(ProtoError::Malformed("status report too long"));
                }
                Msg::StatusReplyFd { len }
            }
            t => return Err(ProtoError::UnknownType(t)),
        };
        if !r.b.is_empty() {
            return Err(ProtoError::Malformed("trailing bytes"));
        }
        Ok(m)
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], ProtoError> {
        if self.b.len() < n {
            return Err(ProtoError::Malformed("body too short"));
        }
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn str(&mut self, max: usize) -> Result<String, ProtoError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(ProtoError::Malformed("string too long"));
        }
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::Malformed("string not UTF-8"))
    }
    fn addr(&mut self) -> Result<SocketAddr, ProtoError> {
        let fam = self.u8()?;
        let mut o = [0u8; 16];
        o.copy_from_slice(self.take(16)?);
        let port = self.u16()?;
        let v6 = Ipv6Addr::from(o);
        let ip = match fam {
            4 => IpAddr::V4(
                v6.to_ipv4_mapped()
                    .ok_or(ProtoError::Malformed("IPv4 address"))?,
            ),
            6 => IpAddr::V6(v6),
            _ => return Err(ProtoError::Malformed("address family")),
        };
        Ok(SocketAddr::new(ip, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Msg> {
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let b: SocketAddr = "[fe80::1]:8080".parse().unwrap();
        vec![
            Msg::Hello {
                pid: 42,
                name: "svc-é".into(),
            },
            Msg::Welcome {
                stack_id: 7,
                generation: 3,
            },
            Msg::Bind { addr: a },
            Msg::Unbind { addr: b },
            Msg::Connect { addr: b },
            Msg::ChannelUp {
                channel: 3,
                dir: 1,
                peer: 9,
                generation: 2,
            },
            Msg::Connected {
                channel: 3,
                dir: 0,
                peer: 9,
                generation: 2,
                existing: true,
            },
            Msg::PeerDown {
                channel: 3,
                peer: 9,
            },
            Msg::ChannelReleased { channel: 3 },
            Msg::Ok,
            Msg::Error {
                code: ErrorCode::AddrInUse,
                message: "taken".into(),
            },
            Msg::Error {
                code: ErrorCode::Busy,
                message: "not reading".into(),
            },
            Msg::Error {
                code: ErrorCode::PermissionDenied,
                message: "not in the domain".into(),
            },
            Msg::Status,
            Msg::StatusReply {
                text: "all well".into(),
            },
            Msg::StatusReplyFd { len: 123_456 },
        ]
    }

    #[test]
    fn round_trip_every_message() {
        for m in all() {
            assert_eq!(Msg::decode(&m.encode()), Ok(m));
        }
    }

    /// An error code this side does not know (as a newer manager's code is
    /// to an older library) makes the message malformed, nothing worse:
    /// the stack takes it as its request's failure (see the module docs).
    #[test]
    fn an_unknown_error_code_is_a_malformed_message() {
        let mut bad = Msg::Error {
            code: ErrorCode::Busy,
            message: String::new(),
        }
        .encode();
        bad[HDR..HDR + 2].copy_from_slice(&10u16.to_le_bytes());
        assert_eq!(Msg::decode(&bad), Err(ProtoError::Malformed("error code")));
    }

    #[test]
    fn rejects_malformed() {
        let good = Msg::Bind {
            addr: "1.2.3.4:5".parse().unwrap(),
        }
        .encode();
        assert!(Msg::decode(&good[..5]).is_err());
        let mut bad = good.clone();
        bad[0] = b'Y';
        assert!(Msg::decode(&bad).is_err());
        let mut bad = good.clone();
        bad[2] = 9;
        assert_eq!(Msg::decode(&bad), Err(ProtoError::Version(9)));
        let mut bad = good.clone();
        bad[3] = 200;
        assert_eq!(Msg::decode(&bad), Err(ProtoError::UnknownType(200)));
        let mut bad = good.clone();
        bad.push(0);
        assert!(Msg::decode(&bad).is_err());
        let mut bad = good.clone();
        bad[8] = 5; // address family
        assert!(Msg::decode(&bad).is_err());
        let too_long = Msg::StatusReplyFd {
            len: MAX_STATUS as u32 + 1,
        };
        assert!(Msg::decode(&too_long.encode()).is_err());
        // The longest inline report fits a packet; a longer one is cut.
        let full = "é".repeat(MAX_STATUS_INLINE / 2 - 1) + "xy";
        let e = Msg::StatusReply { text: full.clone() }.encode();
        assert_eq!(e.len(), MAX_MSG);
        assert_eq!(Msg::decode(&e), Ok(Msg::StatusReply { text: full }));
        let e = Msg::StatusReply {
            text: "y".repeat(MAX_MSG),
        }
        .encode();
        assert!(e.len() <= MAX_MSG && Msg::decode(&e).is_ok());
    }

    /// Every truncation and every single-byte corruption of every message
    /// decodes to something or to an error, never a panic.
    #[test]
    fn never_panics_on_mutations() {
        for m in all() {
            let e = m.encode();
            for n in 0..e.len() {
                let _ = Msg::decode(&e[..n]);
            }
            for i in 0..e.len() {
                for v in [0u8, 1, 0x7f, 0xff] {
                    let mut x = e.clone();
                    x[i] = v;
                    let _ = Msg::decode(&x);
                }
            }
        }
        let mut seed = 0x9e3779b97f4a7c15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 40) as usize;
            let mut p: Vec<u8> = (0..len).map(|i| (seed >> (i % 8 * 8)) as u8).collect();
            if p.len() >= 8 {
                p[0] = b'X';
                p[1] = b'I';
                p[2] = PROTO_VERSION;
                let l = (p.len() - 8) as u32;
                p[4..8].copy_from_slice(&l.to_le_bytes());
            }
            let _ = Msg::decode(&p);
        }
    }
}
