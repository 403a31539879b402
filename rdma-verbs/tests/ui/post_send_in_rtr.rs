// RTR accepts receives but cannot send: no `post_send` on an RC queue pair in RTR.

use rdma_verbs::{QueuePair, qp::{Rc, Rtr}, wr::SendList};

fn post(qp: &mut QueuePair<Rc, Rtr>, list: &mut SendList<'_>) {
    // SAFETY: never runs; the call itself must not compile.
    let _ = unsafe { qp.post_send(list) };
}

fn main() {
    let _ = post;
}
