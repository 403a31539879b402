// `cm_start_here ADDRESS:PORT`: rdma-cm's quick start (its README shows this file). A server
// listens on an RDMA port's IP address, a client in another thread connects to it, and a
// message goes from the client's slot ring to the server's; the waits are bounded.

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::net::SocketAddr;
use std::time::Duration;

use rdma_cm::rdma_verbs::cq::WorkCompletion;
use rdma_cm::rdma_verbs::wr::SendRequest;
use rdma_cm::{CmId, ConnParam, EventChannel, EventKind, PortSpace};

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .ok_or("usage: cm_start_here ADDRESS:PORT")?
        .parse()?;
    let wait = Duration::from_secs(5);
    let channel = EventChannel::new()?;
    let listener = CmId::new(&channel, PortSpace::Tcp)?;
    listener.bind_addr(addr)?;
    listener.listen(1)?;
    let client = std::thread::spawn(move || client(addr, wait).map_err(|e| e.to_string()));
    let served = serve(&listener, wait);
    // The client's error first: when both sides failed, it is the cause.
    client.join().map_err(|_| "the client panicked")??;
    served
}

/// The server: a queue pair brought to RTS with the connection's attributes, receives posted
/// into every slot of its ring, the accept, then the message.
fn serve(listener: &CmId, wait: Duration) -> Result<(), Error> {
    let request = listener.get_request(wait)?;
    let id = request.id;
    let context = id.context()?;
    let pd = context.alloc_pd()?;
    let mut cq = context.create_cq(16)?;
    let mut qp = id.ready_rc_qp(pd.qp_builder(&cq, &cq).build()?)?;
    let mut rx = qp.slot_ring(4, 64)?;
    qp.fill_slot_ring(&mut rx)?;
    id.accept(&ConnParam::new().qp_num(qp.qp_num()))?;
    drop(id.wait_event(EventKind::Established, wait)?);

    let mut wcs = [WorkCompletion::default(); 1];
    let wc = *cq
        .poll_for(&mut wcs, 1, wait)?
        .first()
        .ok_or("no message in 5 s")?;
    let slot = rx.complete(&wc).ok_or("a completion of no receive")?;
    if !wc.is_success() {
        return Err(format!("the receive failed: {}", wc.status()).into());
    }
    println!(
        "server received {:?}",
        String::from_utf8_lossy(rx.bytes(&slot)?)
    );
    Ok(())
}

fn client(addr: SocketAddr, wait: Duration) -> Result<(), Error> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel, PortSpace::Tcp)?;
    id.resolve(addr, wait)?;
    let context = id.context()?;
    let pd = context.alloc_pd()?;
    let mut cq = context.create_cq(16)?;
    let (mut qp, _) = id.connect_qp(pd.qp_builder(&cq, &cq).build()?, &ConnParam::new(), wait)?;

    let mut tx = qp.slot_ring(1, 64)?;
    let mut slot = tx.take().ok_or("no free slot")?;
    tx.fill(&mut slot, b"hello over rdma-cm")?;
    qp.post_send_slot(&mut tx, SendRequest::send(slot))?;
    let mut wcs = [WorkCompletion::default(); 1];
    let wc = *cq
        .poll_for(&mut wcs, 1, wait)?
        .first()
        .ok_or("no send completion in 5 s")?;
    let slot = tx.complete(&wc).ok_or("a completion of no send")?;
    if !wc.is_success() {
        return Err(format!("the send failed: {}", wc.status()).into());
    }
    tx.put(slot)?;
    println!("client sent its message");
    id.disconnect()?;
    Ok(())
}
