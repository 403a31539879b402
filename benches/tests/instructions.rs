//! The `instructions` program on the device, without callgrind: every mode runs its rounds and
//! checks them (each completion's status and opcode, every byte received), so that
//! `cargo xtask instructions` counts rounds that work. A wrong mode must be refused.

use std::process::Command;

const INSTRUCTIONS: &str = env!("CARGO_BIN_EXE_instructions");

/// Every mode `cargo xtask instructions` counts, but C's.
const MODES: [&str; 9] = [
    "unsafe",
    "owned",
    "reuse",
    "slot",
    "srq-unsafe",
    "srq-slot",
    "cq-ex",
    "shared-unsafe",
    "shared-slot",
];

#[test]
fn every_mode_runs_and_checks_its_rounds() {
    let Some(_device) = rdma_test_support::device() else {
        return;
    };
    for mode in MODES {
        let out = Command::new(INSTRUCTIONS)
            .args([mode, "40"])
            .output()
            .expect("run instructions");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout
                .lines()
                .any(|line| line == format!("{mode}: 40 rounds")),
            "{mode}: {stdout}"
        );
        if mode.starts_with("shared-") {
            let polled_twice = stdout
                .lines()
                .find_map(|line| line.strip_suffix(" of 40 rounds polled twice"))
                .and_then(|n| n.parse::<u32>().ok());
            // One round in 40 may need its second completion polled apart (the program
            // fails past that).
            assert!(polled_twice.is_some_and(|n| n <= 1), "{mode}: {stdout}");
        }
    }
    let out = Command::new(INSTRUCTIONS)
        .args(["shared-owned", "40"])
        .output()
        .expect("run instructions");
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "instructions: unknown mode \"shared-owned\"\n"
    );
}
