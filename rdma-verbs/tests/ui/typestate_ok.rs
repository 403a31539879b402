// The control of the typestate cases: the calls they make compile in the states that allow
// them, with the same argument types, so each case fails only because of its state (or its
// attribute type).

use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};

fn sends(qp: &mut QueuePair<Rc, Rts>, list: &mut SendList<'_>, request: &SendRequest<'_>) {
    // SAFETY: never runs; only compiled.
    let _ = unsafe { qp.post_send(list) };
    // SAFETY: as above.
    let _ = unsafe { qp.post_send_one(request) };
}

fn ud_send(qp: &mut QueuePair<Ud, Rts>, request: &SendRequest<'_>) {
    // SAFETY: as above.
    let _ = unsafe { qp.post_send_one(request) };
}

fn receives(qp: &mut QueuePair<Rc, Init>, list: &mut RecvList<'_>, request: &RecvRequest<'_>) {
    // SAFETY: as above.
    let _ = unsafe { qp.post_recv(list) };
    // SAFETY: as above.
    let _ = unsafe { qp.post_recv_one(request) };
}

fn transitions(reset: QueuePair<Rc, Reset>, ud: QueuePair<Ud, Init>) {
    let init = reset.into_init(&ConnectedInitAttr::new(1)).unwrap();
    let _ = init.qp_num();
    let rtr = init
        .into_rtr(&RcRtrAttr::new(AddressVector::new(1), 0x11, 0))
        .unwrap();
    let _ = rtr.into_rts(&RcRtsAttr::new(0));
    let _ = ud.into_rtr(&UdRtrAttr);
}

fn main() {
    let _ = (sends, ud_send, receives, transitions);
}
