// The safe owned post takes owned memory only: a request that borrows a region's bytes (the
// device would use them after the borrow ends) is `SendRequest<_, Borrowed>`, which
// `post_send_owned` does not take.

use rdma_verbs::{MemoryRegion, QueuePair, qp::{Rc, Rts}, wr::SendRequest};

fn post(qp: &mut QueuePair<Rc, Rts>, mr: &MemoryRegion) {
    let _ = qp.post_send_owned(SendRequest::send(mr.slice(..8).unwrap()));
}

fn main() {
    let _ = post;
}
