//! The examples' service children die with the example however it ends
//! (`kill -9` included), rather than serve for ever: the kernel sends
//! them SIGKILL when their parent goes (`PR_SET_PDEATHSIG`).
//!
//! Shared by the examples with `#[path]`.

use std::process::Command;

/// Where the example puts its own pid for its children to check.
const PARENT: &str = "XIO_EXAMPLE_PARENT";

/// A command running this same executable with `args`, as a child that
/// dies with this process (it calls [`die_with_parent`]).
pub fn command(args: &[&str]) -> std::io::Result<Command> {
    let mut c = Command::new(std::env::current_exe()?);
    c.args(args).env(PARENT, std::process::id().to_string());
    Ok(c)
}

/// In a child made by [`command`]: asks for SIGKILL when the parent
/// exits. The parent may have died before the request (it is not sent
/// then), so its pid is checked after: a child already orphaned (its
/// parent now init, or a subreaper) exits at once. Run by hand, without
/// the variable, nothing is asked.
pub fn die_with_parent() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(parent) = std::env::var(PARENT) else {
        return Ok(());
    };
    let parent: i32 = parent.parse()?;
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    if rustix::process::Pid::as_raw(rustix::process::getppid()) != parent {
        eprintln!("the example that started this process is gone");
        std::process::exit(1);
    }
    Ok(())
}
