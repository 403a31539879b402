// A send list takes requests of any operation, and borrows the regions each names: the target
// of a READ cannot be dropped while the list may still be posted either.

use rdma_verbs::{ProtectionDomain, QueuePair, mr::{AccessFlags, RemoteMemory}, qp::{Rc, Rts}, wr::{SendList, SendRequest}};

fn drop_target_first(pd: &ProtectionDomain, qp: &mut QueuePair<Rc, Rts>, remote: RemoteMemory) {
    let mut list = SendList::with_capacity(4);
    let mr = pd.register(64, AccessFlags::LOCAL_WRITE).unwrap();
    list.push(SendRequest::read(mr.slice(..).unwrap(), remote).tag(1))
        .unwrap();
    drop(mr);
    // SAFETY: never runs; the region was dropped above, which must not compile.
    let _ = unsafe { qp.post_send(&mut list) };
}

fn main() {
    let _ = drop_target_first;
}
