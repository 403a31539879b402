// The safe owned receive takes owned memory only: a receive into borrowed memory is
// `RecvRequest<_, Borrowed>`, which `post_recv_owned` does not take.

use rdma_verbs::{MemoryRegion, QueuePair, qp::{Rc, Rts}, wr::RecvRequest};

fn post(qp: &mut QueuePair<Rc, Rts>, mr: &MemoryRegion) {
    let _ = qp.post_recv_owned(RecvRequest::new(mr.slice(..8).unwrap()));
}

fn main() {
    let _ = post;
}
