// SEND_WITH_INV carries the key it invalidates where immediate data would go: its request has
// no `with_imm` (refused by the compiler, not at post time).

use rdma_verbs::{MemoryRegion, wr::SendRequest};

fn invalidate_with_imm(mr: &MemoryRegion) {
    let _request = SendRequest::send_with_invalidate(mr.slice(..).unwrap(), 7).with_imm(5);
}

fn main() {
    let _ = invalidate_with_imm;
}
