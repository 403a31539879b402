//! Between hosts: RDMA WRITE, READ and atomics from one node to another, and what loss, delay,
//! reordering and a link going down do to them. Run by `cargo xtask test --nodes 2` (one VM per
//! node, rxe on a virtio NIC, one virtual Ethernet segment between them); see
//! `docs/test-harness.md`. Every test runs on both nodes: node 0 is the target, node 1 the
//! initiator, and they meet at barriers of `rdma_test_support::Cluster`.
//!
//! Everything posted here goes through the safe owned-buffer path.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rdma_test_support::Cluster;
use rdma_test_support::verbs::*;
use rdma_verbs::{ah::*, cq::*, device::*, mr::*, owned::*, qp::*, wr::*};

/// The bound of every completion wait here: the link is lossy in some tests, and both VMs run
/// under emulation on two cores.
const BOUND: Duration = Duration::from_secs(120);

/// Node 0 registers memory and checks what landed in it; node 1 posts.
const TARGET: usize = 0;
const INITIATOR: usize = 1;

fn setup() -> Option<(Fixture, Cluster)> {
    let f = fixture()?;
    let c = rdma_test_support::cluster()?;
    assert!(c.node() < 2, "these tests use nodes 0 and 1");
    Some((f, c))
}

/// Byte `i` of a transfer of `seed`: depends on the position within the page and on the page,
/// so that a misplaced or repeated page shows.
fn byte(seed: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(31) ^ ((i / 4096) as u8).wrapping_add(seed)
}

fn fill(seed: u8, offset: usize, out: &mut [u8]) {
    for (k, b) in out.iter_mut().enumerate() {
        *b = byte(seed, offset + k);
    }
}

/// Checks `got` (which starts at `offset` of a transfer of `seed`); names the first wrong byte
/// and how many are wrong.
fn check(what: &str, seed: u8, offset: usize, got: &[u8]) {
    let wrong = got
        .iter()
        .enumerate()
        .filter(|&(k, &b)| b != byte(seed, offset + k))
        .count();
    if let Some((k, &b)) = got
        .iter()
        .enumerate()
        .find(|&(k, &b)| b != byte(seed, offset + k))
    {
        panic!(
            "{what}: byte {} is {b:#04x}, expected {:#04x}; {wrong} of {} bytes wrong",
            offset + k,
            byte(seed, offset + k),
            got.len()
        );
    }
}

/// Completions of `cq` until `want` arrived; fails after [`BOUND`].
fn reap_within(cq: &mut CompletionQueue, want: usize, what: &str) -> Vec<Completion> {
    rdma_test_support::verbs::reap_within(cq, want, BOUND, what)
}

/// This node's queue pair number, first PSN and GID, as published for the peer.
fn endpoint(qpn: u32, psn: u32, gid: [u8; 16]) -> String {
    let hex: String = gid.iter().map(|b| format!("{b:02x}")).collect();
    format!("{qpn} {psn} {hex}")
}

fn parse_endpoint(text: &str) -> (u32, u32, Gid) {
    let mut words = text.split_whitespace();
    let qpn = words.next().and_then(|w| w.parse().ok()).expect("qpn");
    let psn = words.next().and_then(|w| w.parse().ok()).expect("psn");
    let hex = words.next().expect("gid");
    let mut gid = [0u8; 16];
    for (k, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * k..2 * k + 2], 16).expect("gid hex");
    }
    (qpn, psn, Gid(gid))
}

fn remote_text(remote: RemoteMemory) -> String {
    format!("{} {} {}", remote.addr, remote.len, remote.rkey)
}

fn parse_remote(text: &str) -> RemoteMemory {
    let words: Vec<u64> = text
        .split_whitespace()
        .map(|w| w.parse().expect("number"))
        .collect();
    RemoteMemory {
        addr: words[0],
        len: words[1] as u32,
        rkey: words[2] as u32,
    }
}

/// Connects `qp` (RC, in RESET) to the same-named queue pair of the other node: INIT with
/// `access`, publishes this side's endpoint, RTR to the peer's (`rd_atomic` reads and atomics
/// may be outstanding in each direction), RTS with `rts`; then waits until both sides are in
/// RTS.
fn connect(
    f: &Fixture,
    c: &Cluster,
    qp: QueuePair<Rc, Reset>,
    access: AccessFlags,
    rd_atomic: u8,
    mut rts: RcRtsAttr,
) -> QueuePair<Rc, Rts> {
    let psn = 0x1000 + c.node() as u32 * 0x100;
    let qp = qp
        .into_init(&ConnectedInitAttr::new(f.device.port).access(access))
        .expect("INIT");
    c.publish("endpoint", &endpoint(qp.qp_num(), psn, f.device.gid));
    let (peer_qpn, peer_psn, peer_gid) = parse_endpoint(&c.fetch(c.peer(), "endpoint"));
    let peer_ip = peer_gid.ipv4().map(IpAddr::V4);
    assert_eq!(
        peer_ip,
        Some(c.addr(c.peer())),
        "the peer's GID is its address on the segment"
    );
    let av = AddressVector::new(f.device.port).grh(peer_gid, f.device.gid_index as u8);
    // The path's far end is the peer's interface: libibverbs resolves its MAC through the
    // neighbour table, as the peer's sysfs names it.
    let netdev = f
        .context
        .query_gid(f.device.port, f.device.gid_index)
        .expect("the GID entry")
        .netdev()
        .expect("a RoCE GID's interface");
    let own_mac = std::fs::read_to_string(format!("/sys/class/net/{netdev}/address"))
        .expect("the interface's MAC");
    let macs = c.exchange("mac", own_mac.trim());
    let l2 = f
        .context
        .resolve_eth_l2(&av)
        .expect("ibv_resolve_eth_l2_from_gid");
    let resolved = l2
        .mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    assert_eq!(resolved, macs[c.peer()], "the peer's MAC");
    assert_eq!(l2.vlan, None, "no VLAN on the segment");
    let mut rtr = RcRtrAttr::new(av, peer_qpn, peer_psn);
    rtr.max_dest_rd_atomic = rd_atomic;
    rts.sq_psn = psn;
    rts.max_rd_atomic = rd_atomic;
    let qp = qp.into_rtr(&rtr).expect("RTR").into_rts(&rts).expect("RTS");
    c.barrier("connected");
    qp
}

/// A counter of this node's rxe device (`/sys/class/infiniband/DEV/ports/1/hw_counters/NAME`).
fn hw_counter(f: &Fixture, name: &str) -> u64 {
    let path = format!(
        "/sys/class/infiniband/{}/ports/{}/hw_counters/{name}",
        f.device.name, f.device.port
    );
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .parse()
        .expect("a counter")
}

/// RDMA WRITE, READ, fetch-and-add and compare-and-swap from node 1 into node 0's memory: every
/// byte written is checked on node 0, every byte read on node 1, and each atomic's old value.
#[test]
fn rc_write_read_and_atomics_between_hosts() {
    let Some((f, c)) = setup() else { return };
    const HALF: usize = 64 * 1024;
    let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let mut cq = f.cq(64);
    let qp = f.pd.qp_builder(&cq, &cq).build().expect("create QP");
    if c.node() == TARGET {
        let mut region =
            f.pd.register(2 * HALF + 8, AccessFlags::LOCAL_WRITE | rights)
                .unwrap();
        let mut second = vec![0u8; HALF];
        fill(2, HALF, &mut second);
        region.write_at(HALF, &second).unwrap();
        region.write_at(2 * HALF, &1000u64.to_ne_bytes()).unwrap();
        c.publish("region", &remote_text(region.remote(..).unwrap()));
        let _qp = connect(&f, &c, qp, rights, 1, RcRtsAttr::new(0));
        c.barrier("done");
        let mut first = vec![0u8; HALF];
        region.read_at(0, &mut first).unwrap();
        check("node 0: what node 1 wrote", 1, 0, &first);
        assert_eq!(
            region.load_u64(2 * HALF).unwrap(),
            77,
            "node 0: the counter after FAA +5 and a CAS 1005 -> 77"
        );
        c.barrier("checked");
    } else {
        let mut qp = connect(&f, &c, qp, AccessFlags::empty(), 1, RcRtsAttr::new(0));
        let region = parse_remote(&c.fetch(TARGET, "region"));
        assert_eq!(region.len as usize, 2 * HALF + 8);
        let pool = BufferPool::new(&f.pd, 4, HALF).unwrap();
        let mut out = pool.take().unwrap();
        out.set_len(HALF).unwrap();
        fill(1, 0, &mut out);
        qp.post_send_owned(SendRequest::write(out, region.slice(0, HALF as u32).unwrap()).tag(1))
            .unwrap();
        let mut back = pool.take().unwrap();
        back.set_len(HALF).unwrap();
        qp.post_send_owned(
            SendRequest::read(back, region.slice(HALF as u32, HALF as u32).unwrap()).tag(2),
        )
        .unwrap();
        let mut done = reap_within(&mut cq, 2, "WRITE and READ").into_iter();
        let write = done.next().unwrap();
        assert_eq!(
            (write.tag(), write.status(), write.wc().opcode()),
            (Some(1), WcStatus::Success, WcOpcode::RdmaWrite)
        );
        let mut read = done.next().unwrap();
        assert_eq!(
            (read.tag(), read.status(), read.wc().opcode()),
            (Some(2), WcStatus::Success, WcOpcode::RdmaRead)
        );
        check(
            "node 1: what it read from node 0",
            2,
            HALF,
            &read.take_buf().unwrap(),
        );
        drop((write, read));
        let word = region.slice(2 * HALF as u32, 8).unwrap();
        let mut old = Vec::new();
        for (tag, opcode, request) in [
            (
                3,
                WcOpcode::FetchAdd,
                SendRequest::fetch_add(pool.take().unwrap(), word, 5),
            ),
            (
                4,
                WcOpcode::CompSwap,
                SendRequest::compare_swap(pool.take().unwrap(), word, 1005, 77),
            ),
            (
                5,
                WcOpcode::CompSwap,
                SendRequest::compare_swap(pool.take().unwrap(), word, 1005, 9),
            ),
        ] {
            qp.post_send_owned(request.tag(tag)).unwrap();
            let mut done = reap_within(&mut cq, 1, "an atomic").remove(0);
            assert_eq!(
                (done.tag(), done.status(), done.wc().opcode()),
                (Some(tag), WcStatus::Success, opcode),
                "{:?}",
                done.wc()
            );
            let buf = done.take_buf().unwrap();
            old.push(u64::from_ne_bytes(buf[..8].try_into().unwrap()));
        }
        assert_eq!(
            old,
            [1000, 1005, 77],
            "old values: FAA +5 on 1000, CAS 1005 -> 77 (swaps), CAS 1005 -> 9 (does not)"
        );
        c.barrier("done");
        c.barrier("checked");
    }
}

/// A multi-MiB RC transfer over a link with loss, delay and reordering in both directions (data
/// and acknowledgements): every byte arrives intact, because RC retransmits. Node 1 writes 4 MiB
/// into node 0 and reads it back; node 0 checks what was written, node 1 what it read. Each
/// side's netem must have dropped packets, and node 1's device must have retransmitted.
#[test]
fn rc_transfer_survives_loss_delay_and_reordering() {
    let Some((f, c)) = setup() else { return };
    const SIZE: usize = 4 << 20;
    const CHUNK: usize = 64 * 1024;
    const DEPTH: usize = 16;
    let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut cq = f.cq(64);
    let qp =
        f.pd.qp_builder(&cq, &cq)
            .max_send_wr(DEPTH as u32)
            .build()
            .expect("create QP");
    if c.node() == TARGET {
        let region =
            f.pd.register(SIZE, AccessFlags::LOCAL_WRITE | rights)
                .unwrap();
        c.publish("region", &remote_text(region.remote(..).unwrap()));
        let _qp = connect(&f, &c, qp, rights, DEPTH as u8, RcRtsAttr::new(0));
        // Acknowledgements and READ responses leave from here.
        let netem = c.netem("loss 2% delay 1ms");
        c.barrier("lossy");
        c.barrier("done");
        let dropped = netem.dropped();
        drop(netem);
        let mut written = vec![0u8; SIZE];
        region.read_at(0, &mut written).unwrap();
        check("node 0: the 4 MiB node 1 wrote", 7, 0, &written);
        assert!(dropped > 0, "node 0's netem dropped nothing");
        note(&format!("node 0: netem dropped {dropped} packets"));
        c.barrier("checked");
    } else {
        let mut qp = connect(
            &f,
            &c,
            qp,
            AccessFlags::empty(),
            DEPTH as u8,
            RcRtsAttr::new(0),
        );
        let region = parse_remote(&c.fetch(TARGET, "region"));
        let netem = c.netem("loss 3% delay 2ms reorder 25% 50%");
        c.barrier("lossy");
        let retried = hw_counter(&f, "completer_retry_err") + hw_counter(&f, "rcvd_seq_err");
        let started = Instant::now();
        let pool = BufferPool::new(&f.pd, DEPTH, CHUNK).unwrap();
        let chunks = SIZE / CHUNK;
        // Writes: up to DEPTH in flight, each chunk's own pattern slice.
        let (mut posted, mut completed) = (0, 0);
        while completed < chunks {
            while posted < chunks && posted - completed < DEPTH {
                let mut buf = pool.take().expect("a free buffer");
                buf.set_len(CHUNK).unwrap();
                fill(7, posted * CHUNK, &mut buf);
                let at = region.slice((posted * CHUNK) as u32, CHUNK as u32).unwrap();
                qp.post_send_owned(SendRequest::write(buf, at).tag(posted as u64))
                    .unwrap();
                posted += 1;
            }
            for done in reap_within(&mut cq, 1, "a WRITE under loss") {
                assert_eq!(
                    (done.tag(), done.status(), done.wc().opcode()),
                    (
                        Some(completed as u64),
                        WcStatus::Success,
                        WcOpcode::RdmaWrite
                    ),
                    "write {completed}"
                );
                completed += 1;
            }
        }
        let wrote = started.elapsed();
        // Reads of the same 4 MiB back, DEPTH in flight.
        let (mut posted, mut completed) = (0, 0);
        while completed < chunks {
            while posted < chunks && posted - completed < DEPTH {
                let mut buf = pool.take().expect("a free buffer");
                buf.set_len(CHUNK).unwrap();
                let at = region.slice((posted * CHUNK) as u32, CHUNK as u32).unwrap();
                qp.post_send_owned(SendRequest::read(buf, at).tag(posted as u64))
                    .unwrap();
                posted += 1;
            }
            for mut done in reap_within(&mut cq, 1, "a READ under loss") {
                assert_eq!(
                    (done.tag(), done.status(), done.wc().opcode()),
                    (
                        Some(completed as u64),
                        WcStatus::Success,
                        WcOpcode::RdmaRead
                    ),
                    "read {completed}"
                );
                let buf = done.take_buf().unwrap();
                check(
                    &format!("node 1: chunk {completed} read back"),
                    7,
                    completed * CHUNK,
                    &buf,
                );
                completed += 1;
            }
        }
        let total = started.elapsed();
        let dropped = netem.dropped();
        drop(netem);
        let retries =
            hw_counter(&f, "completer_retry_err") + hw_counter(&f, "rcvd_seq_err") - retried;
        note(&format!(
            "node 1: 4 MiB written in {:.1} s, read back in {:.1} s; netem dropped {dropped} \
             packets; {retries} retransmission events (completer_retry_err + rcvd_seq_err)",
            wrote.as_secs_f64(),
            (total - wrote).as_secs_f64()
        ));
        assert!(dropped > 0, "node 1's netem dropped nothing");
        assert!(retries > 0, "node 1's device never retransmitted");
        c.barrier("done");
        c.barrier("checked");
    }
}

/// The target's link goes down in the middle of a stream of writes: the initiator's next write
/// fails with exactly `RetryExcErr` within a bound (retry count 3), the queue pair is in ERR
/// and the requests behind it are flushed; the writes completed before landed intact.
///
/// What this shows about RC: `RetryExcErr` says the requester gave up, not that the write did
/// not happen. The target's queue pair never learns of the failure and stays in RTS; packets
/// held while its link was down (here in the host's socket buffer under QEMU, on a real
/// network in a switch queue) can still reach it when the link returns, and it executes them.
/// So the failed writes go to a chunk of their own, which is not checked; the run notes
/// whether they landed.
#[test]
fn rc_link_down_ends_in_retry_exceeded() {
    let Some((f, c)) = setup() else { return };
    const CHUNK: usize = 16 * 1024;
    const BEFORE: usize = 8;
    let rights = AccessFlags::REMOTE_WRITE;
    let mut cq = f.cq(64);
    let qp = f.pd.qp_builder(&cq, &cq).build().expect("create QP");
    if c.node() == TARGET {
        let region =
            f.pd.register((BEFORE + 1) * CHUNK, AccessFlags::LOCAL_WRITE | rights)
                .unwrap();
        c.publish("region", &remote_text(region.remote(..).unwrap()));
        let qp = connect(&f, &c, qp, rights, 1, RcRtsAttr::new(0));
        c.barrier("flowing");
        let down = c.link_down();
        c.barrier("down");
        c.barrier("failed");
        down.restore();
        let mut written = vec![0u8; BEFORE * CHUNK];
        region.read_at(0, &mut written).unwrap();
        check(
            "node 0: the writes before the link went down",
            9,
            0,
            &written,
        );
        // Give whatever was held while the link was down a moment to arrive.
        std::thread::sleep(Duration::from_secs(2));
        let mut late = vec![0u8; CHUNK];
        region.read_at(BEFORE * CHUNK, &mut late).unwrap();
        let landed = (0..CHUNK).all(|k| late[k] == byte(10, k));
        note(&format!(
            "node 0: its queue pair is {:?}; the write that failed with RetryExcErr on node 1 \
             {} after the link came back",
            qp.query_state().unwrap(),
            if landed { "landed" } else { "did not land" }
        ));
        assert_eq!(
            qp.query_state().unwrap(),
            QpStateKind::Rts,
            "the target never learns of the initiator's failure"
        );
        c.barrier("checked");
    } else {
        let mut rts = RcRtsAttr::new(0);
        rts.retry_cnt = 3;
        let mut qp = connect(&f, &c, qp, AccessFlags::empty(), 1, rts);
        let region = parse_remote(&c.fetch(TARGET, "region"));
        let pool = BufferPool::new(&f.pd, 8, CHUNK).unwrap();
        for k in 0..BEFORE {
            let mut buf = pool.take().unwrap();
            buf.set_len(CHUNK).unwrap();
            fill(9, k * CHUNK, &mut buf);
            let at = region.slice((k * CHUNK) as u32, CHUNK as u32).unwrap();
            qp.post_send_owned(SendRequest::write(buf, at).tag(k as u64))
                .unwrap();
            let done = reap_within(&mut cq, 1, "a write before the link went down");
            assert_eq!(done[0].status(), WcStatus::Success);
        }
        c.barrier("flowing");
        c.barrier("down");
        // Three more writes into a link that is down: the first exhausts its retries, the
        // others are flushed.
        let started = Instant::now();
        for k in 0..3u64 {
            let mut buf = pool.take().unwrap();
            buf.set_len(CHUNK).unwrap();
            fill(10, 0, &mut buf);
            let at = region.slice((BEFORE * CHUNK) as u32, CHUNK as u32).unwrap();
            qp.post_send_owned(SendRequest::write(buf, at).tag(100 + k))
                .unwrap();
        }
        let done = reap_within(&mut cq, 3, "writes into a dead link");
        let elapsed = started.elapsed();
        let got: Vec<(Option<u64>, WcStatus)> =
            done.iter().map(|d| (d.tag(), d.status())).collect();
        assert_eq!(
            got,
            [
                (Some(100), WcStatus::RetryExcErr),
                (Some(101), WcStatus::WrFlushErr),
                (Some(102), WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(qp.query_state().unwrap(), QpStateKind::Error);
        drop(done);
        assert_eq!(pool.available(), 8, "every buffer came back");
        note(&format!(
            "node 1: RetryExcErr {:.2} s after the link went down (timeout 14, retry count 3)",
            elapsed.as_secs_f64()
        ));
        c.barrier("failed");
        c.barrier("checked");
    }
}

/// UD datagrams through 5 % loss: each one arrives whole and intact or not at all. Node 1 sends
/// 1000 numbered datagrams of 1000 bytes; node 0 checks the bytes and the sender of every one it
/// received, sees no number twice, and misses at least as many as node 1's netem dropped.
#[test]
fn ud_under_loss_loses_whole_datagrams_only() {
    let Some((f, c)) = setup() else { return };
    const QKEY: u32 = 0x1111_2222;
    const COUNT: usize = 1000;
    const SIZE: usize = 1000;
    let mut cq = f.cq(2048);
    let mut qp = f.ud_qp(
        f.pd.qp_builder(&cq, &cq)
            .max_recv_wr(COUNT as u32)
            .max_send_wr(64),
        QKEY,
    );
    c.publish("endpoint", &endpoint(qp.qp_num(), 0, f.device.gid));
    let (peer_qpn, _, peer_gid) = parse_endpoint(&c.fetch(c.peer(), "endpoint"));
    if c.node() == TARGET {
        let pool = BufferPool::new(&f.pd, COUNT, GRH_LEN + SIZE).unwrap();
        let mut list = OwnedRecvList::with_capacity(COUNT);
        for k in 0..COUNT {
            list.push(pool.take().unwrap(), k as u64).unwrap();
        }
        qp.post_recv_list(&mut list).unwrap();
        c.barrier("receiving");
        c.barrier("sent");
        let dropped: usize = c.fetch(INITIATOR, "dropped").parse().unwrap();
        // Whatever still comes arrives within a few seconds of the last send.
        let mut seen = vec![false; COUNT];
        let mut received = 0;
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < Duration::from_secs(5) {
            let n = cq
                .poll_each(64, |mut done| {
                    assert_eq!(done.status(), WcStatus::Success, "{:?}", done.wc());
                    assert_eq!(done.wc().opcode(), WcOpcode::Recv);
                    assert_eq!(done.wc().src_qp(), peer_qpn, "the sender");
                    let buf = done.take_buf().unwrap();
                    assert_eq!(buf.len(), GRH_LEN + SIZE, "a whole datagram");
                    assert_eq!(
                        &buf[32..36],
                        &peer_gid.ipv4().unwrap().octets(),
                        "the IPv4 source in the GRH"
                    );
                    let data = &buf[GRH_LEN..];
                    let number = u32::from_ne_bytes(data[..4].try_into().unwrap()) as usize;
                    assert!(number < COUNT, "datagram number {number}");
                    assert!(!seen[number], "datagram {number} arrived twice");
                    seen[number] = true;
                    check(&format!("datagram {number}"), number as u8, 4, &data[4..]);
                    received += 1;
                })
                .unwrap();
            if n > 0 {
                quiet_since = Instant::now();
            }
        }
        note(&format!(
            "node 0: {received} of {COUNT} datagrams arrived intact; node 1's netem dropped \
             {dropped}"
        ));
        assert!(dropped > 0, "node 1's netem dropped nothing");
        // netem sees RoCE packets only, one per datagram: exactly the dropped ones are missing
        // (a datagram lost anywhere else, or delivered twice, fails this).
        assert_eq!(
            received,
            COUNT - dropped,
            "{received} of {COUNT} arrived, netem dropped {dropped}"
        );
        assert_eq!(seen.iter().filter(|&&s| !s).count(), dropped);
        c.barrier("checked");
    } else {
        let ah = f
            .pd
            .create_ah(&AddressVector::new(f.device.port).grh(peer_gid, f.device.gid_index as u8))
            .unwrap();
        let pool = BufferPool::new(&f.pd, 32, SIZE).unwrap();
        c.barrier("receiving");
        let netem = c.netem("loss 5%");
        let mut completed = 0;
        for number in 0..COUNT {
            // Paced by the send completions: at most 32 in flight.
            while pool.available() == 0 {
                for done in reap_within(&mut cq, 1, "a UD send") {
                    assert_eq!(done.status(), WcStatus::Success, "{:?}", done.wc());
                    completed += 1;
                }
            }
            let mut buf = pool.take().unwrap();
            buf.set_len(SIZE).unwrap();
            buf[..4].copy_from_slice(&(number as u32).to_ne_bytes());
            fill(number as u8, 4, &mut buf[4..]);
            qp.post_send_owned(
                SendRequest::send(buf)
                    .to(&ah, peer_qpn, QKEY)
                    .tag(number as u64),
            )
            .unwrap();
        }
        for done in reap_within(&mut cq, COUNT - completed, "the last UD sends") {
            assert_eq!(done.status(), WcStatus::Success, "{:?}", done.wc());
        }
        // Let netem's queue drain before counting.
        std::thread::sleep(Duration::from_millis(500));
        let dropped = netem.dropped();
        drop(netem);
        c.publish("dropped", &dropped.to_string());
        c.barrier("sent");
        c.barrier("checked");
    }
}
