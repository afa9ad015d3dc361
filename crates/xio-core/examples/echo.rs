//! An L2-forwarder-style echo service over the zero-copy interface.
//!
//! The service receives a frame, swaps its destination and source MAC
//! addresses *in place* (the received buffer becomes writable again without
//! a new allocation) and sends the same buffer back: DPDK's l2fwd pattern.
//!
//! ```text
//! cargo run --release -p xio-core --example echo               # self-contained run
//! cargo run --release -p xio-core --example echo -- serve PREFIX ADDR  # just the service
//! ```
//! Without arguments it starts an embedded manager, the service as a child
//! process, and a client that sends 100,000 frames and checks every echo.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Instant;

use xio_core::prelude::*;

#[path = "common/run_dir.rs"]
mod run_dir;

#[path = "common/child.rs"]
mod child;

fn serve(prefix: &str, addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let mut stack = Stack::builder(prefix).name("l2fwd-echo").attach()?;
    stack.bind(addr)?;
    println!("ready");
    loop {
        let msg = match stack.recv() {
            Ok(m) => m,
            Err(Error::Reset(peer)) => {
                eprintln!("echo: peer {peer:?} left");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let from = msg.from;
        let mut frame = msg.buf.into_mut(); // same buffer, writable again
        if frame.len() >= 12 {
            let (dst, rest) = frame.split_at_mut(6);
            dst.swap_with_slice(&mut rest[..6]);
        }
        if let Err(e) = stack.send(from, frame) {
            eprintln!("echo: {e}");
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        let prefix = args.get(2).ok_or("usage: echo serve PREFIX ADDR")?;
        let addr = args
            .get(3)
            .ok_or("usage: echo serve PREFIX ADDR")?
            .parse()?;
        child::die_with_parent()?;
        return serve(prefix, addr);
    }

    // Removed on the way out, however `main` returns.
    let _dir = run_dir::RunDir::create("echo")?;
    let prefix = format!("echo-{}", std::process::id());
    let manager = Manager::builder(&prefix).spawn()?;
    let addr: SocketAddr = "10.0.0.1:9".parse()?;

    let mut child = child::command(&["serve", &prefix, &addr.to_string()])?
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )?;

    let mut stack = Stack::builder(&prefix).name("l2fwd-client").attach()?;
    let peer = stack.connect(addr)?;
    let dst = [0x02, 0, 0, 0, 0, 0xdd];
    let src = [0x02, 0, 0, 0, 0, 0x55];
    let n = 100_000u32;
    let t = Instant::now();
    for i in 0..n {
        let mut f = stack.alloc(64 + (i as usize % 1400))?;
        f[..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f[12..16].copy_from_slice(&i.to_le_bytes());
        stack.send(peer, f)?;
        let back = stack.recv()?.buf;
        assert_eq!(&back[..6], &src, "MACs swapped");
        assert_eq!(&back[6..12], &dst);
        assert_eq!(&back[12..16], &i.to_le_bytes());
    }
    let el = t.elapsed();
    println!(
        "{n} frames forwarded and checked in {:.1} ms: {:.2} us per round trip (mean)",
        el.as_secs_f64() * 1e3,
        el.as_secs_f64() * 1e6 / n as f64
    );
    child.kill()?;
    child.wait()?;
    drop(stack);
    print!("{}", xio_core::manager::query_status(&prefix)?);
    manager.stop();
    Ok(())
}
