//! Doorbell-batched owned posts on the device: a list of sends (some unsignaled, one inline,
//! an RDMA WRITE with immediate) and a list of receives, each posted with one call, on the
//! classic and the extended send path; a list longer than the free slots, posted in part and
//! finished later; an SRQ fed by a list; and what a list post refuses, with nothing posted and
//! every buffer still in the list.

use rdma_test_support::verbs::*;
use rdma_verbs::{cq::*, mr::*, owned::*, qp::*, wr::*, *};

const SIZE: usize = 128;

/// Pushes `request` tagged `m`, signaled only when `m % 4 == 3`.
fn push_every_fourth_signaled<'a, K: Operation>(
    list: &mut OwnedSendList<'a>,
    request: SendRequest<'a, K, Owned<'a>>,
    m: u64,
) {
    let request = request.tag(m);
    list.push(if m % 4 == 3 {
        request
    } else {
        request.unsignaled()
    })
    .unwrap();
}

fn message(m: u64) -> Vec<u8> {
    pattern(SIZE, m as u8)
}

/// Sixteen requests in one list, one doorbell: SENDs of buffers, an inline SEND (request 5)
/// and an RDMA WRITE with immediate (request 9), signaled every fourth; sixteen receives in
/// one list. Every byte and tag arrives in order, and the four send completions return all
/// sixteen buffers. On both send paths.
#[test]
fn owned_lists_post_sixteen_requests_with_one_call() {
    let Some(f) = fixture() else { return };
    for path in [SendPath::Classic, SendPath::Extended] {
        let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
        let (mut a, mut b) = f.rc_pair(
            f.pd.qp_builder(&cq_a, &cq_a)
                .max_send_wr(32)
                .max_inline_data(64)
                .send_path(path),
            f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(32),
            AccessFlags::REMOTE_WRITE,
        );
        let target =
            f.pd.register(SIZE, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
                .unwrap();
        let tx = BufferPool::new(&f.pd, 16, SIZE).unwrap();
        let rx = BufferPool::new(&f.pd, 16, SIZE).unwrap();
        let inline = pattern(48, 0x55);

        let mut receives = OwnedRecvList::with_capacity(16);
        for m in 0..16 {
            receives.push(rx.take().unwrap(), 100 + m).unwrap();
        }
        assert_eq!((receives.len(), receives.capacity()), (16, 16));
        b.post_recv_list(&mut receives).unwrap();
        assert!(receives.is_empty(), "{path:?}");
        assert_eq!(b.owned_in_flight(), 16);

        let mut sends = OwnedSendList::with_capacity(16);
        for m in 0..16u64 {
            // Requests of different operations (types) go into one list.
            match m {
                5 => push_every_fourth_signaled(&mut sends, SendRequest::send(&inline), m),
                9 => {
                    let mut buf = tx.take().unwrap();
                    buf.fill_from(&message(m)).unwrap();
                    let write = SendRequest::write(buf, target.remote(..).unwrap());
                    push_every_fourth_signaled(&mut sends, write.with_imm(0x900d_0000 | 9), m);
                }
                _ => {
                    let mut buf = tx.take().unwrap();
                    buf.fill_from(&message(m)).unwrap();
                    push_every_fourth_signaled(&mut sends, SendRequest::send(buf), m);
                }
            }
        }
        a.post_send_list(&mut sends).unwrap();
        assert!(sends.is_empty());
        assert_eq!(
            tx.available(),
            1,
            "15 buffers in flight (one request is inline)"
        );

        let sent = reap(&mut cq_a, 4);
        let tags: Vec<_> = sent.iter().map(|c| (c.tag(), c.status())).collect();
        assert_eq!(
            tags,
            [3, 7, 11, 15].map(|t| (Some(t), WcStatus::Success)),
            "{path:?}"
        );
        drop(sent);
        assert_eq!(
            (tx.available(), a.owned_in_flight()),
            (16, 0),
            "the signaled completions released the unsignaled requests' buffers"
        );

        let received = reap(&mut cq_b, 16);
        for (m, mut c) in received.into_iter().enumerate() {
            let m = m as u64;
            assert_eq!(c.tag(), Some(100 + m), "{path:?}: in order");
            assert!(c.is_success(), "{c:?}");
            let buf = c.take_buf().unwrap();
            match m {
                5 => assert_eq!(&buf[..], &inline[..]),
                9 => {
                    assert_eq!(c.wc().opcode(), WcOpcode::RecvRdmaWithImm);
                    assert_eq!(c.wc().imm_data(), Some(0x900d_0000 | 9));
                    assert_eq!(buf.len(), 0, "the bytes went to the target");
                    let mut landed = vec![0; SIZE];
                    target.read_at(0, &mut landed).unwrap();
                    assert_eq!(landed, message(9));
                }
                _ => {
                    assert_eq!(c.wc().opcode(), WcOpcode::Recv);
                    assert_eq!(&buf[..], &message(m)[..], "{path:?}: message {m}");
                }
            }
        }
        assert_eq!(rx.available(), 16);
    }
}

/// A list longer than the free send slots: the requests that fit are posted, the error says
/// where it stopped (`QueueFull` at that index), and the rest stay in the list with their
/// buffers; once completions free the slots, posting the same list again sends them, and every
/// message arrives once, in order.
#[test]
fn owned_send_list_posts_what_fits_and_keeps_the_rest() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(4),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(32),
        AccessFlags::empty(),
    );
    let slots = a.caps().max_send_wr as usize;
    let total = slots + 3;
    let tx = BufferPool::new(&f.pd, total, SIZE).unwrap();
    let rx = BufferPool::new(&f.pd, total, SIZE).unwrap();
    let mut receives = OwnedRecvList::with_capacity(total);
    for m in 0..total as u64 {
        receives.push(rx.take().unwrap(), m).unwrap();
    }
    b.post_recv_list(&mut receives).unwrap();

    let mut sends = OwnedSendList::with_capacity(total);
    for m in 0..total as u64 {
        let mut buf = tx.take().unwrap();
        buf.fill_from(&message(m)).unwrap();
        sends.push(SendRequest::send(buf).tag(m)).unwrap();
    }
    match a.post_send_list(&mut sends) {
        Err(Error::QueueFull { verb, index }) => {
            assert_eq!((verb, index), ("owned post", slots));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((sends.len(), a.owned_in_flight()), (3, slots));
    assert_eq!(
        tx.available(),
        0,
        "the three left hold their buffers in the list"
    );
    let first = reap(&mut cq_a, slots);
    assert_eq!(
        first.iter().map(Completion::tag).collect::<Vec<_>>(),
        (0..slots as u64).map(Some).collect::<Vec<_>>()
    );
    drop(first);
    a.post_send_list(&mut sends).unwrap();
    assert!(sends.is_empty());
    let rest = reap(&mut cq_a, 3);
    assert_eq!(
        rest.iter().map(Completion::tag).collect::<Vec<_>>(),
        (slots as u64..total as u64).map(Some).collect::<Vec<_>>()
    );
    drop(rest);
    let received = reap(&mut cq_b, total);
    for (m, mut c) in received.into_iter().enumerate() {
        assert_eq!(c.tag(), Some(m as u64));
        assert_eq!(&c.take_buf().unwrap()[..], &message(m as u64)[..], "{m}");
    }
    assert_no_completion_each(&mut cq_b);
    assert_eq!((tx.available(), rx.available()), (total, total));
}

/// An SRQ fed by one list of sixteen receives; two queue pairs each post a list of eight sends
/// into it; every message arrives with its bytes, through either queue pair.
#[test]
fn owned_srq_fed_by_a_list() {
    let Some(f) = fixture() else { return };
    let mut srq = f.pd.create_srq(16, 1).unwrap();
    let mut send_cq = f.cq(32);
    let mut recv_cq = f.cq(32);
    let (mut a1, b1) = f.rc_pair(
        f.pd.qp_builder(&send_cq, &send_cq),
        f.pd.qp_builder(&recv_cq, &recv_cq).srq(&srq),
        AccessFlags::empty(),
    );
    let (mut a2, b2) = f.rc_pair(
        f.pd.qp_builder(&send_cq, &send_cq),
        f.pd.qp_builder(&recv_cq, &recv_cq).srq(&srq),
        AccessFlags::empty(),
    );
    let rx = BufferPool::new(&f.pd, 16, SIZE).unwrap();
    let tx = BufferPool::new(&f.pd, 16, SIZE).unwrap();
    let mut receives = OwnedRecvList::with_capacity(16);
    for m in 0..16 {
        receives.push(rx.take().unwrap(), 1000 + m).unwrap();
    }
    srq.post_recv_list(&mut receives).unwrap();
    assert_eq!((receives.len(), srq.owned_in_flight()), (0, 16));

    let mut sends = OwnedSendList::with_capacity(8);
    for (p, a) in [(0u64, &mut a1), (1, &mut a2)] {
        for m in 0..8 {
            let mut buf = tx.take().unwrap();
            buf.fill_from(&message(p << 4 | m)).unwrap();
            let request = SendRequest::send(buf).tag(p << 4 | m);
            sends
                .push(if m == 7 {
                    request
                } else {
                    request.unsignaled()
                })
                .unwrap();
        }
        a.post_send_list(&mut sends).unwrap();
    }
    drop(reap(&mut send_cq, 2));
    assert_eq!(tx.available(), 16);
    let mut seen = std::collections::BTreeSet::new();
    for mut c in reap(&mut recv_cq, 16) {
        assert!(c.is_success(), "{c:?}");
        assert!(c.tag().is_some_and(|t| (1000..1016).contains(&t)));
        let p = u64::from(c.wc().qp_num() == b2.qp_num());
        assert!(p == 1 || c.wc().qp_num() == b1.qp_num());
        let buf = c.take_buf().unwrap();
        // Which message landed in which receive is the SRQ's choice; which pair sent it is
        // not: match the bytes against that pair's eight.
        let m = (0..8)
            .find(|&m| buf[..] == message(p << 4 | m)[..])
            .unwrap_or_else(|| panic!("pair {p}: unknown bytes {:?}", &buf[..8]));
        assert!(seen.insert(p << 4 | m), "message {p}/{m} twice");
    }
    assert_eq!(seen.len(), 16);
    assert_eq!(srq.owned_in_flight(), 0);
    assert_eq!(rx.available(), 16);
}

/// What a list post refuses, before posting anything: a buffer of another protection domain
/// (named by its index), an operation the transport does not allow, a UD send without a
/// destination, receives for a queue pair on an SRQ. The list keeps every request and its
/// buffer; nothing is in flight. Pushing refuses a full list and a short atomic result buffer,
/// giving the buffer back. (Immediate data on a READ does not compile: an owned request's type
/// says its operation.)
#[test]
fn owned_list_refusals_post_nothing_and_keep_the_buffers() {
    let Some(f) = fixture() else { return };
    let cq = f.cq(16);
    let other_pd = f.context.alloc_pd().unwrap();
    let pool = BufferPool::new(&f.pd, 8, SIZE).unwrap();
    let foreign = BufferPool::new(&other_pd, 1, SIZE).unwrap();
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq, &cq),
        AccessFlags::REMOTE_READ,
    );
    let remote =
        f.pd.register(SIZE, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();

    // Another PD's buffer at index 2.
    let mut sends = OwnedSendList::with_capacity(4);
    for _ in 0..2 {
        sends.push(SendRequest::send(pool.take().unwrap())).unwrap();
    }
    sends
        .push(SendRequest::send(foreign.take().unwrap()))
        .unwrap();
    match a.post_send_list(&mut sends) {
        Err(Error::InvalidArgument(why)) => assert!(why.starts_with("request 2:"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!((sends.len(), a.owned_in_flight()), (3, 0));
    assert_eq!(sends.take_bufs().count(), 3);
    assert_eq!((pool.available(), foreign.available()), (8, 1));

    // A full list gives the buffer back.
    let mut small = OwnedSendList::with_capacity(1);
    small.push(SendRequest::send(pool.take().unwrap())).unwrap();
    let refused = small
        .push(SendRequest::send(pool.take().unwrap()))
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(_)),
        "{refused}"
    );
    assert!(refused.into_buf().is_some());
    small.clear();
    assert_eq!(pool.available(), 8);

    // An atomic's result needs 8 bytes.
    let tiny = BufferPool::new(&f.pd, 1, 4).unwrap();
    let refused = sends
        .push(SendRequest::fetch_add(
            tiny.take().unwrap(),
            remote.remote(..8).unwrap(),
            1,
        ))
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(_)),
        "{refused}"
    );
    drop(refused);
    assert_eq!(tiny.available(), 1);

    // RDMA READ on UC: refused by the transport check before the post verb runs.
    let (mut uc, _uc_peer) = f.uc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq, &cq),
        AccessFlags::REMOTE_WRITE,
    );
    let mut reads = OwnedSendList::with_capacity(2);
    reads.push(SendRequest::send(pool.take().unwrap())).unwrap();
    reads
        .push(SendRequest::read(
            pool.take().unwrap(),
            remote.remote(..).unwrap(),
        ))
        .unwrap();
    match uc.post_send_list(&mut reads) {
        Err(Error::InvalidArgument(why)) => assert!(why.starts_with("request 1:"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!((reads.len(), uc.owned_in_flight()), (2, 0));
    reads.clear();

    // UD without a destination.
    let mut ud = f.ud_qp(f.pd.qp_builder(&cq, &cq), 1);
    let mut datagrams = OwnedSendList::with_capacity(1);
    datagrams
        .push(SendRequest::send(pool.take().unwrap()))
        .unwrap();
    match ud.post_send_list(&mut datagrams) {
        Err(Error::InvalidArgument(why)) => assert!(why.starts_with("request 0:"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!((datagrams.len(), ud.owned_in_flight()), (1, 0));
    datagrams.clear();

    // UD receives, the second with no room for the GRH: nothing posted.
    let mut receives = OwnedRecvList::with_capacity(2);
    receives.push(pool.take().unwrap(), 0).unwrap();
    receives.push_owned(RecvRequest::empty().tag(1)).unwrap();
    match ud.post_recv_list(&mut receives) {
        Err(Error::InvalidArgument(why)) => {
            assert!(
                why.starts_with("request 1:") && why.contains("GRH"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((receives.len(), ud.owned_in_flight()), (2, 0));
    receives.clear();

    // Receives for a queue pair on an SRQ.
    let srq = f.pd.create_srq(4, 1).unwrap();
    let (_c, mut d) = f.rc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq, &cq).srq(&srq),
        AccessFlags::empty(),
    );
    let mut receives = OwnedRecvList::with_capacity(2);
    receives.push(pool.take().unwrap(), 0).unwrap();
    assert!(matches!(
        d.post_recv_list(&mut receives),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(receives.len(), 1);
    receives.clear();
    assert_eq!(pool.available(), 8, "every buffer came back");
}
