//! The interop matrix of `srq_pingpong`: see the `matrix` module for what each run checks and
//! why its configurations cover the options.

mod common;
mod matrix;

use matrix::{SRQ, Side, matrix};

#[test]
fn srq_rust_server_c_client() {
    matrix("srq_pingpong", Side::Rust, Side::C, SRQ);
}

#[test]
fn srq_c_server_rust_client() {
    matrix("srq_pingpong", Side::C, Side::Rust, SRQ);
}

#[test]
fn srq_rust_to_rust() {
    matrix("srq_pingpong", Side::Rust, Side::Rust, SRQ);
}
