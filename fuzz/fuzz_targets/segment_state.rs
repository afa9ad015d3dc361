//! Random bytes anywhere in a pool's segment (ring headers and slots,
//! free-list heads, magazines, buffer headers, stack slots, the header):
//! what a process that can write the segment may do. The stacks and the
//! manager that then allocate, send, receive, free, pop rings, count and
//! reclaim get errors or skip what is corrupt; nothing panics, nothing
//! reads out of bounds (the target runs under AddressSanitizer when
//! `cargo fuzz` is given `-s address`).
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use xio_core::layout::PoolConfig;
use xio_core::pool::{ManagerPool, PoolView, StackPool};
use xio_core::ring::channel_ends;
use xio_core::segment::{Region, Segment};

fuzz_target!(|data: &[u8]| {
    let cfg = PoolConfig {
        classes: vec![(64, 16), (256, 4)],
        max_stacks: 4,
        max_channels: 2,
        ring_capacity: 8,
        quotas: vec![(64, 6)],
    };
    let geo = cfg.geometry().unwrap();
    let len = geo.total_len as usize;
    let region = Region::create_memfd("xio-fuzz", len).unwrap();
    let seg = Segment::init(region, &cfg, &geo).unwrap();
    let mgr = ManagerPool::init(seg.clone());
    for ch in 0..2 {
        seg.reset_channel_rings(ch);
    }
    // Some traffic first, so rings and headers hold real state to damage.
    let a = StackPool::new(PoolView::new(seg.clone()), 1);
    let b = StackPool::new(PoolView::new(seg.clone()), 2);
    let (mut tx, _) = channel_ends(&seg, 1, 0);
    let (_, mut rx) = channel_ends(&seg, 1, 1);
    for _ in 0..3 {
        if let Ok(x) = a.alloc(10, false) {
            let d = a.view().prepare_send(1, x, 10, 2, 0, 0);
            let _ = tx.push(d);
        }
    }
    // The damage: (offset, length, bytes) records.
    let mut d = data;
    while d.len() >= 5 {
        let off = u32::from_le_bytes(d[..4].try_into().unwrap()) as usize % len;
        let n = (d[4] as usize).min(d.len() - 5);
        seg.region().__scribble(off, &d[5..5 + n]);
        d = &d[5 + n..];
    }
    // Everyone carries on.
    for _ in 0..16 {
        match rx.pop() {
            Ok(Some(desc)) => {
                if let Ok(got) = b.view().accept(2, 1, &desc) {
                    b.reuse(got);
                    let back = b.view().prepare_send(2, got, 1, 1, 0, 0);
                    if let Ok(got) = a.view().accept(1, 2, &back) {
                        a.free(got);
                    }
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    let mut held = Vec::new();
    for i in 0..24 {
        let size = if i % 3 == 0 { 200 } else { 20 };
        if let Ok(x) = a.alloc(size, false) {
            held.push(x);
        }
    }
    for x in held {
        a.free(x);
    }
    let _ = mgr.usage();
    let _ = mgr.reclaim(&[3], &[1, 2], &[], Duration::ZERO, |_| true);
    a.flush();
    b.flush();
    let _ = mgr.usage();
    // A stack attaching now maps the damaged segment and reads its header:
    // an error, or a segment whose every offset was checked.
    let fd = seg.region().fd().unwrap().try_clone_to_owned().unwrap();
    // Its id is checked against the header's stack count, as
    // `Stack::attach` checks the id the manager gave it.
    let opened = Segment::open(Region::map_fd(fd).unwrap());
    if let Some(s2) = opened.ok().filter(|s| s.max_stacks() >= 3) {
        let p = StackPool::new(PoolView::new(s2.clone()), 3);
        for size in [1, 64, 65, 256, 257] {
            if let Ok(x) = p.alloc(size, false) {
                p.free(x);
            }
        }
        p.flush();
    }
});
