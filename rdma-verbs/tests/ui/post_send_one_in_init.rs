// Sends can only be posted in RTS: a queue pair in INIT has no `post_send_one` either.

use rdma_verbs::{QueuePair, qp::{Init, Rc}, wr::SendRequest};

fn post(qp: &mut QueuePair<Rc, Init>, request: &SendRequest<'_>) {
    // SAFETY: never runs; the call itself must not compile.
    let _ = unsafe { qp.post_send_one(request) };
}

fn main() {
    let _ = post;
}
