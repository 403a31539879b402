//! Multicast over the connection manager on the device: two receivers and a send-only sender
//! join one group; the `MulticastJoin` event's queue pair, Q_Key and group GID; datagrams to
//! the group reach every attached queue pair, every byte checked; a detached and left one
//! gets nothing more; the kernel's IGMP membership follows joins, leaves and drops; misuse is
//! refused with typed errors, and a leave that librdmacm would block forever is refused.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use rdma_cm::rdma_verbs::{QueuePair, device::Gid, qp::Ud};
use rdma_cm::{CmId, Error, EventChannel, EventKind, JoinKind, PortSpace, UdParam};
use rdma_test_support::cm::ud::*;
use rdma_test_support::cm::*;

const GROUP: Ipv4Addr = Ipv4Addr::new(239, 1, 2, 3);

/// Whether the kernel's IGMP table (`/proc/net/igmp`) has `group` on some interface: the
/// connection manager joins it there for a full member on RoCE.
fn igmp_has(group: Ipv4Addr) -> bool {
    // The table prints the group as the hexadecimal of its in-memory (network order) word.
    let wanted = format!("{:08X}", u32::from_ne_bytes(group.octets()));
    let table = std::fs::read_to_string("/proc/net/igmp").expect("read /proc/net/igmp");
    table
        .lines()
        .any(|line| line.split_whitespace().next() == Some(wanted.as_str()))
}

/// A UDP identifier on a channel of its own, its address resolved towards `group` from the
/// device's address (as the C `mckey` does).
fn group_id(local: IpAddr, group: IpAddr) -> CmId {
    let channel = EventChannel::new().expect("rdma_create_event_channel");
    let id = CmId::new(&channel, PortSpace::Udp).expect("rdma_create_id (UDP)");
    id.resolve_addr(
        Some(SocketAddr::new(local, 0)),
        SocketAddr::new(group, 0),
        WAIT,
    )
    .expect("rdma_resolve_addr to the group");
    drop(
        id.wait_event(EventKind::AddrResolved, WAIT)
            .expect("the group's address resolved"),
    );
    id
}

fn check_group_param(param: &UdParam, id: &CmId, group: Ipv4Addr, what: &str) {
    assert_eq!(
        param.qp_num,
        QueuePair::<Ud, rdma_cm::rdma_verbs::qp::Rts>::MULTICAST_QPN,
        "{what}: {param:?}"
    );
    assert_eq!(param.qkey, UDP_QKEY, "{what}: the group's Q_Key: {param:?}");
    assert_eq!(
        id.qkey().expect("the identifier's Q_Key"),
        param.qkey,
        "{what}"
    );
    let grh = param.av.grh.expect("a group's path is global");
    assert_eq!(
        grh.dgid,
        Gid(group.to_ipv6_mapped().octets()),
        "{what}: the group's GID: {param:?}"
    );
    assert_eq!(param.av.port, id.port_num(), "{what}: {param:?}");
}

/// Two receivers join as full members and attach their queue pairs; a sender joins send-only
/// and sends 8 datagrams to the group: each receiver gets all 8, with the sender's queue pair
/// as source and immediate data, every byte checked. The first receiver then detaches and
/// leaves; of a second round only the second receiver gets anything. The IGMP membership
/// appears with the first full member and is gone after the last leaves (the second by
/// dropping its queue pair, still attached, and its identifier, still joined); no identifier
/// is left.
#[test]
fn multicast_join_send_receive_leave() {
    let Some(local) = device_addr() else { return };
    let before = kernel_cm_ids();
    let group = IpAddr::V4(GROUP);
    assert!(!igmp_has(GROUP), "the group is joined before the test");

    let r1 = group_id(local, group);
    let mut side1 = Side::new(&r1);
    let p1 = r1
        .join_group(group, JoinKind::FullMember, WAIT)
        .expect("receiver 1 joins");
    check_group_param(&p1, &r1, GROUP, "receiver 1");
    assert_eq!(r1.multicast_groups(), vec![group]);
    p1.attach(&mut side1.qp)
        .expect("attach receiver 1's queue pair");
    p1.attach(&mut side1.qp)
        .expect("attaching again does nothing");
    let gid = p1.av.grh.unwrap().dgid;
    assert_eq!(side1.qp.mcast_groups(), &[(gid, p1.av.dlid)]);
    assert!(igmp_has(GROUP), "a full member joins the group by IGMP");

    let r2 = group_id(local, group);
    let mut side2 = Side::new(&r2);
    let p2 = r2
        .join_group(group, JoinKind::FullMember, WAIT)
        .expect("receiver 2 joins");
    check_group_param(&p2, &r2, GROUP, "receiver 2");
    p2.attach(&mut side2.qp)
        .expect("attach receiver 2's queue pair");

    let sender = group_id(local, group);
    let mut tx = Side::new(&sender);
    let to_group = sender
        .join_group(group, JoinKind::SendOnly, WAIT)
        .expect("the sender joins send-only");
    check_group_param(&to_group, &sender, GROUP, "sender");
    let pd = tx.pool.pd().clone();
    let ah = pd
        .create_ah(&to_group.av)
        .expect("ibv_create_ah for the group");
    let sender_qpn = tx.qp.qp_num();
    tx.send_all(&ah, to_group.qp_num, to_group.qkey, 7, "sender, round 1");
    side1.receive_all(Some(sender_qpn), 7, "receiver 1, round 1");
    side2.receive_all(Some(sender_qpn), 7, "receiver 2, round 1");

    // Receiver 1 detaches and leaves; both repost their receives.
    p1.detach(&mut side1.qp).expect("detach receiver 1");
    assert!(side1.qp.mcast_groups().is_empty());
    match side1.qp.detach_mcast(gid, p1.av.dlid) {
        Err(rdma_cm::rdma_verbs::Error::Verb { verb, errno }) => {
            note(&format!("detach of a group not attached: {verb}: {errno}"));
            assert_eq!((verb, errno.raw()), ("ibv_detach_mcast", libc::EINVAL));
        }
        other => panic!("detach of a group not attached: {other:?}"),
    }
    r1.leave_multicast(group).expect("receiver 1 leaves");
    assert!(r1.multicast_groups().is_empty());
    for side in [&mut side1, &mut side2] {
        for i in 0..MESSAGES {
            let buf = side.pool.take().expect("a buffer");
            side.qp.post_recv_buf(buf, u64::from(i)).expect("repost");
        }
    }
    assert!(
        igmp_has(GROUP),
        "receiver 2 is still a member: the group stays joined"
    );
    tx.send_all(&ah, to_group.qp_num, to_group.qkey, 50, "sender, round 2");
    side2.receive_all(Some(sender_qpn), 50, "receiver 2, round 2");
    // rxe hands a group's datagram to every attached queue pair as it arrives: receiver 2 has
    // all of round 2, so receiver 1 would have them too if it were still attached.
    let mut stray = None;
    side1
        .recv_cq
        .poll_each(1, |c| stray = Some(*c.wc()))
        .expect("poll receiver 1");
    assert!(stray.is_none(), "a left receiver got a datagram: {stray:?}");

    // Receiver 2 leaves by dropping everything while its queue pair is still attached: the
    // queue pair is detached before its destroy (which the kernel refuses while attached;
    // a leaked queue pair would keep the identifier, and the group, alive).
    drop((side2, p2, r2));
    assert!(!igmp_has(GROUP), "the last full member is gone: IGMP left");
    drop((tx, ah, pd, to_group, sender, side1, r1));
    assert_cm_ids(before, "after the multicast exchange");
}

/// What misuse gives: joins on an RC identifier, before a device, of a unicast address and of
/// a group joined already; leaving a group not joined; leaving while the group's
/// `MulticastJoin` event is held (librdmacm would wait for it forever) is refused until it is
/// dropped; a leave before the join event was read does not wait, and that event is gone.
#[test]
fn multicast_misuse_is_refused() {
    let Some(local) = device_addr() else { return };
    let before = kernel_cm_ids();
    let group = IpAddr::V4(Ipv4Addr::new(239, 1, 2, 4));
    let channel = EventChannel::new().unwrap();

    let rc = CmId::new(&channel, PortSpace::Tcp).unwrap();
    match rc.join_multicast(group, JoinKind::FullMember) {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("join on an RC identifier: {other:?}"),
    }
    drop(rc);
    let unbound = CmId::new(&channel, PortSpace::Udp).unwrap();
    match unbound.join_multicast(group, JoinKind::FullMember) {
        Err(Error::NoDevice) => {}
        other => panic!("join before a device: {other:?}"),
    }
    drop(unbound);

    let id = group_id(local, group);
    // The count sees an identifier this test thread made (so `assert_cm_ids` can fail).
    assert_eq!(
        kernel_cm_ids(),
        before + 1,
        "the kernel lists the new identifier"
    );
    match id.join_multicast(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), JoinKind::FullMember) {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("join of a unicast address: {other:?}"),
    }
    match id.leave_multicast(group) {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("leave of a group not joined: {other:?}"),
    }
    id.join_multicast(group, JoinKind::FullMember)
        .expect("rdma_join_multicast_ex");
    match id.join_multicast(group, JoinKind::FullMember) {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("a second join of the group: {other:?}"),
    }
    let joined = id
        .wait_event(EventKind::MulticastJoin, WAIT)
        .expect("MulticastJoin");
    assert_eq!(joined.multicast_group(), Some(group));
    assert_eq!(joined.private_data(), &[] as &[u8], "no private data");
    assert!(joined.ud_param().is_some());
    match id.leave_multicast(group) {
        Err(Error::EventsHeld { call, count }) => {
            assert_eq!((call, count), ("rdma_leave_multicast", 1));
        }
        other => panic!("leave with the join event held: {other:?}"),
    }
    assert_eq!(id.multicast_groups(), vec![group], "still joined");
    drop(joined);
    id.leave_multicast(group)
        .expect("leave once the event is dropped");

    // Join and leave before the event is read: nothing waits, nothing comes later.
    id.join_multicast(group, JoinKind::FullMember)
        .expect("join again");
    std::thread::sleep(Duration::from_millis(200));
    id.leave_multicast(group)
        .expect("leave with the join event unread");
    match id.channel().get_event(Some(Duration::from_secs(2))) {
        Ok(None) => {}
        other => panic!("an event after the leave: {other:?}"),
    }
    drop(id);
    drop(channel);
    assert!(!igmp_has(Ipv4Addr::new(239, 1, 2, 4)), "the group is left");
    assert_cm_ids(before, "after the misuse");
}
