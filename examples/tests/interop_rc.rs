//! The interop matrix of `rc_pingpong`: see the `matrix` module for what each run checks and
//! why its configurations cover the options.

mod common;
mod matrix;

use matrix::{RC, Side, matrix};

#[test]
fn rc_rust_server_c_client() {
    matrix("rc_pingpong", Side::Rust, Side::C, RC);
}

#[test]
fn rc_c_server_rust_client() {
    matrix("rc_pingpong", Side::C, Side::Rust, RC);
}

#[test]
fn rc_rust_to_rust() {
    matrix("rc_pingpong", Side::Rust, Side::Rust, RC);
}
