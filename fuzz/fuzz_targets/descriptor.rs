//! Any 16 bytes a peer pushes as a descriptor: the receiver's check
//! (`PoolView::accept`) refuses what is not a buffer in flight to it from
//! that peer, and never reads out of bounds, whatever the fields say.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xio_core::layout::{Descriptor, PoolConfig};
use xio_core::pool::{ManagerPool, PoolView, StackPool};
use xio_core::segment::{Region, Segment};

fuzz_target!(|data: &[u8]| {
    let cfg = PoolConfig {
        classes: vec![(64, 8), (256, 2)],
        max_stacks: 4,
        max_channels: 2,
        ring_capacity: 8,
        quotas: Vec::new(),
    };
    let geo = cfg.geometry().unwrap();
    let seg = Segment::init(Region::heap(geo.total_len as usize).unwrap(), &cfg, &geo).unwrap();
    // The manager's side lays the free lists out.
    let _mgr = ManagerPool::init(seg.clone());
    let tx = StackPool::new(PoolView::new(seg.clone()), 1);
    let rx = StackPool::new(PoolView::new(seg.clone()), 2);
    // One real buffer in flight from 1 to 2, so forged descriptors can
    // name it (or miss it by a field).
    let b = tx.alloc(10, false).unwrap();
    let real = tx.view().prepare_send(1, b, 10, 2, 0, 0);
    let mut taken = false;
    for w in data.chunks_exact(16) {
        let lo = u64::from_le_bytes(w[..8].try_into().unwrap());
        let hi = u64::from_le_bytes(w[8..].try_into().unwrap());
        let d = Descriptor::from_words((lo, hi));
        let from = (lo >> 61) as u16; // 0..7: stacks in and out of range
        rx.view().prefetch(&d, true);
        if let Ok(got) = rx.view().accept(2, from, &d) {
            // Only the real buffer, once, from its sender.
            assert!(!taken && from == 1 && (got.class, got.index) == (real.class, real.index));
            taken = true;
            rx.free(got);
        }
    }
    if !taken {
        rx.free(rx.view().accept(2, 1, &real).unwrap());
    }
});
