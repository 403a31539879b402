// A slot's request is posted by `post_send_slot` only: a list holds borrowed requests, whose
// memory the request names itself.

use rdma_verbs::{slot::Slot, wr::{SendList, SendRequest}};

fn push(slot: Slot) {
    let mut list = SendList::with_capacity(1);
    let _ = list.push(SendRequest::send(slot));
}

fn main() {
    let _ = push;
}
