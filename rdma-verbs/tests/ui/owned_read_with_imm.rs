// An owned request's operation is its type: an RDMA READ cannot carry immediate data, so
// `SendRequest<ReadOp, Owned>` has no `with_imm` (refused by the compiler, not at post time).

use rdma_verbs::{mr::RemoteMemory, owned::Buf, wr::SendRequest};

fn read_with_imm(buf: Buf, remote: RemoteMemory) {
    let _request = SendRequest::read(buf, remote).with_imm(7);
}

fn main() {
    let _ = read_with_imm;
}
