// Only a SEND goes to a UD destination: `OwnedSend<WriteOp>` has no `to`.

use rdma_verbs::{AddressHandle, Buf, OwnedSend, RemoteMemory};

fn write_to_ud(buf: Buf, remote: RemoteMemory, ah: &AddressHandle) {
    let _request = OwnedSend::write(buf, remote).to(ah, 2, 0x1111);
}

fn main() {
    let _ = write_to_ud;
}
