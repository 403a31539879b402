// A slot's request has no UD destination: the slot path does not keep an address handle
// alive, so `SendRequest<SendOp, Slot>` has no `to`.

use rdma_verbs::{AddressHandle, SendRequest, Slot};

fn send_to(slot: Slot, ah: &AddressHandle) {
    let _request = SendRequest::send(slot).to(ah, 2, 0x1111);
}

fn main() {
    let _ = send_to;
}
