//! The other shared-memory libraries, run in the same process pairs,
//! pinning and rounds as X-IO's rows.
//!
//! iceoryx2 (Eclipse, publish-subscribe over shared memory): two services
//! per pair, `<endpoint>/ping` and `<endpoint>/pong`, each carrying `[u8]`
//! slices of the message size; both sides busy-poll `receive`, as
//! iceoryx2's own publish-subscribe benchmark does. A message is loaned,
//! its first and last byte written, and sent (what X-IO's zero-copy round
//! trip does); the echo loans a sample on the other service (a received
//! sample is read-only and belongs to its service, so it cannot be sent
//! back as X-IO's echo sends its buffer), writes the first byte plus one,
//! and sends it. Loans are zero-filled (`loan_slice`): iceoryx2's
//! benchmark sends uninitialised memory, which safe Rust cannot. The echo
//! loans its reply before the request comes; the client's loan (and its
//! fill: a line at 64 B, 64 lines at 4 KiB) is inside the timed round
//! trip, as X-IO's allocation is. A sample of length 0 ends the session.

use std::io::Write;
use std::time::Instant;

use anyhow::{anyhow, ensure, Context, Result};
use iceoryx2::prelude::*;

/// Largest message iceoryx2 is measured at: its loans are zero-filled
/// (see the module docs), which at 64 KiB and up would measure the fill.
pub const ICEORYX2_MAX: usize = 4096;

/// Empty polls between checks that the parent (or the server's reply)
/// still comes.
const PARENT_CHECK_MASK: u32 = (1 << 20) - 1;
/// How long the client waits for one reply before it gives up.
const REPLY_WATCHDOG: std::time::Duration = std::time::Duration::from_secs(30);

type PubSub =
    iceoryx2::service::port_factory::publish_subscribe::PortFactory<ipc::Service, [u8], ()>;

fn services(endpoint: &str) -> Result<(Node<ipc::Service>, PubSub, PubSub)> {
    set_log_level(LogLevel::Error);
    let node = NodeBuilder::new()
        .create::<ipc::Service>()
        .map_err(|e| anyhow!("iceoryx2 node: {e:?}"))?;
    let open = |dir: &str| -> Result<PubSub> {
        let name = ServiceName::new(&format!("{endpoint}/{dir}"))
            .map_err(|e| anyhow!("iceoryx2 service name: {e:?}"))?;
        node.service_builder(&name)
            .publish_subscribe::<[u8]>()
            .max_publishers(1)
            .max_subscribers(1)
            .history_size(0)
            .subscriber_max_buffer_size(1)
            .enable_safe_overflow(true)
            .open_or_create()
            .map_err(|e| anyhow!("iceoryx2 service {dir}: {e:?}"))
    };
    let ping = open("ping")?;
    let pong = open("pong")?;
    Ok((node, ping, pong))
}

type Sub = iceoryx2::port::subscriber::Subscriber<ipc::Service, [u8], ()>;
type Pub = iceoryx2::port::publisher::Publisher<ipc::Service, [u8], ()>;

/// A subscriber on `rx` and a publisher of `size`-byte slices on `tx`.
fn ports(rx: &PubSub, tx: &PubSub, size: usize) -> Result<(Sub, Pub)> {
    let sub = rx
        .subscriber_builder()
        .create()
        .map_err(|e| anyhow!("iceoryx2 subscriber: {e:?}"))?;
    let publ = tx
        .publisher_builder()
        .initial_max_slice_len(size)
        .create()
        .map_err(|e| anyhow!("iceoryx2 publisher: {e:?}"))?;
    Ok((sub, publ))
}

/// Runs in the child: echoes until a sample of length 0 (or the parent's
/// end). Prints `READY` once its subscriber and publisher exist.
pub fn serve_iceoryx2(endpoint: &str, size: usize) -> Result<()> {
    let (_node, ping, pong) = services(endpoint)?;
    let (sub, publ) = ports(&ping, &pong, size)?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "READY")?;
        out.flush()?;
    }
    let parent = rustix::process::getppid();
    let mut empty = 0u32;
    // The reply is loaned before the request comes, as iceoryx2's own
    // benchmark does (X-IO's echo sends back the buffer it received, with
    // no allocation either).
    let loan = || publ.loan_slice(size).map_err(|e| anyhow!("loan: {e:?}"));
    let mut next = Some(loan()?);
    loop {
        let Some(m) = sub.receive().map_err(|e| anyhow!("receive: {e:?}"))? else {
            empty = empty.wrapping_add(1);
            if empty & PARENT_CHECK_MASK == 0 && rustix::process::getppid() != parent {
                anyhow::bail!("parent process exited");
            }
            std::hint::spin_loop();
            continue;
        };
        if m.payload().is_empty() {
            return Ok(());
        }
        let v = m.payload()[0];
        drop(m);
        let mut r = next.take().expect("loaned after each send");
        r.payload_mut()[0] = v.wrapping_add(1);
        r.send().map_err(|e| anyhow!("send: {e:?}"))?;
        next = Some(loan()?);
    }
}

/// Runs in the parent, once the server said `READY`: one checked round
/// trip, `warmup` more, then `iters` timed ones; ends the session.
pub fn ping_iceoryx2(endpoint: &str, size: usize, warmup: usize, iters: usize) -> Result<Vec<u64>> {
    let (_node, ping, pong) = services(endpoint)?;
    let (sub, publ) = ports(&pong, &ping, size)?;
    // Samples sent before the other side subscribes are dropped
    // (history 0): wait for both subscribers.
    let t0 = Instant::now();
    while ping.dynamic_config().number_of_subscribers() < 1
        || pong.dynamic_config().number_of_publishers() < 1
    {
        ensure!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "the iceoryx2 server never subscribed"
        );
        std::hint::spin_loop();
    }
    let round_trip = |v: u8| -> Result<()> {
        let mut m = publ.loan_slice(size).map_err(|e| anyhow!("loan: {e:?}"))?;
        m.payload_mut()[0] = v;
        m.payload_mut()[size - 1] = v;
        m.send().map_err(|e| anyhow!("send: {e:?}"))?;
        let sent = Instant::now();
        let mut spins = 0u32;
        let r = loop {
            if let Some(r) = sub.receive().map_err(|e| anyhow!("receive: {e:?}"))? {
                break r;
            }
            // A watchdog, not a bound: a server that died never answers.
            spins = spins.wrapping_add(1);
            ensure!(
                spins & PARENT_CHECK_MASK != 0 || sent.elapsed() < REPLY_WATCHDOG,
                "no reply from the iceoryx2 server in {REPLY_WATCHDOG:?}"
            );
            std::hint::spin_loop();
        };
        ensure!(
            r.payload().first() == Some(&v.wrapping_add(1)),
            "bad echo: first byte {:?}, expected {}",
            r.payload().first(),
            v.wrapping_add(1)
        );
        Ok(())
    };
    let res = (|| {
        round_trip(0x5a).context("the checked round trip")?;
        for i in 0..warmup {
            round_trip(i as u8)?;
        }
        let mut samples = Vec::with_capacity(iters);
        for i in 0..iters {
            let t = Instant::now();
            round_trip(i as u8)?;
            samples.push(t.elapsed().as_nanos() as u64);
        }
        Ok(samples)
    })();
    // The end of the session, whatever happened.
    if let Ok(m) = publ.loan_slice(0) {
        let _ = m.send();
    }
    res
}

// ---------------------------------------------------------------------------
// CloudWeGo shmipc (shmipc-rs): streams over shared memory, under tokio.
// ---------------------------------------------------------------------------

/// A shmipc configuration: its default wake-up (a message on the Unix
/// socket), or eventfd (protocol V4, no fallback: a failed negotiation is
/// an error, not a silent measurement of the default). Slices sized for
/// 64 B messages, as shmipc's own benchmarks do.
fn shmipc_config(eventfd: bool, tag: &str) -> shmipc::config::Config {
    use shmipc::config::{Config, ProtocolMode, SizePercentPair};
    let mut c = if eventfd {
        Config::default().with_v4_eventfd()
    } else {
        Config::default()
    };
    if eventfd {
        c.protocol.mode = ProtocolMode::V4 { fallback: false };
    }
    c.queue_cap = 65536;
    c.buffer_slice_sizes = vec![
        SizePercentPair {
            size: 64 + 256,
            percent: 70,
        },
        SizePercentPair {
            size: (16 << 10) + 256,
            percent: 20,
        },
        SizePercentPair {
            size: (64 << 10) + 256,
            percent: 10,
        },
    ];
    c.share_memory_path_prefix = format!("/dev/shm/xio-bench-shmipc-{tag}");
    c
}

fn shmipc_err(e: shmipc::Error) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// The server side of `xio-bench tokio` for shmipc: echoes `msg`-byte
/// messages on `conns` streams until each ends. Inside a tokio runtime.
pub async fn shmipc_serve(path: &str, conns: usize, msg: usize) -> Result<()> {
    use shmipc::buffer::BufferReader;
    let addr = std::os::unix::net::SocketAddr::from_pathname(path)?;
    let mut l = shmipc::Listener::new(
        shmipc::transport::DefaultUnixListen,
        addr,
        shmipc_config(false, &format!("srv-{}", std::process::id())),
    )
    .await?;
    let mut tasks = Vec::with_capacity(conns);
    for _ in 0..conns {
        let mut s = l.accept().await?;
        tasks.push(tokio::spawn(async move {
            let mut buf = vec![0u8; msg];
            loop {
                match s.read_exact_bytes(msg).await {
                    Ok(req) => buf.copy_from_slice(&req),
                    Err(shmipc::Error::StreamClosed | shmipc::Error::EndOfStream) => break,
                    Err(e) => return Err(shmipc_err(e)),
                }
                s.recv_buf().release_previous_read();
                s.write_bytes(&buf).map_err(shmipc_err)?;
                s.flush(false).await.map_err(shmipc_err)?;
            }
            let _ = s.close().await;
            Ok::<_, std::io::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    l.close().await;
    Ok(())
}

/// The client side: `conns` streams of one session, each a task doing
/// `msg`-byte request-response from `start + warm` to `start + warm +
/// measure`; the latencies measured, per stream.
pub async fn shmipc_client(
    path: &str,
    conns: usize,
    msg: usize,
    eventfd: bool,
    warm: std::time::Duration,
    measure: std::time::Duration,
) -> Result<Vec<Vec<u64>>> {
    use shmipc::session::{SessionManager, SessionManagerConfig};
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let tag = format!(
        "cli-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let cfg = SessionManagerConfig::new()
        .with_config(shmipc_config(eventfd, &tag))
        .with_session_num(1);
    // The server may not listen yet.
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    let sm = loop {
        let addr = std::os::unix::net::SocketAddr::from_pathname(path)?;
        match SessionManager::new(cfg.clone(), shmipc::transport::DefaultUnixConnect, addr).await {
            Ok(sm) => break sm,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await
            }
            Err(e) => return Err(anyhow!("shmipc session: {e}")),
        }
    };
    let start = Instant::now();
    let from = start + warm;
    let to = from + measure;
    let mut tasks = Vec::with_capacity(conns);
    for i in 0..conns {
        let mut s = sm.get_stream().map_err(|e| anyhow!("shmipc stream: {e}"))?;
        tasks.push(tokio::spawn(async move {
            let mut tx = vec![0u8; msg];
            tx[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let mut lat = Vec::new();
            loop {
                let t0 = Instant::now();
                if t0 >= to {
                    break;
                }
                s.write_bytes(&tx).map_err(shmipc_err)?;
                s.flush(false).await.map_err(shmipc_err)?;
                {
                    let rx = s.read_exact_bytes(msg).await.map_err(shmipc_err)?;
                    if rx[..] != tx[..] {
                        return Err(std::io::Error::other("wrong echo"));
                    }
                }
                s.release_read_and_reuse();
                if t0 >= from {
                    lat.push(t0.elapsed().as_nanos() as u64);
                }
            }
            let _ = s.close().await;
            Ok::<_, std::io::Error>(lat)
        }));
    }
    let mut out = Vec::with_capacity(conns);
    for t in tasks {
        out.push(t.await??);
    }
    sm.close().await;
    Ok(out)
}
