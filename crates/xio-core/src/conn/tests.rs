//! Unit tests of the table: two tables wired back to back, no pool.

use crate::layout::kind;

use super::*;

/// Generations of one slot (the id's bits above the index).
const GENERATIONS: usize = 1 << (32 - INDEX_BITS);

fn a(p: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], p))
}

fn src() -> SocketAddr {
    SocketAddr::from(([127, 88, 0, 1], 5000))
}

fn actions<B: Chunk>(t: &mut Table<B>) -> Vec<Action> {
    std::iter::from_fn(|| t.poll_action()).collect()
}

/// Two tables wired back to back: `c` on stack 1, `s` on stack 2.
fn handshake() -> (Table<Vec<u8>>, Table<Vec<u8>>, ConnId, ConnId) {
    handshake_of()
}

fn handshake_of<B: Chunk>() -> (Table<B>, Table<B>, ConnId, ConnId) {
    let mut c = Table::new(64);
    let mut s = Table::new(64);
    s.listen(a(80), 16).unwrap();
    let cid = c.connect(PeerId(2), a(80), src()).unwrap();
    let acts = actions(&mut c);
    let [Action::SendSyn {
        conn,
        target,
        source,
        ..
    }] = acts[..]
    else {
        panic!("{acts:?}")
    };
    s.on_syn(PeerId(1), conn.0, target, source);
    let acts = actions(&mut s);
    let Action::Control {
        kind: kind::SYN_ACK,
        to,
        arg: from,
        ..
    } = acts[0]
    else {
        panic!("{acts:?}")
    };
    assert_eq!(acts[1], Action::Acceptable(a(80)));
    let sid = s.accept(a(80)).unwrap();
    assert_eq!(sid.0, from);
    assert_eq!(s.addrs(sid).unwrap(), (a(80), src()));
    c.on_syn_ack(PeerId(2), ConnId(to), from);
    assert_eq!(actions(&mut c), vec![Action::Connected(cid)]);
    assert_eq!(c.connect_result(cid), Ok(()));
    (c, s, cid, sid)
}

#[test]
fn handshake_data_partial_reads_and_fin() {
    let (mut c, mut s, cid, sid) = handshake();
    let (peer, to, flag) = c.send_target(cid).unwrap();
    assert_eq!((peer, to, flag), (PeerId(2), sid.0, 0));
    s.on_data(PeerId(1), sid, b"hello ".to_vec());
    s.on_data(PeerId(1), sid, b"world".to_vec());
    let mut buf = [0u8; 3];
    let mut got = Vec::new();
    while let Ok(n) = s.read(sid, &mut buf) {
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"hello world");
    assert_eq!(s.read(sid, &mut buf), Err(ConnError::WouldBlock));
    c.shutdown_write(cid).unwrap();
    assert_eq!(
        actions(&mut c),
        vec![
            Action::Control {
                peer: PeerId(2),
                kind: kind::FIN,
                to: sid.0,
                arg: 0
            },
            Action::Writable(cid)
        ]
    );
    assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
    s.on_fin(PeerId(1), sid);
    assert_eq!(s.read(sid, &mut buf), Ok(0), "end of stream");
    // Half-close: the server can still write back.
    assert!(s.send_target(sid).is_ok());
}

/// A chunk with room to spare, as a pool buffer has.
struct Roomy(Vec<u8>);

impl AsRef<[u8]> for Roomy {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Chunk for Roomy {
    fn footprint(&self) -> usize {
        16
    }
    fn absorb(&mut self, other: &Self) -> bool {
        let fits = self.0.len() + other.0.len() <= 16;
        if fits {
            self.0.extend_from_slice(&other.0);
        }
        fits
    }
}

/// Chunks that arrive while others wait unread are packed into them
/// and credited back at once; the bytes read come out in order, and
/// every footprint is credited exactly once.
#[test]
fn queued_small_chunks_are_packed_and_credited() {
    let (mut c, mut s, cid, sid) = handshake_of::<Roomy>();
    let w = c.window();
    let mut sent = Vec::new();
    // Unpacked, the window (64) holds 4 chunks; packed five to a
    // chunk (each packed one credited back at once), 16 get through.
    assert_eq!(w, 64);
    for i in 0..16u8 {
        c.take_credit(cid, 16).unwrap();
        s.on_data(PeerId(1), sid, Roomy(vec![i; 3]));
        sent.extend([i; 3]);
        pass_credits(&mut s, &mut c, cid);
    }
    let mut got = Vec::new();
    let mut out = [0u8; 7];
    while let Ok(n) = s.read(sid, &mut out) {
        got.extend_from_slice(&out[..n]);
    }
    assert_eq!(got, sent);
    pass_credits(&mut s, &mut c, cid);
    assert_eq!(c.credit_left(cid), w, "every footprint credited back");
}

/// Hands the credits `s` (stack 2) owes to `c` (stack 1) for `cid`.
fn pass_credits<B: Chunk>(s: &mut Table<B>, c: &mut Table<B>, cid: ConnId) {
    for act in actions(s) {
        if let Action::Control {
            kind: kind::CREDIT,
            arg,
            ..
        } = act
        {
            c.on_credit(PeerId(2), cid, arg);
        }
    }
}

#[test]
fn credit_is_taken_returned_and_never_deadlocks() {
    let (mut c, mut s, cid, sid) = handshake();
    let w = c.window();
    assert_eq!(c.credit_left(cid), w);
    // Fill the window with 8-byte chunks.
    let mut sent = 0;
    while c.take_credit(cid, 8).is_ok() {
        s.on_data(PeerId(1), sid, vec![7u8; 8]);
        sent += 8;
    }
    assert_eq!(sent, w);
    assert_eq!(c.take_credit(cid, 8), Err(ConnError::WouldBlock));
    actions(&mut s);
    // The reader drains it all: credit flows back (at least a quarter
    // of the window per message) and the writer may go on.
    let mut out = [0u8; 5];
    let mut credited = 0;
    while let Ok(n) = s.read(sid, &mut out) {
        assert!(n > 0);
        for act in actions(&mut s) {
            if let Action::Control {
                kind: kind::CREDIT,
                arg,
                to,
                ..
            } = act
            {
                assert_eq!(to, cid.0);
                assert!(arg as usize >= w / 4);
                credited += arg as usize;
                c.on_credit(PeerId(2), cid, arg);
            }
        }
    }
    assert_eq!(credited, w);
    assert_eq!(c.credit_left(cid), w);
    // A forged credit cannot push it past the window.
    c.on_credit(PeerId(2), cid, u32::MAX);
    assert_eq!(c.credit_left(cid), w);
}

#[test]
fn refused_reset_and_peer_death() {
    let mut c: Table<Vec<u8>> = Table::new(64);
    let mut s: Table<Vec<u8>> = Table::new(64);
    let cid = c.connect(PeerId(2), a(81), src()).unwrap();
    s.on_syn(PeerId(1), cid.0, a(81), src());
    assert_eq!(
        actions(&mut s),
        vec![Action::Control {
            peer: PeerId(1),
            kind: kind::RST,
            to: cid.0,
            arg: 0
        }]
    );
    actions(&mut c);
    c.on_rst(PeerId(2), cid);
    assert_eq!(
        actions(&mut c),
        vec![
            Action::Connected(cid),
            Action::Readable(cid),
            Action::Writable(cid)
        ]
    );
    assert_eq!(c.connect_result(cid), Err(ConnError::Refused));
    assert_eq!(c.read(cid, &mut [0u8; 1]), Err(ConnError::Refused));

    let (mut c, mut s, cid, sid) = handshake();
    s.on_data(PeerId(1), sid, b"x".to_vec());
    actions(&mut s);
    s.on_peer_gone(PeerId(1));
    assert_eq!(
        actions(&mut s),
        vec![Action::Readable(sid), Action::Writable(sid)]
    );
    let mut b = [0u8; 4];
    // What the dead peer sent first, then the reset.
    assert_eq!(s.read(sid, &mut b), Ok(1));
    assert_eq!(s.read(sid, &mut b), Err(ConnError::Reset));
    // A peer that closed cleanly and then exited: its data, then end
    // of stream; writing to it fails (a broken pipe, as a RST in
    // close-wait).
    let (_, mut s3, _, sid3) = handshake();
    s3.on_data(PeerId(1), sid3, b"last".to_vec());
    s3.on_fin(PeerId(1), sid3);
    s3.on_peer_gone(PeerId(1));
    assert_eq!(s3.read(sid3, &mut b), Ok(4));
    assert_eq!(s3.read(sid3, &mut b), Ok(0));
    assert_eq!(s3.send_target(sid3), Err(ConnError::BrokenPipe));
    // Closing with unread data sends RST, not FIN.
    let (_, mut s2, _, sid2) = handshake();
    s2.on_data(PeerId(1), sid2, b"unread".to_vec());
    actions(&mut s2);
    s2.close(sid2);
    assert!(matches!(
        actions(&mut s2)[..],
        [Action::Control {
            kind: kind::RST,
            ..
        }]
    ));
    c.close(cid);
    assert_eq!(
        actions(&mut c),
        vec![Action::Control {
            peer: PeerId(2),
            kind: kind::FIN,
            to: sid.0,
            arg: 0
        }]
    );
}

#[test]
fn early_data_and_fin_before_the_syn_ack() {
    let mut c: Table<Vec<u8>> = Table::new(64);
    let mut s: Table<Vec<u8>> = Table::new(64);
    s.listen(a(80), 16).unwrap();
    let cid = c.connect(PeerId(2), a(80), src()).unwrap();
    actions(&mut c);
    // Before any answer the client writes, addressed by its own id...
    let (peer, to, flag) = c.send_target(cid).unwrap();
    assert_eq!((peer, to, flag), (PeerId(2), cid.0, kind::EARLY));
    c.close(cid);
    assert_eq!(
        actions(&mut c),
        vec![Action::Control {
            peer: PeerId(2),
            kind: kind::FIN | kind::EARLY,
            to: cid.0,
            arg: 0
        }]
    );
    assert_eq!(c.len(), 1, "kept until the answer");
    // ...and the server maps that id to its own connection.
    s.on_syn(PeerId(1), cid.0, a(80), src());
    let sid = s.accept(a(80)).unwrap();
    assert_eq!(s.early_conn(PeerId(1), cid.0), Some(sid));
    s.on_data(PeerId(1), sid, b"early".to_vec());
    s.on_fin(PeerId(1), sid);
    let mut b = [0u8; 8];
    assert_eq!(s.read(sid, &mut b), Ok(5));
    assert_eq!(s.read(sid, &mut b), Ok(0));
    // The SYN-ACK for the closed connection is taken quietly (no RST);
    // the id is remembered until the server's FIN.
    actions(&mut c);
    c.on_syn_ack(PeerId(2), cid, sid.0);
    assert!(actions(&mut c).is_empty());
    assert_eq!(c.len(), 1, "waits for the peer's FIN");
    actions(&mut s);
    s.close(sid);
    assert_eq!(s.early_conn(PeerId(1), cid.0), None, "forgotten on close");
    assert!(s.is_empty(), "the client had finished: nothing to wait for");
    assert!(matches!(
        actions(&mut s)[..],
        [Action::Control { kind: kind::FIN, to, .. }] if to == cid.0
    ));
    c.on_fin(PeerId(2), cid);
    assert!(actions(&mut c).is_empty());
    assert!(c.is_empty());
}

#[test]
fn stale_ids_are_not_delivered_to_a_reused_slot() {
    let (mut c, _s, cid, _) = handshake();
    c.close(cid);
    // The peer's FIN ends the closed connection for good.
    c.on_fin(PeerId(2), cid);
    let new = c.connect(PeerId(2), a(80), src()).unwrap();
    assert_eq!(new.index(), cid.index(), "slot reused");
    assert_ne!(new, cid, "with a new generation");
    actions(&mut c);
    c.on_data(PeerId(2), cid, b"late".to_vec());
    assert!(
        actions(&mut c).is_empty(),
        "late data never reaches the new one"
    );
    assert_eq!(c.read(cid, &mut [0u8; 4]), Err(ConnError::NotConnected));
    // Data from the wrong peer is refused too.
    c.on_data(PeerId(9), new, b"x".to_vec());
    assert!(actions(&mut c).is_empty());
    // A SYN-ACK for a stale id is answered with a RST.
    c.on_syn_ack(PeerId(2), cid, 77);
    assert!(matches!(
        actions(&mut c)[..],
        [Action::Control {
            kind: kind::RST,
            to: 77,
            ..
        }]
    ));
}

/// Data for a connection closed here is answered with a RST (the
/// writer would otherwise wait for credit forever), once; the reset is
/// reported once, then reads see end of stream and writes a broken
/// pipe, as on Linux.
#[test]
fn data_after_close_is_reset_and_the_reset_is_reported_once() {
    let (mut c, mut s, cid, sid) = handshake();
    s.close(sid);
    let acts = actions(&mut s);
    assert!(
        matches!(
            acts[..],
            [Action::Control {
                kind: kind::FIN,
                ..
            }]
        ),
        "{acts:?}"
    );
    c.on_fin(PeerId(2), cid);
    actions(&mut c);
    assert_eq!(c.read(cid, &mut [0u8; 4]), Ok(0));
    // The client writes anyway: the server resets.
    s.on_data(PeerId(1), sid, b"more".to_vec());
    let acts = actions(&mut s);
    let [Action::Control {
        kind: kind::RST,
        to,
        peer: PeerId(1),
        ..
    }] = acts[..]
    else {
        panic!("{acts:?}")
    };
    assert_eq!(to, cid.0);
    assert!(s.is_empty(), "the closed id is forgotten");
    s.on_data(PeerId(1), sid, b"again".to_vec());
    assert!(actions(&mut s).is_empty(), "one RST is enough");
    c.on_rst(PeerId(2), cid);
    // After the FIN, reads end normally, the reset notwithstanding.
    assert_eq!(c.read(cid, &mut [0u8; 4]), Ok(0));
    assert_eq!(c.peek(cid, &mut [0u8; 4]), Ok(0));
    assert_eq!(c.take_chunk(cid), Ok(None));
    // In close-wait, Linux says EPIPE; then the pipe stays broken.
    assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
    assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
    assert_eq!(c.read(cid, &mut [0u8; 4]), Ok(0));

    // Reset while open: ConnectionReset once, then end of stream and
    // BrokenPipe.
    let (mut c, _s, cid, _) = handshake();
    c.on_rst(PeerId(2), cid);
    assert_eq!(c.read(cid, &mut [0u8; 4]), Err(ConnError::Reset));
    assert_eq!(c.read(cid, &mut [0u8; 4]), Ok(0));
    assert_eq!(c.take_chunk(cid), Ok(None));
    assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
    // A write may be the first to hear of it.
    let (mut c, _s, cid, _) = handshake();
    c.on_rst(PeerId(2), cid);
    assert_eq!(c.send_target(cid), Err(ConnError::Reset));
    assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
    assert_eq!(c.read(cid, &mut [0u8; 4]), Ok(0));
    // A refusal stays an error.
    let mut c: Table<Vec<u8>> = Table::new(64);
    let cid = c.connect(PeerId(2), a(80), src()).unwrap();
    c.on_rst(PeerId(2), cid);
    assert_eq!(c.read(cid, &mut [0u8; 4]), Err(ConnError::Refused));
    assert_eq!(c.read(cid, &mut [0u8; 4]), Err(ConnError::Refused));
    // A closed connection whose peer dies is forgotten.
    let (mut c, _s, cid, _) = handshake();
    c.close(cid);
    assert_eq!(c.len(), 1);
    c.on_peer_gone(PeerId(2));
    assert!(c.is_empty());
    // What arrived before a reset is read first (the 413 a server sent
    // before it closed and reset the rest of an upload), then the reset.
    let (mut c, _s, cid, _) = handshake();
    c.on_data(PeerId(2), cid, b"413".to_vec());
    c.on_rst(PeerId(2), cid);
    let mut b = [0u8; 8];
    assert_eq!(c.peek(cid, &mut b), Ok(3));
    assert_eq!(c.read(cid, &mut b), Ok(3));
    assert_eq!(&b[..3], b"413");
    assert_eq!(c.read(cid, &mut b), Err(ConnError::Reset));
    assert_eq!(c.read(cid, &mut b), Ok(0));
    // A partial write that met the reset leaves it for the next call.
    let (mut c, _s, cid, _) = handshake();
    c.on_rst(PeerId(2), cid);
    assert_eq!(c.send_target(cid), Err(ConnError::Reset));
    c.unreport_reset(cid);
    assert_eq!(c.send_target(cid), Err(ConnError::Reset));
}

/// An id remembered as closing is not handed out again while its peer
/// may still send to it, however often its slot is reused (the
/// generation wraps after 4096).
#[test]
fn a_closing_id_is_not_reissued() {
    let (mut c, _s, cid, _) = handshake();
    c.close(cid);
    for _ in 0..5000 {
        let new = c.connect(PeerId(2), a(80), src()).unwrap();
        assert_ne!(new, cid);
        c.on_rst(PeerId(2), new); // refused
        c.close(new);
    }
    assert_eq!(c.len(), 1, "only the closing one");
}

/// A peer that never answers our FINs, one connection after another
/// (the same slot each time): once the slot comes back to a
/// generation still closing, its oldest is forgotten and reissued
/// (this used to loop for good once every generation was closing),
/// and that connection's peer is reset with a RST that must arrive.
#[test]
fn a_slot_whose_generations_are_all_closing_is_reissued() {
    let mut s: Table<Vec<u8>> = Table::new(64);
    s.listen(a(80), 16).unwrap();
    let mut ends = Vec::new();
    let mut ids = Vec::new();
    for i in 0..GENERATIONS as u32 + 10 {
        s.on_syn(PeerId(1), i, a(80), src());
        let c = s.accept(a(80)).unwrap();
        assert_eq!(c.index(), 0, "one slot, reused");
        ids.push(c);
        s.close(c);
        for act in actions(&mut s) {
            if let Action::Control {
                kind: kind::RST,
                to,
                arg,
                ..
            } = act
            {
                assert_eq!(arg, kind::RST_ENDS, "a reset that ends a connection");
                ends.push(to);
            }
        }
    }
    // The ten oldest were forgotten, their peers told.
    assert_eq!(ends, (0..10).collect::<Vec<u32>>());
    assert_eq!(s.len(), GENERATIONS);
    assert_eq!(ids[GENERATIONS..], ids[..10], "their ids reissued");
}

/// Peers that never answer our FINs, many connections at once: the
/// closing ones stay bounded, the oldest are forgotten (their peers
/// reset) first.
#[test]
fn closing_connections_are_bounded() {
    let mut s: Table<Vec<u8>> = Table::new(64);
    s.listen(a(80), CLOSING_MAX + 10).unwrap();
    let n = CLOSING_MAX as u32 + 5;
    let ids: Vec<ConnId> = (0..n)
        .map(|i| {
            s.on_syn(PeerId(1), i, a(80), src());
            s.accept(a(80)).unwrap()
        })
        .collect();
    actions(&mut s);
    for &c in &ids {
        s.close(c);
    }
    let ends: Vec<u32> = actions(&mut s)
        .into_iter()
        .filter_map(|act| match act {
            Action::Control {
                kind: kind::RST,
                to,
                arg: kind::RST_ENDS,
                ..
            } => Some(to),
            _ => None,
        })
        .collect();
    assert_eq!(ends, (0..5).collect::<Vec<u32>>());
    assert_eq!(s.len(), CLOSING_MAX);
    // A forgotten one's late data is dropped, and no second reset.
    s.on_data(PeerId(1), ids[0], b"late".to_vec());
    assert!(actions(&mut s).is_empty());
    // One that is remembered answers late data with its reset.
    s.on_data(PeerId(1), ids[5], b"late".to_vec());
    assert_eq!(s.len(), CLOSING_MAX - 1);
}

/// The peer answers some FINs: what it answered leaves the order
/// queue too, and never counts against the bound.
#[test]
fn answered_fins_leave_the_closing_order() {
    let mut s: Table<Vec<u8>> = Table::new(64);
    s.listen(a(80), 16).unwrap();
    for i in 0..10_000u32 {
        s.on_syn(PeerId(1), i, a(80), src());
        let c = s.accept(a(80)).unwrap();
        s.close(c);
        s.on_fin(PeerId(1), c);
        assert!(actions(&mut s).iter().all(|a| !matches!(
            a,
            Action::Control {
                kind: kind::RST,
                ..
            }
        )));
    }
    assert_eq!(s.len(), 0);
    assert!(s.closing_order.len() <= 64);
}

/// Windows differ (each process sets its own): a writer whose whole
/// window is below a quarter of the reader's is still credited.
#[test]
fn a_small_writer_window_is_credited_by_a_large_reader() {
    let mut c: Table<Vec<u8>> = Table::new(64);
    let mut s: Table<Vec<u8>> = Table::new(1024);
    s.set_window_floor(64);
    s.listen(a(80), 16).unwrap();
    let cid = c.connect(PeerId(2), a(80), src()).unwrap();
    let Action::SendSyn {
        conn,
        target,
        source,
        ..
    } = actions(&mut c)[0]
    else {
        panic!()
    };
    s.on_syn(PeerId(1), conn.0, target, source);
    let Action::Control { to, arg: from, .. } = actions(&mut s)[0] else {
        panic!()
    };
    let sid = s.accept(a(80)).unwrap();
    c.on_syn_ack(PeerId(2), ConnId(to), from);
    actions(&mut c);
    // Ten windows' worth, 16 bytes at a time, read as it comes.
    let mut b = [0u8; 16];
    for round in 0..40 {
        let (peer, to, _) = c.send_target(cid).unwrap();
        assert_eq!(peer, PeerId(2));
        assert!(
            c.take_credit(cid, 16).is_ok(),
            "writer starved at round {round}"
        );
        s.on_data(PeerId(1), ConnId(to), vec![round as u8; 16]);
        assert_eq!(s.read(sid, &mut b), Ok(16));
        for act in actions(&mut s) {
            if let Action::Control {
                kind: kind::CREDIT,
                to,
                arg,
                ..
            } = act
            {
                c.on_credit(PeerId(2), ConnId(to), arg);
            }
        }
    }
}

#[test]
fn closing_with_unread_data_sends_a_reset_that_must_arrive() {
    let (_c, mut s, _cid, sid) = handshake();
    s.on_data(PeerId(1), sid, b"unread".to_vec());
    actions(&mut s);
    s.close(sid);
    let acts = actions(&mut s);
    assert!(
        acts.iter().any(|a| matches!(
            a,
            Action::Control {
                kind: kind::RST,
                arg: kind::RST_ENDS,
                ..
            }
        )),
        "{acts:?}"
    );
}

#[test]
fn shutting_down_writes_wakes_a_waiting_writer() {
    let (mut c, _s, cid, _) = handshake();
    c.shutdown_write(cid).unwrap();
    assert!(actions(&mut c).contains(&Action::Writable(cid)));
    assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
}

#[test]
fn peek_leaves_the_bytes_for_the_next_read() {
    let (mut c, _s, cid, _) = handshake();
    let mut b = [0u8; 8];
    assert_eq!(c.peek(cid, &mut b), Err(ConnError::WouldBlock));
    c.on_data(PeerId(2), cid, b"abc".to_vec());
    c.on_data(PeerId(2), cid, b"defg".to_vec());
    assert_eq!(c.read(cid, &mut b[..1]), Ok(1));
    assert_eq!(c.peek(cid, &mut b[..5]), Ok(5));
    assert_eq!(&b[..5], b"bcdef");
    assert_eq!(
        c.peek(cid, &mut b),
        Ok(6),
        "across buffers, from the offset"
    );
    assert_eq!(c.read(cid, &mut b), Ok(6));
    assert_eq!(&b[..6], b"bcdefg");
    c.on_fin(PeerId(2), cid);
    assert_eq!(c.peek(cid, &mut b), Ok(0));
}

#[test]
fn a_reporting_peek_reports_a_reset_once_and_a_plain_one_leaves_it() {
    let (mut c, _s, cid, _) = handshake();
    let mut b = [0u8; 8];
    c.on_rst(PeerId(2), cid);
    assert_eq!(c.peek(cid, &mut b), Err(ConnError::Reset));
    assert_eq!(c.peek(cid, &mut b), Err(ConnError::Reset), "left");
    assert_eq!(c.peek_reporting(cid, &mut b), Err(ConnError::Reset));
    assert_eq!(c.peek_reporting(cid, &mut b), Ok(0), "once");
    assert_eq!(c.take_error(cid), None);
    assert_eq!(c.read(cid, &mut b), Ok(0));
}

#[test]
fn a_full_backlog_refuses_until_one_is_accepted() {
    let mut s: Table<Vec<u8>> = Table::new(64);
    s.listen(a(1), 2).unwrap();
    s.on_syn(PeerId(1), 10, a(1), src());
    s.on_syn(PeerId(1), 11, a(1), src());
    actions(&mut s);
    s.on_syn(PeerId(2), 12, a(1), src());
    assert_eq!(s.len(), 2, "the third waits nowhere");
    assert!(matches!(
        s.poll_action(),
        Some(Action::Control { peer: PeerId(2), kind: k, to: 12, .. }) if k == kind::RST
    ));
    let first = s.accept(a(1)).unwrap();
    s.on_syn(PeerId(2), 13, a(1), src());
    assert_eq!(s.len(), 3);
    assert_ne!(s.accept(a(1)).unwrap(), first);
}

#[test]
fn thousands_of_connections_and_reuse() {
    let mut s: Table<Vec<u8>> = Table::new(64);
    s.listen(a(1), 5000).unwrap();
    for round in 0..3 {
        let ids: Vec<ConnId> = (0..5000)
            .map(|i| {
                s.on_syn(PeerId(1 + i % 7), i, a(1), src());
                s.accept(a(1)).unwrap()
            })
            .collect();
        assert_eq!(s.len(), 5000, "round {round}");
        for (i, &c) in ids.iter().enumerate() {
            s.close(c);
            if i % 2 == 0 {
                s.on_fin(PeerId(1 + (i % 7) as u32), c);
            }
        }
        assert_eq!(s.len(), 2500, "closed, the peer may still send");
        for (i, &c) in ids.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
            s.on_rst(PeerId(1 + (i % 7) as u32), c);
        }
        actions(&mut s);
        assert!(s.is_empty());
    }
    assert_eq!(s.listen(a(1), 1), Err(ConnError::AddrInUse));
}
