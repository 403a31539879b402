//! Owned requests over the caller's own registered memory (`RegionRange`): zero-copy gathers
//! and scatters of a pool buffer and a range, RDMA WRITE from and READ into ranges, the
//! region kept registered (its reference count) while a request is in flight and released by
//! the completion, a drop, or an SRQ's destruction; and what is refused: ranges the device
//! would write in a region that is not shared, regions of another protection domain, ranges
//! on inline requests, empty or outside ranges. Every byte that crossed is checked, and the
//! bytes around it are checked unchanged.

use std::sync::Arc;

use rdma_test_support::verbs::*;
use rdma_verbs::{cq::*, mr::*, owned::*, wr::*, *};

const HEADER: usize = 32;

/// Bytes `len` of `region` from `offset`, read with the region's copy.
fn bytes(region: &MemoryRegion, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    region.read_at(offset, &mut out).unwrap();
    out
}

fn invalid(refused: &PostRefused, what: &str) {
    assert!(
        matches!(refused.error(), Error::InvalidArgument(why) if why.contains(what)),
        "{refused}"
    );
}

/// A header from a pool buffer and 512 bytes from the sender's region, gathered into one SEND,
/// land scattered in the receiver's pool buffer (the header) and a range of its shared region
/// (the rest). Both regions are held by their requests until the completions, and only then.
#[test]
fn owned_ranges_gather_and_scatter_zero_copy() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_sge(2),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_sge(2),
        AccessFlags::empty(),
    );
    let mut src = f.pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_at(0, &pattern(4096, 3)).unwrap();
    let src = Arc::new(src);
    let dst = Arc::new(
        f.pd.register(4096, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .into_shared(),
    );
    assert!(dst.is_shared() && !src.is_shared());
    let headers = BufferPool::new(&f.pd, 4, HEADER).unwrap();

    for round in 0..3u8 {
        let at = 1024 + usize::from(round) * 8;
        let receive = RecvRequest::new(headers.take().unwrap())
            .and_range(RegionRange::new(&dst, at..at + 512).unwrap())
            .tag(70 + u64::from(round));
        b.post_recv_owned(receive).unwrap();
        assert_eq!(Arc::strong_count(&dst), 2, "the receive holds the region");

        let mut header = headers.take().unwrap();
        header.fill_from(&pattern(HEADER, 100 + round)).unwrap();
        let from = 100 + usize::from(round);
        let send = SendRequest::send(header)
            .and_range(RegionRange::new(&src, from..from + 512).unwrap())
            .tag(round.into());
        a.post_send_owned(send).unwrap();
        assert_eq!(Arc::strong_count(&src), 2, "the send holds the region");

        let mut sent = reap(&mut cq_a, 1).remove(0);
        assert_eq!(
            (sent.tag(), sent.status(), sent.wc().opcode()),
            (Some(round.into()), WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(sent.take_buf().unwrap().len(), HEADER);
        drop(sent);
        assert_eq!(
            Arc::strong_count(&src),
            1,
            "the completion released the region"
        );

        let mut got = reap(&mut cq_b, 1).remove(0);
        assert_eq!(
            (got.tag(), got.status(), got.wc().opcode()),
            (
                Some(70 + u64::from(round)),
                WcStatus::Success,
                WcOpcode::Recv
            )
        );
        assert_eq!(got.wc().byte_len(), (HEADER + 512) as u32);
        let header = got.take_buf().unwrap();
        assert_eq!(header.len(), HEADER, "the buffer holds what fit in it");
        assert_eq!(&header[..], &pattern(HEADER, 100 + round)[..]);
        drop(got);
        assert_eq!(Arc::strong_count(&dst), 1);
        assert_eq!(
            bytes(&dst, at, 512),
            pattern(4096, 3)[from..from + 512],
            "round {round}: the range received the sender's range"
        );
    }
    // Nothing outside the ranges changed.
    assert!(bytes(&dst, 0, 1024).iter().all(|&b| b == 0));
    assert!(
        bytes(&dst, 1024 + 16 + 512, 4096 - 1552)
            .iter()
            .all(|&b| b == 0)
    );
    assert_eq!(headers.available(), 4);
}

/// RDMA WRITE from a range, READ into a range of a shared region, and a READ scattered into
/// a buffer and a range; every byte checked, the peer's region around the write unchanged.
#[test]
fn owned_write_and_read_ranges() {
    let Some(f) = fixture() else { return };
    let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_sge(2),
        f.pd.qp_builder(&cq_b, &cq_b),
        rights,
    );
    let mut peer =
        f.pd.register(2048, AccessFlags::LOCAL_WRITE | rights)
            .unwrap();
    peer.write_at(1024, &pattern(1024, 9)).unwrap();
    let mut mine = f.pd.register(2048, AccessFlags::LOCAL_WRITE).unwrap();
    mine.write_at(0, &pattern(300, 4)).unwrap();
    let mine = Arc::new(mine.into_shared());
    let pool = BufferPool::new(&f.pd, 2, 64).unwrap();

    let write = SendRequest::write(
        RegionRange::new(&mine, 0..300).unwrap(),
        peer.remote(100..400).unwrap(),
    )
    .tag(1);
    a.post_send_owned(write).unwrap();
    let done = reap(&mut cq_a, 1);
    assert_eq!(
        (done[0].tag(), done[0].status(), done[0].wc().opcode()),
        (Some(1), WcStatus::Success, WcOpcode::RdmaWrite)
    );
    drop(done);
    assert_eq!(bytes(&peer, 100, 300), pattern(300, 4));
    assert!(bytes(&peer, 0, 100).iter().all(|&b| b == 0));
    assert!(bytes(&peer, 400, 624).iter().all(|&b| b == 0));

    let read = SendRequest::read(
        RegionRange::new(&mine, 1000..1500).unwrap(),
        peer.remote(1024..1524).unwrap(),
    )
    .tag(2);
    a.post_send_owned(read).unwrap();
    assert_eq!(Arc::strong_count(&mine), 2);
    let done = reap(&mut cq_a, 1);
    assert_eq!(
        (done[0].tag(), done[0].status(), done[0].wc().opcode()),
        (Some(2), WcStatus::Success, WcOpcode::RdmaRead)
    );
    drop(done);
    assert_eq!(Arc::strong_count(&mine), 1);
    assert_eq!(bytes(&mine, 1000, 500), pattern(1024, 9)[..500]);

    // 64 bytes into the buffer, then 200 into the range.
    let mut target = pool.take().unwrap();
    target.set_len(64).unwrap();
    let read = SendRequest::read(target, peer.remote(1024..1288).unwrap())
        .and_range(RegionRange::new(&mine, 1600..1800).unwrap())
        .tag(3);
    a.post_send_owned(read).unwrap();
    let mut done = reap(&mut cq_a, 1).remove(0);
    assert_eq!((done.tag(), done.status()), (Some(3), WcStatus::Success));
    assert_eq!(&done.take_buf().unwrap()[..], &pattern(1024, 9)[..64]);
    assert_eq!(bytes(&mine, 1600, 200), pattern(1024, 9)[64..264]);
    assert!(bytes(&mine, 1500, 100).iter().all(|&b| b == 0));
}

/// What owned ranges refuse, each with the buffer handed back and the region's reference
/// count back to one: a receive or READ into a region that is not shared, a range of another
/// protection domain, a range on an inline request (bytes, none, or a buffer sent inline) or a
/// UD send, two ranges on one request,
/// a WRITE longer than its remote memory, empty and outside ranges; and in lists,
/// naming the request. A region without `LOCAL_WRITE` cannot be made shared, and a shared
/// region hands out no reference to its bytes.
#[test]
fn owned_range_refusals() {
    let Some(f) = fixture() else { return };
    let (cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_sge(2),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_sge(2),
        AccessFlags::REMOTE_READ,
    );
    let plain = Arc::new(f.pd.register(1024, AccessFlags::LOCAL_WRITE).unwrap());
    let other_pd = f.context.alloc_pd().unwrap();
    let foreign = Arc::new(
        other_pd
            .register(1024, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .into_shared(),
    );
    let pool = BufferPool::new(&f.pd, 2, 64).unwrap();

    #[allow(clippy::reversed_empty_ranges)]
    for bad in [0..0, 1000..1100, 10..5] {
        assert!(
            matches!(
                RegionRange::new(&plain, bad.clone()),
                Err(Error::InvalidArgument(_))
            ),
            "{bad:?}"
        );
    }

    let refused = b
        .post_recv_owned(
            RecvRequest::new(pool.take().unwrap())
                .and_range(RegionRange::new(&plain, 0..512).unwrap()),
        )
        .unwrap_err();
    invalid(&refused, "shared region");
    assert!(refused.into_buf().is_some(), "the buffer comes back");
    assert_eq!(Arc::strong_count(&plain), 1);

    let refused = a
        .post_send_owned(SendRequest::read(
            RegionRange::new(&plain, 0..8).unwrap(),
            plain.remote(8..16).unwrap(),
        ))
        .unwrap_err();
    invalid(&refused, "shared region");

    let refused = b
        .post_recv_owned(RecvRequest::new(RegionRange::new(&foreign, 0..8).unwrap()))
        .unwrap_err();
    invalid(&refused, "protection domain");
    let refused = a
        .post_send_owned(
            SendRequest::send(pool.take().unwrap())
                .and_range(RegionRange::new(&foreign, 0..8).unwrap()),
        )
        .unwrap_err();
    invalid(&refused, "protection domain");
    drop(refused);
    assert_eq!(Arc::strong_count(&foreign), 1);

    let refused = a
        .post_send_owned(
            SendRequest::send(b"inline").and_range(RegionRange::new(&plain, 0..8).unwrap()),
        )
        .unwrap_err();
    invalid(&refused, "inline");
    assert_eq!(Arc::strong_count(&plain), 1);
    // No bytes inline is inline too; and a buffer sent inline carries no range either, since
    // the provider would copy the range's bytes with the CPU while a peer may write them.
    let refused = a
        .post_send_owned(SendRequest::send(b"").and_range(RegionRange::new(&plain, 0..8).unwrap()))
        .unwrap_err();
    invalid(&refused, "inline");
    let refused = a
        .post_send_owned(
            SendRequest::send(pool.take().unwrap())
                .and_range(RegionRange::new(&plain, 0..8).unwrap())
                .inline(),
        )
        .unwrap_err();
    invalid(&refused, "inline");
    assert!(refused.into_buf().is_some(), "the buffer comes back");
    let refused = a
        .post_send_owned(SendRequest::send(RegionRange::new(&plain, 0..8).unwrap()).inline())
        .unwrap_err();
    invalid(&refused, "inline");
    assert_eq!(Arc::strong_count(&plain), 1);
    assert_eq!(pool.available(), 2);

    // One range per request: a second is refused, not silently swapped for the first.
    let r = |range: std::ops::Range<usize>| RegionRange::new(&plain, range).unwrap();
    let refused = a
        .post_send_owned(SendRequest::send(r(0..8)).and_range(r(8..16)))
        .unwrap_err();
    invalid(&refused, "one region range");
    let refused = b
        .post_recv_owned(
            RecvRequest::new(pool.take().unwrap())
                .and_range(r(0..8))
                .and_range(r(8..16)),
        )
        .unwrap_err();
    invalid(&refused, "one region range");
    assert!(refused.into_buf().is_some());
    let mut receives = OwnedRecvList::with_capacity(1);
    let refused = receives
        .push_owned(RecvRequest::new(r(0..8)).and_range(r(8..16)))
        .unwrap_err();
    invalid(&refused, "one region range");
    assert!(receives.is_empty());

    // A WRITE longer than its remote memory is refused, as a READ is (from a range, a
    // buffer, or inline bytes).
    let eight = plain.remote(8..16).unwrap();
    let refused = a
        .post_send_owned(SendRequest::write(r(0..300), eight))
        .unwrap_err();
    invalid(&refused, "a write of 300 bytes to 8 bytes");
    let mut nine = pool.take().unwrap();
    nine.fill_from(&[1; 9]).unwrap();
    let refused = a
        .post_send_owned(SendRequest::write(nine, eight))
        .unwrap_err();
    invalid(&refused, "a write of 9 bytes to 8 bytes");
    assert!(refused.into_buf().is_some());
    let refused = a
        .post_send_owned(SendRequest::write(&[2; 9], eight))
        .unwrap_err();
    invalid(&refused, "a write of 9 bytes to 8 bytes");
    // A READ into an unshared range is refused when pushed to a list, not only when posted.
    let mut sends = OwnedSendList::with_capacity(1);
    let refused = sends.push(SendRequest::read(r(0..8), eight)).unwrap_err();
    invalid(&refused, "shared region");
    assert!(sends.is_empty());
    assert_eq!(Arc::strong_count(&plain), 1);
    assert_eq!(a.owned_in_flight() + b.owned_in_flight(), 0);

    // A UD send keeps its address handle in the entry, so it carries no range.
    let ud_cq = f.cq(4);
    let mut ud = f.ud_qp(f.pd.qp_builder(&ud_cq, &ud_cq).max_send_sge(2), 0x77);
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let refused = ud
        .post_send_owned(
            SendRequest::send(pool.take().unwrap())
                .and_range(RegionRange::new(&plain, 0..8).unwrap())
                .to(&ah, ud.qp_num(), 0x77),
        )
        .unwrap_err();
    invalid(&refused, "UD send");
    assert!(refused.into_buf().is_some());
    assert_eq!((Arc::strong_count(&plain), ud.owned_in_flight()), (1, 0));
    assert_eq!(a.owned_in_flight() + b.owned_in_flight(), 0);

    // Lists: nothing posted, the error names the request, the list keeps it.
    let mut receives = OwnedRecvList::with_capacity(2);
    receives.push(pool.take().unwrap(), 1).unwrap();
    receives
        .push_owned(RecvRequest::new(RegionRange::new(&plain, 0..8).unwrap()))
        .unwrap();
    let error = b.post_recv_list(&mut receives).unwrap_err();
    assert!(
        matches!(&error, Error::InvalidArgument(why) if why.starts_with("request 1:")),
        "{error}"
    );
    assert_eq!((receives.len(), b.owned_in_flight()), (2, 0));
    receives.clear();
    let mut sends = OwnedSendList::with_capacity(1);
    sends
        .push(SendRequest::send(RegionRange::new(&foreign, 0..8).unwrap()))
        .unwrap();
    let error = a.post_send_list(&mut sends).unwrap_err();
    assert!(
        matches!(&error, Error::InvalidArgument(why) if why.starts_with("request 0:")),
        "{error}"
    );
    sends.clear();
    assert_eq!(Arc::strong_count(&plain), 1);
    assert_eq!(Arc::strong_count(&foreign), 1);
    assert_eq!(pool.available(), 2);

    // Sharing: only with LOCAL_WRITE; a shared region lends no reference to its bytes.
    let read_only =
        f.pd.register(64, AccessFlags::empty())
            .unwrap()
            .into_shared();
    assert!(!read_only.is_shared());
    assert!(read_only.as_slice().is_ok());
    let shared =
        f.pd.register(64, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .into_shared();
    assert!(matches!(shared.as_slice(), Err(Error::RemotelyWritable)));
    let remote =
        f.pd.register(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    assert!(remote.unwrap().is_shared());
}

/// Ranges in doorbell-batched lists, an SRQ receive into a range, and receives into ranges
/// still in flight when their queue pair is dropped (released by the drop) or their SRQ is
/// (released by its destruction).
#[test]
fn owned_ranges_in_lists_srq_and_teardown() {
    let Some(f) = fixture() else { return };
    let srq = f.pd.srq_builder(8).max_sge(2).build().unwrap();
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_sge(2),
        f.pd.qp_builder(&cq_b, &cq_b).srq(&srq),
        AccessFlags::empty(),
    );
    let mut srq = srq;
    let mut src = f.pd.register(1024, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_at(0, &pattern(1024, 5)).unwrap();
    let src = Arc::new(src);
    let dst = Arc::new(
        f.pd.register(1024, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .into_shared(),
    );
    let mut receives = OwnedRecvList::with_capacity(2);
    for i in 0..2 {
        let range = RegionRange::new(&dst, i * 256..(i + 1) * 256).unwrap();
        receives
            .push_owned(RecvRequest::new(range).tag(i as u64))
            .unwrap();
    }
    srq.post_recv_list(&mut receives).unwrap();
    assert_eq!((srq.owned_in_flight(), Arc::strong_count(&dst)), (2, 3));
    let mut sends = OwnedSendList::with_capacity(2);
    for i in 0..2 {
        let range = RegionRange::new(&src, 512 + i * 100..512 + i * 100 + 256).unwrap();
        let send = SendRequest::send(range).tag(10 + i as u64);
        sends
            .push(if i == 0 { send.unsignaled() } else { send })
            .unwrap();
    }
    a.post_send_list(&mut sends).unwrap();
    let sent = reap(&mut cq_a, 1);
    assert_eq!(sent[0].tag(), Some(11));
    drop(sent);
    assert_eq!(
        Arc::strong_count(&src),
        1,
        "the signaled send released the unsignaled one too"
    );
    for (i, got) in reap(&mut cq_b, 2).into_iter().enumerate() {
        assert_eq!(
            (got.tag(), got.status(), got.wc().byte_len()),
            (Some(i as u64), WcStatus::Success, 256)
        );
    }
    assert_eq!(Arc::strong_count(&dst), 1);
    for i in 0..2 {
        assert_eq!(
            bytes(&dst, i * 256, 256),
            pattern(1024, 5)[512 + i * 100..512 + i * 100 + 256]
        );
    }

    // Still in flight at teardown: the SRQ's receive until the SRQ goes, a queue pair's
    // receive until the queue pair goes.
    srq.post_recv_owned(RecvRequest::new(RegionRange::new(&dst, 0..64).unwrap()))
        .unwrap();
    let (cq_c, cq_d) = (f.cq(4), f.cq(4));
    let (c, mut d) = f.rc_pair(
        f.pd.qp_builder(&cq_c, &cq_c),
        f.pd.qp_builder(&cq_d, &cq_d),
        AccessFlags::empty(),
    );
    d.post_recv_owned(RecvRequest::new(RegionRange::new(&dst, 64..128).unwrap()))
        .unwrap();
    assert_eq!(Arc::strong_count(&dst), 3);
    drop((c, d));
    assert_eq!(
        Arc::strong_count(&dst),
        2,
        "the queue pair's drop released its receive"
    );
    drop((a, b));
    drop(srq);
    assert_eq!(
        Arc::strong_count(&dst),
        1,
        "the SRQ's destruction released its receive"
    );
}
