// A slot's request goes to its ring's post only: `post_send_owned` does not take it, so the
// slot cannot leave its ring's record by that door.

use rdma_verbs::{QueuePair, qp::{Rc, Rts}, slot::Slot, wr::SendRequest};

fn post(qp: &mut QueuePair<Rc, Rts>, slot: Slot) {
    let _ = qp.post_send_owned(SendRequest::send(slot));
}

fn main() {
    let _ = post;
}
