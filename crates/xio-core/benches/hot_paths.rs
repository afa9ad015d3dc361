//! In-process hot paths, one thread or two, with criterion: the
//! descriptor ring, the pool's allocation through its private cache, the
//! stack's send and receive between two threads, and the connection
//! table. Cross-process figures, side by side with the kernel, are
//! `xio-bench`'s (BENCHMARKS.md); these isolate one layer each, to see
//! what a change to it costs.
//!
//! `cargo bench -p xio-core --bench hot_paths`. On a machine of two cores
//! the two-thread case shares them with criterion's own bookkeeping:
//! compare runs on one machine, in one phase.
// `criterion_group!` makes a function it cannot document.
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use xio_core::conn::{ConnId, Table};
use xio_core::layout::{Descriptor, PoolConfig};
use xio_core::pool::{ManagerPool, PoolView, StackPool};
use xio_core::prelude::*;
use xio_core::ring::heap_ring;
use xio_core::segment::{Region, Segment};

fn ring(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring");
    let (mut tx, mut rx) = heap_ring(1024);
    let d = Descriptor {
        index: 7,
        len: 64,
        ..Default::default()
    };
    g.throughput(Throughput::Elements(1));
    g.bench_function("push_pop_one", |b| {
        b.iter(|| {
            tx.push_one(black_box(d)).unwrap();
            black_box(rx.pop().unwrap());
        })
    });
    let burst = [d; 32];
    let mut out = [Descriptor::default(); 32];
    g.throughput(Throughput::Elements(32));
    g.bench_function("push_pop_burst_32", |b| {
        b.iter(|| {
            assert_eq!(tx.push_burst(black_box(&burst)).unwrap(), 32);
            assert_eq!(rx.pop_burst(&mut out).unwrap(), 32);
        })
    });
    g.finish();
}

/// A pool of one 2 KiB class on the heap, and a stack's view of it.
fn heap_pool() -> (ManagerPool, StackPool) {
    let cfg = PoolConfig {
        classes: vec![(2048, 4096)],
        max_stacks: 4,
        max_channels: 2,
        ring_capacity: 64,
        quotas: Vec::new(),
    };
    let geo = cfg.geometry().unwrap();
    let seg = Segment::init(Region::heap(geo.total_len as usize).unwrap(), &cfg, &geo).unwrap();
    (
        ManagerPool::init(seg.clone()),
        StackPool::new(PoolView::new(seg), 1),
    )
}

fn pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool");
    let (_m, p) = heap_pool();
    g.throughput(Throughput::Elements(1));
    g.bench_function("alloc_free_cached", |b| {
        b.iter(|| p.free(black_box(p.alloc(64, true).unwrap())))
    });
    // More than the private cache holds: magazines go to and come back
    // from the shared lists.
    let mut held = Vec::with_capacity(256);
    g.throughput(Throughput::Elements(256));
    g.bench_function("alloc_free_256_through_lists", |b| {
        b.iter(|| {
            held.extend((0..256).map(|_| p.alloc(64, true).unwrap()));
            for x in held.drain(..) {
                p.free(x);
            }
        })
    });
    g.finish();
}

/// A 64-byte round trip between two stacks of one process on two
/// threads, through an embedded manager's pool.
fn stack(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("xio-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var("XIO_RUN_DIR", &dir);
    let prefix = "hot-paths";
    let manager = Manager::builder(prefix).spawn().unwrap();
    let addr: SocketAddr = "10.0.0.1:7".parse().unwrap();
    let mut server = Stack::attach(prefix).unwrap();
    server.bind(addr).unwrap();
    let echo = std::thread::spawn(move || {
        // Echoes in place until the client says "stop".
        loop {
            let msg = server.recv().unwrap();
            if &msg.buf[..] == b"stop" {
                return;
            }
            server.send(msg.from, msg.buf.into_mut()).unwrap();
        }
    });
    let mut client = Stack::attach(prefix).unwrap();
    let peer = client.connect(addr).unwrap();
    let mut g = c.benchmark_group("stack");
    g.throughput(Throughput::Elements(1));
    g.bench_function("round_trip_64B_two_threads", |b| {
        b.iter(|| {
            let mut buf = client.alloc(64).unwrap();
            buf.copy_from(&[7u8; 64]);
            client.send(peer, buf).unwrap();
            black_box(client.recv().unwrap());
        })
    });
    g.finish();
    let mut stop = client.alloc(4).unwrap();
    stop.copy_from(b"stop");
    client.send(peer, stop).unwrap();
    echo.join().unwrap();
    drop(client);
    manager.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

/// Two tables wired back to back, as two stacks' socket layers are: `c`
/// on stack 1 connected to `s` on stack 2. Returns the connection ids.
fn connected(c: &mut Table<Vec<u8>>, s: &mut Table<Vec<u8>>) -> (ConnId, ConnId) {
    use xio_core::conn::Action;
    let cid = c.connect(PeerId(2), addr(80), addr(5000)).unwrap();
    let (conn, target, source) = loop {
        match c.poll_action() {
            Some(Action::SendSyn {
                conn,
                target,
                source,
                ..
            }) => break (conn, target, source),
            Some(_) => {}
            None => panic!("no SYN"),
        }
    };
    s.on_syn(PeerId(1), conn.0, target, source);
    while s.poll_action().is_some() {}
    let sid = s.accept(addr(80)).unwrap();
    c.on_syn_ack(PeerId(2), cid, sid.0);
    while c.poll_action().is_some() {}
    (cid, sid)
}

fn conn_table(c: &mut Criterion) {
    let mut g = c.benchmark_group("conn_table");
    let (mut ct, mut st) = (Table::new(1 << 20), Table::new(1 << 20));
    st.listen(addr(80), 1024).unwrap();
    let (_cid, sid) = connected(&mut ct, &mut st);
    let mut out = [0u8; 64];
    g.throughput(Throughput::Elements(1));
    g.bench_function("data_64B_in_and_read", |b| {
        b.iter_batched(
            || vec![7u8; 64],
            |chunk| {
                st.on_data(PeerId(1), sid, chunk);
                assert_eq!(st.read(sid, &mut out).unwrap(), 64);
                while st.poll_action().is_some() {}
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("open_and_close", |b| {
        b.iter(|| {
            let (cid, sid) = connected(&mut ct, &mut st);
            ct.close(cid);
            while ct.poll_action().is_some() {}
            st.on_fin(PeerId(1), sid);
            st.close(sid);
            while st.poll_action().is_some() {}
            ct.on_fin(PeerId(2), cid);
            while ct.poll_action().is_some() {}
        })
    });
    g.finish();
}

criterion_group!(benches, ring, pool, stack, conn_table);
criterion_main!(benches);
