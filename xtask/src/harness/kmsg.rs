//! The guest kernel's log, checked around each test binary: a provider that warns, hits a
//! `BUG`, underflows a reference count or reports a use-after-free while our tests run fails
//! the binary that was running (the tests can pass while the kernel under them corrupts
//! memory).
//!
//! `cargo xtask kernel-log mark` (run by the guest script before a binary) prints the sequence
//! number of the newest record in `/dev/kmsg`; `cargo xtask kernel-log since SEQ NAME` (after
//! it) prints `guest: kernel during NAME: MESSAGE` for each newer record that looks like one of
//! those. The verdict fails each named binary. With two lanes, a binary that ran beside the
//! culprit is named too: both windows hold the record.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// What a kernel record must contain to fail the binary: the markers of `WARN()`, `BUG()`,
/// oopses, the reference-count and memory checkers, lockups and stalls.
const PATTERNS: &[&str] = &[
    "WARNING:",
    "BUG:",
    "kernel BUG",
    "refcount_t:",
    "use-after-free",
    "Oops",
    "general protection fault",
    "KASAN:",
    "UBSAN:",
    "list_add corruption",
    "list_del corruption",
    "blocked for more than",
    "soft lockup",
    "hard LOCKUP",
    "self-detected stall",
];

/// Whether a kernel message is one the verdict must see.
pub(crate) fn flagged(message: &str) -> bool {
    PATTERNS.iter().any(|pattern| message.contains(pattern))
}

/// The sequence number and message of one `/dev/kmsg` record (`PRIO,SEQ,TIME,FLAGS;MESSAGE`,
/// then ` KEY=VALUE` lines).
pub(crate) fn parse_record(record: &str) -> Option<(u64, &str)> {
    let (header, rest) = record.split_once(';')?;
    let seq = header.split(',').nth(1)?.parse().ok()?;
    let message = rest.split('\n').next().unwrap_or("");
    Some((seq, message))
}

/// Every record `/dev/kmsg` still holds, oldest first.
fn records() -> Result<Vec<(u64, String)>, String> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .map_err(|e| format!("cannot read /dev/kmsg: {e}"))?;
    let mut records = Vec::new();
    // One read returns one record; records are at most about 1 KiB.
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                let text = String::from_utf8_lossy(&buffer[..n]);
                if let Some((seq, message)) = parse_record(&text) {
                    records.push((seq, message.to_string()));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // EPIPE: the record was overwritten while we read; the next read goes on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => return Err(format!("reading /dev/kmsg: {e}")),
        }
    }
    Ok(records)
}

/// `cargo xtask kernel-log mark | since SEQ NAME` (run by the guest scripts, not by people).
pub(crate) fn kernel_log(args: &[String]) -> Result<(), String> {
    match args {
        [mark] if mark == "mark" => {
            // Unreadable: 0, and `since` says why.
            let last = records().ok().and_then(|r| r.last().map(|(seq, _)| *seq));
            println!("{}", last.unwrap_or(0));
            Ok(())
        }
        [since, seq, name] if since == "since" => {
            let seq: u64 = seq
                .parse()
                .map_err(|_| format!("kernel-log since: `{seq}` is not a sequence number"))?;
            match records() {
                Ok(records) => {
                    for (_, message) in records.iter().filter(|(s, m)| *s > seq && flagged(m)) {
                        println!("guest: kernel during {name}: {message}");
                    }
                }
                Err(error) => println!("guest: kernel during {name}: {error}"),
            }
            Ok(())
        }
        _ => Err("usage: kernel-log mark | kernel-log since SEQ NAME".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_give_their_sequence_and_message() {
        assert_eq!(
            parse_record(
                "4,1234,56789012,-;WARNING: CPU: 1 PID: 7 at rxe_pool.c:255\n SUBSYSTEM=x\n"
            ),
            Some((1234, "WARNING: CPU: 1 PID: 7 at rxe_pool.c:255"))
        );
        assert_eq!(parse_record("6,7,1,c;hello"), Some((7, "hello")));
        assert_eq!(parse_record("garbage"), None);
    }

    #[test]
    fn the_provider_bugs_we_saw_are_flagged_and_routine_lines_are_not() {
        assert!(flagged(
            "WARNING: CPU: 0 PID: 312 at drivers/infiniband/sw/rxe/rxe_pool.c:255 __rxe_cleanup+0x9e/0xc0 [rdma_rxe]"
        ));
        assert!(flagged("refcount_t: underflow; use-after-free."));
        assert!(flagged(
            "BUG: kernel NULL pointer dereference, address: 0000000000000008"
        ));
        assert!(!flagged("rdma_rxe: loaded"));
        assert!(!flagged("rdma_rxe: qp#17 moved to error state"));
        assert!(!flagged(
            "IPv6: ADDRCONF(NETDEV_CHANGE): d0: link becomes ready"
        ));
    }
}
