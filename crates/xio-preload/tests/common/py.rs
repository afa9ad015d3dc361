//! Python programs run by the tests: a manager per test, a script, and
//! each process's stdout read line by line.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;

use xio_core::manager::{Manager, ManagerHandle};

use super::{command, run_dir, WATCHDOG};

/// A manager and a Python script.
pub struct Setup {
    pub mgr: ManagerHandle,
    pub prefix: String,
    pub script: PathBuf,
}

impl Setup {
    /// A manager of its own and `script` written to a file.
    pub fn new(test: &str, script: &str) -> Setup {
        let dir = run_dir();
        let prefix = format!("pre-{test}-{}", std::process::id());
        let mgr = Manager::builder(&prefix).spawn().unwrap();
        let path = dir.join(format!("{test}.py"));
        std::fs::write(&path, script).unwrap();
        Setup {
            mgr,
            prefix,
            script: path,
        }
    }
}

impl Setup {
    /// Waits until a preloaded server's listener on `port` is bound on
    /// X-IO too. The library binds X-IO's side at the listener's first
    /// accept or poll, after the script has printed its port: a client
    /// started before that goes to the kernel, as it would with a real
    /// server that is not yet serving.
    pub fn wait_bound(&self, port: &str) {
        let port: u16 = port.parse().expect("a port number");
        super::wait_until("the server's X-IO listener", || {
            self.mgr
                .snapshot()
                .stacks
                .iter()
                .any(|st| st.addrs.iter().any(|a| a.port() == port))
        });
    }
}

/// A `python3` running the script, its stdout read line by line.
pub struct Py {
    pub child: Child,
    stdin: Option<ChildStdin>,
    pub lines: mpsc::Receiver<String>,
}

impl Py {
    pub fn spawn(s: &Setup, preload: bool, args: &[&str]) -> Py {
        Py::spawn_with(s, preload, &[], args)
    }

    /// [`Py::spawn`] with `env` set for it.
    pub fn spawn_with(s: &Setup, preload: bool, env: &[(&str, &str)], args: &[&str]) -> Py {
        let mut child = command(&s.prefix, "python3", preload)
            .arg(&s.script)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 (Debian's python3 package)");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Py {
            child,
            stdin,
            lines,
        }
    }

    /// The next line, which must start with `tag`; the rest of it.
    pub fn expect(&mut self, tag: &str) -> String {
        let l = self
            .lines
            .recv_timeout(WATCHDOG)
            .unwrap_or_else(|_| panic!("no {tag:?} line from python3"));
        l.strip_prefix(tag)
            .unwrap_or_else(|| panic!("wanted {tag:?}, got {l:?}"))
            .trim()
            .to_owned()
    }

    pub fn tell(&mut self) {
        let i = self.stdin.as_mut().unwrap();
        i.write_all(b"go\n").unwrap();
        i.flush().unwrap();
    }

    pub fn wait_ok(mut self) {
        let st = self.child.wait().unwrap();
        assert!(st.success(), "python3 exited with {st}");
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
