//! Security domains across real users: the `xio-manager` binary run as
//! one user with `--allow-gid` of a group; a member of the group (another
//! user) serves, the manager's own user talks to it; a user outside the
//! group is refused with an error naming the rule, cannot reach the
//! pool's memory through `/proc`, and runs a pool of its own that the
//! others cannot join. The users and the group are made here (`useradd`,
//! `groupadd`); the test needs root, which CI is.
//!
//! No test harness: the binary is both the test (as root) and the
//! processes it starts as the other users (`runuser -u USER -- <this
//! binary> <role> ...`), one role per run.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_xio-manager");
const GROUP: &str = "xiot-team";
/// Runs the manager; its own user is in its domain.
const OWNER: &str = "xiot-owner";
/// In `GROUP` (a supplementary group): admitted by `--allow-gid`.
const MEMBER: &str = "xiot-member";
/// In no allowed group: refused.
const OUTSIDER: &str = "xiot-outsider";
const ADDR: &str = "10.9.8.7:4000";
const WATCHDOG: Duration = Duration::from_secs(60);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("attach") => role_attach(),
        Some("serve") => role_serve(),
        Some("client") => role_client(),
        Some("proc-fds") => role_proc_fds(&args[2]),
        _ => test(),
    }
}

/// Attaches a stack to `$XIO_PREFIX` and prints the outcome.
fn role_attach() {
    match xio_core::stack::Stack::attach(&xio_core::paths::default_prefix()) {
        Ok(_) => println!("attached"),
        Err(e) => {
            let io: std::io::Error = e.into();
            println!("refused kind={:?}: {io}", io.kind());
        }
    }
}

/// Serves one echo connection on `ADDR`.
fn role_serve() {
    let l = xio_core::net::XioListener::bind(ADDR).expect("bind");
    println!("listening");
    std::io::stdout().flush().unwrap();
    let (mut s, _) = l.accept().expect("accept");
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).expect("read");
    s.write_all(&buf[..n]).expect("write");
    // Until the client has read it and closed.
    let _ = s.read(&mut buf);
}

/// Talks to the echo service on `ADDR`.
fn role_client() {
    let mut s = xio_core::net::XioStream::connect(ADDR).expect("connect");
    let msg = b"hello across users";
    s.write_all(msg).expect("write");
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).expect("read");
    assert_eq!(&back, msg);
    println!("echoed");
}

/// Tries to open a process's fds through /proc, as a process of the same
/// user could open a pool's segment.
fn role_proc_fds(pid: &str) {
    match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(entries) => {
            let mut opened = 0;
            for e in entries.flatten() {
                if std::fs::File::open(e.path()).is_ok() {
                    opened += 1;
                }
            }
            println!("listed, opened {opened}");
        }
        Err(e) => println!("refused kind={:?}", e.kind()),
    }
}

fn sh(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Makes `GROUP` and the three users (no home, no login), if missing.
fn make_users() {
    let out = sh(Command::new("groupadd").args(["-f", GROUP]));
    assert!(out.status.success(), "groupadd: {out:?}");
    for (user, groups) in [(OWNER, ""), (MEMBER, GROUP), (OUTSIDER, "")] {
        if sh(Command::new("id").arg("-u").arg(user)).status.success() {
            continue;
        }
        let mut cmd = Command::new("useradd");
        cmd.args(["-M", "-N", "-s", "/usr/sbin/nologin"]);
        if !groups.is_empty() {
            cmd.args(["-G", groups]);
        }
        let out = sh(cmd.arg(user));
        assert!(out.status.success(), "useradd {user}: {out:?}");
    }
}

fn id(flag: &str, name: &str) -> u32 {
    let out = sh(Command::new("id").arg(flag).arg(name));
    assert!(out.status.success(), "id {flag} {name}: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn gid_of_group(name: &str) -> u32 {
    let out = sh(Command::new("getent").args(["group", name]));
    assert!(out.status.success(), "getent group {name}: {out:?}");
    let line = String::from_utf8(out.stdout).unwrap();
    line.split(':').nth(2).unwrap().trim().parse().unwrap()
}

/// This binary in `role`, as `user`, with the run dir and prefix set.
fn as_user(user: &str, run_dir: &Path, prefix: &str, role: &[&str]) -> Command {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", user, "--"])
        .arg(std::env::current_exe().unwrap())
        .args(role)
        .env("XIO_RUN_DIR", run_dir)
        .env("XIO_PREFIX", prefix)
        .stdin(Stdio::null());
    cmd
}

fn stdout_of(mut cmd: Command) -> String {
    let out = sh(&mut cmd);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// A manager run as `user` with `args`, its run dir `run_dir`.
struct Manager(std::process::Child);

impl Manager {
    fn start(user: &str, run_dir: &Path, prefix: &str, args: &[&str]) -> Manager {
        use std::os::unix::process::CommandExt;
        let child = Command::new(BIN)
            .args(["--prefix", prefix, "--class", "2K:64"])
            .args(args)
            .env("XIO_RUN_DIR", run_dir)
            .uid(id("-u", user))
            .gid(id("-g", user))
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut m = Manager(child);
        let sock = run_dir.join(format!("{prefix}.sock"));
        let deadline = Instant::now() + WATCHDOG;
        while !sock.exists() {
            assert!(
                m.0.try_wait().unwrap().is_none(),
                "the manager as {user} exited"
            );
            assert!(Instant::now() < deadline, "watchdog: {user}'s manager");
            std::thread::sleep(Duration::from_millis(5));
        }
        m
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A directory owned by `user` (mode 0755) in a fresh base.
fn dir_of(base: &Path, name: &str, user: &str) -> PathBuf {
    let d = base.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&d, Some(id("-u", user)), Some(id("-g", user))).unwrap();
    d
}

fn test() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("domains: skipped: making users and running processes as them needs root");
        return;
    }
    let started = Instant::now();
    make_users();
    let base = std::env::temp_dir().join(format!("xio-domains-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The test binary runs as the other users too.
    let exe = std::env::current_exe().unwrap();
    for a in exe.ancestors().skip(1) {
        let m = std::fs::metadata(a).unwrap();
        assert!(
            m.mode() & 0o001 != 0,
            "{} is not searchable by others",
            a.display()
        );
    }

    // The team's pool: run by OWNER, the group admitted.
    let team_home = dir_of(&base, "team", OWNER);
    let team_run = team_home.join("run");
    let team = Manager::start(OWNER, &team_run, "team", &["--allow-gid", GROUP]);
    // The files match the domain: others may search the dir (not list
    // it) and connect to the socket; the credentials decide.
    let dmode = std::fs::metadata(&team_run).unwrap().mode() & 0o777;
    assert_eq!(dmode, 0o711, "run dir mode {dmode:o}");
    let smode = std::fs::metadata(team_run.join("team.sock"))
        .unwrap()
        .mode()
        & 0o777;
    assert_eq!(smode, 0o666, "socket mode {smode:o}");

    // A member of the group (another user than the manager's) serves; the
    // manager's own user talks to it.
    let mut server = as_user(MEMBER, &team_run, "team", &["serve"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = [0u8; 10];
    server
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut line)
        .unwrap_or_else(|e| panic!("the member's service did not start: {e}"));
    assert_eq!(&line, b"listening\n");
    let echoed = stdout_of(as_user(OWNER, &team_run, "team", &["client"]));
    assert_eq!(echoed.trim(), "echoed");
    let out = server.wait_with_output().unwrap();
    assert!(out.status.success(), "the member's service: {out:?}");

    // The outsider is refused, with the rule named.
    let refused = stdout_of(as_user(OUTSIDER, &team_run, "team", &["attach"]));
    assert!(
        refused.starts_with("refused kind=PermissionDenied"),
        "{refused}"
    );
    let uid = id("-u", OUTSIDER);
    assert!(
        refused.contains(&format!("uid {uid}")) && refused.contains("--allow-gid"),
        "{refused}"
    );
    assert!(
        refused.contains(&format!("gids [{}]", gid_of_group(GROUP))),
        "{refused}"
    );
    // ... and cannot open the pool's memory through the manager's /proc.
    let pid = team.0.id().to_string();
    let peek = stdout_of(as_user(OUTSIDER, &team_run, "team", &["proc-fds", &pid]));
    assert_eq!(peek.trim(), "refused kind=PermissionDenied");

    // The outsider's own pool, in the default domain: the member is
    // refused there in turn. Two prefixes, two pools, neither reachable
    // from the other's users.
    let own_run = dir_of(&base, "outsider", OUTSIDER).join("run");
    let own = Manager::start(OUTSIDER, &own_run, "own", &[]);
    let smode = std::fs::metadata(own_run.join("own.sock")).unwrap().mode() & 0o777;
    assert_eq!(smode, 0o600, "a private domain's socket mode {smode:o}");
    let dmode = std::fs::metadata(&own_run).unwrap().mode() & 0o777;
    assert_eq!(dmode, 0o700, "a private domain's run dir mode {dmode:o}");
    // A private run dir cannot even be searched: the socket is out of
    // reach before any credential is checked.
    let member = stdout_of(as_user(MEMBER, &own_run, "own", &["attach"]));
    assert!(member.starts_with("refused"), "{member}");
    // Opened up for the test's sake, the credential check refuses it.
    std::fs::set_permissions(&own_run, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(
        own_run.join("own.sock"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let member = stdout_of(as_user(MEMBER, &own_run, "own", &["attach"]));
    assert!(
        member.starts_with("refused kind=PermissionDenied"),
        "{member}"
    );
    assert!(member.contains("security domain"), "{member}");
    let pid = own.0.id().to_string();
    let peek = stdout_of(as_user(MEMBER, &own_run, "own", &["proc-fds", &pid]));
    assert_eq!(peek.trim(), "refused kind=PermissionDenied");

    // A stack does not trust a manager of another user found in a dir
    // everyone may write to (XIO_RUN_DIR named, but not that user's).
    let common = base.join("common");
    std::fs::create_dir_all(&common).unwrap();
    std::fs::set_permissions(&common, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let squat = Manager::start(OUTSIDER, &common, "squat", &["--allow-gid", GROUP]);
    let member = stdout_of(as_user(MEMBER, &common, "squat", &["attach"]));
    assert!(
        member.starts_with("refused kind=PermissionDenied")
            && member.contains("refusing the X-IO manager"),
        "{member}"
    );
    drop(squat);

    drop(own);
    drop(team);
    let _ = std::fs::remove_dir_all(&base);
    println!("domains: ok in {:?}", started.elapsed());
}
