//! Stopping the VM as a whole: `vng` runs in a process group of its own (python, then QEMU,
//! are its descendants), which the watchdog signals as one, and any descendant that left the
//! group is signalled by its process ID.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The process groups of the running VMs, for the signal handler (0: a free slot). The
/// multi-node mode runs up to [`MAX_VMS`] at once.
static VM_GROUPS: [AtomicI32; MAX_VMS] = [const { AtomicI32::new(0) }; MAX_VMS];

/// How many VMs can run at once.
pub(crate) const MAX_VMS: usize = 8;

/// While it lives, SIGINT, SIGTERM and SIGHUP of the harness also kill the VM's process group:
/// the group is not the terminal's foreground group, so Ctrl-C no longer reaches it.
pub(crate) struct GroupGuard {
    slot: Option<usize>,
}

impl GroupGuard {
    pub(crate) fn new(group: u32) -> Self {
        let group = i32::try_from(group).unwrap_or(0);
        let slot = VM_GROUPS.iter().position(|cell| {
            cell.compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            let handler = forward as extern "C" fn(libc::c_int);
            // SAFETY: `forward` only calls async-signal-safe functions (kill, signal, raise) and
            // reads atomics.
            unsafe { libc::signal(signal, handler as libc::sighandler_t) };
        }
        Self { slot }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            VM_GROUPS[slot].store(0, Ordering::SeqCst);
        }
    }
}

extern "C" fn forward(signal: libc::c_int) {
    for cell in &VM_GROUPS {
        let group = cell.load(Ordering::SeqCst);
        if group > 0 {
            // SAFETY: kill(2) is async-signal-safe; the group is a VM's, which this process
            // started.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
    }
    // SAFETY: signal(2) and raise(3) are async-signal-safe: restore the default action and
    // raise the signal again, so that the harness ends as the signal would have ended it.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

/// The parent process ID and process group of `pid`, and whether it has exited (zombie or
/// gone), from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(u32, u32, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `PID (COMM) STATE PPID PGRP ...`; COMM may hold spaces and parentheses.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((ppid, pgrp, state == "Z" || state == "X"))
}

/// Every live process, with its parent and process group.
fn processes() -> Vec<(u32, u32, u32)> {
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let Some((ppid, pgrp, false)) = stat(pid) {
                found.push((pid, ppid, pgrp));
            }
        }
    }
    found
}

/// Whether `pid` is still running (not a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, _, exited)| !exited)
}

/// Every live descendant of `root`, by walking `/proc`.
pub(crate) fn descendants(root: u32) -> Vec<u32> {
    let parents = processes();
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid, _) in &parents {
            if ppid == parent && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

/// Whether any live (not zombie) process is left in process group `group`.
pub(crate) fn group_alive(group: u32) -> bool {
    processes().iter().any(|&(_, _, pgrp)| pgrp == group)
}

fn signal_all(group: u32, pids: &[u32], signal: libc::c_int) {
    if let Ok(group) = i32::try_from(group) {
        // SAFETY: plain kill(2) of the process group this harness created.
        unsafe { libc::kill(-group, signal) };
    }
    for &pid in pids {
        if let Ok(pid) = i32::try_from(pid) {
            // SAFETY: plain kill(2) of a process found below the VM a moment ago.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

/// Stops the process group led by `leader` and every descendant of `leader`, wherever its
/// group: SIGTERM, then SIGKILL for whatever is left after `grace`. Returns the processes
/// still alive after that (none, unless they are stuck in the kernel).
pub(crate) fn stop_group(leader: u32, grace: Duration) -> Vec<u32> {
    let mut members = descendants(leader);
    members.push(leader);
    signal_all(leader, &members, libc::SIGTERM);
    for (signal, wait) in [(None, grace), (Some(libc::SIGKILL), Duration::from_secs(5))] {
        if let Some(signal) = signal {
            // Processes started while stopping: include them.
            for pid in descendants(leader) {
                if !members.contains(&pid) {
                    members.push(pid);
                }
            }
            signal_all(leader, &members, signal);
        }
        let until = Instant::now() + wait;
        while members.iter().any(|&pid| alive(pid)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
        if !members.iter().any(|&pid| alive(pid)) {
            return Vec::new();
        }
    }
    members.into_iter().filter(|&pid| alive(pid)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    /// Waits (bounded) until `root` has `count` descendants.
    fn wait_for_descendants(root: u32, count: usize) -> Vec<u32> {
        for _ in 0..200 {
            let found = descendants(root);
            if found.len() >= count {
                return found;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the test processes did not start: {:?}", descendants(root));
    }

    #[test]
    fn a_group_that_ignores_sigterm_and_a_runaway_descendant_are_stopped() {
        // A shell that ignores SIGTERM (its `sleep`s inherit that), with one child that left
        // the group (`setsid`), as a QEMU in a session of its own would.
        let mut child = Command::new("sh")
            .args([
                "-c",
                "trap '' TERM; sleep 300 & setsid sleep 300 & sleep 300; wait",
            ])
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("sh");
        let leader = child.id();
        let below = wait_for_descendants(leader, 3);
        let survivors = stop_group(leader, Duration::from_millis(500));
        assert_eq!(survivors, Vec::<u32>::new());
        let status = child.wait().expect("wait");
        assert!(!status.success());
        assert!(!group_alive(leader), "the group is empty");
        for pid in below {
            assert!(!alive(pid), "process {pid} survived");
        }
    }

    #[test]
    fn the_proc_stat_of_this_process_is_read() {
        let (ppid, _, exited) = stat(std::process::id()).expect("own stat");
        assert!(!exited);
        assert_eq!(ppid, std::os::unix::process::parent_id());
    }
}
