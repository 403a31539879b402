//! `cargo xtask setup`: installs what a fresh machine needs. Safe to run again: it installs only
//! what is missing.

use std::process::Command;

use crate::harness::host_has_active_device;

/// Building the workspace: the rdma-core development packages and pkg-config; and a C++
/// compiler for libFuzzer, which `cargo xtask fuzz` builds.
const BUILD: &[&str] = &["pkg-config", "libibverbs-dev", "librdmacm-dev", "g++"];
/// Running: the user-space providers (rxe among them).
const RUNTIME: &[&str] = &["rdma-core", "ibverbs-providers", "librdmacm1"];
/// The C tools the tests use as independent peers and the benches compare with, and valgrind
/// (`cargo xtask instructions` counts instructions with callgrind).
const TOOLS: &[&str] = &["ibverbs-utils", "rdmacm-utils", "perftest", "valgrind"];
/// The declared minimum Rust version (`rust-version` in the workspace manifest), installed so
/// that CI can build with it (`cargo +1.85 check`).
const MSRV: &str = "1.85";
/// A dated nightly with Miri, which CI runs over the unit tests of the crate's lock-free and
/// unsafe data-path structures (`.ci/run`, which names the same toolchain): pinned, so that a
/// new nightly cannot turn CI red.
pub(crate) const MIRI_NIGHTLY: &str = "nightly-2026-05-20";
/// The Soft-RoCE VM, for hosts without an RDMA device: QEMU, a distribution kernel that ships
/// `rdma_rxe`, virtme-ng's runtime needs, and the tools to build the rxe device in the guest.
const VM: &[&str] = &[
    "qemu-system-x86",
    "linux-image-amd64",
    "busybox-static",
    "iproute2",
    "kmod",
    "python3-pip",
];
/// virtme-ng (`vng`), from PyPI: boots the kernel with the host's root file system.
const VIRTME_NG: &str = "virtme-ng==1.42";

/// `cargo xtask setup --kernel VERSION`: installs the distribution's kernel `VERSION`
/// (`linux-image-VERSION-amd64`, Debian 12 has `6.12` beside its default `6.1`) unless a kernel
/// of that version with `rdma_rxe` is in `/boot`, for `cargo xtask test --kernel VERSION` (the
/// full tier's second-kernel run).
pub(crate) fn run_kernel(version: &str) -> Result<(), String> {
    if let Ok(kernel) = crate::harness::choose_kernel(version) {
        println!(
            "setup: kernel {version} is installed ({})",
            kernel.display()
        );
        return Ok(());
    }
    install_debs(&[&format!("linux-image-{version}-amd64")])?;
    let kernel = crate::harness::choose_kernel(version)?;
    println!("setup: kernel {version} installed ({})", kernel.display());
    Ok(())
}

pub(crate) fn run() -> Result<(), String> {
    let mut wanted: Vec<&str> = BUILD.iter().chain(RUNTIME).chain(TOOLS).copied().collect();
    let need_vm = !host_has_active_device();
    if need_vm {
        wanted.extend(VM);
    }
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|p| !deb_installed(p))
        .collect();
    if missing.is_empty() {
        println!("setup: all {} packages are installed", wanted.len());
    } else {
        install_debs(&missing)?;
    }
    if need_vm {
        if crate::harness::find_vng().is_some() {
            println!("setup: vng is installed");
        } else {
            pip_install(VIRTME_NG)?;
            if crate::harness::find_vng().is_none() {
                return Err("virtme-ng installed, but `vng` is not on PATH".to_string());
            }
        }
        crate::harness::find_kernel()?;
    }
    install_msrv_toolchain()?;
    install_miri()?;
    println!("setup: done");
    Ok(())
}

/// Installs the MSRV toolchain with rustup (minimal profile), unless it is there.
fn install_msrv_toolchain() -> Result<(), String> {
    let Ok(list) = Command::new("rustup").args(["toolchain", "list"]).output() else {
        println!("setup: rustup not found: install Rust {MSRV} by hand to check the MSRV");
        return Ok(());
    };
    if String::from_utf8_lossy(&list.stdout)
        .lines()
        .any(|l| l.starts_with(&format!("{MSRV}-")))
    {
        println!("setup: Rust {MSRV} (the MSRV) is installed");
        return Ok(());
    }
    rustup_install(&[MSRV])
}

/// `rustup toolchain install --profile minimal <args>`.
fn rustup_install(args: &[&str]) -> Result<(), String> {
    let status = Command::new("rustup")
        .args(["toolchain", "install", "--profile", "minimal"])
        .args(args)
        .status()
        .map_err(|e| format!("running rustup: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`rustup toolchain install {}` failed ({status})",
            args.join(" ")
        ))
    }
}

/// Installs [`MIRI_NIGHTLY`] with Miri and the standard library's sources (which Miri
/// builds), unless they are there.
fn install_miri() -> Result<(), String> {
    let installed = Command::new("rustup")
        .args([
            "component",
            "list",
            "--installed",
            "--toolchain",
            MIRI_NIGHTLY,
        ])
        .output();
    let Ok(installed) = installed else {
        println!(
            "setup: rustup not found: install {MIRI_NIGHTLY} with miri by hand for CI's Miri step"
        );
        return Ok(());
    };
    let listed = String::from_utf8_lossy(&installed.stdout);
    let has = |component: &str| listed.lines().any(|l| l.starts_with(component));
    if installed.status.success() && has("miri") && has("rust-src") {
        println!("setup: {MIRI_NIGHTLY} with Miri is installed");
        return Ok(());
    }
    rustup_install(&[MIRI_NIGHTLY, "--component", "miri,rust-src"])
}

fn deb_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.ends_with(b"install ok installed"))
}

fn install_debs(packages: &[&str]) -> Result<(), String> {
    if Command::new("apt-get").arg("--version").output().is_err() {
        return Err(format!(
            "apt-get is not available; install the equivalents of these Debian packages by hand: {}",
            packages.join(" ")
        ));
    }
    println!("setup: installing {}", packages.join(" "));
    let root = is_root();
    let apt = |args: &[&str]| -> Result<(), String> {
        let mut command = if root {
            Command::new("apt-get")
        } else {
            let mut c = Command::new("sudo");
            c.arg("apt-get");
            c
        };
        let status = command
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("running apt-get: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("`apt-get {}` failed ({status})", args.join(" ")))
        }
    };
    apt(&["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(packages);
    apt(&args)
}

fn pip_install(spec: &str) -> Result<(), String> {
    println!("setup: installing {spec} from PyPI");
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", spec])
        .status()
        .map_err(|e| format!("running pip: {e}"))?;
    if status.success() {
        return Ok(());
    }
    // Debian's own python3 refuses system-wide pip installs without this flag (PEP 668).
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--break-system-packages",
            spec,
        ])
        .status()
        .map_err(|e| format!("running pip: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`pip install {spec}` failed ({status})"))
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}
