//! Compile-fail tests: the misuses the typestate and the borrows are meant to stop do not
//! compile. Each case in `tests/ui/` has the expected compiler error next to it.
//!
//! The harness (`cargo xtask test`) runs this target on the host: it invokes the compiler and
//! touches no device.

#[test]
fn compile_fail_ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
