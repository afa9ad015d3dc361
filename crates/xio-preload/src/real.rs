//! libc's own functions, found with `dlsym(RTLD_NEXT)` at first use: what
//! the hooks call for every fd that is not a moved socket, and for their
//! own work on kernel fds.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use libc::{size_t, sockaddr, socklen_t, ssize_t};

/// Defines `$name`, calling the next definition of `$sym` after this
/// library's (libc's).
macro_rules! real {
    ($(fn $name:ident($($a:ident: $t:ty),*) -> $r:ty;)*) => {$(
        /// libc's function of this name.
        ///
        /// # Safety
        ///
        /// libc's contract for it.
        pub(crate) unsafe fn $name($($a: $t),*) -> $r {
            static P: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
            let mut p = P.load(Ordering::Relaxed);
            if p.is_null() {
                let sym = concat!(stringify!($name), "\0");
                // SAFETY: a NUL-terminated name; RTLD_NEXT is valid in a
                // shared object.
                p = unsafe { libc::dlsym(libc::RTLD_NEXT, sym.as_ptr().cast()) };
                if p.is_null() {
                    // Nothing to fall back on: libc has no such symbol.
                    std::process::abort();
                }
                P.store(p, Ordering::Relaxed);
            }
            // SAFETY: `p` is libc's function of this name, whose C
            // signature this declaration repeats.
            let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(p) };
            // SAFETY: the caller's contract.
            unsafe { f($($a),*) }
        }
    )*};
}

real! {
    fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    fn listen(fd: c_int, backlog: c_int) -> c_int;
    fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    fn recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    fn close(fd: c_int) -> c_int;
    fn shutdown(fd: c_int, how: c_int) -> c_int;
    fn dup(fd: c_int) -> c_int;
    fn dup2(fd: c_int, to: c_int) -> c_int;
    fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int;
    fn ioctl(fd: c_int, req: libc::c_ulong, arg: usize) -> c_int;
    fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int;
    fn ppoll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: *const libc::timespec, sigmask: *const libc::sigset_t) -> c_int;
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int;
    fn epoll_pwait(epfd: c_int, out: *mut libc::epoll_event, max: c_int, timeout: c_int, sigmask: *const libc::sigset_t) -> c_int;
    fn fork() -> libc::pid_t;
    fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
    fn close_range(first: u32, last: u32, flags: c_int) -> c_int;
    fn closefrom(lowfd: c_int) -> ();
    fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t;
    fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t;
    fn sendfile(out: c_int, input: c_int, offset: *mut libc::off_t, count: size_t) -> ssize_t;
    fn select(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *mut libc::timeval) -> c_int;
    fn pselect(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *const libc::timespec, sigmask: *const libc::sigset_t) -> c_int;
    fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t;
    fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t;
    fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE;
    fn posix_spawn(pid: *mut libc::pid_t, path: *const libc::c_char, fa: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut libc::c_char, envp: *const *mut libc::c_char) -> c_int;
    fn posix_spawnp(pid: *mut libc::pid_t, file: *const libc::c_char, fa: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut libc::c_char, envp: *const *mut libc::c_char) -> c_int;
    fn posix_spawn_file_actions_adddup2(fa: *mut libc::posix_spawn_file_actions_t, fd: c_int, newfd: c_int) -> c_int;
    fn system(command: *const libc::c_char) -> c_int;
    fn popen(command: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE;
}
