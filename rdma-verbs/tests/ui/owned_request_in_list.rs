// An owned request goes to `post_send_owned` or an `OwnedSendList`: a `SendList` holds
// borrowed requests only.

use rdma_verbs::{owned::Buf, wr::{SendList, SendRequest}};

fn push(buf: Buf) {
    let mut list = SendList::with_capacity(1);
    let _ = list.push(SendRequest::send(buf));
}

fn main() {
    let _ = push;
}
