//! The manager's counters and the pool's use in Prometheus' text
//! exposition format: [`Metrics::render`], which the `xio-manager` binary
//! serves on an opt-in local address (`--metrics`), and which an embedded
//! manager's handle gives too. Every metric is read when rendered: the
//! counters from the manager's snapshot, the buffers from their headers
//! (a racy but consistent-enough count), the per-stack counters from the
//! stacks' slots.
//!
//! The metrics, their types and labels are listed in docs/operations.md,
//! "Metrics".

use std::fmt::Write;
use std::sync::{Arc, Mutex};

use crate::backend::AnyManagerPool;
use crate::segment::Segment;
use crate::sync::Ordering;

use super::handle::ManagerHandle;
use super::{Manager, Snapshot};

/// A manager's metrics, readable from any thread while it runs.
#[derive(Clone, Debug)]
pub struct Metrics {
    pool: AnyManagerPool,
    seg: Segment,
    snapshot: Arc<Mutex<Snapshot>>,
}

impl Manager {
    /// The manager's metrics (see the module docs), for another thread
    /// to render while [`Manager::run`] serves.
    pub fn metrics(&self) -> Metrics {
        Metrics {
            pool: self.pool.clone(),
            seg: self.seg.clone(),
            snapshot: self.snapshot.clone(),
        }
    }
}

impl ManagerHandle {
    /// The manager's metrics (see [`Metrics`]).
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }
}

impl Metrics {
    /// The metrics as Prometheus' text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let s = self
            .snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let usage = self.pool.usage();
        let mut t = String::new();
        let head = |t: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(t, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        head(
            &mut t,
            "xio_pool_buffers",
            "gauge",
            "Buffers of the size class.",
        );
        for u in &usage {
            let _ = writeln!(
                t,
                "xio_pool_buffers{{class=\"{}\"}} {}",
                u.buf_size, u.total
            );
        }
        head(
            &mut t,
            "xio_pool_buffers_free",
            "gauge",
            "Free buffers of the size class.",
        );
        for u in &usage {
            let _ = writeln!(
                t,
                "xio_pool_buffers_free{{class=\"{}\"}} {}",
                u.buf_size, u.free
            );
        }
        head(
            &mut t,
            "xio_pool_buffers_held",
            "gauge",
            "Buffers of the size class held by a stack.",
        );
        for u in &usage {
            for (owner, n) in &u.by_owner {
                let _ = writeln!(
                    t,
                    "xio_pool_buffers_held{{class=\"{}\",stack=\"{owner}\"}} {n}",
                    u.buf_size
                );
            }
        }
        head(
            &mut t,
            "xio_pool_quota",
            "gauge",
            "Most buffers of the size class one stack may have charged to it.",
        );
        for u in &usage {
            let _ = writeln!(t, "xio_pool_quota{{class=\"{}\"}} {}", u.buf_size, u.quota);
        }
        head(
            &mut t,
            "xio_pool_buffers_charged",
            "gauge",
            "Buffers of the size class charged to a stack (allocated by it and not yet freed by whoever holds them), against its quota.",
        );
        for u in &usage {
            for (who, n) in &u.by_charge {
                let _ = writeln!(
                    t,
                    "xio_pool_buffers_charged{{class=\"{}\",stack=\"{who}\"}} {n}",
                    u.buf_size
                );
            }
        }
        let gauges = [
            ("xio_stacks", "Registered stacks.", s.stacks.len() as u64),
            (
                "xio_stacks_max",
                "Stack slots.",
                u64::from(self.seg.max_stacks()),
            ),
            ("xio_channels", "Open channels.", s.channels.len() as u64),
            (
                "xio_channels_max",
                "Channel slots.",
                u64::from(self.seg.max_channels()),
            ),
            (
                "xio_unswept_stacks",
                "Dead stacks whose buffers are not back yet.",
                s.unswept as u64,
            ),
        ];
        for (name, help, v) in gauges {
            head(&mut t, name, "gauge", help);
            let _ = writeln!(t, "{name} {v}");
        }
        let counters = [
            ("xio_attaches_total", "Stacks registered.", s.attaches),
            (
                "xio_attaches_refused_total",
                "Connections refused or dropped before registering.",
                s.refused,
            ),
            (
                "xio_stack_deaths_total",
                "Stacks that died or left, once their buffers were back.",
                s.deaths,
            ),
            (
                "xio_reclaimed_buffers_total",
                "Buffers given back from stacks that died or left.",
                s.reclaimed,
            ),
            (
                "xio_orphan_buffers_total",
                "Buffers held in the name of no stack, given back.",
                s.orphans,
            ),
            (
                "xio_bad_messages_total",
                "Malformed or unexpected control messages.",
                s.bad_messages,
            ),
            (
                "xio_liveness_repairs_total",
                "Times the manager's liveness word was found forged and put back.",
                s.liveness_repairs,
            ),
            (
                "xio_gate_repairs_total",
                "Free-list gates found closed outside a sweep and reopened.",
                s.gate_repairs,
            ),
            (
                "xio_nudges_total",
                "Stacks woken because a ring held something for them for a whole look.",
                s.nudges,
            ),
        ];
        for (name, help, v) in counters {
            head(&mut t, name, "counter", help);
            let _ = writeln!(t, "{name} {v}");
        }
        // Per stack, from its slot: one table, one loop.
        type Read = fn(&crate::layout::StackSlot) -> u64;
        let per_stack: [(&str, &str, Read); 5] = [
            (
                "xio_stack_sleeps_total",
                "Times the stack slept on its doorbell.",
                |s| s.sleeps.load(Ordering::Relaxed),
            ),
            (
                "xio_stack_pool_empty_total",
                "Allocations the stack found its class empty for (each attempt of a waiting one).",
                |s| s.pool_empty.load(Ordering::Relaxed),
            ),
            (
                "xio_stack_quota_full_total",
                "Allocations refused because the stack was at its quota of the class (each attempt).",
                |s| s.quota_full.load(Ordering::Relaxed),
            ),
            (
                "xio_stack_ring_full_total",
                "Sends that found the ring to the peer full (each attempt).",
                |s| s.ring_full.load(Ordering::Relaxed),
            ),
            (
                "xio_stack_corrupt_descriptors_total",
                "Descriptors the stack refused.",
                |s| s.corrupt.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, read) in per_stack {
            head(&mut t, name, "counter", help);
            for st in &s.stacks {
                let _ = writeln!(
                    t,
                    "{name}{{stack=\"{}\",name=\"{}\"}} {}",
                    st.id,
                    label(&st.name),
                    read(self.seg.stack_slot(st.id))
                );
            }
        }
        t
    }
}

/// A label value as the text format wants it: backslash, double quote
/// and newline escaped (a stack names itself).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
