// Sends can only be posted in RTS: a queue pair in INIT has no `post_send`.

use rdma_verbs::{QueuePair, qp::{Init, Rc}, wr::SendList};

fn post(qp: &mut QueuePair<Rc, Init>, list: &mut SendList<'_>) {
    // SAFETY: never runs; the call itself must not compile.
    let _ = unsafe { qp.post_send(list) };
}

fn main() {
    let _ = post;
}
