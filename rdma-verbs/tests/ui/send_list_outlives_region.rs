// A send list borrows the regions its requests name: the region cannot be dropped while the
// list may still be posted.

use rdma_verbs::{ProtectionDomain, QueuePair, mr::AccessFlags, qp::{Rc, Rts}, wr::{SendList, SendRequest}};

fn drop_region_first(pd: &ProtectionDomain, qp: &mut QueuePair<Rc, Rts>) {
    let mut list = SendList::with_capacity(4);
    let mr = pd.register(64, AccessFlags::LOCAL_WRITE).unwrap();
    list.push(SendRequest::send(mr.slice(..).unwrap()).tag(1))
        .unwrap();
    drop(mr);
    // SAFETY: never runs; the region was dropped above, which must not compile.
    let _ = unsafe { qp.post_send(&mut list) };
}

fn main() {
    let _ = drop_region_first;
}
