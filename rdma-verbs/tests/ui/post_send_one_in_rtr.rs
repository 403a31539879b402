// RTR cannot send whatever the transport: no `post_send_one` on a UD queue pair in RTR.

use rdma_verbs::{QueuePair, qp::{Rtr, Ud}, wr::SendRequest};

fn post(qp: &mut QueuePair<Ud, Rtr>, request: &SendRequest<'_>) {
    // SAFETY: never runs; the call itself must not compile.
    let _ = unsafe { qp.post_send_one(request) };
}

fn main() {
    let _ = post;
}
