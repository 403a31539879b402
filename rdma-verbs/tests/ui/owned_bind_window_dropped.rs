// An owned bind borrows its window until it is posted (or dropped): the window cannot be
// deallocated, or bound by a second request, meanwhile. The control is
// `owned_bind_window_dropped_ok`.

use std::sync::Arc;

use rdma_verbs::{MemoryRegion, MemoryWindow, QueuePair, mr::AccessFlags, qp::{Rc, Rts}, wr::SendRequest};

fn bind(qp: &mut QueuePair<Rc, Rts>, mut mw: MemoryWindow, mr: Arc<MemoryRegion>) {
    let request = SendRequest::bind_mw(&mut mw, &mr, .., AccessFlags::REMOTE_WRITE).unwrap();
    drop(mw);
    let _ = qp.post_send_owned(request);
}

fn main() {
    let _ = bind;
}
