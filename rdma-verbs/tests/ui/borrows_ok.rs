// The control of `mr_slice_outlives_region` and `send_list_outlives_region`: the same code
// compiles when the region outlives the slice and the list's last post.

use rdma_verbs::{ProtectionDomain, QueuePair, mr::AccessFlags, qp::{Rc, Rts}, wr::{SendList, SendRequest}};

fn slice_in_time(pd: &ProtectionDomain) -> u32 {
    let mr = pd.register(64, AccessFlags::LOCAL_WRITE).unwrap();
    let slice = mr.slice(..16).unwrap();
    slice.lkey()
}

fn drop_region_last(pd: &ProtectionDomain, qp: &mut QueuePair<Rc, Rts>) {
    let mut list = SendList::with_capacity(4);
    let mr = pd.register(64, AccessFlags::LOCAL_WRITE).unwrap();
    list.push(SendRequest::send(mr.slice(..).unwrap()).tag(1))
        .unwrap();
    // SAFETY: never runs; only compiled.
    let _ = unsafe { qp.post_send(&mut list) };
    drop(list);
    drop(mr);
}

fn main() {
    let _ = (slice_in_time, drop_region_last);
}
