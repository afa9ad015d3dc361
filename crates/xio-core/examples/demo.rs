//! The end-to-end demonstration: an echo service and a client in
//! separate processes exchanging zero-copy messages (the X-IO manager runs
//! on a thread of the client's process), side by side with the same echo
//! over a Unix-domain socket.
//!
//! ```text
//! cargo run --release -p xio-core --example demo
//! ```
//! With two or more CPUs the client and the services are pinned to
//! different cores (the deployment X-IO is for); every payload is checked.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Stdio};
use std::time::Instant;

use xio_core::prelude::*;

#[path = "common/run_dir.rs"]
mod run_dir;

#[path = "common/child.rs"]
mod child;

const ROUNDS: usize = 100_000;
const SIZE: usize = 64;
/// Round trips run before the measured ones.
const WARMUP: usize = 10_000;

fn pin(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    let _ = rustix::thread::sched_setaffinity(None, &set);
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn serve_xio(prefix: &str, addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let mut stack = Stack::builder(prefix).name("demo-echo").attach()?;
    stack.bind(addr)?;
    println!("ready");
    loop {
        match stack.recv() {
            Ok(m) => {
                let from = m.from;
                stack.send(from, m.buf.into_mut())?; // same buffer back: zero-copy
            }
            Err(Error::Reset(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

fn serve_uds(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let l = UnixListener::bind(path)?;
    println!("ready");
    let (mut s, _) = l.accept()?;
    let mut buf = [0u8; SIZE];
    loop {
        if s.read_exact(&mut buf).is_err() {
            return Ok(());
        }
        s.write_all(&buf)?;
    }
}

fn spawn(args: &[&str]) -> Result<Child, Box<dyn std::error::Error>> {
    let mut c = child::command(args)?.stdout(Stdio::piped()).spawn()?;
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap()).read_line(&mut line)?;
    Ok(c)
}

fn percentiles(mut v: Vec<u64>) -> (f64, f64) {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    (at(0.5), at(0.99))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve-xio") => {
            child::die_with_parent()?;
            pin_to(&args[4]);
            return serve_xio(&args[2], args[3].parse()?);
        }
        Some("serve-uds") => {
            child::die_with_parent()?;
            pin_to(&args[3]);
            return serve_uds(&args[2]);
        }
        _ => {}
    }
    // Removed on the way out, however `main` returns.
    let dir = run_dir::RunDir::create("demo")?;
    let prefix = "demo";
    println!(
        "X-IO demo: {ROUNDS} round trips of {SIZE} B (after {WARMUP} unmeasured), client and \
         service in separate processes"
    );
    println!(
        "(a round trip: the client sends a message and waits for the service to send it\n \
         back; over X-IO the same pool buffer goes there and back, nothing is copied)"
    );
    // Client on CPU 0, services on CPU 1 ("-" when there is one CPU).
    let server_cpu = if cpus() >= 2 {
        println!("(client pinned to CPU 0, services to CPU 1)");
        pin(0);
        "1"
    } else {
        "-"
    };
    let manager = Manager::builder(prefix).spawn()?;

    // X-IO: zero-copy, adaptive waiting (the default).
    let addr: SocketAddr = "10.0.0.1:7".parse()?;
    let mut server = spawn(&["serve-xio", prefix, &addr.to_string(), server_cpu])?;
    let mut stack = Stack::builder(prefix).name("demo-client").attach()?;
    let peer = stack.connect(addr)?;
    let mut xio = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS + WARMUP {
        let t = Instant::now();
        let mut b = stack.alloc(SIZE)?;
        b[..8].copy_from_slice(&(i as u64).to_le_bytes());
        stack.send(peer, b)?;
        let m = stack.recv()?;
        let el = t.elapsed().as_nanos() as u64;
        assert_eq!(m.buf[..8], (i as u64).to_le_bytes(), "echo of round {i}");
        if i >= WARMUP {
            xio.push(el);
        }
    }
    let policy = stack.spin_policy().clone();
    drop(stack);
    server.wait()?;
    let status = xio_core::manager::query_status(prefix)?;

    // The same echo over a Unix-domain stream socket.
    let path = dir.join("uds.sock");
    let path = path.to_str().ok_or("path")?;
    let mut userver = spawn(&["serve-uds", path, server_cpu])?;
    let mut s = UnixStream::connect(path)?;
    let mut uds = Vec::with_capacity(ROUNDS);
    let mut buf = [0u8; SIZE];
    for i in 0..ROUNDS + WARMUP {
        let t = Instant::now();
        buf[..8].copy_from_slice(&(i as u64).to_le_bytes());
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        let el = t.elapsed().as_nanos() as u64;
        assert_eq!(buf[..8], (i as u64).to_le_bytes());
        if i >= WARMUP {
            uds.push(el);
        }
    }
    drop(s);
    userver.wait()?;

    let (x50, x99) = percentiles(xio);
    let (u50, u99) = percentiles(uds);
    println!();
    println!("| transport ({SIZE} B echo)          | p50 round trip | p99 round trip |");
    println!("|--------------------------------|---------------:|---------------:|");
    println!("| X-IO zero-copy (adaptive wait) | {x50:>11.2} us | {x99:>11.2} us |");
    println!("| Unix-domain stream socket      | {u50:>11.2} us | {u99:>11.2} us |");
    println!();
    println!(
        "X-IO is {:.1}x faster at the median; every echoed payload was checked.",
        u50 / x50
    );
    println!(
        "how the X-IO client waited for its replies (adaptive waiting): {} by watching \
         the ring\n on its core, {} asleep until woken (a wake-up costs {:.1} us on this machine)",
        policy.spin_hits,
        policy.sleeps,
        policy.wake_cost().as_secs_f64() * 1e6
    );
    println!();
    println!("manager status after the X-IO run (a stack is a process attached to the pool; every\n buffer is back in it):");
    print!("{status}");
    manager.stop();
    Ok(())
}

fn pin_to(cpu: &str) {
    if let Ok(c) = cpu.parse() {
        pin(c);
    }
}
