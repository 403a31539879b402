// Receives can be posted from INIT on: a queue pair in RESET has no `post_recv_one`.

use rdma_verbs::{QueuePair, qp::{Rc, Reset}, wr::RecvRequest};

fn post(qp: &mut QueuePair<Rc, Reset>, request: &RecvRequest<'_>) {
    // SAFETY: never runs; the call itself must not compile.
    let _ = unsafe { qp.post_recv_one(request) };
}

fn main() {
    let _ = post;
}
