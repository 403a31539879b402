// An owned receive goes to `post_recv_owned` or an `OwnedRecvList`: a `RecvList` holds
// borrowed receives only.

use rdma_verbs::{owned::Buf, wr::{RecvList, RecvRequest}};

fn push(buf: Buf) {
    let mut list = RecvList::with_capacity(1);
    let _ = list.push(RecvRequest::new(buf));
}

fn main() {
    let _ = push;
}
