// RTR accepts receives but cannot send, whatever the transport.

use rdma_verbs::{QueuePair, Rc, Rtr, SendList, SendRequest, Ud};

fn post_rc(qp: &mut QueuePair<Rc, Rtr>, list: &mut SendList<'_>) {
    // SAFETY: never runs; the call itself must not compile.
    let _ = unsafe { qp.post_send(list) };
}

fn post_ud(qp: &mut QueuePair<Ud, Rtr>, request: &SendRequest<'_>) {
    // SAFETY: never runs; the call itself must not compile.
    let _ = unsafe { qp.post_send_one(request) };
}

fn main() {
    let _ = (post_rc, post_ud);
}
