//! [`Owned`]: the memory model of the owned-buffer path's send requests
//! ([`SendRequest<'_, K, Owned>`](SendRequest)), and their posting
//! ([`QueuePair::post_send_owned`]).

use std::fmt;
use std::sync::Arc;

use super::{OwnedSges, PostRefused, RegionRange, check_pd, check_region, post_owned, range};
use crate::ah::AddressHandle;
use crate::buf::Buf;
use crate::error::{Error, Result};
use crate::flags::{AccessFlags, SendFlags};
use crate::inflight::Ring;
use crate::mr::MemoryRegion;
use crate::mw::{BindRange, MemoryWindow, MwShared};
use crate::qp::{QueuePair, Rts, Transport, may_have_posted};
use crate::wr::{
    AtomicTarget, BindOp, BindRegion, IntoMemory, Memoryless, Operation, Payload, ReadOp, SendOp,
    SendRequest, SendWr, WriteOp, memory_sealed,
};

/// The memory model of the owned-buffer path: what a [`SendRequest<'_, K, Owned>`](SendRequest)
/// carries into [`QueuePair::post_send_owned`] (or an
/// [`OwnedSendList`](crate::owned::OwnedSendList)), moved into the queue pair's in-flight table until
/// the request's completion hands it back through
/// [`CompletionQueue::poll_each`](crate::CompletionQueue::poll_each).
///
/// The constructors take it from what they are given ([`IntoMemory`]): a [`Buf`] (its first
/// [`len`](Buf::len) bytes), a [`RegionRange`] (bytes of the caller's region, zero-copy), or
/// bytes of no region copied into the request when it is posted (inline; `b""` for none);
/// [`and_range`](SendRequest::and_range) appends a range after a buffer's bytes. A UD
/// destination ([`to`](SendRequest::to)) is kept alive (a clone of the address handle), and a
/// bind ([`bind_mw`](SendRequest::bind_mw) given `&Arc<MemoryRegion>`) keeps its region, until
/// the request completes.
///
/// Signaled by default: the completion hands the buffer back. An
/// [`unsignaled`](SendRequest::unsignaled) request produces no completion; its buffer returns
/// to its pool when a later signaled request of the same queue pair completes (the post
/// signals it whatever it asked when otherwise none might come: see
/// [`QueuePair::post_send_owned`]).
///
/// ```no_run
/// # use rdma_verbs::{QueuePair, owned::BufferPool, qp::{Rc, Rts}, wr::SendRequest};
/// # fn f(qp: &mut QueuePair<Rc, Rts>, pool: &BufferPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut buf = pool.take().expect("a free buffer");
/// buf.fill_from(b"hello")?;
/// qp.post_send_owned(SendRequest::send(buf).with_imm(7).tag(1))?;
/// qp.post_send_owned(SendRequest::send(b"inline bytes").tag(2))?;
/// # Ok(()) }
/// ```
///
/// What an operation cannot carry does not compile, as for every model:
///
/// ```compile_fail,E0599
/// # fn f(buf: rdma_verbs::owned::Buf, remote: rdma_verbs::mr::RemoteMemory) {
/// let request = rdma_verbs::wr::SendRequest::read(buf, remote).with_imm(7);
/// # }
/// ```
pub struct Owned<'a> {
    pub(super) buf: Option<Buf>,
    /// Bytes of a caller's region, after the buffer's ([`SendRequest::and_range`]).
    pub(super) range: Option<RegionRange>,
    /// A second range was given, which the request cannot carry: refused when prepared.
    pub(super) ranges_over: bool,
    dest: Option<(AddressHandle, u32, u32)>,
    bind: Option<Bind<'a>>,
    /// The region a bind names, which the request keeps until the bind has executed.
    bind_region: Option<Arc<MemoryRegion>>,
}

/// A checked BIND_MW: the window, the key the bind gives it (taken by the window only once
/// the request is posted, so that a request the device never sees leaves the window's key as
/// the device knows it), the range and the rights.
struct Bind<'a> {
    mw: &'a mut MemoryWindow,
    rkey: u32,
    range: BindRange,
    access: AccessFlags,
}

impl Owned<'_> {
    #[inline]
    pub(super) fn of(buf: Option<Buf>, range: Option<RegionRange>) -> Self {
        Self {
            buf,
            range,
            ranges_over: false,
            dest: None,
            bind: None,
            bind_region: None,
        }
    }
}

impl fmt::Debug for Owned<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owned")
            .field("buf", &self.buf)
            .field("range", &self.range)
            .field(
                "dest",
                &self.dest.as_ref().map(|(_, qpn, qkey)| (qpn, qkey)),
            )
            .field("bind_rkey", &self.bind.as_ref().map(|bind| bind.rkey))
            .finish()
    }
}

impl memory_sealed::Sealed for Owned<'_> {}
impl Memoryless for Owned<'_> {
    #[inline]
    fn none() -> Self {
        Self::of(None, None)
    }
}

impl memory_sealed::Sealed for Buf {}
impl<'a> IntoMemory<'a, Owned<'a>> for Buf {
    #[inline]
    fn into_memory(self) -> (Payload<'a>, Owned<'a>) {
        (Payload::None, Owned::of(Some(self), None))
    }
}
impl<'a> AtomicTarget<'a, Owned<'a>> for Buf {}

impl memory_sealed::Sealed for RegionRange {}
impl<'a> IntoMemory<'a, Owned<'a>> for RegionRange {
    #[inline]
    fn into_memory(self) -> (Payload<'a>, Owned<'a>) {
        (Payload::None, Owned::of(None, Some(self)))
    }
}

impl memory_sealed::Sealed for &Arc<MemoryRegion> {}
impl<'a> BindRegion<'a, Owned<'a>> for &Arc<MemoryRegion> {
    #[inline]
    fn region(&self) -> &MemoryRegion {
        self
    }

    fn bind(
        self,
        mw: &'a mut MemoryWindow,
        range: BindRange,
        access: AccessFlags,
    ) -> Result<(SendWr<'a>, Owned<'a>)> {
        let rkey = mw.preview_type2_rkey()?;
        let mut owned = Owned::of(None, None);
        owned.bind = Some(Bind {
            mw,
            rkey,
            range,
            access,
        });
        owned.bind_region = Some(Arc::clone(self));
        Ok((SendWr::bind_pending(), owned))
    }
}

impl<'a, K: Operation> SendRequest<'a, K, Owned<'a>> {
    /// Appends `range` to the request's memory, after the buffer's bytes (a second
    /// scatter/gather entry; the queue pair needs `max_send_sge` of 2 for both). A request
    /// carries one range: a second is refused when the request is posted or pushed.
    #[inline]
    fn with_range(mut self, range: RegionRange) -> Self {
        let memory = self.memory_mut();
        memory.ranges_over |= memory.range.is_some();
        memory.range = Some(range);
        self
    }

    /// The buffer the request carries, if any: for a request that will not be posted.
    pub fn into_buf(self) -> Option<Buf> {
        self.into_parts().1.buf
    }
}

impl<'a> SendRequest<'a, SendOp, Owned<'a>> {
    /// The bytes of `range` sent after the buffer's (gathered: the buffer's
    /// [`len`](Buf::len) bytes, then the range's), for example a header from a pool buffer
    /// and a payload straight from the caller's region. Refused at post on an inline request
    /// (bytes of no region, `b""`, or [`inline`](SendRequest::inline)) and on a UD send (whose
    /// in-flight entry keeps its address handle instead).
    pub fn and_range(self, range: RegionRange) -> Self {
        self.with_range(range)
    }

    /// The destination of a UD send: queue pair `remote_qpn` with Q_Key `remote_qkey` behind
    /// `ah`, which the request keeps alive (a clone) until it completes. Required for every
    /// request posted to a UD queue pair, refused on the others.
    pub fn to(mut self, ah: &AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.memory_mut().dest = Some((ah.clone(), remote_qpn, remote_qkey));
        self
    }
}

impl<'a> SendRequest<'a, WriteOp, Owned<'a>> {
    /// The bytes of `range` written after the buffer's. Refused at post on an inline request
    /// (bytes of no region, `b""`, or [`inline`](SendRequest::inline)).
    pub fn and_range(self, range: RegionRange) -> Self {
        self.with_range(range)
    }
}

impl<'a> SendRequest<'a, ReadOp, Owned<'a>> {
    /// Scatters the READ's bytes: the buffer's first `len` bytes, then `range`'s (of a
    /// [shared](MemoryRegion::is_shared) region).
    pub fn and_range(self, range: RegionRange) -> Self {
        self.with_range(range)
    }
}

impl<'a> SendRequest<'a, BindOp, Owned<'a>> {
    /// The key the bind gives its window (its [`rkey`](MemoryWindow::rkey) from the moment
    /// the request is posted).
    pub fn rkey(&self) -> u32 {
        self.memory().bind.as_ref().map_or(0, |bind| bind.rkey)
    }
}

/// Inline bytes that are bytes (an empty slice names no memory, as `b""` does).
#[inline]
fn inline_bytes<'a>(payload: Payload<'a>) -> Option<&'a [u8]> {
    match payload {
        Payload::Inline(bytes) if !bytes.is_empty() => Some(bytes),
        _ => None,
    }
}

impl<'a, K: Operation> SendRequest<'a, K, Owned<'a>> {
    /// Checks what can be checked without the queue pair, and splits the request into what the
    /// in-flight table keeps and what the work request needs.
    #[inline]
    pub(super) fn prepare(self) -> std::result::Result<Prepared<'a>, PostRefused> {
        let (wr, owned) = self.into_parts();
        let Owned {
            mut buf,
            range,
            ranges_over,
            dest,
            bind,
            bind_region,
        } = owned;
        if wr.has_atomic_result() {
            if let Some(result) = buf.as_mut() {
                if let Err(error) = result.set_len(8) {
                    return Err(PostRefused { error, buf });
                }
            }
        }
        let inline = inline_bytes(wr.payload());
        if range.is_some() {
            let error = if ranges_over {
                Some(range::second_range("request"))
            } else if matches!(wr.payload(), Payload::Inline(_))
                || wr.flags().contains(SendFlags::INLINE)
            {
                // Also for `.inline()` on a buffer with a range: the provider would copy the
                // range's bytes with the CPU while a peer or the device may write them (a
                // shared region's bytes are read with atomic copies only).
                Some(Error::invalid(
                    "an inline request cannot carry a region range",
                ))
            } else if dest.is_some() {
                Some(Error::invalid(
                    "a UD send cannot carry a region range (send it from a buffer)",
                ))
            } else {
                None
            };
            if let Some(error) = error {
                return Err(PostRefused { error, buf });
            }
        }
        let sges = OwnedSges::new(buf.as_ref().map(|b| b.raw_slice(false)), range.as_ref());
        // Binds carry no range (`and_range` is not theirs).
        let region = match range {
            Some(range) => Some(range.into_region()),
            None => bind_region,
        };
        // The device moves as many bytes as the local side names, whatever the remote
        // memory's length: a READ or WRITE longer than it would reach past it.
        if let Some(remote) = wr.rdma_remote() {
            let bytes = inline.map_or_else(|| sges.bytes(), |bytes| bytes.len() as u64);
            if bytes > u64::from(remote.len) {
                let (what, direction) = if wr.device_only_reads() {
                    ("a write of", "to")
                } else {
                    ("a read of", "from")
                };
                let error = Error::InvalidArgument(format!(
                    "{what} {bytes} bytes {direction} {} bytes of remote memory",
                    remote.len
                ));
                return Err(PostRefused { error, buf });
            }
        }
        Ok(Prepared {
            buf,
            sges,
            wr,
            bind,
            region,
            dest,
        })
    }
}

/// An owned send request checked and split for posting: the buffer (which moves into the
/// in-flight table when posted, and comes back if the post is refused), the range of its
/// bytes the work request names, and the rest of the request.
pub(crate) struct Prepared<'a> {
    pub(crate) buf: Option<Buf>,
    /// The buffer's bytes and the range's, as the work request names them.
    sges: OwnedSges,
    /// The request as built, naming no memory but inline bytes.
    wr: SendWr<'a>,
    bind: Option<Bind<'a>>,
    /// The region a bind names, or the region of the caller's range the request names after
    /// the buffer: its in-flight entry keeps it registered.
    region: Option<Arc<MemoryRegion>>,
    dest: Option<(AddressHandle, u32, u32)>,
}

impl Prepared<'_> {
    /// The caller's tag.
    #[inline]
    pub(crate) fn tag(&self) -> u64 {
        self.wr.wr_id()
    }

    /// Whether the caller asked for a completion.
    #[inline]
    pub(crate) fn asks_signal(&self) -> bool {
        self.wr.flags().contains(SendFlags::SIGNALED)
    }

    /// Makes the request name no memory (see `list.rs`).
    pub(crate) fn disarm(&mut self) {
        self.sges.clear();
    }

    /// Marks the request as one the provider may have taken (posted, or its post's outcome
    /// unknown): a bind's window takes the bind's key, and is returned for the queue pair to
    /// record (`QueuePair::keep_window`).
    #[inline]
    pub(crate) fn hand_over(&mut self) -> Option<Arc<MwShared>> {
        let bind = self.bind.as_mut()?;
        bind.mw.commit_rkey(bind.rkey);
        Some(bind.mw.shared().clone())
    }

    /// The window of a bind.
    #[inline]
    pub(crate) fn window(&self) -> Option<&Arc<MwShared>> {
        self.bind.as_ref().map(|bind| bind.mw.shared())
    }

    /// What the in-flight entry keeps alive besides the buffer: the region of a bind or a
    /// range (a reference of its own, so that the request can be taken back whole), or a UD
    /// destination's handle (a UD send carries no range, and no bind).
    #[inline]
    pub(crate) fn keep(&self) -> Option<Arc<dyn Send + Sync>> {
        if let Some(region) = &self.region {
            return Some(region.clone());
        }
        self.dest.as_ref().map(|(ah, _, _)| ah.keep_alive())
    }

    /// Checks the range's region (if any) against protection domain `pd`, and that the device
    /// may write it if the operation writes (a READ).
    #[inline]
    pub(crate) fn check_range(&self, pd: *mut crate::ffi::ibv_pd) -> Result<()> {
        match &self.region {
            Some(region) if self.bind.is_none() => {
                check_region(region, pd, !self.wr.device_only_reads())
            }
            _ => Ok(()),
        }
    }

    /// Refuses, without the queue pair, a device write into a range of a region that is not
    /// shared (the protection domain is checked at post).
    pub(crate) fn check_sharing(&self) -> Result<()> {
        match &self.region {
            Some(region)
                if self.bind.is_none() && !self.wr.device_only_reads() && !region.is_shared() =>
            {
                Err(range::not_shared())
            }
            _ => Ok(()),
        }
    }

    /// The work request, with owned id `id`, signaled whatever the caller asked if `signal`:
    /// for the request that took the in-flight table's last free slot, and one the safe paths'
    /// run of unsignaled sends forces (`QueuePair::next_unsignaled`). Unsignaled requests are
    /// released only by a later completion, and with the queue full of them none could come.
    #[inline]
    pub(crate) fn request(&self, id: u64, signal: bool) -> SendWr<'_> {
        let wr: SendWr<'_> = self.wr;
        let payload = match inline_bytes(wr.payload()) {
            Some(bytes) => Payload::Inline(bytes),
            None => self.sges.payload(),
        };
        let mut request = wr.with_payload(payload).owned(id);
        if let Some((ah, remote_qpn, remote_qkey)) = &self.dest {
            request = request.to(ah, *remote_qpn, *remote_qkey);
        }
        if let (Some(bind), Some(mr)) = (&self.bind, &self.region) {
            request = request.with_bind(bind.mw, bind.rkey, mr, bind.range, bind.access);
        }
        let flags = if signal {
            wr.flags() | SendFlags::SIGNALED
        } else {
            wr.flags()
        };
        request.set_flags(flags)
    }
}

impl fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("buf", &self.buf)
            .field("tag", &self.tag())
            .finish_non_exhaustive()
    }
}

impl<T: Transport> QueuePair<T, Rts> {
    /// Posts an owned send request: its buffer moves into the queue pair until the request's
    /// completion (or a later one of this queue pair, for an unsignaled request) hands it back
    /// through [`CompletionQueue::poll_each`](crate::CompletionQueue::poll_each) on the send
    /// completion queue. Allocates nothing, except that a bind's window is recorded by the
    /// queue pair (see [`MemoryWindow`]), which may grow its record.
    ///
    /// An [`unsignaled`](SendRequest::unsignaled) request is signaled whatever it asked when it
    /// takes the send table's last free slot, or when it would make `max_send_wr` unsignaled
    /// sends of this queue pair in a row (owned and slot sends counted together), so
    /// that a completion always comes to release them.
    ///
    /// A UD queue pair needs a destination ([`to`](SendRequest::to)); its address handle stays
    /// alive until the request completes. To post several requests with one doorbell, use
    /// [`post_send_list`](Self::post_send_list).
    ///
    /// # Errors
    ///
    /// [`PostRefused`], with the buffer when the device never saw it:
    /// [`Error::InvalidArgument`] for an operation the transport does not allow (a bind on
    /// UD), immediate data where it cannot go, an atomic whose buffer holds fewer than 8
    /// bytes, a READ or WRITE longer than its remote memory, a buffer, range, address handle
    /// or memory window of another protection domain, a READ into a range of a region that
    /// is not shared, or a range on an inline request, on a UD send, or given twice;
    /// [`Error::QueueFull`] when as many requests are in flight as the send queue holds; else
    /// as [`post_send_one`](Self::post_send_one).
    // Inlined at every call site, where the kind of request is known, so that the compiler
    // folds the dispatch on it (docs/benchmarks.md, "What the code is shaped by").
    #[inline(always)]
    pub fn post_send_owned<K: Operation>(
        &mut self,
        request: SendRequest<'_, K, Owned<'_>>,
    ) -> std::result::Result<(), PostRefused> {
        let mut prepared = request.prepare()?;
        let pd = self.pd().as_raw();
        if let Err(error) =
            check_pd(prepared.buf.as_ref(), pd).and_then(|()| prepared.check_range(pd))
        {
            return Err(PostRefused {
                error,
                buf: prepared.buf,
            });
        }
        // A bind holds its window's lock from the check that the window is allocated until the
        // post verb returns, so that no queue pair's destruction deallocates it meanwhile
        // (`mw.rs`).
        let window = if K::BIND {
            prepared.window().cloned()
        } else {
            None
        };
        let guard = match window.as_deref().map(MwShared::lock_for_post).transpose() {
            Ok(guard) => guard,
            Err(error) => {
                return Err(PostRefused {
                    error,
                    buf: prepared.buf,
                });
            }
        };
        let keep = prepared.keep();
        let buf = prepared.buf.take();
        let asked = prepared.asks_signal();
        // Built before the record, whose atomic stores would make the compiler reload the
        // prepared request from memory and dispatch on its kind again; the id and the last
        // slot's signal are set after it.
        let request = prepared.request(0, false);
        let result = post_owned(
            self,
            |qp: &Self| -> &Ring { &qp.tables().send },
            prepared.tag(),
            buf,
            keep,
            |qp, id, last_slot| {
                let request = request.owned(id);
                // Signaled as asked, when it takes the table's last slot, and after
                // `max_send_wr - 1` unsignaled sends of the safe paths in a row.
                let run = qp.next_unsignaled(asked || last_slot, qp.caps().max_send_wr);
                let request = if run == 0 {
                    request.add_flags(SendFlags::SIGNALED)
                } else {
                    request
                };
                // SAFETY: the request names the buffer's bytes and a range's (`sges`), or inline
                // bytes copied during the call, or none. The buffer was moved into the send table
                // before this post, with a reference to the range's region, and they leave it
                // only with this request's completion (or a later one of this queue, which
                // completes in order), with the queue pair's reset or destruction, or if this
                // post fails without the device having seen it; the buffer holds its region
                // registered meanwhile, and no Rust code can reach its bytes. The range's region
                // stays registered, and Rust reaches it only through `&` (`Arc`): reads, which
                // a device read does not race, and for a READ into it (`check_range`) only
                // atomic ones, as the region is shared. `remote` is the peer's memory. The
                // request's id has `OWNED_ID_BIT`, which no other post may use, so no other
                // completion can release the buffer.
                let result = unsafe { qp.post_send_wr(&request) };
                qp.count_unsignaled(run, &result);
                result
            },
        );
        drop(guard);
        // The provider may have the request: a bind keeps the window's new key.
        if K::BIND
            && result
                .as_ref()
                .map_or_else(|refused| may_have_posted(&refused.error), |()| true)
        {
            if let Some(window) = prepared.hand_over() {
                self.keep_window(window);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi;

    /// The raw `send_flags` an owned request's work request carries.
    fn raw_flags<K: Operation>(request: SendRequest<'_, K, Owned<'_>>, last_slot: bool) -> u32 {
        let prepared = request.prepare().expect("prepared");
        let mut raw = ffi::ibv_send_wr::default();
        let mut one = ffi::ibv_sge::default();
        prepared
            .request(7, last_slot)
            .fill(&mut raw, &mut one)
            .expect("filled");
        raw.send_flags
    }

    /// Signaled by default; `unsignaled`, `solicited` and `fenced` reach the work request; the
    /// request that takes a queue's last slot is signaled whatever it asked.
    #[test]
    fn owned_send_flags_reach_the_work_request() {
        let (signaled, solicited, fence) = (
            ffi::IBV_SEND_SIGNALED,
            ffi::IBV_SEND_SOLICITED,
            ffi::IBV_SEND_FENCE,
        );
        assert_eq!(raw_flags(SendRequest::send(b""), false), signaled);
        assert_eq!(raw_flags(SendRequest::send(b"").unsignaled(), false), 0);
        assert_eq!(
            raw_flags(SendRequest::send(b"").unsignaled(), true),
            signaled
        );
        assert_eq!(
            raw_flags(SendRequest::send(b"").with_imm(1).solicited(), false),
            signaled | solicited
        );
        assert_eq!(
            raw_flags(SendRequest::send(b"").fenced().unsignaled(), false),
            fence
        );
        assert_eq!(
            raw_flags(SendRequest::local_invalidate(9).fenced(), false),
            signaled | fence
        );
        assert_eq!(
            raw_flags(SendRequest::local_invalidate(9).solicited(), false),
            signaled | solicited
        );
    }
}
