// Only a SEND has a UD destination: `SendRequest<WriteOp>` has no `to` (UD has no RDMA).

use rdma_verbs::{AddressHandle, MemoryRegion, mr::RemoteMemory, wr::SendRequest};

fn write_to(mr: &MemoryRegion, remote: RemoteMemory, ah: &AddressHandle) {
    let _request = SendRequest::write(mr.slice(..).unwrap(), remote).to(ah, 2, 0x1111);
}

fn main() {
    let _ = write_to;
}
