// A slot's request is posted by `post_send_slot` only: the `unsafe` posts take borrowed
// requests, so a slot cannot leave its ring's record by that door.

use rdma_verbs::{QueuePair, qp::{Rc, Rts}, slot::Slot, wr::SendRequest};

fn post(qp: &mut QueuePair<Rc, Rts>, slot: Slot) {
    // SAFETY: not reached; the call does not compile.
    let _ = unsafe { qp.post_send_one(&SendRequest::send(slot)) };
}

fn main() {
    let _ = post;
}
