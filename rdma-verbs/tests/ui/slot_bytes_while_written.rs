// A slot's bytes read through `SlotRing::bytes` borrow the slot: it cannot be written through
// `bytes_mut` (or `fill`) while the read lives, on this thread or another.

use rdma_verbs::slot::SlotRing;

fn read_then_write(ring: &mut SlotRing) {
    let mut slot = ring.take().unwrap();
    let ring: &SlotRing = ring;
    let read = ring.bytes(&slot).unwrap();
    let write = ring.bytes_mut(&mut slot).unwrap();
    write[0] = 1;
    let _ = read[0];
    drop(slot);
}

fn main() {
    let _ = read_then_write;
}
