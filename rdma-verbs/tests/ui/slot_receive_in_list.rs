// A slot's receive goes to `post_recv_slot`: a `RecvList` holds borrowed receives only (the
// `unsafe` post would let the slot's bytes be reached while the device writes them).

use rdma_verbs::{slot::Slot, wr::{RecvList, RecvRequest}};

fn push(slot: Slot) {
    let mut list = RecvList::with_capacity(1);
    let _ = list.push(RecvRequest::new(slot));
}

fn main() {
    let _ = push;
}
