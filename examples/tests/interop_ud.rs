//! The interop matrix of `ud_pingpong`: see the `matrix` module for what each run checks and
//! why its configurations cover the options.

mod common;
mod matrix;

use matrix::{Side, UD, matrix};

#[test]
fn ud_rust_server_c_client() {
    matrix("ud_pingpong", Side::Rust, Side::C, UD);
}

#[test]
fn ud_c_server_rust_client() {
    matrix("ud_pingpong", Side::C, Side::Rust, UD);
}

#[test]
fn ud_rust_to_rust() {
    matrix("ud_pingpong", Side::Rust, Side::Rust, UD);
}
