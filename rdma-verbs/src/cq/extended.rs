//! Extended completion queues (`struct ibv_cq_ex`): a [`CompletionQueue`] built with
//! [`CqBuilder::extended`](super::CqBuilder::extended) is polled one completion at a time in a
//! session ([`CompletionQueue::poll_extended`]: `ibv_start_poll` / `ibv_next_poll` /
//! `ibv_end_poll`), reading only the fields asked for at creation, including those the classic
//! `ibv_wc` lacks (completion timestamps, VLAN, flow tag). It stays a completion queue: queue
//! pairs take it, and [`poll`](CompletionQueue::poll) works on it as on any other.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use bitflags::bitflags;

use std::time::Duration;

use super::{CompletionQueue, WcOpcode, WcStatus, poll_until};
use crate::device::Context;
use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::flags::WcFlags;

bitflags! {
    /// The fields an extended completion queue reports (`enum ibv_create_cq_wc_flags`,
    /// `IBV_WC_EX_WITH_*`): what [`CqPoll`]'s accessors can read. The work request id, status,
    /// opcode, vendor error and completion flags are always there.
    #[repr(transparent)]
    #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
    pub struct WcFields: u64 {
        /// `IBV_WC_EX_WITH_BYTE_LEN`: [`CqPoll::byte_len`].
        const BYTE_LEN = ffi::IBV_WC_EX_WITH_BYTE_LEN as u64;
        /// `IBV_WC_EX_WITH_IMM`: [`CqPoll::imm_data`] and [`CqPoll::invalidated_rkey`].
        const IMM = ffi::IBV_WC_EX_WITH_IMM as u64;
        /// `IBV_WC_EX_WITH_QP_NUM`: [`CqPoll::qp_num`].
        const QP_NUM = ffi::IBV_WC_EX_WITH_QP_NUM as u64;
        /// `IBV_WC_EX_WITH_SRC_QP`: [`CqPoll::src_qp`].
        const SRC_QP = ffi::IBV_WC_EX_WITH_SRC_QP as u64;
        /// `IBV_WC_EX_WITH_SLID`: [`CqPoll::slid`].
        const SLID = ffi::IBV_WC_EX_WITH_SLID as u64;
        /// `IBV_WC_EX_WITH_SL`: [`CqPoll::sl`].
        const SL = ffi::IBV_WC_EX_WITH_SL as u64;
        /// `IBV_WC_EX_WITH_DLID_PATH_BITS`: [`CqPoll::dlid_path_bits`].
        const DLID_PATH_BITS = ffi::IBV_WC_EX_WITH_DLID_PATH_BITS as u64;
        /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`: [`CqPoll::completion_timestamp`], the
        /// device's clock (see [`Context::raw_clock`]).
        const COMPLETION_TIMESTAMP = ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as u64;
        /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`:
        /// [`CqPoll::completion_wallclock_ns`].
        const COMPLETION_TIMESTAMP_WALLCLOCK =
            ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK as u64;
        /// `IBV_WC_EX_WITH_CVLAN`: [`CqPoll::cvlan`].
        const CVLAN = ffi::IBV_WC_EX_WITH_CVLAN as u64;
        /// `IBV_WC_EX_WITH_FLOW_TAG`: [`CqPoll::flow_tag`].
        const FLOW_TAG = ffi::IBV_WC_EX_WITH_FLOW_TAG as u64;
        /// `IBV_WC_EX_WITH_TM_INFO`: [`CqPoll::tm_info`] (tag matching).
        const TM_INFO = ffi::IBV_WC_EX_WITH_TM_INFO as u64;
        /// The fields of the classic `ibv_wc` (`IBV_WC_STANDARD_FLAGS`).
        const STANDARD = ffi::IBV_WC_STANDARD_FLAGS as u64;
    }
}

/// What a completion queue created with `ibv_create_cq_ex` adds to a classic one.
pub(crate) struct Extended {
    raw: NonNull<ffi::ibv_cq_ex>,
    fields: WcFields,
    /// Each session reads one completion: the provider's `ibv_next_poll` cannot be trusted at
    /// the end of the queue (Soft-RoCE; see [`Extended::new`]).
    one_per_session: bool,
}

impl Extended {
    /// What `ibv_create_cq_ex` returned for `context`'s device, reporting `fields`.
    ///
    /// Soft-RoCE's provider mishandled `ibv_next_poll` at the end of the queue until
    /// rdma-core 59: up to 54.0 it ends the session itself, so the `ibv_end_poll` the manual
    /// asks for then moves the consumer index past the producer (the next poll reads entries
    /// never written); later it releases the queue's lock there, and `ibv_end_poll` releases
    /// it again. The versions cannot be told apart at run time, so on Soft-RoCE every session
    /// reads exactly one completion (`ibv_start_poll`, then `ibv_end_poll`), which all of them
    /// handle.
    pub(crate) fn new(context: &Context, raw: NonNull<ffi::ibv_cq_ex>, fields: WcFields) -> Self {
        let one_per_session = context.may_be_soft_roce();
        Self {
            raw,
            fields,
            one_per_session,
        }
    }

    /// The `ibv_cq` at the start of the extended queue.
    pub(crate) fn as_cq(&self) -> NonNull<ffi::ibv_cq> {
        // SAFETY: a cast; `ibv_cq_ex` begins with the fields of `ibv_cq`.
        let cq = unsafe { ffi::ibv_cq_ex_to_cq(self.raw.as_ptr()) };
        // `raw` is not null, and the cast keeps the address.
        NonNull::new(cq).unwrap_or(self.raw.cast())
    }
}

/// A token of the calling thread, unique among the threads alive (the address of a
/// thread-local), never 0.
pub(crate) fn thread_token() -> usize {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|token| std::ptr::from_ref(token) as usize)
}

/// Ends the session on every way out of [`CompletionQueue::poll_extended`] (a panic in the
/// caller's function included), on the thread that started it.
struct SessionEnd<'a> {
    raw: NonNull<ffi::ibv_cq_ex>,
    /// The queue's mark of the thread in a session.
    session: &'a AtomicUsize,
    /// A start or next returned 0 and no end followed yet.
    open: bool,
}

impl SessionEnd<'_> {
    fn end(&mut self) {
        if self.open {
            // SAFETY: a live queue in a session (`open`), ended once here.
            unsafe { ffi::ibv_end_poll(self.raw.as_ptr()) };
            self.open = false;
        }
    }
}

impl Drop for SessionEnd<'_> {
    fn drop(&mut self) {
        self.end();
        self.session.store(0, Ordering::Release);
    }
}

impl CompletionQueue {
    /// Reads up to `max` completions in one poll session (`ibv_start_poll`, `ibv_next_poll`,
    /// `ibv_end_poll`), handing each to `f` as a [`CqPoll`] whose accessors read the fields
    /// the queue was created with; returns how many. The session ends before this returns,
    /// also when `f` panics, and consumes every completion `f` was given.
    ///
    /// ```no_run
    /// # use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};
    /// # fn f(context: &Context) -> Result<()> {
    /// let mut cq = context
    ///     .cq_builder(64)
    ///     .extended(WcFields::BYTE_LEN | WcFields::QP_NUM)
    ///     .build()?;
    /// // ... post requests that complete on `cq` ...
    /// let read = cq.poll_extended(16, |c| {
    ///     println!("{} {:?} {:?} {:?}", c.wr_id(), c.status(), c.byte_len(), c.qp_num());
    /// })?;
    /// # let _ = read; Ok(()) }
    /// ```
    ///
    /// While `f` runs, the provider may hold the queue's lock. Destroying or resetting one of
    /// the queue's queue pairs from inside `f` would wait on that lock forever on some
    /// providers (mlx5): the crate refuses it there with `EBUSY` (and a dropped queue pair
    /// is then leaked, not destroyed).
    ///
    /// Completions of the safe paths' requests (owned buffers, slot rings) come to `f` as
    /// bare ids, which those paths then never see: their buffers and slots stay in flight
    /// until the queue pair is destroyed. Poll a queue that serves them with their own calls.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] for a queue not built with
    ///   [`extended`](super::CqBuilder::extended).
    /// - [`Error::Verb`] with `ibv_start_poll` or `ibv_next_poll` and the provider's errno;
    ///   the completions `f` was given before it are consumed.
    ///
    /// # References
    ///
    /// [`ibv_create_cq_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq_ex.3.html)
    #[doc(alias = "ibv_start_poll")]
    #[doc(alias = "ibv_next_poll")]
    #[doc(alias = "ibv_end_poll")]
    pub fn poll_extended(&mut self, max: usize, mut f: impl FnMut(&CqPoll<'_>)) -> Result<usize> {
        let Some(ex) = self.ex.as_ref() else {
            return Err(Error::InvalidArgument(
                "ibv_start_poll: the queue was not created with extended fields".into(),
            ));
        };
        if max == 0 {
            return Ok(0);
        }
        let (raw, fields, one_per_session) = (ex.raw, ex.fields, ex.one_per_session);
        let mut session = SessionEnd {
            raw,
            session: &self.inner.session,
            open: false,
        };
        session.session.store(thread_token(), Ordering::Release);
        let start = || {
            let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
            // SAFETY: a live extended queue, not in a session (`&mut self`; every session
            // ends before `poll_extended` returns); `attr` is valid.
            unsafe { ffi::ibv_start_poll(raw.as_ptr(), &mut attr) }
        };
        let mut ret = start();
        let mut verb = "ibv_start_poll";
        let mut read = 0;
        while ret == 0 {
            session.open = true;
            f(&CqPoll {
                raw,
                fields,
                _session: PhantomData,
            });
            read += 1;
            if read == max {
                break;
            }
            if one_per_session {
                session.end();
                ret = start();
            } else {
                verb = "ibv_next_poll";
                // SAFETY: a live queue in a session.
                ret = unsafe { ffi::ibv_next_poll(raw.as_ptr()) };
                if ret != 0 {
                    // The manual: end the session after `ibv_next_poll` fails, ENOENT
                    // included (a failed `ibv_start_poll` opened none).
                    session.end();
                }
            }
        }
        drop(session);
        match ret {
            0 | libc::ENOENT => Ok(read),
            errno => Err(Error::verb(verb, Errno::from_raw(errno))),
        }
    }

    /// [`poll_extended`](Self::poll_extended) until `min` completions have been handed to `f`
    /// or `timeout` has passed; returns how many were (fewer than `min`: the time ran out).
    /// Each session reads at most the completions still wanted. Waits as
    /// [`poll_for`](Self::poll_for) does: a busy poll that backs off from yielding to 50 µs
    /// sleeps after a thousand empty polls.
    ///
    /// # Errors
    ///
    /// As [`poll_extended`](Self::poll_extended); the completions `f` was given before the
    /// error are consumed.
    pub fn poll_extended_for(
        &mut self,
        min: usize,
        timeout: Duration,
        mut f: impl FnMut(&CqPoll<'_>),
    ) -> Result<usize> {
        poll_until(min, timeout, |n| self.poll_extended(min - n, &mut f))
    }

    /// The fields the queue reports to [`poll_extended`](Self::poll_extended); `None` for a queue
    /// built without [`extended`](super::CqBuilder::extended).
    pub fn fields(&self) -> Option<WcFields> {
        self.ex.as_ref().map(|ex| ex.fields)
    }

    /// `ibv_modify_cq`: completion moderation: the device raises a completion event after
    /// `count` completions or `period_us` microseconds, whichever comes first.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the provider cannot moderate (Soft-RoCE); else
    /// [`Error::Verb`] with the call's errno.
    ///
    /// # References
    ///
    /// [`ibv_modify_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_cq.3.html)
    #[doc(alias = "ibv_modify_cq")]
    pub fn set_moderation(&mut self, count: u16, period_us: u16) -> Result<()> {
        let mut attr = ffi::ibv_modify_cq_attr {
            attr_mask: ffi::IBV_CQ_ATTR_MODERATE,
            moderate: ffi::ibv_moderate_cq {
                cq_count: count,
                cq_period: period_us,
            },
        };
        // SAFETY: a live queue; `attr` is a valid structure the call reads.
        let ret = unsafe { ffi::ibv_modify_cq(self.as_raw(), &mut attr) };
        Error::check("ibv_modify_cq", ret)
    }
}

/// One completion of an extended completion queue, in a poll session of
/// [`CompletionQueue::poll_extended`]: its accessors read the provider's current entry, and
/// are reachable only while the session is on it (the caller's function gets a shared
/// reference it cannot keep).
///
/// Each accessor of an optional field returns `None` when the queue was not created with that
/// field ([`WcFields`]), or, for [`imm_data`](Self::imm_data) and
/// [`invalidated_rkey`](Self::invalidated_rkey), when the completion carries none. The fields
/// other than the id and the status are valid only for a successful completion, as in C.
pub struct CqPoll<'a> {
    raw: NonNull<ffi::ibv_cq_ex>,
    fields: WcFields,
    /// Tied to the session; not `Send` or `Sync` (a raw pointer).
    _session: PhantomData<&'a mut ()>,
}

impl CqPoll<'_> {
    /// The work request's `wr_id`.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        // SAFETY: a live queue in a session; the provider set the field for this completion.
        unsafe { (*self.raw.as_ptr()).wr_id }
    }

    /// The status.
    #[inline]
    pub fn status(&self) -> WcStatus {
        // SAFETY: as in `wr_id`.
        WcStatus::from_raw(unsafe { (*self.raw.as_ptr()).status })
    }

    /// `ibv_wc_read_opcode`: the opcode.
    #[doc(alias = "ibv_wc_read_opcode")]
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        // SAFETY: a live queue in a session, on a completion.
        let raw = unsafe { ffi::ibv_wc_read_opcode(self.raw.as_ptr()) };
        raw.map_or(WcOpcode::Unknown(u32::MAX), WcOpcode::from_raw)
    }

    /// `ibv_wc_read_vendor_err`: the vendor's error code (failed completions).
    #[doc(alias = "ibv_wc_read_vendor_err")]
    pub fn vendor_err(&self) -> u32 {
        // SAFETY: as in `opcode`.
        unsafe { ffi::ibv_wc_read_vendor_err(self.raw.as_ptr()) }.unwrap_or(0)
    }

    /// `ibv_wc_read_wc_flags`: the completion's flags.
    #[doc(alias = "ibv_wc_read_wc_flags")]
    #[inline]
    pub fn wc_flags(&self) -> WcFlags {
        // SAFETY: as in `opcode`.
        let raw = unsafe { ffi::ibv_wc_read_wc_flags(self.raw.as_ptr()) };
        WcFlags::from_bits_retain(raw.unwrap_or(0))
    }

    /// Whether the queue reports `field`.
    #[inline(always)]
    fn has(&self, field: WcFields) -> bool {
        self.fields.contains(field)
    }

    /// `ibv_wc_read_byte_len`: bytes received (receives) or read (RDMA READ, atomics).
    #[doc(alias = "ibv_wc_read_byte_len")]
    #[inline]
    pub fn byte_len(&self) -> Option<u32> {
        if !self.has(WcFields::BYTE_LEN) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_byte_len(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_imm_data`: the immediate data (host byte order), where the completion
    /// carries some.
    #[doc(alias = "ibv_wc_read_imm_data")]
    pub fn imm_data(&self) -> Option<u32> {
        if !self.has(WcFields::IMM) || !self.wc_flags().contains(WcFlags::WITH_IMM) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_imm_data(self.raw.as_ptr()) }.map(u32::from_be)
    }

    /// `ibv_wc_read_invalidated_rkey`: the rkey a SEND with invalidate invalidated, where the
    /// completion carries one.
    #[doc(alias = "ibv_wc_read_invalidated_rkey")]
    pub fn invalidated_rkey(&self) -> Option<u32> {
        if !self.has(WcFields::IMM) || !self.wc_flags().contains(WcFlags::WITH_INV) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_invalidated_rkey(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_qp_num`: the local queue pair's number.
    #[doc(alias = "ibv_wc_read_qp_num")]
    pub fn qp_num(&self) -> Option<u32> {
        if !self.has(WcFields::QP_NUM) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_qp_num(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_src_qp`: the sender's queue pair number (UD receives).
    #[doc(alias = "ibv_wc_read_src_qp")]
    pub fn src_qp(&self) -> Option<u32> {
        if !self.has(WcFields::SRC_QP) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_src_qp(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_slid`: the sender's LID (UD receives; 0 on RoCE).
    #[doc(alias = "ibv_wc_read_slid")]
    pub fn slid(&self) -> Option<u32> {
        if !self.has(WcFields::SLID) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_slid(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_sl`: the service level (UD receives).
    #[doc(alias = "ibv_wc_read_sl")]
    pub fn sl(&self) -> Option<u8> {
        if !self.has(WcFields::SL) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_sl(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_dlid_path_bits`: the destination LID path bits (UD receives).
    #[doc(alias = "ibv_wc_read_dlid_path_bits")]
    pub fn dlid_path_bits(&self) -> Option<u8> {
        if !self.has(WcFields::DLID_PATH_BITS) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_dlid_path_bits(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_completion_ts`: when the completion was made, on the device's clock
    /// ([`Context::raw_clock`] reads it now).
    #[doc(alias = "ibv_wc_read_completion_ts")]
    pub fn completion_timestamp(&self) -> Option<u64> {
        if !self.has(WcFields::COMPLETION_TIMESTAMP) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_completion_ts(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_completion_wallclock_ns`: when the completion was made, in nanoseconds of
    /// wall-clock time.
    #[doc(alias = "ibv_wc_read_completion_wallclock_ns")]
    pub fn completion_wallclock_ns(&self) -> Option<u64> {
        if !self.has(WcFields::COMPLETION_TIMESTAMP_WALLCLOCK) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_completion_wallclock_ns(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_cvlan`: the customer VLAN tag (raw packet receives).
    #[doc(alias = "ibv_wc_read_cvlan")]
    pub fn cvlan(&self) -> Option<u16> {
        if !self.has(WcFields::CVLAN) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_cvlan(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_flow_tag`: the flow tag a steering rule set (raw packet receives).
    #[doc(alias = "ibv_wc_read_flow_tag")]
    pub fn flow_tag(&self) -> Option<u32> {
        if !self.has(WcFields::FLOW_TAG) {
            return None;
        }
        // SAFETY: as in `opcode`; the queue reports the field.
        unsafe { ffi::ibv_wc_read_flow_tag(self.raw.as_ptr()) }
    }

    /// `ibv_wc_read_tm_info`: the tag and private value of a tag-matching completion.
    #[doc(alias = "ibv_wc_read_tm_info")]
    pub fn tm_info(&self) -> Option<(u64, u32)> {
        if !self.has(WcFields::TM_INFO) {
            return None;
        }
        let mut info = ffi::ibv_wc_tm_info::default();
        // SAFETY: as in `opcode`; the queue reports the field; `info` is writable.
        let ret = unsafe { ffi::ibv_wc_read_tm_info(self.raw.as_ptr(), &mut info) };
        (ret == 0).then_some((info.tag, info.priv_))
    }
}

impl fmt::Debug for CqPoll<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqPoll")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("fields", &self.fields)
            .finish()
    }
}

/// The device's free-running clock (`ibv_values_ex.raw_clock`), as
/// [`Context::raw_clock`] reads it: in the device's units (mlx5: clock cycles in `nsec`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RawClock {
    /// Seconds.
    pub sec: i64,
    /// Nanoseconds (or the device's units).
    pub nsec: i64,
}

impl Context {
    /// `ibv_query_rt_values_ex`: the device's clock now, to compare with
    /// [`CqPoll::completion_timestamp`].
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the device has no readable clock (Soft-RoCE); else
    /// [`Error::Verb`] with the call's errno.
    ///
    /// # References
    ///
    /// [`ibv_query_rt_values_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_query_rt_values_ex.3.html)
    #[doc(alias = "ibv_query_rt_values_ex")]
    pub fn raw_clock(&self) -> Result<RawClock> {
        let mut values = ffi::ibv_values_ex {
            comp_mask: ffi::IBV_VALUES_MASK_RAW_CLOCK,
            raw_clock: ffi::timespec::default(),
        };
        // SAFETY: a live context; `values` is readable and writable.
        let ret = unsafe { ffi::ibv_query_rt_values_ex(self.as_raw(), &mut values) };
        Error::check("ibv_query_rt_values_ex", ret)?;
        Ok(RawClock {
            sec: values.raw_clock.tv_sec,
            nsec: values.raw_clock.tv_nsec,
        })
    }
}
