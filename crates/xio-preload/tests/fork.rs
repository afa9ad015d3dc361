//! `fork` under the preload library: Python's forking servers, a moved
//! stream used by parent and child in turn, and a child that execs a
//! program with the connection as its stdio (nginx's master and workers
//! are in nginx.rs).

mod common;

use common::py::{Py, Setup};
use common::wait_until;

/// A `socketserver.ForkingTCPServer` echo server: the parent accepts
/// (over X-IO), forks a child per connection and closes its copy; the
/// child serves it. Then a stream used by both: the child writes first,
/// the parent after the child is gone.
const SCRIPT: &str = r#"
import os, socket, socketserver, sys
role = sys.argv[1]
def listen():
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(4)
    print("PORT", l.getsockname()[1], os.getpid(), flush=True)
    return l
if role == "forking":
    class H(socketserver.StreamRequestHandler):
        def handle(self):
            for line in self.rfile:
                self.wfile.write(("%d " % os.getpid()).encode() + line)
    s = socketserver.ForkingTCPServer(("127.0.0.1", 0), H)
    print("PORT", s.server_address[1], os.getpid(), flush=True)
    s.serve_forever()
elif role == "shared":
    l = listen()
    c, _ = l.accept()
    c.sendall(b"before the fork\n")
    pid = os.fork()
    if pid == 0:
        c.sendall(b"from the child\n")
        got = c.recv(100)
        c.sendall(b"child read " + got)
        os._exit(0)
    os.waitpid(pid, 0)
    c.sendall(b"from the parent\n")
    c.close()
    print("DONE", flush=True)
elif role == "cgi":
    # Fork and exec, as a CGI server does: the child's stdin and stdout
    # are the connection, and the program it runs (cat) knows nothing.
    l = listen()
    c, _ = l.accept()
    pid = os.fork()
    if pid == 0:
        os.dup2(c.fileno(), 0)
        os.dup2(c.fileno(), 1)
        os.execvp("cat", ["cat"])
    c.close()
    os.waitpid(pid, 0)
    print("DONE", flush=True)
elif role == "nonblock":
    # An inheritable non-blocking stream is handed over at the fork: it
    # stays non-blocking for the program.
    import fcntl
    l = listen()
    c, _ = l.accept()
    c.setblocking(False)
    os.set_inheritable(c.fileno(), True)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    fl = fcntl.fcntl(c.fileno(), fcntl.F_GETFL)
    print("NONBLOCK", fl & os.O_NONBLOCK != 0, flush=True)
    c.sendall(b"after the fork\n")
    c.close()
    print("DONE", flush=True)
else:
    port = int(sys.argv[2])
    if role == "echo":
        s = socket.create_connection(("127.0.0.1", port))
        data = os.urandom(200000)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
        print("ECHOED", len(got), got == data, flush=True)
    elif role == "lines":
        pids = set()
        for i in range(int(sys.argv[3])):
            s = socket.create_connection(("127.0.0.1", port))
            f = s.makefile("rwb")
            for j in range(50):
                msg = b"x" * (j * 37 % 3000) + b"%d.%d\n" % (i, j)
                f.write(msg)
                f.flush()
                pid, echo = f.readline().split(b" ", 1)
                assert echo == msg, (echo[-20:], msg[-20:])
                pids.add(pid)
            s.close()
        print("ECHOED", len(pids), flush=True)
    else:
        s = socket.create_connection(("127.0.0.1", port))
        f = s.makefile("rwb")
        print("LINE", f.readline().decode().strip(), flush=True)
        print("LINE", f.readline().decode().strip(), flush=True)
        f.write(b"ping\n")
        f.flush()
        print("LINE", f.readline().decode().strip(), flush=True)
        print("LINE", f.readline().decode().strip(), flush=True)
        print("EOF", f.read() == b"", flush=True)
    sys.stdin.readline()
"#;

/// The preloaded server of `role`, and the port it listens on.
fn serve(s: &Setup, role: &str) -> (Py, String) {
    let mut server = Py::spawn(s, true, &[role]);
    let port_pid = server.expect("PORT");
    let (port, _) = port_pid.split_once(' ').unwrap();
    let port = port.to_owned();
    s.wait_bound(&port);
    (server, port)
}

/// Each connection to a preloaded `ForkingTCPServer` goes over X-IO (the
/// manager shows the channel), its forked child serves it through the
/// parent's relay, and every echo comes back intact; when all are done,
/// the pool is whole.
#[test]
fn a_forking_python_server_serves_each_connection_from_its_child() {
    let s = Setup::new("forking", SCRIPT);
    let (server, port) = serve(&s, "forking");
    let port = port.as_str();
    let mut client = Py::spawn(&s, true, &["lines", port, "8"]);
    // Eight connections, each served by its own child.
    assert_eq!(client.expect("ECHOED"), "8");
    let snap = s.mgr.snapshot();
    assert_eq!(
        snap.channels.len(),
        1,
        "client to server over X-IO: {snap:?}"
    );
    client.tell();
    client.wait_ok();
    drop(server);
    wait_until("the pool whole", || s.mgr.pool_is_whole());
}

/// A moved stream open at a fork is shared as a kernel socket is: the
/// child writes and reads it, exits, and the parent writes after it, in
/// that order; the parent's close is the peer's end of stream.
#[test]
fn a_stream_open_at_a_fork_is_shared_by_parent_and_child() {
    let s = Setup::new("shared", SCRIPT);
    let (mut server, port) = serve(&s, "shared");
    let port = port.as_str();
    let mut client = Py::spawn(&s, true, &["pair", port]);
    assert_eq!(client.expect("LINE"), "before the fork");
    assert_eq!(client.expect("LINE"), "from the child");
    assert_eq!(client.expect("LINE"), "child read ping");
    assert_eq!(client.expect("LINE"), "from the parent");
    assert_eq!(client.expect("EOF"), "True");
    assert_eq!(s.mgr.snapshot().channels.len(), 1, "over X-IO");
    server.expect("DONE");
    client.tell();
    client.wait_ok();
    server.wait_ok();
    wait_until("the pool whole", || s.mgr.pool_is_whole());
}

/// A connection handed to a program that knows nothing of X-IO: the
/// server forks and execs `cat` with the connection as its stdin and
/// stdout (CGI's way); 200 kB come back intact and `cat`'s exit ends the
/// stream.
#[test]
fn a_fork_and_exec_child_serves_a_moved_connection_as_its_stdio() {
    let s = Setup::new("cgi", SCRIPT);
    let (mut server, port) = serve(&s, "cgi");
    let port = port.as_str();
    let mut client = Py::spawn(&s, true, &["echo", port]);
    assert_eq!(client.expect("ECHOED"), "200000 True");
    assert_eq!(s.mgr.snapshot().channels.len(), 1, "over X-IO");
    server.expect("DONE");
    client.tell();
    client.wait_ok();
    server.wait_ok();
    wait_until("the pool whole", || s.mgr.pool_is_whole());
}

/// A non-blocking stream handed to the kernel path at a fork (it is
/// inheritable) stays non-blocking: an event loop's fd must not start
/// blocking because its process forked.
#[test]
fn a_stream_handed_over_at_a_fork_keeps_its_flags() {
    let s = Setup::new("nonblock", SCRIPT);
    let (mut server, port) = serve(&s, "nonblock");
    let mut client = Py::spawn(&s, true, &["pair", port.as_str()]);
    assert_eq!(server.expect("NONBLOCK"), "True");
    assert_eq!(client.expect("LINE"), "after the fork");
    server.expect("DONE");
    drop(client);
    server.wait_ok();
}
