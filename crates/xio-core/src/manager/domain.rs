//! The manager's security domain: which processes may attach to its pool.
//!
//! A pool is one security domain. Whoever attaches maps the whole segment
//! read-write, so admission is the only boundary between services: two
//! services that must not reach each other's buffers belong in two pools
//! (two prefixes, each with its own manager) run by different users.
//! Prefixes of one user are names, not walls: a process of that user can
//! open another prefix's segment through `/proc/<pid>/fd` of any process
//! holding it. Another user cannot (the kernel checks `/proc` access as it
//! checks `ptrace`), which is why a domain is drawn by users and groups.
//!
//! The rule: a connecting process is admitted when its effective uid is
//! the manager's, root's, or one [`ManagerBuilder::allow_uid`] named, or
//! when its effective gid or one of its supplementary groups (the kernel's
//! record of the socket's peer, `SO_PEERCRED` and `SO_PEERGROUPS`) is one
//! [`ManagerBuilder::allow_gid`] named. Anyone else gets
//! [`ErrorCode::PermissionDenied`] with a message naming the rule.
//!
//! The files follow the rule: with no one else allowed, the control socket
//! is `0600` and a run dir the manager made is `0700`; with others
//! allowed, the socket is `0666` and the run dir (if the manager's own)
//! gains search permission (`0711`, names not listed), so they can reach
//! the socket, where the credential check above decides.
//!
//! [`ManagerBuilder::allow_uid`]: super::ManagerBuilder::allow_uid
//! [`ManagerBuilder::allow_gid`]: super::ManagerBuilder::allow_gid
//! [`ErrorCode::PermissionDenied`]: crate::proto::ErrorCode::PermissionDenied

use std::os::fd::AsFd;

use crate::ctrl;

/// Who may attach: the manager's own user, root, and the users and groups
/// allowed besides.
#[derive(Clone, Debug)]
pub(super) struct Domain {
    /// The manager's effective uid.
    owner: u32,
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl Domain {
    pub(super) fn new(owner: u32, mut uids: Vec<u32>, mut gids: Vec<u32>) -> Domain {
        uids.retain(|&u| u != owner && u != 0);
        uids.sort_unstable();
        uids.dedup();
        gids.sort_unstable();
        gids.dedup();
        Domain { owner, uids, gids }
    }

    /// Whether anyone besides the manager's user and root may attach.
    pub(super) fn shared(&self) -> bool {
        !self.uids.is_empty() || !self.gids.is_empty()
    }

    /// Checks the process at the other end of `sock`: `Ok` if admitted,
    /// else the refusal's message, naming the rule.
    pub(super) fn admit(&self, sock: &impl AsFd) -> Result<(), String> {
        let cred = match ctrl::peer_cred(sock) {
            Ok(c) => c,
            Err(e) => return Err(format!("permission denied: the peer's credentials: {e}")),
        };
        if cred.uid == self.owner || cred.uid == 0 || self.uids.contains(&cred.uid) {
            return Ok(());
        }
        if self.gids.contains(&cred.gid) {
            return Ok(());
        }
        // Asked only when the primary ids did not do: most attaches are
        // the manager's own user's.
        let groups = if self.gids.is_empty() {
            Vec::new()
        } else {
            ctrl::peer_groups(sock).unwrap_or_default()
        };
        if groups.iter().any(|g| self.gids.contains(g)) {
            return Ok(());
        }
        Err(format!(
            "permission denied: uid {} (gid {}{}) is not in this pool's security domain \
             ({}); the manager's operator can admit it with xio-manager --allow-uid or \
             --allow-gid",
            cred.uid,
            cred.gid,
            if groups.is_empty() {
                String::new()
            } else {
                format!(", groups {groups:?}")
            },
            self.describe()
        ))
    }

    /// The rule in words: "uid 1000 and root, uids [..], gids [..]".
    pub(super) fn describe(&self) -> String {
        let mut s = if self.owner == 0 {
            "root".to_owned()
        } else {
            format!("uid {} and root", self.owner)
        };
        if !self.uids.is_empty() {
            s += &format!(", uids {:?}", self.uids);
        }
        if !self.gids.is_empty() {
            s += &format!(", gids {:?}", self.gids);
        }
        s
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_manager_user_and_root_are_not_listed_twice() {
        let d = Domain::new(1000, vec![0, 1000, 1002, 1001, 1002], vec![]);
        assert_eq!(d.uids, vec![1001, 1002]);
        assert!(d.shared());
        assert!(!Domain::new(1000, vec![1000, 0], vec![]).shared());
        assert!(Domain::new(1000, vec![], vec![50]).shared());
        assert_eq!(
            Domain::new(7, vec![8], vec![9, 9]).describe(),
            "uid 7 and root, uids [8], gids [9]"
        );
        assert_eq!(Domain::new(0, vec![], vec![9]).describe(), "root, gids [9]");
    }

    #[test]
    fn a_peers_groups_are_its_supplementary_groups() {
        use std::os::unix::net::UnixStream;
        let (a, _b) = UnixStream::pair().unwrap();
        let mut want: Vec<u32> = rustix::process::getgroups()
            .unwrap()
            .into_iter()
            .map(|g| g.as_raw())
            .collect();
        let mut got = ctrl::peer_groups(&a).unwrap();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want);
    }

    #[test]
    fn this_process_is_admitted_by_its_own_user_and_by_its_group() {
        use std::os::unix::net::UnixStream;
        let (a, _b) = UnixStream::pair().unwrap();
        let me = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        assert!(Domain::new(me, vec![], vec![]).admit(&a).is_ok());
        // Another owner: admitted as root, by uid, or by group; refused
        // otherwise (unless this test runs as root, whom every domain
        // admits).
        let other = me.wrapping_add(12345);
        assert!(Domain::new(other, vec![me], vec![]).admit(&a).is_ok());
        assert!(Domain::new(other, vec![], vec![gid]).admit(&a).is_ok());
        let refused = Domain::new(other, vec![], vec![gid.wrapping_add(777)]).admit(&a);
        if me == 0 {
            assert!(refused.is_ok());
        } else {
            let why = refused.unwrap_err();
            assert!(why.contains("not in this pool's security domain"), "{why}");
            assert!(why.contains("--allow-uid"), "{why}");
        }
    }
}
