// The control of `owned_bind_window_dropped`: the window is dropped after the post, and its
// key read once the request is gone.

use std::sync::Arc;

use rdma_verbs::{MemoryRegion, MemoryWindow, QueuePair, mr::AccessFlags, qp::{Rc, Rts}, wr::SendRequest};

fn bind(qp: &mut QueuePair<Rc, Rts>, mut mw: MemoryWindow, mr: Arc<MemoryRegion>) -> u32 {
    let request = SendRequest::bind_mw(&mut mw, &mr, .., AccessFlags::REMOTE_WRITE).unwrap();
    let _ = qp.post_send_owned(request);
    let rkey = mw.rkey();
    drop(mw);
    rkey
}

fn main() {
    let _ = bind;
}
