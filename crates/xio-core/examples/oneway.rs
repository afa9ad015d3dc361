//! A one-way (asynchronous) sender: the paper's DAG-style communication,
//! where the producer never waits for an answer.
//!
//! ```text
//! cargo run --release -p xio-core --example oneway
//! ```
//! Starts an embedded manager and a receiving child process, then streams
//! 2 million 64-byte messages in bursts of 32 with the burst APIs
//! (`send_burst_with` / `recv_burst_with`). The receiver checks the
//! sequence numbers and reports the rate. A full ring makes the sender wait:
//! nothing is ever dropped.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Instant;

use xio_core::prelude::*;

#[path = "common/run_dir.rs"]
mod run_dir;

#[path = "common/child.rs"]
mod child;

const N: u64 = 2_000_000;

fn receive(prefix: &str, addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let mut stack = Stack::builder(prefix).name("oneway-sink").attach()?;
    stack.bind(addr)?;
    println!("ready");
    let mut next = 0u64;
    let mut t = None;
    while next < N {
        // The burst path: each payload is shown by reference and the
        // buffers go back to the pool together.
        stack.recv_burst_with(64, |_, _, payload| {
            let seq = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
            assert_eq!(seq, next, "in order, nothing lost");
            next += 1;
        })?;
        t.get_or_insert_with(Instant::now);
    }
    let el = t.map(|t| t.elapsed()).unwrap_or_default();
    println!(
        "received {N} messages in order in {:.1} ms: {:.1} M messages/s",
        el.as_secs_f64() * 1e3,
        N as f64 / el.as_secs_f64() / 1e6
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("receive") {
        child::die_with_parent()?;
        return receive(&args[2], args[3].parse()?);
    }
    // Removed on the way out, however `main` returns.
    let _dir = run_dir::RunDir::create("oneway")?;
    let prefix = format!("oneway-{}", std::process::id());
    let manager = Manager::builder(&prefix).spawn()?;
    let addr: SocketAddr = "10.0.0.2:9".parse()?;
    let mut child = child::command(&["receive", &prefix, &addr.to_string()])?
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line)?;

    let mut stack = Stack::builder(&prefix).name("oneway-source").attach()?;
    let peer = stack.connect(addr)?;
    let t = Instant::now();
    // The burst path: each payload is written straight into its pool
    // buffer, 32 at a time.
    let mut seq = 0u64;
    while seq < N {
        let n = 32.min(N - seq) as usize;
        stack.send_burst_with(peer, n, 64, |i, payload| {
            payload[..8].copy_from_slice(&(seq + i as u64).to_le_bytes());
        })?;
        seq += n as u64;
    }
    println!(
        "sent {N} messages in {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line)?;
    print!("{line}");
    child.wait()?;
    drop(stack);
    manager.stop();
    Ok(())
}
