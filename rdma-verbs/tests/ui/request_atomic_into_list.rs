// An atomic's old value lands in one 8-byte word: its target is a slice of a region or a
// slot, never a scatter/gather list.

use rdma_verbs::{mr::RemoteMemory, wr::{SendRequest, Sge}};

fn fetch(entries: &[Sge<'_>], remote: RemoteMemory) {
    let _request = SendRequest::fetch_add(entries, remote, 1);
}

fn main() {
    let _ = fetch;
}
