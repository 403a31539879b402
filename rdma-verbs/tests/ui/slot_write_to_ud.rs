// Only a SEND has a UD destination: a slot's RDMA WRITE has no `to` (UD carries SENDs only).
// The control, `slot_request_ops_ok.rs`, sends a slot to an address handle.

use rdma_verbs::{AddressHandle, mr::RemoteMemory, slot::Slot, wr::SendRequest};

fn write_to(slot: Slot, remote: RemoteMemory, ah: &AddressHandle) {
    let _request = SendRequest::write(slot, remote).to(ah, 2, 0x1111);
}

fn main() {
    let _ = write_to;
}
