// The control of `request_unused`: the same code compiles under `deny(unused_must_use)` when
// the unsignaled request is the one posted.

#![deny(unused_must_use)]

use rdma_verbs::{MemoryRegion, QueuePair, qp::{Rc, Rts}, wr::SendRequest};

fn post_unsignaled(qp: &mut QueuePair<Rc, Rts>, mr: &MemoryRegion) {
    let request = SendRequest::send(mr.slice(..).unwrap()).tag(1);
    let request = request.unsignaled();
    // SAFETY: never runs; only compiled.
    let _ = unsafe { qp.post_send_one(&request) };
}

fn main() {
    let _ = post_unsignaled;
}
