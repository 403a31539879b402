// A request's operation is its type: an atomic cannot carry immediate data, so
// `SendRequest<AtomicOp>` has no `with_imm` (refused by the compiler, not at post time).

use rdma_verbs::{MemoryRegion, mr::RemoteMemory, wr::SendRequest};

fn fetch_add_with_imm(mr: &MemoryRegion, remote: RemoteMemory) {
    let _request = SendRequest::fetch_add(mr.slice(..8).unwrap(), remote, 1).with_imm(7);
}

fn main() {
    let _ = fetch_add_with_imm;
}
