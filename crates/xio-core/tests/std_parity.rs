//! Differential tests: the same scenario run against `std::net` over
//! loopback TCP and against X-IO's [`XioListener`] / [`XioStream`] (an
//! embedded manager, a server net and a client net), comparing what a
//! program sees: byte counts, data and `io::ErrorKind`s. The socket layer
//! promises that code written against std ports by changing the type
//! names; where X-IO differs on purpose (documented on the type), the
//! difference is listed in [`KNOWN`], which pins both sides.
//!
//! The scenarios are written once, against [`Family`] / [`Lst`] /
//! [`Strm`], whose methods are std's own names: the two implementations
//! are the same macro expanded for each type.

mod common;
#[path = "common/parity.rs"]
mod parity;
#[macro_use]
#[path = "common/std_scenarios.rs"]
mod std_scenarios;

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use common::*;
use std_scenarios::*;
use xio_core::manager::ManagerHandle;
use xio_core::net::{Net, XioListener, XioStream};

same_api!(XioListener, XioStream);

/// X-IO: listeners on one net, connects from another, each net kept
/// driven by a thread waiting in an `accept` (ended by a connect to it).
struct Xio {
    _mgr: ManagerHandle,
    server: Net,
    client: Net,
    /// A net of the pool with strict addresses.
    strict: Net,
    /// Each driver's address, the net to connect to it from, its thread.
    drivers: Vec<(SocketAddr, Net, std::thread::JoinHandle<()>)>,
}

impl Xio {
    fn start(test: &str) -> Xio {
        setup();
        let p = prefix(test);
        let mgr = manager_builder(&p).spawn().unwrap();
        let server = Net::attach(&p).unwrap();
        let client = Net::attach(&p).unwrap();
        let strict = Net::builder(&p).strict_addresses(true).attach().unwrap();
        let mut drivers = Vec::new();
        for (a, net, other) in [
            ("10.250.0.1:9", &server, &client),
            ("10.250.0.2:9", &client, &server),
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let l = net.listen(a).unwrap();
            let t = std::thread::spawn(move || drop(l.accept().unwrap()));
            drivers.push((a, other.clone(), t));
        }
        Xio {
            _mgr: mgr,
            server,
            client,
            strict,
            drivers,
        }
    }
}

impl Drop for Xio {
    fn drop(&mut self) {
        for (a, other, t) in self.drivers.drain(..) {
            // A connect from the other net: the accept returns.
            let s = other.connect(a);
            let _ = t.join();
            drop(s);
        }
    }
}

impl Family for Xio {
    type L = XioListener;
    fn bind(&self, a: SocketAddr) -> io::Result<XioListener> {
        self.server.listen(a)
    }
    fn connect(&self, a: SocketAddr) -> io::Result<XioStream> {
        self.client.connect(a)
    }
    fn connect_timeout(&self, a: SocketAddr, t: Duration) -> io::Result<XioStream> {
        self.client.connect_timeout(&a, t)
    }
    fn bind_any(&self, a: &[SocketAddr]) -> io::Result<XioListener> {
        self.server.listen(a)
    }
    fn bind_strict(&self, a: SocketAddr) -> io::Result<XioListener> {
        self.strict.listen(a)
    }
    fn connect_any(&self, a: &[SocketAddr]) -> io::Result<XioStream> {
        self.client.connect(a)
    }
    /// The kernel answers a loopback peer within the sending call; here
    /// each net's driver thread takes in what came, and a loaded machine
    /// can keep it off the CPU past a moment's sleep. So also wait until
    /// both nets' rings are empty on two looks in a row (a reset answers
    /// a write: two hops).
    fn settle(&self) {
        std::thread::sleep(Duration::from_millis(50));
        let deadline = std::time::Instant::now() + WATCHDOG;
        let mut quiet = 0;
        while quiet < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the drivers never took in what came"
            );
            if self.client.has_input() || self.server.has_input() {
                quiet = 0;
            } else {
                quiet += 1;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A difference from std that X-IO makes on purpose (documented where
/// named): in scenario `scenario`, step `step` gives `std` over TCP and
/// `xio` here.
struct Known {
    scenario: &'static str,
    step: &'static str,
    std: &'static str,
    xio: &'static str,
}

const KNOWN: &[Known] = &[
    // `XioStream::local_addr`: X-IO clients do not bind; a connecting
    // stream's address is made from its process's stack id.
    Known {
        scenario: "addresses",
        step: "client's ip is the listener's",
        std: "true",
        xio: "false",
    },
    // `XioListener` docs: X-IO addresses are names, not routes, so any
    // address can be bound (std's bind wants one of the host's) unless
    // the net is strict (`strict_addresses`, the scenario of that name).
    Known {
        scenario: "several_addresses_and_after_shutdown",
        step: "bind an address of no interface",
        std: "Err(AddrNotAvailable)",
        xio: "Ok(())",
    },
    // `XioStream` docs: a read into an empty buffer is `Ok(0)` at once
    // (Linux's waits for data or the timeout, or says `EAGAIN`).
    Known {
        scenario: "empty_reads_and_writes",
        step: "nonblocking empty read, nothing queued",
        std: "Err(WouldBlock)",
        xio: "Ok(0)",
    },
    // `Net::connect` docs: a connect over a route the net knows returns
    // before the listener answers; a refusal is the first read's.
    Known {
        scenario: "listener_dropped_with_unaccepted",
        step: "connect again",
        std: "Err(ConnectionRefused)",
        xio: "Ok(())",
    },
];

/// Runs `scenario` in both worlds and compares the logs, step by step.
fn differential<A, B>(name: &'static str, v6: bool, scenario: A, xio_scenario: B)
where
    A: FnOnce(&Std, &mut Log),
    B: FnOnce(&Xio, &mut Log),
{
    // A host without IPv6 loopback (a container started with it off) has
    // no std side to compare with: say so rather than fail.
    if v6 && std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("{name}: skipped over IPv6: ::1 cannot be bound here");
        return;
    }
    V6.set(v6);
    let mut want = Log::default();
    scenario(&Std, &mut want);
    let x = Xio::start(&format!("{name}{}", if v6 { "6" } else { "" }));
    let mut got = Log::default();
    xio_scenario(&x, &mut got);
    drop(x);
    parity::judge(name, "std", &want.0, &got.0, |n, step| {
        KNOWN
            .iter()
            .find(|k| k.scenario == n && k.step == step)
            .map(|k| (k.std, k.xio))
    });
}

/// One test per scenario and address family: the scenario's generic
/// function, run in both worlds.
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        mod v4 {
            use super::*;
            $(
                #[test]
                fn $name() {
                    differential(stringify!($name), false, scenario::$name::<Std>, scenario::$name::<Xio>);
                }
            )*
        }
        mod v6 {
            use super::*;
            $(
                #[test]
                fn $name() {
                    differential(stringify!($name), true, scenario::$name::<Std>, scenario::$name::<Xio>);
                }
            )*
        }
    };
}

with_scenarios!(scenarios);
