//! `cargo xtask pingpong`: the README's main job.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::build::json_string;
use super::vm::{self, GUEST_DEVICE, guest_prelude, shell_quote};

/// `cargo xtask pingpong`: the README's main job: `rc_pingpong` server and client on the
/// device (in the VM where the host has none), printing their address and result lines.
pub(crate) fn pingpong(root: &Path, args: &[String]) -> Result<(), String> {
    let output = Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "build",
            "--package",
            "rdma-examples",
            "--bin",
            "rc_pingpong",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err("building rc_pingpong failed".to_string());
    }
    let binary = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .filter_map(|l| json_string(l, "executable"))
        .find(|p| p.ends_with("/rc_pingpong"))
        .ok_or("cargo did not report the rc_pingpong binary")?;
    let extra: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    let extra = extra.join(" ");
    let port = 18515;
    if super::host_has_active_device() {
        let gid = std::env::var("RDMA_TEST_GID_INDEX").unwrap_or_else(|_| "1".to_string());
        let mut server = Command::new(&binary)
            .args(["-g", &gid, "-p", &port.to_string()])
            .args(args)
            .spawn()
            .map_err(|e| format!("starting the server: {e}"))?;
        std::thread::sleep(Duration::from_secs(1));
        let client = Command::new(&binary)
            .args(["-g", &gid, "-p", &port.to_string()])
            .args(args)
            .arg("127.0.0.1")
            .status()
            .map_err(|e| format!("starting the client: {e}"))?;
        let server = server.wait().map_err(|e| format!("waiting: {e}"))?;
        return if client.success() && server.success() {
            Ok(())
        } else {
            Err(format!("server {server}, client {client}"))
        };
    }
    let work = root.join(".rdma-test").join(std::process::id().to_string());
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let script = work.join("pingpong.sh");
    let mut text = guest_prelude();
    text.push_str(&format!(
        r#"echo "guest: ==> rc_pingpong server and client on {GUEST_DEVICE}"
bin={binary}
$bin -g 1 -p {port} {extra} > {server_log} 2>&1 &
server=$!
i=0
until grep -q ":$(printf %04X {port}) .* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
    i=$((i+1)); [ $i -gt 600 ] && fail "the server never listened"
    sleep 0.1
done
$bin -g 1 -p {port} {extra} 127.0.0.1 > {client_log} 2>&1
client_status=$?
wait $server
server_status=$?
echo "guest: server (exit $server_status):"; sed 's/^/  /' {server_log}
echo "guest: client (exit $client_status):"; sed 's/^/  /' {client_log}
[ $server_status -eq 0 ] && [ $client_status -eq 0 ] && echo "guest: pingpong ok"
echo "guest: done"
"#,
        binary = shell_quote(&binary),
        server_log = shell_quote(&work.join("server.log").to_string_lossy()),
        client_log = shell_quote(&work.join("client.log").to_string_lossy()),
    ));
    std::fs::write(&script, text).map_err(|e| format!("writing {}: {e}", script.display()))?;
    let run = vm::boot_vm(root, &script, "guest: ==>", vm::timeout_from_env())?;
    let problems = run.problems();
    if !problems.is_empty() {
        Err(problems.join("; "))
    } else if run.log.lines().any(|l| l == "guest: pingpong ok") {
        Ok(())
    } else {
        Err("rc_pingpong failed in the VM".to_string())
    }
}
