// A request, a slice or a transition's attributes do nothing until they are used: building
// one and dropping it is a mistake the compiler reports (`#[must_use]`). Here `unsignaled()`
// returns a new request, which is dropped, and the request posted below is still signaled.
// Under `deny(unused_must_use)` that is an error.

#![deny(unused_must_use)]

use rdma_verbs::{MemoryRegion, QueuePair, qp::{Rc, Rts}, wr::SendRequest};

fn post_signaled_by_mistake(qp: &mut QueuePair<Rc, Rts>, mr: &MemoryRegion) {
    let request = SendRequest::send(mr.slice(..).unwrap()).tag(1);
    request.unsignaled();
    // SAFETY: never runs; only compiled.
    let _ = unsafe { qp.post_send_one(&request) };
}

fn main() {
    let _ = post_signaled_by_mistake;
}
