// Only a SEND goes to a UD destination: `SendRequest<WriteOp, Owned>` has no `to`.

use rdma_verbs::{AddressHandle, mr::RemoteMemory, owned::Buf, wr::SendRequest};

fn write_to_ud(buf: Buf, remote: RemoteMemory, ah: &AddressHandle) {
    let _request = SendRequest::write(buf, remote).to(ah, 2, 0x1111);
}

fn main() {
    let _ = write_to_ud;
}
