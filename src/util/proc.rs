//! Processes on this machine.

/// Whether a process exists.
pub fn process_alive(pid: u32) -> bool {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    match i32::try_from(pid) {
        Ok(p) if p > 0 => !matches!(kill(Pid::from_raw(p), None), Err(Errno::ESRCH)),
        _ => false,
    }
}
