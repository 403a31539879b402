//! The interop matrix of `uc_pingpong`: see the `matrix` module for what each run checks and
//! why its configurations cover the options.

mod common;
mod matrix;

use matrix::{Side, UC, matrix};

#[test]
fn uc_rust_server_c_client() {
    matrix("uc_pingpong", Side::Rust, Side::C, UC);
}

#[test]
fn uc_c_server_rust_client() {
    matrix("uc_pingpong", Side::C, Side::Rust, UC);
}

#[test]
fn uc_rust_to_rust() {
    matrix("uc_pingpong", Side::Rust, Side::Rust, UC);
}
