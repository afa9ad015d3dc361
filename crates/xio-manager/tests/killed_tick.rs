//! As `killed.rs`, with futex_waitv turned off (`XIO_FUTEX_WAITV=0`, what
//! a kernel before 5.16 or a sandbox refusing the call leaves): the
//! stacks sleep on their doorbell alone with the one-second tick, and the
//! tick still finds the manager gone.

mod common;
mod support;

#[test]
fn with_the_tick_sleeping_stacks_learn_of_a_killed_manager() {
    // Before the first sleep of this process: the variable is read once.
    std::env::set_var("XIO_FUTEX_WAITV", "0");
    common::sleeping_stacks_learn_of_a_killed_manager(common::Sleep::Tick);
}
