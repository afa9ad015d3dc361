//! glibc's `signal` family under the library: a C program's handlers go
//! behind the library's trampoline (through its `sigaction`), and must be
//! installed with the flags and mask glibc gives them, or the library
//! would interrupt or restart calls where the kernel does not.

mod common;

use std::process::Command;

use common::{library, run_dir};

/// Installs handlers with `siginterrupt` + `signal`, `bsd_signal`,
/// `ssignal`, `sysv_signal` and `__sysv_signal`, and prints what
/// `sigaction` then reports for each, and whether the kernel calls the
/// handler itself (under the library it calls the trampoline).
const PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
extern __sighandler_t bsd_signal(int, __sighandler_t);
extern __sighandler_t ssignal(int, __sighandler_t);
extern __sighandler_t sysv_signal(int, __sighandler_t);
extern __sighandler_t __sysv_signal(int, __sighandler_t);
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static void h(int s) { (void)s; }
static void show(const char *what, int sig) {
    struct sigaction a;
    sigaction(sig, 0, &a);
    /* The kernel's own view, past any hook: the handler it calls. */
    struct { void *handler; unsigned long flags; void *restorer; unsigned long mask; } k;
    syscall(SYS_rt_sigaction, sig, 0, &k, 8);
    printf("%s: handler %d restart %d resethand %d nodefer %d self-masked %d; kernel calls it %d\n",
           what, a.sa_handler == h, !!(a.sa_flags & SA_RESTART), !!(a.sa_flags & SA_RESETHAND),
           !!(a.sa_flags & SA_NODEFER), sigismember(&a.sa_mask, sig), k.handler == (void *)h);
}
int main(void) {
    siginterrupt(SIGALRM, 1);
    signal(SIGALRM, h);
    show("siginterrupt(1) then signal", SIGALRM);
    siginterrupt(SIGALRM, 0);
    show("siginterrupt(0)", SIGALRM);
    siginterrupt(SIGUSR1, 1);
    bsd_signal(SIGUSR1, h);
    show("siginterrupt(1) then bsd_signal", SIGUSR1);
    ssignal(SIGUSR2, h);
    show("ssignal", SIGUSR2);
    sysv_signal(SIGHUP, h);
    show("sysv_signal", SIGHUP);
    __sysv_signal(SIGWINCH, h);
    show("__sysv_signal", SIGWINCH);
    printf("invalid: %d\n", signal(0, h) == SIG_ERR && siginterrupt(65, 1) == -1);
    return 0;
}
"#;

/// The program prints the same with the library as without it (glibc's
/// own), and the answers are glibc's documented ones.
#[test]
fn the_signal_family_installs_handlers_as_glibc_does() {
    let dir = run_dir();
    let src = dir.join("signals.c");
    let exe = dir.join("signals");
    std::fs::write(&src, PROGRAM).unwrap();
    let st = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc (Debian's gcc)");
    assert!(st.success(), "cc failed");
    let run = |preload: bool| {
        let mut c = Command::new(&exe);
        c.env_remove("LD_PRELOAD");
        if preload {
            c.env("LD_PRELOAD", library());
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let glibc = run(false);
    assert!(
        glibc.contains("siginterrupt(1) then signal: handler 1 restart 0")
            && glibc.contains("siginterrupt(0): handler 1 restart 1")
            && glibc.contains("sysv_signal: handler 1 restart 0 resethand 1 nodefer 1")
            && glibc.contains("invalid: 1"),
        "glibc's answers:\n{glibc}"
    );
    assert_eq!(glibc.matches("kernel calls it 1").count(), 6, "{glibc}");
    let preloaded = run(true);
    assert_eq!(
        preloaded.matches("kernel calls it 0").count(),
        6,
        "every handler behind the trampoline:\n{preloaded}"
    );
    assert_eq!(
        preloaded.replace("kernel calls it 0", "kernel calls it 1"),
        glibc,
        "under the library as under glibc"
    );
}
