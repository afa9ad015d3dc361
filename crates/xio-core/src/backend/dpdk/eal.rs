//! The process's EAL: a manager is the DPDK primary of its prefix, stacks
//! are secondaries; and the checks of what DPDK needs (hugepages, a
//! hugetlbfs mount) before it is asked.

use std::ffi::CString;
use std::sync::OnceLock;

use dpdk_sys as sys;

use super::error::{errno_text, DpdkError};

/// Whether this process is the DPDK primary of its prefix or a secondary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Creates the shared objects (the manager).
    Primary,
    /// Looks them up (a stack).
    Secondary,
}

impl Role {
    pub(super) fn name(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Secondary => "secondary",
        }
    }
}

/// The process's EAL: initialised once, for one prefix and role.
#[derive(Debug)]
pub struct Eal {
    prefix: String,
    role: Role,
}

/// The EAL starts once per process: DPDK cannot start it again, not even
/// after a failed start, so a failure is kept and answered again.
pub(super) static EAL: OnceLock<Result<Eal, DpdkError>> = OnceLock::new();

/// Checks what DPDK needs before `rte_eal_init` as `role`, which reports
/// it badly: reserved hugepages, free ones for a primary, and a mounted
/// hugetlbfs.
pub fn preflight(role: Role) -> Result<(), DpdkError> {
    let pages = HugePages::from_sysfs(std::path::Path::new("/sys/kernel/mm/hugepages"))
        .unwrap_or_else(|| {
            HugePages::from_meminfo(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
        });
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    check_hugepages(pages, &mounts, role)
}

/// Hugepages reserved and free on the machine, over every page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugePages {
    /// Reserved.
    pub total: u64,
    /// Not in use.
    pub free: u64,
}

impl HugePages {
    /// From a directory laid out as `/sys/kernel/mm/hugepages` (one
    /// `hugepages-<size>kB` directory per page size, each with
    /// `nr_hugepages` and `free_hugepages`); `None` if it cannot be read.
    /// `/proc/meminfo` counts the default page size only: 1 GiB pages
    /// reserved beside a 2 MiB default, as DPDK deployments do, are
    /// only here.
    pub fn from_sysfs(dir: &std::path::Path) -> Option<HugePages> {
        let read = |d: &std::path::Path, f: &str| -> Option<u64> {
            std::fs::read_to_string(d.join(f)).ok()?.trim().parse().ok()
        };
        let mut pages = HugePages { total: 0, free: 0 };
        let mut any = false;
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let d = e.path();
            if !e.file_name().to_string_lossy().starts_with("hugepages-") {
                continue;
            }
            pages.total += read(&d, "nr_hugepages")?;
            pages.free += read(&d, "free_hugepages")?;
            any = true;
        }
        any.then_some(pages)
    }

    /// From `/proc/meminfo` text (the default page size's).
    pub fn from_meminfo(meminfo: &str) -> HugePages {
        let field = |k: &str| -> u64 {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|r| r.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        HugePages {
            total: field("HugePages_Total:"),
            free: field("HugePages_Free:"),
        }
    }
}

/// The hugetlbfs mount points listed in `/proc/mounts` text.
fn hugetlbfs_dirs(mounts: &str) -> impl Iterator<Item = &str> {
    mounts.lines().filter_map(|l| {
        let mut f = l.split_whitespace();
        let dir = f.nth(1)?;
        (f.next() == Some("hugetlbfs")).then_some(dir)
    })
}

/// [`preflight`] on the given hugepage counts and `/proc/mounts` text.
pub fn check_hugepages(pages: HugePages, mounts: &str, role: Role) -> Result<(), DpdkError> {
    let fix = "reserve some as root: `echo 256 > /proc/sys/vm/nr_hugepages` and \
               `mount -t hugetlbfs nodev /dev/hugepages` (or run .ci/run)";
    if pages.total == 0 {
        return Err(DpdkError::Hugepages(format!(
            "no hugepages are reserved on this machine; the dpdk backend needs them: {fix}"
        )));
    }
    // A secondary maps the primary's pages and takes none of its own: a
    // manager whose pool fills every reserved page (hugepages sized to
    // the pool, as DPDK deployments do) still takes stacks.
    if role == Role::Primary && pages.free == 0 {
        return Err(DpdkError::Hugepages(format!(
            "all {} hugepages are in use; free some or reserve more: {fix}",
            pages.total
        )));
    }
    if hugetlbfs_dirs(mounts).next().is_none() {
        return Err(DpdkError::Hugepages(format!(
            "no hugetlbfs is mounted: {fix}"
        )));
    }
    Ok(())
}

impl Eal {
    /// Initialises DPDK in this process as `role` of `prefix` (DPDK's
    /// `--file-prefix`: one per pool, like X-IO's prefix), or returns the
    /// EAL already running with the same prefix and role.
    pub fn init(prefix: &str, role: Role) -> Result<&'static Eal, DpdkError> {
        let r = EAL.get_or_init(|| Self::start(prefix, role));
        match r {
            // A primary uses its own objects: asking for a secondary of
            // the same prefix (a stack in the manager's process) is fine.
            Ok(e) if e.prefix == prefix && (e.role == role || role == Role::Secondary) => Ok(e),
            Ok(e) => Err(DpdkError::AlreadyInit {
                prefix: e.prefix.clone(),
                role: e.role.name(),
                wanted: prefix.into(),
                wanted_role: role.name(),
            }),
            Err(e) => Err(e.clone()),
        }
    }

    fn start(prefix: &str, role: Role) -> Result<Eal, DpdkError> {
        preflight(role)?;
        // EAL pins the calling thread to its lcore's CPUs: keep the
        // caller's own placement (a benchmark's pinning, a service's
        // taskset) instead.
        let affinity = rustix::thread::sched_getaffinity(None).ok();
        // One lcore, floating over the CPUs this process may use: EAL
        // would otherwise pin the calling thread to one core. Named one
        // by one, not as `0..n`: in a container limited to other CPUs (a
        // cpuset cgroup) pinning to CPUs outside it fails, and with it
        // `rte_eal_init`.
        let cpus = affinity.as_ref().map_or_else(
            || {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                format!("0-{}", n - 1)
            },
            cpu_list,
        );
        let args = [
            "xio".to_string(),
            format!("--proc-type={}", role.name()),
            format!("--file-prefix={prefix}"),
            "--no-pci".into(),
            "--no-telemetry".into(),
            format!("--lcores=0@({cpus})"),
            "--log-level=lib.eal:error".into(),
        ]
        .into_iter()
        .chain(
            std::env::var("XIO_DPDK_EAL_ARGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned),
        )
        .collect::<Vec<_>>();
        let cargs: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_str()).expect("no NUL in EAL args"))
            .collect();
        let mut argv: Vec<*mut std::ffi::c_char> =
            cargs.iter().map(|a| a.as_ptr().cast_mut()).collect();
        // SAFETY: argv holds valid NUL-terminated strings that outlive the
        // call (EAL may permute argv, not free it); called once (OnceLock).
        let n = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
        if let Some(set) = affinity {
            let _ = rustix::thread::sched_setaffinity(None, &set);
        }
        if n < 0 {
            return Err(DpdkError::Eal {
                prefix: prefix.into(),
                role: role.name(),
                reason: errno_text(),
                hint: match role {
                    Role::Secondary => " (a secondary needs the primary, the X-IO manager \
                                        started with the dpdk backend and this prefix, to be \
                                        running)"
                        .into(),
                    Role::Primary => match processes_using(prefix).as_slice() {
                        [] => " (DPDK needs root or access to /dev/hugepages)".into(),
                        // A manager restarted while processes attached to
                        // the one before still run: DPDK keeps the prefix
                        // to them until they exit.
                        pids => format!(
                            " (process {} still uses this prefix's DPDK memory, attached to an \
                             earlier manager; a new primary can start once it has exited)",
                            pids.iter()
                                .map(u32::to_string)
                                .collect::<Vec<_>>()
                                .join(", process ")
                        ),
                    },
                },
            });
        }
        Ok(Eal {
            prefix: prefix.into(),
            role,
        })
    }

    /// Removes the prefix's hugepage files (what a clean manager stop
    /// leaves behind: DPDK keeps them for secondaries, and would only clear
    /// them when a primary of the same prefix starts again). Processes that
    /// still map them keep their memory until they exit.
    pub fn remove_hugepage_files(prefix: &str) {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let stem = format!("{prefix}map_");
        for dir in hugetlbfs_dirs(&mounts) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_name().to_str().is_some_and(|n| n.starts_with(&stem)) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The role.
    pub fn role(&self) -> Role {
        self.role
    }
}

/// The processes other than this one that map `prefix`'s DPDK files (its
/// runtime directory's or its hugepage files): the secondaries that keep a
/// new primary of the prefix from starting.
fn processes_using(prefix: &str) -> Vec<u32> {
    let runtime = format!("/dpdk/{prefix}/");
    let pages = format!("/{prefix}map_");
    let me = std::process::id();
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| {
                m.lines()
                    .any(|l| l.contains(&runtime) || l.contains(&pages))
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The CPUs of `set` in EAL's cpuset syntax, runs as ranges (`0-3,6`).
fn cpu_list(set: &rustix::thread::CpuSet) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for c in (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)) {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == c => *end = c,
            _ => runs.push((c, c)),
        }
    }
    runs.iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "nodev /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n";

    const fn pages(total: u64, free: u64) -> HugePages {
        HugePages { total, free }
    }

    #[test]
    fn preflight_explains_what_is_missing() {
        let none = HugePages::from_meminfo("HugePages_Total:       0\nHugePages_Free:        0\n");
        assert_eq!(none, pages(0, 0));
        for role in [Role::Primary, Role::Secondary] {
            let e = check_hugepages(none, MOUNTS, role).unwrap_err().to_string();
            assert!(e.contains("no hugepages are reserved"), "{e}");
            assert!(e.contains("nr_hugepages"), "{e}");
        }
        let e = check_hugepages(pages(256, 0), MOUNTS, Role::Primary)
            .unwrap_err()
            .to_string();
        assert!(e.contains("all 256 hugepages are in use"), "{e}");
        let ok = HugePages::from_meminfo("HugePages_Total:     256\nHugePages_Free:      100\n");
        assert_eq!(ok, pages(256, 100));
        for role in [Role::Primary, Role::Secondary] {
            let e = check_hugepages(ok, "proc /proc proc rw 0 0\n", role)
                .unwrap_err()
                .to_string();
            assert!(e.contains("no hugetlbfs is mounted"), "{e}");
            assert!(check_hugepages(ok, MOUNTS, role).is_ok());
        }
    }

    /// A stack joins a manager whose pool took every reserved hugepage:
    /// the secondary maps the primary's pages and needs no free one. The
    /// check refused it ("all 256 hugepages are in use") before DPDK was
    /// asked, so no service could attach to a manager sized to the
    /// machine's hugepages.
    #[test]
    fn a_secondary_needs_no_free_hugepage() {
        assert!(check_hugepages(pages(256, 0), MOUNTS, Role::Secondary).is_ok());
    }

    /// 1 GiB pages reserved beside a 2 MiB default page size (`hugepagesz=1G
    /// hugepages=4` on the kernel command line, or through sysfs), as
    /// DPDK deployments do: `/proc/meminfo` counts the default size only,
    /// and the check read it alone, so it said no hugepages were reserved
    /// and DPDK, which would have used the 1 GiB mount, was never asked.
    #[test]
    fn hugepages_of_every_size_are_counted() {
        let dir = std::env::temp_dir().join(format!("xio-hp-{}", std::process::id()));
        for (size, n) in [("2048kB", 0), ("1048576kB", 4)] {
            let d = dir.join(format!("hugepages-{size}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("nr_hugepages"), format!("{n}\n")).unwrap();
            std::fs::write(d.join("free_hugepages"), format!("{n}\n")).unwrap();
        }
        let found = HugePages::from_sysfs(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found, Some(pages(4, 4)));
        let gig = "nodev /mnt/huge1g hugetlbfs rw,relatime,pagesize=1024M 0 0\n";
        assert!(check_hugepages(pages(4, 4), gig, Role::Primary).is_ok());
        assert_eq!(HugePages::from_sysfs(&dir), None, "gone: unreadable");
    }

    #[test]
    fn cpu_lists_name_the_cpus_of_a_set() {
        let mut set = rustix::thread::CpuSet::new();
        for c in [1, 2, 3, 6, 9, 10] {
            set.set(c);
        }
        assert_eq!(cpu_list(&set), "1-3,6,9-10");
    }
}
