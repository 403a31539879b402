// The control of the slot request cases: every operation a slot carries, with the options of
// each, posted safely; a request erased of its operation; a request taken back unposted; a
// SEND to a UD destination.

use rdma_verbs::{AddressHandle, QueuePair, mr::RemoteMemory, qp::{Rc, Rts}, slot::SlotRing, wr::SendRequest};
use rdma_verbs::{qp::Ud, slot::SlotRefused};

fn post(qp: &mut QueuePair<Rc, Rts>, ring: &mut SlotRing, remote: RemoteMemory, read: bool)
    -> Result<(), SlotRefused> {
    let mut next = || ring.take().unwrap();
    let (a, b, c, d, e, f, g) = (next(), next(), next(), next(), next(), next(), next());
    qp.post_send_slot(ring, SendRequest::send(a).with_imm(1).solicited().tag(1))?;
    qp.post_send_slot(ring, SendRequest::write(b, remote).with_imm(2).inline())?;
    qp.post_send_slot(ring, SendRequest::read(c, remote).fenced().tag(3))?;
    qp.post_send_slot(ring, SendRequest::fetch_add(d, remote, 1).unsignaled())?;
    qp.post_send_slot(ring, SendRequest::compare_swap(e, remote, 1, 2))?;
    let chosen = if read {
        SendRequest::read(f, remote).erase()
    } else {
        SendRequest::write(f, remote).erase()
    };
    qp.post_send_slot(ring, chosen.tag(4))?;
    ring.put(SendRequest::send(g).tag(5).into_slot())?;
    Ok(())
}

fn post_ud(qp: &mut QueuePair<Ud, Rts>, ring: &mut SlotRing, ah: &AddressHandle)
    -> Result<(), SlotRefused> {
    let slot = ring.take().unwrap();
    qp.post_send_slot(ring, SendRequest::send(slot).to(ah, 2, 0x1111).unsignaled().tag(6))
}

fn main() {
    let _ = (post, post_ud);
}
