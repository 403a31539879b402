// Receives can be posted from INIT on: a queue pair in RESET has no `post_recv`.

use rdma_verbs::{QueuePair, qp::{Rc, Reset}, wr::RecvList};

fn post(qp: &mut QueuePair<Rc, Reset>, list: &mut RecvList<'_>) {
    // SAFETY: never runs; the call itself must not compile.
    let _ = unsafe { qp.post_recv(list) };
}

fn main() {
    let _ = post;
}
