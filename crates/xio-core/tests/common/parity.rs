//! The judging half of the differential tests (`std_parity` against std's
//! TCP, xio-tokio's `tokio_parity` against tokio's): a scenario's steps
//! as the kernel's sockets said them and as X-IO said them, compared step
//! by step, where a known difference must be exactly the one pinned.
//!
//! Shared with xio-tokio's tests by `#[path]`.

/// Compares the steps of scenario `name`: `want` from the kernel's
/// sockets (`theirs` names them in messages: "std", "tcp"), `got` from
/// X-IO. `known(name, step)` gives the pinned pair (theirs, X-IO's) of a
/// step known to differ. Panics on other steps, a difference not pinned,
/// or a pinned one that changed.
pub fn judge(
    name: &str,
    theirs: &str,
    want: &[(&'static str, String)],
    got: &[(&'static str, String)],
    known: impl Fn(&str, &str) -> Option<(&'static str, &'static str)>,
) {
    // (Shown with --nocapture: what both said, step by step.)
    for ((step, s), (_, x)) in want.iter().zip(got) {
        eprintln!("{name}: {step}: {theirs} {s}, xio {x}");
    }
    let steps = |l: &[(&'static str, String)]| l.iter().map(|(s, _)| *s).collect::<Vec<_>>();
    assert_eq!(steps(want), steps(got), "{name}: the same steps");
    let mut diffs = Vec::new();
    for ((step, s), (_, x)) in want.iter().zip(got) {
        match known(name, step) {
            Some(pinned) => assert_eq!(
                (s.as_str(), x.as_str()),
                pinned,
                "{name}/{step}: as KNOWN pins it"
            ),
            None if s != x => diffs.push(format!("  {step}: {theirs} {s}, xio {x}")),
            None => {}
        }
    }
    assert!(
        diffs.is_empty(),
        "{name}: X-IO differs from {theirs}:\n{}",
        diffs.join("\n")
    );
}
