// An SRQ slot ring's slot, as a slot ring's: its bytes read through `SrqSlotRing::bytes`
// borrow the slot, which cannot be written through `bytes_mut` (or `fill`) while the read
// lives, on this thread or another.

use rdma_verbs::slot::SrqSlotRing;

fn read_then_write(ring: &mut SrqSlotRing) {
    let mut slot = ring.take().unwrap();
    let ring: &SrqSlotRing = ring;
    let read = ring.bytes(&slot).unwrap();
    let write = ring.bytes_mut(&mut slot).unwrap();
    write[0] = 1;
    let _ = read[0];
    drop(slot);
}

fn main() {
    let _ = read_then_write;
}
