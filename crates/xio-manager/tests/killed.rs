//! The `xio-manager` binary killed with -9 while stacks sleep in a
//! receive with no deadline: they wake with `Error::ManagerGone` (the
//! kernel releases the manager's liveness word and wakes them through
//! futex_waitv) and their channel keeps working without the manager.

mod common;
mod support;

#[test]
fn sleeping_stacks_learn_of_a_killed_manager_and_keep_their_channel() {
    common::sleeping_stacks_learn_of_a_killed_manager(common::Sleep::Waitv);
}
