// Bytes of no region are a send's inline data, never a receive's memory.

use rdma_verbs::{wr::{RecvList, RecvRequest}};

fn push(bytes: &[u8]) {
    let mut list = RecvList::with_capacity(1);
    let _ = list.push(RecvRequest::new(bytes));
}

fn main() {
    let _ = push;
}
