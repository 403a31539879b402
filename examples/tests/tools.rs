//! The device tools against rdma-core's C programs on the same device: `devinfo` (with `-i`,
//! `-v`, `-l`) against `ibv_devinfo`, `devices` against `ibv_devices`, and `asyncwatch` against
//! `ibv_asyncwatch` while the port's network device goes down and up.
//!
//! Every child process is bounded by a deadline and killed when it is exceeded.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdma_test_support::TestDevice;
use rdma_verbs::{Context, device::PortState};

/// How long a one-shot tool may run.
const RUN_DEADLINE: Duration = Duration::from_secs(60);
/// How long to wait for a line from a watcher, or for the port to come back.
const EVENT_DEADLINE: Duration = Duration::from_secs(30);

/// The asyncwatch test takes the port down: the tests of this file run one at a time, whatever
/// `--test-threads` says.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn rust_tool(name: &str) -> &'static str {
    match name {
        "devinfo" => env!("CARGO_BIN_EXE_devinfo"),
        "devices" => env!("CARGO_BIN_EXE_devices"),
        "asyncwatch" => env!("CARGO_BIN_EXE_asyncwatch"),
        other => panic!("no Rust tool {other}"),
    }
}

/// What a finished tool printed.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Runs `program` to completion, for [`RUN_DEADLINE`] at most (then kills it and fails).
fn run(program: &str, args: &[&str]) -> Ran {
    let what = format!("{program} {}", args.join(" "));
    let started = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout pipe")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr pipe")));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for a tool") {
            break status;
        }
        if started.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {RUN_DEADLINE:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ran {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
        elapsed: started.elapsed(),
    }
}

/// Runs `program`, which must succeed, and returns its standard output.
fn run_ok(program: &str, args: &[&str]) -> String {
    let ran = run(program, args);
    assert!(
        ran.status.success(),
        "{program} {}: {}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        ran.status,
        ran.stdout,
        ran.stderr
    );
    ran.stdout
}

/// One `key:\tvalue` line of a devinfo report.
#[derive(Debug)]
struct Field {
    value: String,
    /// The whole line, tabs included, with any flag lines that follow it.
    line: String,
}

/// The fields of a devinfo report, keyed `device/port/name` (port `-` for device fields).
///
/// Lines of five tabs and a name (capability flags) belong to the field above them; other lines
/// without a colon ("... not supported") are fields with an empty value. A name repeated in one
/// section gets a `#2`, `#3`... suffix.
fn fields(report: &str) -> BTreeMap<String, Field> {
    let mut map: BTreeMap<String, Field> = BTreeMap::new();
    let mut device = String::from("?");
    let mut port = String::from("-");
    let mut last: Option<String> = None;
    for line in report.lines() {
        let text = line.trim_start_matches('\t');
        if text.is_empty() {
            continue;
        }
        if line.starts_with("\t\t\t\t\t") {
            if let Some(field) = last.as_ref().and_then(|k| map.get_mut(k)) {
                field.line.push('\n');
                field.line.push_str(line);
                continue;
            }
        }
        let (name, value) = match text.split_once(':') {
            Some((name, value)) => (name.to_string(), value.trim().to_string()),
            None => (text.to_string(), String::new()),
        };
        if name == "hca_id" {
            device = value.clone();
            port = "-".into();
        } else if name == "port" && line.starts_with("\t\tport:") {
            port = value.clone();
        }
        let base = format!("{device}/{port}/{name}");
        let mut key = base.clone();
        let mut n = 1;
        while map.contains_key(&key) {
            n += 1;
            key = format!("{base}#{n}");
        }
        map.insert(
            key.clone(),
            Field {
                value,
                line: line.to_string(),
            },
        );
        last = Some(key);
    }
    map
}

/// Fields every report has, device and port ones.
const DEVICE_FIELDS: &[&str] = &[
    "hca_id",
    "transport",
    "node_guid",
    "sys_image_guid",
    "vendor_id",
    "vendor_part_id",
    "hw_ver",
    "phys_port_cnt",
];
const PORT_FIELDS: &[&str] = &[
    "state",
    "max_mtu",
    "active_mtu",
    "sm_lid",
    "port_lid",
    "port_lmc",
    "link_layer",
];
/// Fields `-v` adds that are checked to be present in both.
const VERBOSE_DEVICE_FIELDS: &[&str] = &[
    "max_mr_size",
    "page_size_cap",
    "max_qp",
    "max_qp_wr",
    "device_cap_flags",
    "max_sge",
    "max_cq",
    "max_cqe",
    "max_mr",
    "max_pd",
    "max_qp_rd_atom",
    "atomic_cap",
    "max_mw",
    "max_ah",
    "max_srq",
    "max_pkeys",
    "device_cap_flags_ex",
    "num_comp_vectors",
];
const VERBOSE_PORT_FIELDS: &[&str] = &[
    "max_msg_sz",
    "port_cap_flags",
    "max_vl_num",
    "pkey_tbl_len",
    "gid_tbl_len",
    "active_width",
    "active_speed",
];

/// Runs `devinfo` and `ibv_devinfo` with `args` and compares their reports: the required
/// fields must be in both, and every field both print must be the same line, tabs included.
fn compare_devinfo(device: &TestDevice, args: &[&str], verbose: bool) {
    let ours_text = run_ok(rust_tool("devinfo"), args);
    let theirs_text = run_ok("ibv_devinfo", args);
    let ours = fields(&ours_text);
    let theirs = fields(&theirs_text);
    let context = format!(
        "devinfo {}\n--- ours:\n{ours_text}\n--- ibv_devinfo:\n{theirs_text}",
        args.join(" ")
    );

    let dev = &device.name;
    let port = device.port;
    let mut required: Vec<String> = DEVICE_FIELDS
        .iter()
        .map(|name| format!("{dev}/-/{name}"))
        .collect();
    required.extend(
        PORT_FIELDS
            .iter()
            .map(|name| format!("{dev}/{port}/{name}")),
    );
    if verbose {
        required.extend(
            VERBOSE_DEVICE_FIELDS
                .iter()
                .map(|name| format!("{dev}/-/{name}")),
        );
        required.extend(
            VERBOSE_PORT_FIELDS
                .iter()
                .map(|name| format!("{dev}/{port}/{name}")),
        );
    }
    for key in &required {
        assert!(ours.contains_key(key), "devinfo lacks {key}\n{context}");
        assert!(
            theirs.contains_key(key),
            "ibv_devinfo lacks {key}\n{context}"
        );
    }
    // fw_ver is printed only when the device has one: both or neither.
    let fw = format!("{dev}/-/fw_ver");
    assert_eq!(
        ours.contains_key(&fw),
        theirs.contains_key(&fw),
        "fw_ver\n{context}"
    );
    assert_eq!(ours[&format!("{dev}/-/hca_id")].value, *dev);

    let mut compared = 0;
    for (key, field) in &ours {
        if let Some(other) = theirs.get(key) {
            assert_eq!(field.line, other.line, "field {key} differs\n{context}");
            compared += 1;
        }
    }
    assert!(compared >= required.len(), "{context}");

    if verbose {
        // The GID tables: the same entries, and at least the test's own GID.
        let gids = |map: &BTreeMap<String, Field>| -> Vec<String> {
            map.iter()
                .filter(|(k, _)| k.starts_with(&format!("{dev}/{port}/GID[")))
                .map(|(_, f)| f.line.clone())
                .collect()
        };
        let (our_gids, their_gids) = (gids(&ours), gids(&theirs));
        assert_eq!(our_gids, their_gids, "GID tables differ\n{context}");
        let wanted = format!("[{:3}]:", device.gid_index);
        assert!(
            our_gids.iter().any(|line| line.contains(&wanted)),
            "GID index {} not listed\n{context}",
            device.gid_index
        );
    }
}

#[test]
fn tools_devinfo_matches_ibv_devinfo() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let _serial = serial();
    compare_devinfo(&device, &["-d", &device.name], false);
}

#[test]
fn tools_devinfo_port_matches_ibv_devinfo() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let _serial = serial();
    let port = device.port.to_string();
    compare_devinfo(&device, &["-d", &device.name, "-i", &port], false);
    // Only the chosen port is listed.
    let ours = run_ok(rust_tool("devinfo"), &["-d", &device.name, "-i", &port]);
    let ports: Vec<&str> = ours
        .lines()
        .filter(|l| l.starts_with("\t\tport:\t"))
        .collect();
    assert_eq!(ports, [format!("\t\tport:\t{port}")], "{ours}");
}

#[test]
fn tools_devinfo_verbose_matches_ibv_devinfo() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let _serial = serial();
    compare_devinfo(&device, &["-d", &device.name, "-v"], true);
}

#[test]
fn tools_devinfo_list_matches_ibv_devinfo() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let _serial = serial();
    let ours = run_ok(rust_tool("devinfo"), &["-l"]);
    let theirs = run_ok("ibv_devinfo", &["-l"]);
    assert_eq!(ours, theirs);
    assert!(ours.contains(&format!("\n\t{}\n", device.name)), "{ours}");
}

#[test]
fn tools_devices_matches_ibv_devices() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let _serial = serial();
    let ours = run_ok(rust_tool("devices"), &[]);
    let theirs = run_ok("ibv_devices", &[]);
    assert_eq!(ours, theirs);
    let listed = ours
        .lines()
        .any(|l| l.trim_start().starts_with(device.name.as_str()));
    assert!(listed, "{} not listed:\n{ours}", device.name);
}

/// Checks a failed run: a non-zero exit, one line on stderr naming the program, in bounded
/// time.
fn assert_one_line_failure(ran: &Ran, what: &str) {
    assert!(
        !ran.status.success(),
        "{what}: succeeded\nstdout:\n{}",
        ran.stdout
    );
    let lines: Vec<&str> = ran.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: stderr:\n{}", ran.stderr);
    assert!(lines[0].starts_with("devinfo: "), "{what}: {}", lines[0]);
    assert!(
        ran.elapsed < Duration::from_secs(30),
        "{what}: took {:?}",
        ran.elapsed
    );
}

#[test]
fn tools_devinfo_unknown_device_fails() {
    let Some(_device) = rdma_test_support::device() else {
        return;
    };
    let _serial = serial();
    let ran = run(rust_tool("devinfo"), &["-d", "nosuchdev"]);
    assert_one_line_failure(&ran, "devinfo -d nosuchdev");
    assert!(ran.stderr.contains("nosuchdev"), "{}", ran.stderr);
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);
}

#[test]
fn tools_devinfo_missing_port_fails() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let _serial = serial();
    let ports = Context::open(&device.name)
        .and_then(|c| c.query_device())
        .expect("query the device")
        .phys_port_cnt;
    let missing = ports.max(8) + 1;
    let missing = missing.to_string();
    let what = format!("devinfo -d {} -i {missing}", device.name);
    let ran = run(rust_tool("devinfo"), &["-d", &device.name, "-i", &missing]);
    assert_one_line_failure(&ran, &what);
    assert!(ran.stdout.is_empty(), "{what}: stdout:\n{}", ran.stdout);
}

/// A running watcher, killed when dropped; its stdout lines arrive on a channel.
struct Watcher {
    name: String,
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Watcher {
    fn start(program: &str, device: &str) -> Self {
        let mut child = Command::new(program)
            .args(["-d", device])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let stdout = child.stdout.take().expect("stdout pipe");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            name: program.to_string(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits up to [`EVENT_DEADLINE`] for a line `wanted` accepts; fails with everything seen.
    fn expect(&mut self, wanted: impl Fn(&str) -> bool, description: &str) -> String {
        let deadline = Instant::now() + EVENT_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "{}: no line {description} within {EVENT_DEADLINE:?} (exited: {:?}); saw:\n{}",
                    self.name,
                    self.child.try_wait().ok().flatten(),
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The event lines seen so far.
    fn events(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter(|l| l.starts_with("  event_type "))
            .cloned()
            .collect()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `ip` with `args` (root in the test VM).
fn ip(args: &[&str]) -> Result<(), String> {
    let mut last = String::new();
    for program in ["ip", "/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip"] {
        match Command::new(program).args(args).status() {
            Ok(status) if status.success() => return Ok(()),
            Ok(status) => return Err(format!("ip {}: {status}", args.join(" "))),
            Err(e) => last = format!("cannot run {program}: {e}"),
        }
    }
    Err(last)
}

/// Brings the network device back up when dropped, and waits until the port is active and its
/// GID is back, so that the tests after this one find the device as they expect.
struct LinkRestore {
    netdev: String,
    context: Context,
    device: TestDevice,
}

impl LinkRestore {
    fn ready(&self) -> bool {
        let active = self
            .context
            .query_port(self.device.port)
            .is_ok_and(|p| p.state == PortState::Active);
        let gid_back = self.context.gid_table().is_ok_and(|table| {
            table
                .iter()
                .any(|e| e.port == u32::from(self.device.port) && e.gid.0 == self.device.gid)
        });
        active && gid_back
    }
}

impl Drop for LinkRestore {
    fn drop(&mut self) {
        if let Err(e) = ip(&["link", "set", &self.netdev, "up"]) {
            eprintln!("could not bring {} back up: {e}", self.netdev);
        }
        let deadline = Instant::now() + EVENT_DEADLINE;
        while !self.ready() {
            if Instant::now() > deadline {
                eprintln!(
                    "port {} of {} not active with its GID {EVENT_DEADLINE:?} after {} came up",
                    self.device.port, self.device.name, self.netdev
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn tools_asyncwatch_reports_port_events() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let _serial = serial();
    let context = Context::open(&device.name).expect("open the device");
    let gid = context
        .query_gid(device.port, device.gid_index)
        .expect("query the test GID");
    let Some(netdev) = gid.netdev() else {
        panic!(
            "GID {} of {} port {} has no network device to take down",
            device.gid_index, device.name, device.port
        );
    };

    let mut ours = Watcher::start(rust_tool("asyncwatch"), &device.name);
    let mut theirs = Watcher::start("ibv_asyncwatch", &device.name);
    let prefix = format!("{}: async event FD ", device.name);
    for watcher in [&mut ours, &mut theirs] {
        let first = watcher.expect(|l| l.starts_with(&prefix), "naming the device and its FD");
        let fd = &first[prefix.len()..];
        assert!(fd.parse::<u32>().is_ok(), "{}: {first}", watcher.name);
    }

    let port_err = format!("  event_type IBV_EVENT_PORT_ERR (10), port {}", device.port);
    let port_active = format!(
        "  event_type IBV_EVENT_PORT_ACTIVE (9), port {}",
        device.port
    );
    {
        // From here on the link is restored whatever happens.
        let _restore = LinkRestore {
            netdev: netdev.clone(),
            context: context.clone(),
            device: device.clone(),
        };
        ip(&["link", "set", &netdev, "down"]).expect("take the link down");
        for watcher in [&mut ours, &mut theirs] {
            watcher.expect(|l| l == port_err, &port_err);
        }
        ip(&["link", "set", &netdev, "up"]).expect("bring the link up");
        for watcher in [&mut ours, &mut theirs] {
            watcher.expect(|l| l == port_active, &port_active);
        }
    }
    assert_eq!(
        context.query_port(device.port).map(|p| p.state).ok(),
        Some(PortState::Active),
        "port not active again"
    );
    assert_eq!(
        ours.events(),
        theirs.events(),
        "asyncwatch and ibv_asyncwatch saw different events"
    );
    let ours_events = ours.events();
    let err_at = ours_events.iter().position(|l| *l == port_err);
    let active_at = ours_events.iter().rposition(|l| *l == port_active);
    assert!(
        matches!((err_at, active_at), (Some(e), Some(a)) if e < a),
        "{ours_events:?}"
    );
}
