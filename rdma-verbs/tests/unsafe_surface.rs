//! The edges of the safe API where the device, a peer or the provider meets Rust memory:
//! remotely writable regions copied while a peer writes them, `load_u64`'s access check,
//! address handles of another protection domain, context or device, and completion channels
//! whose descriptor safe code made blocking.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use rdma_test_support::verbs::*;
use rdma_verbs::{ah::*, channel::*, cq::*, device::*, mr::*, qp::*, scope::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;
const TARGET: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);
const QKEY: u32 = 0x1111_1111;

// ---------------------------------------------------------------------------------------------
// Remotely writable regions
// ---------------------------------------------------------------------------------------------

#[test]
fn read_at_while_a_peer_writes_then_every_byte_after_completion() {
    let Some(f) = fixture() else { return };
    const SIZE: usize = 64 * 1024;
    const ROUNDS: u8 = 8;
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let mut src = f.pd.register(SIZE, LOCAL).unwrap();
    let target = f.pd.register(SIZE, TARGET).unwrap();
    assert!(matches!(target.as_slice(), Err(Error::RemotelyWritable)));
    let remote = target.remote(..).unwrap();

    let stop = AtomicBool::new(false);
    let reads = AtomicUsize::new(0);
    std::thread::scope(|threads| {
        // The local side copies the region in a loop, at an odd offset and length (so that both
        // the byte-wise head and tail and the word-wise middle run), while the peer writes it.
        let reader = threads.spawn(|| {
            let mut buf = vec![0u8; SIZE - 5];
            while !stop.load(Ordering::Relaxed) {
                target.read_at(3, &mut buf).unwrap();
                reads.fetch_add(1, Ordering::Relaxed);
            }
        });
        // The reader is copying before the first write is posted: an event, not a delay.
        while reads.load(Ordering::Relaxed) == 0 {
            assert!(!reader.is_finished(), "the reader stopped");
            std::thread::yield_now();
        }
        for round in 1..=ROUNDS {
            let data = pattern(SIZE, round.wrapping_mul(37));
            src.as_mut_slice().unwrap().copy_from_slice(&data);
            let before = reads.load(Ordering::Relaxed);
            write(&mut a, u64::from(round), &src, remote);
            assert_ok(
                &wait_for(&mut cq_a, 1)[0],
                u64::from(round),
                WcOpcode::RdmaWrite,
            );
            // The write has completed (RC: acknowledged, so placed): every byte is the new one,
            // read whole, at an unaligned offset, and in odd pieces.
            let mut whole = vec![0u8; SIZE];
            target.read_at(0, &mut whole).unwrap();
            assert_eq!(whole, data, "round {round}: the whole region");
            let mut piece = vec![0u8; SIZE - 11];
            target.read_at(7, &mut piece).unwrap();
            assert_eq!(&piece[..], &data[7..SIZE - 4], "round {round}: bytes 7..");
            for (offset, len) in [(1, 1), (5, 3), (8, 8), (13, 29), (SIZE - 9, 9)] {
                let mut small = vec![0u8; len];
                target.read_at(offset, &mut small).unwrap();
                assert_eq!(&small[..], &data[offset..offset + len], "round {round}");
            }
            note_progress(round, reads.load(Ordering::Relaxed) - before);
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().expect("the reader panicked");
    });
    assert!(reads.load(Ordering::Relaxed) > 0);
}

fn note_progress(round: u8, reads: usize) {
    if round == 1 {
        note(&format!(
            "{reads} concurrent read_at copies during the first write"
        ));
    }
}

#[test]
fn write_at_then_peer_read_and_load_u64_on_a_remotely_writable_region() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    );
    const SIZE: usize = 4096;
    let mut exposed =
        f.pd.register(SIZE, TARGET | AccessFlags::REMOTE_READ)
            .unwrap();
    // Written through atomic stores at unaligned offsets, then read by the device.
    let data = pattern(SIZE, 91);
    exposed.write_at(0, &data[..5]).unwrap();
    exposed.write_at(5, &data[5..4001]).unwrap();
    exposed.write_at(4001, &data[4001..]).unwrap();
    let copy = f.pd.register(SIZE, LOCAL).unwrap();
    // SAFETY: `copy` and `exposed` stay registered and untouched until the completion below.
    unsafe {
        a.post_send_one(
            &SendRequest::read(copy.slice(..).unwrap(), exposed.remote(..).unwrap()).tag(1),
        )
        .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 1, WcOpcode::RdmaRead);
    assert_eq!(copy.as_slice().unwrap(), &data[..]);

    // load_u64 reads the words write_at stored.
    let word = u64::from_ne_bytes(data[16..24].try_into().unwrap());
    assert_eq!(exposed.load_u64(16).unwrap(), word);
    exposed
        .write_at(24, &0x0123_4567_89ab_cdefu64.to_ne_bytes())
        .unwrap();
    assert_eq!(exposed.load_u64(24).unwrap(), 0x0123_4567_89ab_cdef);
    assert!(matches!(
        exposed.load_u64(4),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        exposed.load_u64(SIZE - 8 + 8),
        Err(Error::InvalidArgument(_))
    ));
    drop(copy);
}

#[test]
fn load_u64_refuses_a_region_without_local_write() {
    let Some(f) = fixture() else { return };
    for access in [AccessFlags::empty(), AccessFlags::REMOTE_READ] {
        let mut mr = f.pd.register(64, access).unwrap();
        mr.as_mut_slice().unwrap()[8..16].copy_from_slice(&7u64.to_ne_bytes());
        match mr.load_u64(8) {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains("LOCAL_WRITE"), "{message}")
            }
            other => panic!("load_u64 on a region with {access:?}: {other:?}"),
        }
        // The read-only way to the same word.
        let mut word = [0u8; 8];
        mr.read_at(8, &mut word).unwrap();
        assert_eq!(u64::from_ne_bytes(word), 7);
    }
    let mut mr = f.pd.register(64, LOCAL).unwrap();
    mr.as_mut_slice().unwrap()[8..16].copy_from_slice(&7u64.to_ne_bytes());
    assert_eq!(mr.load_u64(8).unwrap(), 7);
}

// ---------------------------------------------------------------------------------------------
// Address handles of another protection domain, context or device
// ---------------------------------------------------------------------------------------------

/// Shows that `refused` posted nothing on `a`: a good datagram (wr_id 100) posted after the
/// refusals is the first and only send completion, and the first and only datagram `b`
/// receives.
fn assert_only_the_good_datagram_arrives(
    (a, cq_a): (&mut QueuePair<Ud, Rts>, &mut CompletionQueue),
    (b, cq_b): (&QueuePair<Ud, Rts>, &mut CompletionQueue),
    good: &AddressHandle,
    src: &MemoryRegion,
) {
    // SAFETY: `src` stays registered and unchanged until the completion is polled below.
    unsafe {
        a.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(100).to(
            good,
            b.qp_num(),
            QKEY,
        ))
        .unwrap();
    }
    assert_ok(&wait_for(cq_a, 1)[0], 100, WcOpcode::Send);
    let wc = wait_for(cq_b, 1)[0];
    assert_ok(&wc, 7, WcOpcode::Recv);
    assert_eq!(wc.byte_len() as usize, GRH_LEN + src.len(), "{wc:?}");
    assert_eq!(wc.src_qp(), a.qp_num());
    assert_cq_empty(cq_a);
    assert_cq_empty(cq_b);
}

#[test]
fn address_handle_of_another_pd_or_context_is_refused_and_nothing_is_posted() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut a = f.ud_qp(f.pd.qp_builder(&cq_a, &cq_a), QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b), QKEY);
    let good = f.pd.create_ah(&f.av()).unwrap();
    // Another protection domain of the same context...
    let other_pd = f.context.alloc_pd().unwrap();
    let same_context = other_pd.create_ah(&f.av()).unwrap();
    // ... and one of another context on the same device.
    let context2 = Context::open(&f.device.name).unwrap();
    let pd2 = context2.alloc_pd().unwrap();
    let other_context = pd2.create_ah(&f.av()).unwrap();

    let mut src = f.pd.register(64, LOCAL).unwrap();
    src.as_mut_slice().unwrap().copy_from_slice(&pattern(64, 3));
    let dst = f.pd.register(64 + GRH_LEN, LOCAL).unwrap();
    // SAFETY: `dst` stays registered and unread until the receive completes below.
    unsafe {
        b.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(7))
            .unwrap()
    };

    for (what, bad) in [
        ("another PD", &same_context),
        ("another context", &other_context),
    ] {
        let request = SendRequest::send(src.slice(..).unwrap())
            .tag(1)
            .to(bad, b.qp_num(), QKEY);
        // SAFETY: refused before anything is posted (asserted); `src` outlives the call.
        let one = unsafe { a.post_send_one(&request) };
        assert!(
            matches!(one, Err(Error::InvalidArgument(_))),
            "post_send_one, {what}: {one:?}"
        );
        // In a list: alone, and after a good request (nothing of the list is posted).
        let good_request =
            SendRequest::send(src.slice(..).unwrap())
                .tag(2)
                .to(&good, b.qp_num(), QKEY);
        for requests in [vec![request], vec![good_request, request]] {
            let mut list = SendList::with_capacity(2);
            for r in requests {
                list.push(r).unwrap();
            }
            // SAFETY: as above.
            let posted = unsafe { a.post_send(&mut list) };
            assert!(
                matches!(posted, Err(Error::InvalidArgument(_))),
                "post_send, {what}: {posted:?}"
            );
        }
        // Through a scope, which posts the same way.
        let scoped = a.scope(ScopeCqs::shared(&mut cq_a), |s| {
            s.send(
                SendRequest::send(src.slice(..).unwrap())
                    .tag(3)
                    .to(bad, b.qp_num(), QKEY),
            )
        });
        assert!(
            matches!(scoped, Ok(Err(Error::InvalidArgument(_)))),
            "scope, {what}: {scoped:?}"
        );
    }
    assert_eq!(a.query_state().unwrap(), QpStateKind::Rts);
    assert_only_the_good_datagram_arrives((&mut a, &mut cq_a), (&b, &mut cq_b), &good, &src);
    let received = dst.as_slice().unwrap();
    assert_eq!(&received[GRH_LEN..], &pattern(64, 3)[..]);
}

#[test]
fn address_handle_of_another_device_is_refused() {
    let Some(f) = fixture() else { return };
    let Some(name) = rdma_test_support::second_device() else {
        return;
    };
    let context2 = Context::open(&name).unwrap();
    let pd2 = context2.alloc_pd().unwrap();
    // A path from the second device's port 1 to the test device's GID (any valid handle of
    // that device will do: it must be refused before the provider sees it).
    let gid2 = context2.routable_gid(1).unwrap();
    let av2 = AddressVector::new(1).grh(Gid(f.device.gid), gid2.index as u8);
    let foreign = pd2.create_ah(&av2).unwrap();

    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut a = f.ud_qp(f.pd.qp_builder(&cq_a, &cq_a), QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b), QKEY);
    let good = f.pd.create_ah(&f.av()).unwrap();
    let mut src = f.pd.register(32, LOCAL).unwrap();
    src.as_mut_slice().unwrap().copy_from_slice(&pattern(32, 8));
    let dst = f.pd.register(32 + GRH_LEN, LOCAL).unwrap();
    // SAFETY: `dst` stays registered and unread until the receive completes below.
    unsafe {
        b.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(7))
            .unwrap()
    };
    let request = SendRequest::send(src.slice(..).unwrap())
        .tag(1)
        .to(&foreign, b.qp_num(), QKEY);
    // SAFETY: refused before anything is posted (asserted).
    let one = unsafe { a.post_send_one(&request) };
    assert!(matches!(one, Err(Error::InvalidArgument(_))), "{one:?}");
    let mut list = SendList::with_capacity(1);
    list.push(request).unwrap();
    // SAFETY: as above.
    let posted = unsafe { a.post_send(&mut list) };
    assert!(
        matches!(posted, Err(Error::InvalidArgument(_))),
        "{posted:?}"
    );
    assert_only_the_good_datagram_arrives((&mut a, &mut cq_a), (&b, &mut cq_b), &good, &src);
    assert_eq!(&dst.as_slice().unwrap()[GRH_LEN..], &pattern(32, 8)[..]);
}

// ---------------------------------------------------------------------------------------------
// Completion channels whose descriptor safe code made blocking
// ---------------------------------------------------------------------------------------------

/// Clears `O_NONBLOCK` on the channel's descriptor with safe code only: a duplicate of the
/// borrowed descriptor shares the open file description, hence its status flags, and
/// `UnixStream::set_nonblocking` sets them for any descriptor (`ioctl(FIONBIO)`).
fn make_blocking_through_as_fd(channel: &CompletionChannel) {
    let duplicate = channel.as_fd().try_clone_to_owned().unwrap();
    let stream = std::os::unix::net::UnixStream::from(duplicate);
    stream.set_nonblocking(false).unwrap();
    drop(stream);
    // Only to check that it happened (reading the flags needs `fcntl`).
    // SAFETY: F_GETFL on an open descriptor has no memory effects.
    let flags = unsafe { libc::fcntl(channel.as_fd().as_raw_fd(), libc::F_GETFL) };
    assert!(flags >= 0, "fcntl");
    assert_eq!(flags & libc::O_NONBLOCK, 0, "O_NONBLOCK still set");
}

use std::os::fd::AsRawFd;

/// Waits (up to [`WAIT`]) for what a waiter thread sends. If it never comes, the thread is stuck
/// in a read that holds the channel's event lock: `keep` (the CQ, whose drop takes that lock)
/// is leaked so that the failing test can end instead of hanging.
fn bounded<T: std::fmt::Debug, K>(rx: &mpsc::Receiver<T>, what: &str, keep: &mut Option<K>) -> T {
    match rx.recv_timeout(WAIT) {
        Ok(value) => value,
        Err(e) => {
            std::mem::forget(keep.take());
            panic!("{what}: no answer within {WAIT:?} ({e}): blocked in a read under the lock");
        }
    }
}

#[test]
fn channel_reads_never_block_after_safe_code_cleared_o_nonblock() {
    let Some(f) = fixture() else { return };
    let ch = f.context.create_comp_channel().unwrap();
    let cq = f.context.cq_builder(16).channel(&ch).build().unwrap();
    let cq_b = f.cq(16);
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let src = f.pd.register(64, LOCAL).unwrap();
    let target = f.pd.register(64, TARGET).unwrap();
    let mut cq = Some(cq);
    make_blocking_through_as_fd(&ch);

    // With nothing pending: a zero time-out and a non-blocking get_event return at once.
    let (tx, rx) = mpsc::channel();
    {
        let ch = ch.clone();
        std::thread::spawn(move || {
            let _ = tx.send(format!("{:?}", ch.wait(Duration::ZERO)));
            ch.set_nonblocking(true).unwrap();
            let _ = tx.send(format!("{:?}", ch.get_event()));
            ch.set_nonblocking(false).unwrap();
        });
    }
    let zero = bounded(&rx, "wait(ZERO)", &mut cq);
    assert!(zero.starts_with("Err(Timeout("), "{zero}");
    let none = bounded(&rx, "non-blocking get_event", &mut cq);
    assert_eq!(none, "Ok(None)");

    // A first waiter without deadline does not hold the lock while it waits: a second waiter
    // with a short bound returns Timeout, and the first still gets the event later.
    let (first_tx, first_rx) = mpsc::channel();
    let (tid_tx, tid_rx) = mpsc::channel();
    {
        let ch = ch.clone();
        std::thread::spawn(move || {
            tid_tx.send(thread_id()).unwrap();
            let _ = first_tx.send(ch.wait(Duration::MAX).map(|_| ()));
        });
    }
    wait_until_asleep(tid_rx.recv_timeout(WAIT).expect("the first waiter started"));
    let (second_tx, second_rx) = mpsc::channel();
    {
        let ch = ch.clone();
        std::thread::spawn(move || {
            let _ = second_tx.send(format!("{:?}", ch.wait(Duration::from_millis(200))));
        });
    }
    let second = bounded(&second_rx, "the second waiter", &mut cq);
    assert!(second.starts_with("Err(Timeout("), "{second}");
    assert!(
        matches!(first_rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
        "the first waiter returned with nothing pending"
    );

    let cq_ref = cq.as_mut().unwrap();
    cq_ref.req_notify(false).unwrap();
    write(&mut a, 1, &src, target.remote(..).unwrap());
    let first = bounded(&first_rx, "the first waiter", &mut cq);
    assert!(first.is_ok(), "{first:?}");
    let cq_ref = cq.as_mut().unwrap();
    assert_ok(&wait_for(cq_ref, 1)[0], 1, WcOpcode::RdmaWrite);

    // Dropping the CQ takes the event lock: it must be free.
    let (drop_tx, drop_rx) = mpsc::channel();
    let owned = cq.take();
    std::thread::spawn(move || {
        drop(owned);
        let _ = drop_tx.send(());
    });
    bounded(&drop_rx, "dropping the CQ", &mut None::<()>);
    drop(a);
}

#[test]
fn two_waiters_on_a_channel_made_blocking_get_every_event() {
    // Many rounds of one event each, with two waiters on a channel made blocking through
    // AsFd: every event reaches one of them and neither ever blocks in a read.
    let Some(f) = fixture() else { return };
    let ch = f.context.create_comp_channel().unwrap();
    let cq = f.context.cq_builder(16).channel(&ch).build().unwrap();
    let cq_b = f.cq(16);
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let src = f.pd.register(64, LOCAL).unwrap();
    let target = f.pd.register(64, TARGET).unwrap();
    let remote = target.remote(..).unwrap();
    let mut cq = Some(cq);
    make_blocking_through_as_fd(&ch);

    const ROUNDS: u64 = 20;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    for _ in 0..2 {
        let (ch, tx, stop) = (ch.clone(), tx.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let outcome = ch.wait(Duration::from_millis(100));
                if tx.send(format!("{outcome:?}")).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut events = 0;
    for round in 0..ROUNDS {
        let cq_ref = cq.as_mut().unwrap();
        cq_ref.req_notify(false).unwrap();
        write(&mut a, round, &src, remote);
        assert_ok(&wait_for(cq_ref, 1)[0], round, WcOpcode::RdmaWrite);
        while events <= round {
            let outcome = bounded(&rx, "a waiter", &mut cq);
            if outcome.starts_with("Ok(") {
                events += 1;
            } else {
                assert!(outcome.starts_with("Err(Timeout("), "{outcome}");
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    // Both waiters end (each within its bound).
    loop {
        match rx.recv_timeout(WAIT) {
            Ok(outcome) => assert!(!outcome.starts_with("Err(V"), "{outcome}"),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                std::mem::forget(cq.take());
                panic!("a waiter is still blocked {WAIT:?} after its bound");
            }
        }
    }
    assert_eq!(events, ROUNDS);
}
