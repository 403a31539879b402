// Receives can be posted from INIT on: a queue pair in RESET has no `post_recv`.

use rdma_verbs::{QueuePair, Rc, RecvList, RecvRequest, Reset};

fn post(qp: &mut QueuePair<Rc, Reset>, list: &mut RecvList<'_>, request: &RecvRequest<'_>) {
    // SAFETY: never runs; the calls themselves must not compile.
    let _ = unsafe { qp.post_recv(list) };
    // SAFETY: as above.
    let _ = unsafe { qp.post_recv_one(request) };
}

fn main() {
    let _ = post;
}
