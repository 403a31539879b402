//! The `static inline` functions of `verbs.h`, ported to Rust.
//!
//! C code gets these from the header; they have no symbol in `libibverbs.so`, so bindgen cannot
//! bind them. Each port keeps the C name and argument list, and follows the C body, with one
//! difference: a provider operation that is missing (a null function pointer) is reported, never
//! called. See the crate documentation for the exact convention.
//!
//! # Live batches
//!
//! The `# Safety` sections of the `ibv_wr_*` builders require `qp` to be *in a live batch*: it
//! points to the live `ibv_qp_ex` of a queue pair (from [`ibv_qp_to_qp_ex`]) that was created
//! with the `IBV_QP_EX_WITH_*` send-ops flag of the operation used, and [`ibv_wr_start`] was
//! called on it and not yet followed by [`ibv_wr_complete`] or [`ibv_wr_abort`].

use core::ffi::{c_int, c_uint, c_void};
use core::mem::{offset_of, size_of};
use core::ptr;

use crate::*;

/// Port of `__VERBS_ABI_IS_EXTENDED`: the `abi_compat` value of a context opened through the
/// extended ABI (`(void *)UINTPTR_MAX`).
pub const VERBS_ABI_IS_EXTENDED: *mut core::ffi::c_void = usize::MAX as *mut core::ffi::c_void;

/// Sets the calling thread's `errno`, as the C inline functions do before returning null.
#[inline]
pub(crate) fn set_errno(value: c_int) {
    // SAFETY: `__errno_location` returns the address of the calling thread's `errno`, which is
    // valid for writes for the whole life of the thread.
    unsafe { *libc::__errno_location() = value };
}

/// Port of `verbs_get_ctx`: the address of the `verbs_context` that embeds `ctx`, or null when
/// the context was not opened through the extended (verbs_context) ABI.
///
/// The address is computed with wrapping byte arithmetic and is not a usable pointer to a whole
/// structure: a provider built against an older rdma-core has a shorter `verbs_context` (fewer
/// operations in front of `sz`), so this address may lie before its allocation. Never
/// dereference it, nor project a field through it (`(*v).field` requires `v` to be inside the
/// allocation); reach fields with [`verbs_get_ctx_op`], which checks `sz` first and forms no
/// pointer outside the provider's structure.
///
/// # Safety
///
/// `ctx` must point to a live `ibv_context` returned by libibverbs.
#[inline]
pub unsafe fn verbs_get_ctx(ctx: *mut ibv_context) -> *mut verbs_context {
    // SAFETY: the caller guarantees `ctx` points to a live context.
    if unsafe { (*ctx).abi_compat } != VERBS_ABI_IS_EXTENDED {
        return ptr::null_mut();
    }
    // The header's "container_of". Wrapping: the result may lie outside the allocation.
    ctx.wrapping_byte_sub(offset_of!(verbs_context, context))
        .cast::<verbs_context>()
}

/// The field at byte offset `field_offset` of the `verbs_context` embedding `ctx`, or null when
/// the context is not extended or the provider's structure (its last `sz` bytes end at the end
/// of ours) does not reach that field. Only `sz` and the returned field are touched: both lie
/// inside the provider's structure, counted back from `ctx`, so no pointer here leaves it.
///
/// # Safety
///
/// `ctx` must point to a live `ibv_context` returned by libibverbs; `field_offset` is the offset
/// of a field that lies before `context` in [`verbs_context`].
#[inline]
unsafe fn verbs_ctx_field(ctx: *mut ibv_context, field_offset: usize) -> *mut u8 {
    let context_offset = offset_of!(verbs_context, context);
    // SAFETY: the caller guarantees a live context.
    if unsafe { (*ctx).abi_compat } != VERBS_ABI_IS_EXTENDED || field_offset >= context_offset {
        return ptr::null_mut();
    }
    // `sz` is the field right before `context` in every rdma-core version: inside the
    // provider's structure whatever its age.
    let sz_ptr = ctx
        .wrapping_byte_sub(context_offset - offset_of!(verbs_context, sz))
        .cast::<usize>();
    // SAFETY: `sz` of a live extended context, aligned as `ctx` is (8 bytes).
    let sz = unsafe { sz_ptr.read() };
    // The provider's structure holds our last `sz` bytes: a field exists if it starts at least
    // that far from our end.
    if sz < size_of::<verbs_context>() - field_offset {
        return ptr::null_mut();
    }
    ctx.wrapping_byte_sub(context_offset - field_offset)
        .cast::<u8>()
}

/// Port of the `verbs_get_ctx_op` macro: operation `op` of the context's `verbs_context`, if the
/// provider's structure is large enough to hold it (checked with `sz`, as the macro does) and
/// it is set; else `None`.
///
/// `op_offset` is the operation's offset (`offset_of!(verbs_context, op)`) and `field` names
/// the same field (`|v| &v.op`), which gives its type; `field` is never called. Unlike the C
/// macro it returns the operation, not the `verbs_context`: a provider's structure may be
/// shorter than ours, so no pointer to the whole structure is handed out (see
/// [`verbs_get_ctx`]).
///
/// # Safety
///
/// `ctx` must point to a live `ibv_context` returned by libibverbs, and `op_offset` must be the
/// offset of the field `field` returns.
#[inline]
pub unsafe fn verbs_get_ctx_op<F: Copy>(
    ctx: *mut ibv_context,
    op_offset: usize,
    field: fn(&verbs_context) -> &Option<F>,
) -> Option<F> {
    let _ = field;
    // SAFETY: forwarded caller guarantees; every operation lies before `context`.
    let at = unsafe { verbs_ctx_field(ctx, op_offset) };
    if at.is_null() {
        return None;
    }
    // SAFETY: the field exists in the provider's structure (size check above), is aligned (a
    // function pointer in a structure aligned as `ctx`), and has type `Option<F>` (caller
    // guarantee).
    unsafe { at.cast::<Option<F>>().read() }
}

/// Returns a null pointer after setting `errno` to `errno`: how the pointer-returning ports
/// report a missing operation.
#[inline]
fn null_with_errno<T>(errno: c_int) -> *mut T {
    set_errno(errno);
    ptr::null_mut()
}

/// Reads operation `$op` of a context's extended ops, or evaluates `$missing` when the provider
/// lacks it.
macro_rules! ctx_op {
    ($ctx:expr, $op:ident, $missing:expr) => {{
        // SAFETY: the caller of the enclosing function guarantees a live context; the offset is
        // that of the field the closure names.
        let op = unsafe {
            verbs_get_ctx_op($ctx, offset_of!(verbs_context, $op), |v: &verbs_context| {
                &v.$op
            })
        };
        match op {
            Some(op) => op,
            None => return $missing,
        }
    }};
}

/// Reads operation `$op` of the context's classic op table (`ibv_context_ops`), or evaluates
/// `$missing` (by default `EOPNOTSUPP`) when the provider lacks it.
macro_rules! classic_op {
    ($ctx:expr, $op:ident) => {
        classic_op!($ctx, $op, libc::EOPNOTSUPP)
    };
    ($ctx:expr, $op:ident, $missing:expr) => {{
        // SAFETY: the caller of the enclosing function guarantees that `$ctx` is live.
        match unsafe { (*$ctx).ops.$op } {
            Some(op) => op,
            None => return $missing,
        }
    }};
}

/// Reads operation `$op` of a function table embedded in a provider object (`ibv_qp_ex`,
/// `ibv_cq_ex`, `ibv_dm`, `ibv_wq`), or evaluates `$missing` when the provider left it null.
macro_rules! obj_op {
    ($obj:expr, $op:ident, $missing:expr) => {{
        // SAFETY: the caller of the enclosing function guarantees that `$obj` is live.
        match unsafe { (*$obj).$op } {
            Some(op) => op,
            None => return $missing,
        }
    }};
}

/// Port of `ibv_post_send`: posts a linked list of send work requests.
///
/// Returns 0, or an errno value (`ENOMEM` when the send queue is full, `EINVAL` for a bad
/// request), with `*bad_wr` set to the first request not posted.
///
/// # Safety
///
/// `qp` must be a live queue pair, `wr` a valid, null-terminated list of work requests whose
/// scatter/gather entries describe registered memory that stays valid until the requests
/// complete, and `bad_wr` writable.
#[inline]
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: `qp` is live, so its context is too.
    let ctx = unsafe { (*qp).context };
    let op = classic_op!(ctx, post_send);
    // SAFETY: forwarded caller guarantees; `op` is the provider's post_send.
    unsafe { op(qp, wr, bad_wr) }
}

/// Port of `ibv_post_recv`: posts a linked list of receive work requests.
///
/// # Safety
///
/// As [`ibv_post_send`], for receive requests.
#[inline]
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `qp` is live, so its context is too.
    let ctx = unsafe { (*qp).context };
    let op = classic_op!(ctx, post_recv);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, wr, bad_wr) }
}

/// Port of `ibv_post_srq_recv`: posts a linked list of receive work requests to a shared
/// receive queue.
///
/// # Safety
///
/// As [`ibv_post_send`], with `srq` a live shared receive queue.
#[inline]
pub unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `srq` is live, so its context is too.
    let ctx = unsafe { (*srq).context };
    let op = classic_op!(ctx, post_srq_recv);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(srq, wr, bad_wr) }
}

/// Port of `ibv_poll_cq`: moves up to `num_entries` completions into `wc`.
///
/// Returns the number of completions written (fewer than `num_entries` means the queue is now
/// empty), or a negative value on error (`-EOPNOTSUPP` when the provider lacks `poll_cq`).
///
/// # Safety
///
/// `cq` must be a live completion queue and `wc` writable for `num_entries` entries.
#[inline]
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `cq` is live, so its context is too.
    let ctx = unsafe { (*cq).context };
    let op = classic_op!(ctx, poll_cq, -libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(cq, num_entries, wc) }
}

/// Port of `ibv_req_notify_cq`: arms the completion queue so that its next (solicited, if
/// `solicited_only` is non-zero) completion raises an event on its completion channel.
///
/// # Safety
///
/// `cq` must be a live completion queue.
#[inline]
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: `cq` is live, so its context is too.
    let ctx = unsafe { (*cq).context };
    let op = classic_op!(ctx, req_notify_cq);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(cq, solicited_only) }
}

/// Port of `ibv_query_port` (the `___ibv_query_port` behind the C macro): fills `port_attr`
/// through the provider's extended `query_port`, or through the compatibility symbol
/// [`ibv_query_port_compat`] with the rest zeroed.
///
/// # Safety
///
/// `context` must be a live context and `port_attr` writable.
#[inline]
pub unsafe fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the caller guarantees a live context; the offset is the named field's.
    let op = unsafe {
        verbs_get_ctx_op(context, offset_of!(verbs_context, query_port), |v| {
            &v.query_port
        })
    };
    if let Some(op) = op {
        // SAFETY: forwarded caller guarantees; the size tells the provider how much to fill.
        return unsafe { op(context, port_num, port_attr, size_of::<ibv_port_attr>()) };
    }
    // SAFETY: `port_attr` is writable; the compat struct is a prefix of ibv_port_attr.
    unsafe {
        ptr::write_bytes(port_attr, 0, 1);
        crate::ibv_query_port_compat(context, port_num, port_attr.cast())
    }
}

/// Port of `ibv_post_wq_recv`: posts a linked list of receive work requests to a work queue.
///
/// Returns 0, or an errno value with `*bad_recv_wr` set to the first request not posted
/// (`EOPNOTSUPP`, with `*bad_recv_wr` untouched, when the provider lacks `post_recv`).
///
/// # Safety
///
/// As [`ibv_post_send`], with `wq` a live work queue from [`ibv_create_wq`].
#[inline]
pub unsafe fn ibv_post_wq_recv(
    wq: *mut ibv_wq,
    recv_wr: *mut ibv_recv_wr,
    bad_recv_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let op = obj_op!(wq, post_recv, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees; `op` is the work queue's post_recv.
    unsafe { op(wq, recv_wr, bad_recv_wr) }
}

/// Port of `ibv_post_srq_ops`: posts a linked list of tag-matching operations to a shared
/// receive queue.
///
/// Returns 0, or an errno value with `*bad_op` set to the first operation not posted; when the
/// provider lacks `post_srq_ops`, `*bad_op` is `op` and the result `EOPNOTSUPP`.
///
/// # Safety
///
/// `srq` must be a live tag-matching shared receive queue, `op` a valid, null-terminated list
/// of operations whose memory stays valid until they complete, and `bad_op` writable.
#[inline]
pub unsafe fn ibv_post_srq_ops(
    srq: *mut ibv_srq,
    op: *mut ibv_ops_wr,
    bad_op: *mut *mut ibv_ops_wr,
) -> c_int {
    // SAFETY: `srq` is live, so its context is too.
    let ctx = unsafe { (*srq).context };
    let post_srq_ops = ctx_op!(ctx, post_srq_ops, {
        // SAFETY: the caller guarantees that `bad_op` is writable.
        unsafe { *bad_op = op };
        libc::EOPNOTSUPP
    });
    // SAFETY: forwarded caller guarantees.
    unsafe { post_srq_ops(srq, op, bad_op) }
}

// ---------------------------------------------------------------------------------------------
// Work request builders of the extended QP (`ibv_wr_*`); see "Live batches" in the module docs.
// ---------------------------------------------------------------------------------------------

/// Port of `ibv_wr_atomic_cmp_swp`: adds an atomic compare-and-swap of the 8 bytes at
/// `remote_addr` to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_atomic_cmp_swp` (C: `void`).
///
/// # Safety
///
/// `qp` must be [in a live batch](self#live-batches); the local buffer set next with
/// [`ibv_wr_set_sge`] must be registered and stay valid until the request completes.
#[inline]
pub unsafe fn ibv_wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) -> c_int {
    let op = obj_op!(qp, wr_atomic_cmp_swp, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, rkey, remote_addr, compare, swap) };
    0
}

/// Port of `ibv_wr_atomic_fetch_add`: adds an atomic fetch-and-add of `add` to the 8 bytes at
/// `remote_addr` to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_atomic_fetch_add` (C: `void`).
///
/// # Safety
///
/// As [`ibv_wr_atomic_cmp_swp`].
#[inline]
pub unsafe fn ibv_wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) -> c_int {
    let op = obj_op!(qp, wr_atomic_fetch_add, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, rkey, remote_addr, add) };
    0
}

/// Port of `ibv_wr_bind_mw`: adds the binding of memory window `mw` (type 2) with new key
/// `rkey` to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_bind_mw` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch, `mw` a live memory window and `bind_info` readable, its `mr`
/// a live memory region.
#[inline]
pub unsafe fn ibv_wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    bind_info: *const ibv_mw_bind_info,
) -> c_int {
    let op = obj_op!(qp, wr_bind_mw, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, mw, rkey, bind_info) };
    0
}

/// Port of `ibv_wr_local_inv`: adds the local invalidation of `invalidate_rkey` to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_local_inv` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch.
#[inline]
pub unsafe fn ibv_wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) -> c_int {
    let op = obj_op!(qp, wr_local_inv, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(qp, invalidate_rkey) };
    0
}

/// Port of `ibv_wr_rdma_read`: adds an RDMA read from `remote_addr` to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_rdma_read` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch; the local buffers set next must be registered and stay valid
/// until the request completes.
#[inline]
pub unsafe fn ibv_wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) -> c_int {
    let op = obj_op!(qp, wr_rdma_read, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, rkey, remote_addr) };
    0
}

/// Port of `ibv_wr_rdma_write`: adds an RDMA write to `remote_addr` to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_rdma_write` (C: `void`).
///
/// # Safety
///
/// As [`ibv_wr_rdma_read`].
#[inline]
pub unsafe fn ibv_wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) -> c_int {
    let op = obj_op!(qp, wr_rdma_write, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, rkey, remote_addr) };
    0
}

/// Port of `ibv_wr_rdma_write_imm`: adds an RDMA write with immediate data (big-endian) to the
/// batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_rdma_write_imm` (C: `void`).
///
/// # Safety
///
/// As [`ibv_wr_rdma_read`].
#[inline]
pub unsafe fn ibv_wr_rdma_write_imm(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: __be32,
) -> c_int {
    let op = obj_op!(qp, wr_rdma_write_imm, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, rkey, remote_addr, imm_data) };
    0
}

/// Port of `ibv_wr_send`: adds a send to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_send` (C: `void`).
///
/// # Safety
///
/// As [`ibv_wr_rdma_read`].
#[inline]
pub unsafe fn ibv_wr_send(qp: *mut ibv_qp_ex) -> c_int {
    let op = obj_op!(qp, wr_send, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp) };
    0
}

/// Port of `ibv_wr_send_imm`: adds a send with immediate data (big-endian) to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_send_imm` (C: `void`).
///
/// # Safety
///
/// As [`ibv_wr_rdma_read`].
#[inline]
pub unsafe fn ibv_wr_send_imm(qp: *mut ibv_qp_ex, imm_data: __be32) -> c_int {
    let op = obj_op!(qp, wr_send_imm, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, imm_data) };
    0
}

/// Port of `ibv_wr_send_inv`: adds a send that invalidates `invalidate_rkey` at the remote end
/// to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_send_inv` (C: `void`).
///
/// # Safety
///
/// As [`ibv_wr_rdma_read`].
#[inline]
pub unsafe fn ibv_wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) -> c_int {
    let op = obj_op!(qp, wr_send_inv, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, invalidate_rkey) };
    0
}

/// Port of `ibv_wr_send_tso`: adds a TCP segmentation offload send, with the `hdr_sz`-byte
/// packet header at `hdr` and maximum segment size `mss`, to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_send_tso` (C: `void`).
///
/// # Safety
///
/// As [`ibv_wr_rdma_read`], and `hdr` must be readable for `hdr_sz` bytes.
#[inline]
pub unsafe fn ibv_wr_send_tso(
    qp: *mut ibv_qp_ex,
    hdr: *mut c_void,
    hdr_sz: u16,
    mss: u16,
) -> c_int {
    let op = obj_op!(qp, wr_send_tso, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, hdr, hdr_sz, mss) };
    0
}

/// Port of `ibv_wr_set_ud_addr`: sets the destination of the batch's last request on a UD
/// queue pair.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_set_ud_addr` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch and `ah` a live address handle that outlives the request.
#[inline]
pub unsafe fn ibv_wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) -> c_int {
    let op = obj_op!(qp, wr_set_ud_addr, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, ah, remote_qpn, remote_qkey) };
    0
}

/// Port of `ibv_wr_set_xrc_srqn`: sets the remote shared receive queue of the batch's last
/// request on an XRC queue pair.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_set_xrc_srqn` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch.
#[inline]
pub unsafe fn ibv_wr_set_xrc_srqn(qp: *mut ibv_qp_ex, remote_srqn: u32) -> c_int {
    let op = obj_op!(qp, wr_set_xrc_srqn, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(qp, remote_srqn) };
    0
}

/// Port of `ibv_wr_set_inline_data`: copies `length` bytes at `addr` into the batch's last
/// request as its inline payload.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_set_inline_data` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch and `addr` readable for `length` bytes (only during the call).
#[inline]
pub unsafe fn ibv_wr_set_inline_data(
    qp: *mut ibv_qp_ex,
    addr: *mut c_void,
    length: usize,
) -> c_int {
    let op = obj_op!(qp, wr_set_inline_data, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, addr, length) };
    0
}

/// Port of `ibv_wr_set_inline_data_list`: copies the `num_buf` buffers of `buf_list` into the
/// batch's last request as its inline payload.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_set_inline_data_list` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch, `buf_list` readable for `num_buf` entries, each describing
/// readable memory (only during the call).
#[inline]
pub unsafe fn ibv_wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) -> c_int {
    let op = obj_op!(qp, wr_set_inline_data_list, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, num_buf, buf_list) };
    0
}

/// Port of `ibv_wr_set_sge`: sets the single local buffer of the batch's last request.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_set_sge` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch; the buffer must lie in the memory region of `lkey` and stay
/// valid until the request completes.
#[inline]
pub unsafe fn ibv_wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) -> c_int {
    let op = obj_op!(qp, wr_set_sge, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, lkey, addr, length) };
    0
}

/// Port of `ibv_wr_set_sge_list`: sets the `num_sge` local buffers of the batch's last request.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_set_sge_list` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch and `sg_list` readable for `num_sge` entries, each as for
/// [`ibv_wr_set_sge`].
#[inline]
pub unsafe fn ibv_wr_set_sge_list(
    qp: *mut ibv_qp_ex,
    num_sge: usize,
    sg_list: *const ibv_sge,
) -> c_int {
    let op = obj_op!(qp, wr_set_sge_list, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, num_sge, sg_list) };
    0
}

/// Port of `ibv_wr_start`: starts a batch of work requests on an extended queue pair.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_start` (C: `void`).
///
/// # Safety
///
/// `qp` must be the live `ibv_qp_ex` of a queue pair created with send-ops flags, with no batch
/// in progress.
#[inline]
pub unsafe fn ibv_wr_start(qp: *mut ibv_qp_ex) -> c_int {
    let op = obj_op!(qp, wr_start, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(qp) };
    0
}

/// Port of `ibv_wr_complete`: posts the batch started by [`ibv_wr_start`].
///
/// Returns 0, or an errno value, in which case none of the batch was posted (`EOPNOTSUPP` when
/// the provider lacks `wr_complete`).
///
/// # Safety
///
/// `qp` must be in a live batch.
#[inline]
pub unsafe fn ibv_wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    let op = obj_op!(qp, wr_complete, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(qp) }
}

/// Port of `ibv_wr_abort`: discards the batch started by [`ibv_wr_start`].
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_abort` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch.
#[inline]
pub unsafe fn ibv_wr_abort(qp: *mut ibv_qp_ex) -> c_int {
    let op = obj_op!(qp, wr_abort, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(qp) };
    0
}

/// Port of `ibv_wr_atomic_write`: adds an atomic write of the 8 bytes at `atomic_wr` to
/// `remote_addr` to the batch.
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `wr_atomic_write` (C: `void`).
///
/// # Safety
///
/// `qp` must be in a live batch and `atomic_wr` readable for 8 bytes (only during the call).
#[inline]
pub unsafe fn ibv_wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) -> c_int {
    let op = obj_op!(qp, wr_atomic_write, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, rkey, remote_addr, atomic_wr) };
    0
}

// ---------------------------------------------------------------------------------------------
// Extended completion queue polling
// ---------------------------------------------------------------------------------------------

/// Port of `ibv_cq_ex_to_cq`: the `ibv_cq` at the start of an extended completion queue, for
/// the functions that take one (`ibv_destroy_cq`, `ibv_req_notify_cq`, ...).
///
/// # Safety
///
/// None beyond the pointer's use: this is a cast, valid because `ibv_cq_ex` begins with the
/// fields of `ibv_cq`. The result is as valid as `cq`.
#[inline]
pub unsafe fn ibv_cq_ex_to_cq(cq: *mut ibv_cq_ex) -> *mut ibv_cq {
    cq.cast()
}

/// Port of `ibv_start_poll`: starts polling and reads the first completion into the CQ's
/// `status` and `wr_id` fields, made readable with the `ibv_wc_read_*` functions.
///
/// Returns 0 when a completion was read, `ENOENT` when the queue is empty (no
/// [`ibv_end_poll`] needed then), another errno value on error (`EOPNOTSUPP` when the provider
/// lacks `start_poll`).
///
/// # Safety
///
/// `cq` must be a live extended completion queue (from [`ibv_create_cq_ex`]) that is not being
/// polled, and `attr` must point to a valid `ibv_poll_cq_attr`.
#[inline]
pub unsafe fn ibv_start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    let op = obj_op!(cq, start_poll, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(cq, attr) }
}

/// Port of `ibv_next_poll`: reads the next completion, as [`ibv_start_poll`].
///
/// Returns 0, `ENOENT` when the queue is empty, another errno value on error (`EOPNOTSUPP` when
/// the provider lacks `next_poll`).
///
/// # Safety
///
/// `cq` must be a live extended completion queue being polled (after a successful
/// [`ibv_start_poll`] and before [`ibv_end_poll`]).
#[inline]
pub unsafe fn ibv_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    let op = obj_op!(cq, next_poll, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(cq) }
}

/// Port of `ibv_end_poll`: ends the polling started by a successful [`ibv_start_poll`].
///
/// Returns 0, or `EOPNOTSUPP` when the provider lacks `end_poll` (C: `void`).
///
/// # Safety
///
/// As [`ibv_next_poll`].
#[inline]
pub unsafe fn ibv_end_poll(cq: *mut ibv_cq_ex) -> c_int {
    let op = obj_op!(cq, end_poll, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(cq) };
    0
}

/// Port of `ibv_wc_read_opcode`: the opcode of the current completion, or `None` when the
/// provider lacks `read_opcode`.
///
/// # Safety
///
/// As [`ibv_next_poll`]: `cq` is being polled and holds a current completion.
#[inline]
pub unsafe fn ibv_wc_read_opcode(cq: *mut ibv_cq_ex) -> Option<ibv_wc_opcode> {
    let op = obj_op!(cq, read_opcode, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_vendor_err`: the vendor error of the current completion, or `None` when
/// the provider lacks `read_vendor_err`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_vendor_err(cq: *mut ibv_cq_ex) -> Option<u32> {
    let op = obj_op!(cq, read_vendor_err, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_byte_len`: the byte count of the current completion, or `None` when the
/// provider lacks `read_byte_len`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_byte_len(cq: *mut ibv_cq_ex) -> Option<u32> {
    let op = obj_op!(cq, read_byte_len, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_imm_data`: the immediate data (big-endian) of the current completion,
/// or `None` when the provider lacks `read_imm_data`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_imm_data(cq: *mut ibv_cq_ex) -> Option<__be32> {
    let op = obj_op!(cq, read_imm_data, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_invalidated_rkey`: the key invalidated by the current (send with
/// invalidate) completion, read through `read_imm_data`, or `None` when the provider lacks it.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_invalidated_rkey(cq: *mut ibv_cq_ex) -> Option<u32> {
    let op = obj_op!(cq, read_imm_data, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_qp_num`: the local queue pair number of the current completion, or
/// `None` when the provider lacks `read_qp_num`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_qp_num(cq: *mut ibv_cq_ex) -> Option<u32> {
    let op = obj_op!(cq, read_qp_num, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_src_qp`: the remote queue pair number of the current completion, or
/// `None` when the provider lacks `read_src_qp`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_src_qp(cq: *mut ibv_cq_ex) -> Option<u32> {
    let op = obj_op!(cq, read_src_qp, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_wc_flags`: the `IBV_WC_*` flags of the current completion, or `None`
/// when the provider lacks `read_wc_flags`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_wc_flags(cq: *mut ibv_cq_ex) -> Option<c_uint> {
    let op = obj_op!(cq, read_wc_flags, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_slid`: the source LID of the current completion, or `None` when the
/// provider lacks `read_slid`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_slid(cq: *mut ibv_cq_ex) -> Option<u32> {
    let op = obj_op!(cq, read_slid, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_sl`: the service level of the current completion, or `None` when the
/// provider lacks `read_sl`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_sl(cq: *mut ibv_cq_ex) -> Option<u8> {
    let op = obj_op!(cq, read_sl, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_dlid_path_bits`: the destination LID path bits of the current
/// completion, or `None` when the provider lacks `read_dlid_path_bits`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_dlid_path_bits(cq: *mut ibv_cq_ex) -> Option<u8> {
    let op = obj_op!(cq, read_dlid_path_bits, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_completion_ts`: the device timestamp of the current completion, or
/// `None` when the provider lacks `read_completion_ts`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_completion_ts(cq: *mut ibv_cq_ex) -> Option<u64> {
    let op = obj_op!(cq, read_completion_ts, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_completion_wallclock_ns`: the wall-clock timestamp (nanoseconds) of the
/// current completion, or `None` when the provider lacks `read_completion_wallclock_ns`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> Option<u64> {
    let op = obj_op!(cq, read_completion_wallclock_ns, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_cvlan`: the customer VLAN of the current completion, or `None` when
/// the provider lacks `read_cvlan`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_cvlan(cq: *mut ibv_cq_ex) -> Option<u16> {
    let op = obj_op!(cq, read_cvlan, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_flow_tag`: the flow tag of the current completion, or `None` when the
/// provider lacks `read_flow_tag`.
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`].
#[inline]
pub unsafe fn ibv_wc_read_flow_tag(cq: *mut ibv_cq_ex) -> Option<u32> {
    let op = obj_op!(cq, read_flow_tag, None);
    // SAFETY: forwarded caller guarantee.
    Some(unsafe { op(cq) })
}

/// Port of `ibv_wc_read_tm_info`: fills `tm_info` with the tag-matching information of the
/// current completion.
///
/// Returns 0, or `EOPNOTSUPP` (with `tm_info` untouched) when the provider lacks
/// `read_tm_info` (C: `void`).
///
/// # Safety
///
/// As [`ibv_wc_read_opcode`], and `tm_info` must be writable.
#[inline]
pub unsafe fn ibv_wc_read_tm_info(cq: *mut ibv_cq_ex, tm_info: *mut ibv_wc_tm_info) -> c_int {
    let op = obj_op!(cq, read_tm_info, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(cq, tm_info) };
    0
}

// ---------------------------------------------------------------------------------------------
// Device queries
// ---------------------------------------------------------------------------------------------

/// Port of `ibv_query_gid_ex`: reads entry `gid_index` of the GID table of port `port_num`,
/// through [`_ibv_query_gid_ex`] with this crate's entry size.
///
/// Returns 0 or an errno value.
///
/// # Safety
///
/// `context` must be a live context and `entry` writable.
#[inline]
pub unsafe fn ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
) -> c_int {
    // SAFETY: forwarded caller guarantees; the size is that of `*entry`.
    unsafe {
        crate::_ibv_query_gid_ex(
            context,
            port_num,
            gid_index,
            entry,
            flags,
            size_of::<ibv_gid_entry>(),
        )
    }
}

/// Port of `ibv_query_gid_table`: reads up to `max_entries` valid GID table entries of all the
/// device's ports, through [`_ibv_query_gid_table`] with this
/// crate's entry size.
///
/// Returns the number of entries written, or a negative errno value.
///
/// # Safety
///
/// `context` must be a live context and `entries` writable for `max_entries` entries.
#[inline]
pub unsafe fn ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
) -> isize {
    // SAFETY: forwarded caller guarantees; the size is that of one entry.
    unsafe {
        crate::_ibv_query_gid_table(
            context,
            entries,
            max_entries,
            flags,
            size_of::<ibv_gid_entry>(),
        )
    }
}

/// Port of `ibv_query_device_ex`: fills `attr` with the extended device attributes.
///
/// Returns `EINVAL` if `input` is non-null with a non-zero `comp_mask`. Without the provider's
/// `query_device_ex`, or when it answers `EOPNOTSUPP` or `ENOSYS`, falls back (as the C does)
/// to zeroing `attr` and filling its `orig_attr` with [`ibv_query_device`].
/// Returns 0 or an errno value.
///
/// # Safety
///
/// `context` must be a live context, `input` null or readable, and `attr` writable.
#[inline]
pub unsafe fn ibv_query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
) -> c_int {
    // SAFETY: a non-null `input` is readable (caller guarantee).
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: the caller guarantees a live context; the offset is the named field's.
    let op = unsafe {
        verbs_get_ctx_op(context, offset_of!(verbs_context, query_device_ex), |v| {
            &v.query_device_ex
        })
    };
    if let Some(op) = op {
        // SAFETY: forwarded caller guarantees; the size tells the provider how much to fill.
        let ret = unsafe { op(context, input, attr, size_of::<ibv_device_attr_ex>()) };
        if ret != libc::EOPNOTSUPP && ret != libc::ENOSYS {
            return ret;
        }
    }
    // SAFETY: `attr` is writable (caller guarantee) and `orig_attr` is its first field.
    unsafe {
        ptr::write_bytes(attr, 0, 1);
        crate::ibv_query_device(context, &raw mut (*attr).orig_attr)
    }
}

/// Port of `ibv_query_rt_values_ex`: reads the device's current real-time values selected by
/// `values->comp_mask`.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `query_rt_values`).
///
/// # Safety
///
/// `context` must be a live context and `values` readable and writable.
#[inline]
pub unsafe fn ibv_query_rt_values_ex(
    context: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    let op = ctx_op!(context, query_rt_values, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, values) }
}

// ---------------------------------------------------------------------------------------------
// Completion queues, shared receive queues, queue pairs
// ---------------------------------------------------------------------------------------------

/// Port of `ibv_create_cq_ex`: creates an extended completion queue.
///
/// Returns the queue, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `create_cq_ex`).
///
/// # Safety
///
/// `context` must be a live context and `cq_attr` a valid `ibv_cq_init_attr_ex` whose pointers
/// (`channel`, `parent_domain`) are live or null.
#[inline]
pub unsafe fn ibv_create_cq_ex(
    context: *mut ibv_context,
    cq_attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    let op = ctx_op!(context, create_cq_ex, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, cq_attr) }
}

/// Port of `ibv_modify_cq`: modifies the moderation of a completion queue.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `modify_cq`).
///
/// # Safety
///
/// `cq` must be a live completion queue and `attr` readable.
#[inline]
pub unsafe fn ibv_modify_cq(cq: *mut ibv_cq, attr: *mut ibv_modify_cq_attr) -> c_int {
    // SAFETY: `cq` is live, so its context is too.
    let ctx = unsafe { (*cq).context };
    let op = ctx_op!(ctx, modify_cq, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(cq, attr) }
}

/// Port of `ibv_create_srq_ex`: creates a shared receive queue of any type.
///
/// As in C, a request that sets only `IBV_SRQ_INIT_ATTR_PD` (and optionally
/// `IBV_SRQ_INIT_ATTR_TYPE` with `IBV_SRQT_BASIC`) goes to
/// [`ibv_create_srq`]; any other to the provider's `create_srq_ex`.
/// Returns the queue, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `create_srq_ex`).
///
/// # Safety
///
/// `context` must be a live context and `srq_init_attr_ex` a valid, writable
/// `ibv_srq_init_attr_ex` whose pointers selected by `comp_mask` are live.
#[inline]
pub unsafe fn ibv_create_srq_ex(
    context: *mut ibv_context,
    srq_init_attr_ex: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    // SAFETY: the caller guarantees `srq_init_attr_ex` is valid.
    let (mask, srq_type, pd) = unsafe {
        (
            (*srq_init_attr_ex).comp_mask,
            (*srq_init_attr_ex).srq_type,
            (*srq_init_attr_ex).pd,
        )
    };
    if mask & !(IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE) == 0
        && mask & IBV_SRQ_INIT_ATTR_PD != 0
        && (mask & IBV_SRQ_INIT_ATTR_TYPE == 0 || srq_type == IBV_SRQT_BASIC)
    {
        // SAFETY: `ibv_srq_init_attr` is a prefix of `ibv_srq_init_attr_ex`; `pd` is live.
        return unsafe { crate::ibv_create_srq(pd, srq_init_attr_ex.cast()) };
    }
    let op = ctx_op!(context, create_srq_ex, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, srq_init_attr_ex) }
}

/// Port of `ibv_get_srq_num`: reads the number of an XRC shared receive queue into `*srq_num`.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `get_srq_num`).
///
/// # Safety
///
/// `srq` must be a live shared receive queue and `srq_num` writable.
#[inline]
pub unsafe fn ibv_get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    // SAFETY: `srq` is live, so its context is too.
    let ctx = unsafe { (*srq).context };
    let op = ctx_op!(ctx, get_srq_num, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(srq, srq_num) }
}

/// Port of `ibv_create_qp_ex`: creates a queue pair with extended attributes.
///
/// As in C, a request whose `comp_mask` is exactly `IBV_QP_INIT_ATTR_PD` goes to
/// [`ibv_create_qp`]; any other to the provider's `create_qp_ex`. Returns
/// the queue pair, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `create_qp_ex`).
///
/// # Safety
///
/// `context` must be a live context and `qp_init_attr_ex` a valid, writable
/// `ibv_qp_init_attr_ex` whose pointers selected by `comp_mask` are live.
#[inline]
pub unsafe fn ibv_create_qp_ex(
    context: *mut ibv_context,
    qp_init_attr_ex: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: the caller guarantees `qp_init_attr_ex` is valid.
    let (mask, pd) = unsafe { ((*qp_init_attr_ex).comp_mask, (*qp_init_attr_ex).pd) };
    if mask == IBV_QP_INIT_ATTR_PD {
        // SAFETY: `ibv_qp_init_attr` is a prefix of `ibv_qp_init_attr_ex`; `pd` is live.
        return unsafe { crate::ibv_create_qp(pd, qp_init_attr_ex.cast()) };
    }
    let op = ctx_op!(context, create_qp_ex, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, qp_init_attr_ex) }
}

/// Port of `ibv_open_qp`: opens a shareable (XRC target) queue pair.
///
/// Returns the queue pair, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `open_qp`).
///
/// # Safety
///
/// `context` must be a live context and `qp_open_attr` a valid `ibv_qp_open_attr` whose `xrcd`
/// is live.
#[inline]
pub unsafe fn ibv_open_qp(
    context: *mut ibv_context,
    qp_open_attr: *mut ibv_qp_open_attr,
) -> *mut ibv_qp {
    let op = ctx_op!(context, open_qp, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, qp_open_attr) }
}

/// Port of `ibv_modify_qp_rate_limit`: sets the rate limit of a (raw packet) queue pair.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `modify_qp_rate_limit`).
///
/// # Safety
///
/// `qp` must be a live queue pair and `attr` readable.
#[inline]
pub unsafe fn ibv_modify_qp_rate_limit(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_rate_limit_attr,
) -> c_int {
    // SAFETY: `qp` is live, so its context is too.
    let ctx = unsafe { (*qp).context };
    let op = ctx_op!(ctx, modify_qp_rate_limit, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, attr) }
}

/// Port of `ibv_open_xrcd`: opens an XRC domain.
///
/// Returns the domain, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `open_xrcd`).
///
/// # Safety
///
/// `context` must be a live context and `xrcd_init_attr` a valid `ibv_xrcd_init_attr`.
#[inline]
pub unsafe fn ibv_open_xrcd(
    context: *mut ibv_context,
    xrcd_init_attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    let op = ctx_op!(context, open_xrcd, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, xrcd_init_attr) }
}

/// Port of `ibv_close_xrcd`: closes an XRC domain.
///
/// Returns 0 or an errno value. The C calls `close_xrcd` without checking it (a domain can only
/// come from a provider that has `open_xrcd`); this port checks, and returns `EOPNOTSUPP` when
/// the context is not extended or the provider lacks `close_xrcd`.
///
/// # Safety
///
/// `xrcd` must be a live XRC domain, not used afterwards if this succeeds.
#[inline]
pub unsafe fn ibv_close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    // SAFETY: `xrcd` is live, so its context is too.
    let ctx = unsafe { (*xrcd).context };
    let op = ctx_op!(ctx, close_xrcd, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(xrcd) }
}

/// Port of `ibv_create_wq`: creates a work queue, and (as the C does) initializes its
/// `wq_context`, `events_completed`, `mutex` and `cond`.
///
/// Returns the work queue, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `create_wq`).
///
/// # Safety
///
/// `context` must be a live context and `wq_init_attr` a valid, writable `ibv_wq_init_attr`
/// whose `pd` and `cq` are live.
#[inline]
pub unsafe fn ibv_create_wq(
    context: *mut ibv_context,
    wq_init_attr: *mut ibv_wq_init_attr,
) -> *mut ibv_wq {
    let op = ctx_op!(context, create_wq, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    let wq = unsafe { op(context, wq_init_attr) };
    if !wq.is_null() {
        // SAFETY: a non-null result is the provider's new, live work queue, not yet shared;
        // the bindings' pthread types have libc's layout (both are glibc's).
        unsafe {
            (*wq).wq_context = (*wq_init_attr).wq_context;
            (*wq).events_completed = 0;
            libc::pthread_mutex_init((&raw mut (*wq).mutex).cast(), ptr::null());
            libc::pthread_cond_init((&raw mut (*wq).cond).cast(), ptr::null());
        }
    }
    wq
}

/// Port of `ibv_modify_wq`: modifies the attributes of a work queue selected by
/// `wq_attr->attr_mask`.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `modify_wq`).
///
/// # Safety
///
/// `wq` must be a live work queue and `wq_attr` readable and writable.
#[inline]
pub unsafe fn ibv_modify_wq(wq: *mut ibv_wq, wq_attr: *mut ibv_wq_attr) -> c_int {
    // SAFETY: `wq` is live, so its context is too.
    let ctx = unsafe { (*wq).context };
    let op = ctx_op!(ctx, modify_wq, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(wq, wq_attr) }
}

/// Port of `ibv_destroy_wq`: destroys a work queue.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `destroy_wq`).
///
/// # Safety
///
/// `wq` must be a live work queue, not used afterwards if this succeeds.
#[inline]
pub unsafe fn ibv_destroy_wq(wq: *mut ibv_wq) -> c_int {
    // SAFETY: `wq` is live, so its context is too.
    let ctx = unsafe { (*wq).context };
    let op = ctx_op!(ctx, destroy_wq, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(wq) }
}

/// Port of `ibv_create_rwq_ind_table`: creates a receive work queue indirection table (RSS).
///
/// Returns the table, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `create_rwq_ind_table`).
///
/// # Safety
///
/// `context` must be a live context and `init_attr` a valid `ibv_rwq_ind_table_init_attr`
/// whose `ind_tbl` holds `1 << log_ind_tbl_size` live work queues.
#[inline]
pub unsafe fn ibv_create_rwq_ind_table(
    context: *mut ibv_context,
    init_attr: *mut ibv_rwq_ind_table_init_attr,
) -> *mut ibv_rwq_ind_table {
    let op = ctx_op!(
        context,
        create_rwq_ind_table,
        null_with_errno(libc::EOPNOTSUPP)
    );
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, init_attr) }
}

/// Port of `ibv_destroy_rwq_ind_table`: destroys a receive work queue indirection table.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks
/// `destroy_rwq_ind_table`).
///
/// # Safety
///
/// `rwq_ind_table` must be a live indirection table, not used afterwards if this succeeds.
#[inline]
pub unsafe fn ibv_destroy_rwq_ind_table(rwq_ind_table: *mut ibv_rwq_ind_table) -> c_int {
    // SAFETY: `rwq_ind_table` is live, so its context is too.
    let ctx = unsafe { (*rwq_ind_table).context };
    let op = ctx_op!(ctx, destroy_rwq_ind_table, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(rwq_ind_table) }
}

/// Port of `ibv_alloc_td`: allocates a thread domain.
///
/// Returns the domain, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `alloc_td`).
///
/// # Safety
///
/// `context` must be a live context and `init_attr` a valid `ibv_td_init_attr`.
#[inline]
pub unsafe fn ibv_alloc_td(
    context: *mut ibv_context,
    init_attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    let op = ctx_op!(context, alloc_td, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, init_attr) }
}

/// Port of `ibv_dealloc_td`: frees a thread domain.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `dealloc_td`).
///
/// # Safety
///
/// `td` must be a live thread domain, not used afterwards if this succeeds.
#[inline]
pub unsafe fn ibv_dealloc_td(td: *mut ibv_td) -> c_int {
    // SAFETY: `td` is live, so its context is too.
    let ctx = unsafe { (*td).context };
    let op = ctx_op!(ctx, dealloc_td, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(td) }
}

/// Port of `ibv_alloc_parent_domain`: allocates a parent domain (a protection domain with a
/// thread domain and custom allocators).
///
/// Returns the domain, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `alloc_parent_domain`).
///
/// # Safety
///
/// `context` must be a live context and `attr` a valid `ibv_parent_domain_init_attr` whose
/// `pd` and `td` are live and whose allocator callbacks, if set, stay callable for the life of
/// the domain's objects.
#[inline]
pub unsafe fn ibv_alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    let op = ctx_op!(
        context,
        alloc_parent_domain,
        null_with_errno(libc::EOPNOTSUPP)
    );
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, attr) }
}

// ---------------------------------------------------------------------------------------------
// Flow steering
// ---------------------------------------------------------------------------------------------

/// Port of `ibv_create_flow`: attaches a steering rule to a queue pair.
///
/// Returns the flow, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `ibv_create_flow`).
///
/// # Safety
///
/// `qp` must be a live queue pair and `flow` a valid `ibv_flow_attr` followed by its
/// `num_of_specs` specifications (`size` bytes in all).
#[inline]
pub unsafe fn ibv_create_flow(qp: *mut ibv_qp, flow: *mut ibv_flow_attr) -> *mut ibv_flow {
    // SAFETY: `qp` is live, so its context is too.
    let ctx = unsafe { (*qp).context };
    let op = ctx_op!(ctx, ibv_create_flow, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, flow) }
}

/// Port of `ibv_destroy_flow`: removes a steering rule.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `ibv_destroy_flow`).
///
/// # Safety
///
/// `flow_id` must be a live flow, not used afterwards if this succeeds.
#[inline]
pub unsafe fn ibv_destroy_flow(flow_id: *mut ibv_flow) -> c_int {
    // SAFETY: `flow_id` is live, so its context is too.
    let ctx = unsafe { (*flow_id).context };
    let op = ctx_op!(ctx, ibv_destroy_flow, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(flow_id) }
}

/// Port of `ibv_create_flow_action_esp`: creates an IPsec ESP flow action.
///
/// Returns the action, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `create_flow_action_esp`).
///
/// # Safety
///
/// `ctx` must be a live context and `esp` a valid `ibv_flow_action_esp_attr` whose pointers are
/// valid for their stated lengths.
#[inline]
pub unsafe fn ibv_create_flow_action_esp(
    ctx: *mut ibv_context,
    esp: *mut ibv_flow_action_esp_attr,
) -> *mut ibv_flow_action {
    let op = ctx_op!(
        ctx,
        create_flow_action_esp,
        null_with_errno(libc::EOPNOTSUPP)
    );
    // SAFETY: forwarded caller guarantees.
    unsafe { op(ctx, esp) }
}

/// Port of `ibv_modify_flow_action_esp`: modifies an IPsec ESP flow action.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks
/// `modify_flow_action_esp`).
///
/// # Safety
///
/// `action` must be a live flow action and `esp` as for [`ibv_create_flow_action_esp`].
#[inline]
pub unsafe fn ibv_modify_flow_action_esp(
    action: *mut ibv_flow_action,
    esp: *mut ibv_flow_action_esp_attr,
) -> c_int {
    // SAFETY: `action` is live, so its context is too.
    let ctx = unsafe { (*action).context };
    let op = ctx_op!(ctx, modify_flow_action_esp, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(action, esp) }
}

/// Port of `ibv_destroy_flow_action`: destroys a flow action.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `destroy_flow_action`).
///
/// # Safety
///
/// `action` must be a live flow action, not used afterwards if this succeeds.
#[inline]
pub unsafe fn ibv_destroy_flow_action(action: *mut ibv_flow_action) -> c_int {
    // SAFETY: `action` is live, so its context is too.
    let ctx = unsafe { (*action).context };
    let op = ctx_op!(ctx, destroy_flow_action, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(action) }
}

// ---------------------------------------------------------------------------------------------
// Memory windows, memory regions, device memory
// ---------------------------------------------------------------------------------------------

/// Port of `ibv_alloc_mw`: allocates a memory window of `type_` (`IBV_MW_TYPE_1` or `_2`).
///
/// Returns the window, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `alloc_mw`).
///
/// # Safety
///
/// `pd` must be a live protection domain.
#[inline]
pub unsafe fn ibv_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw {
    // SAFETY: `pd` is live, so its context is too.
    let ctx = unsafe { (*pd).context };
    let op = classic_op!(ctx, alloc_mw, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantee.
    unsafe { op(pd, type_) }
}

/// Port of `ibv_dealloc_mw`: frees a memory window.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `dealloc_mw`).
///
/// # Safety
///
/// `mw` must be a live memory window, not used afterwards if this succeeds.
#[inline]
pub unsafe fn ibv_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: `mw` is live, so its context is too.
    let ctx = unsafe { (*mw).context };
    let op = classic_op!(ctx, dealloc_mw);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(mw) }
}

/// Port of `ibv_inc_rkey`: `rkey` with its low 8 bits (the key's tag) incremented, wrapping
/// within those 8 bits.
///
/// # Safety
///
/// None: the function only computes on its argument; it is `unsafe` like the other ports.
#[inline]
pub unsafe fn ibv_inc_rkey(rkey: u32) -> u32 {
    const MASK: u32 = 0x0000_00ff;
    let newtag = (rkey.wrapping_add(1) & MASK) as u8;
    (rkey & !MASK) | u32::from(newtag)
}

/// Port of `ibv_bind_mw`: posts the binding of a type 1 memory window to a memory region.
///
/// As in C, returns `EINVAL` when `mw` is not of type 1 or when `bind_info` has no `mr` but a
/// non-zero `addr` or `length`, and `EPERM` when `mw` and `bind_info.mr` belong to different
/// protection domains; else 0 or the provider's errno value (`EOPNOTSUPP` when the provider
/// lacks `bind_mw`).
///
/// # Safety
///
/// `qp` must be a live queue pair, `mw` a live memory window, and `mw_bind` a valid, writable
/// `ibv_mw_bind` whose `bind_info.mr` is null or a live memory region.
#[inline]
pub unsafe fn ibv_bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int {
    // SAFETY: the caller guarantees `mw_bind` and `mw` are valid.
    let (bind_info, mw_type, mw_pd, ctx) =
        unsafe { ((*mw_bind).bind_info, (*mw).type_, (*mw).pd, (*mw).context) };
    if mw_type != IBV_MW_TYPE_1 {
        return libc::EINVAL;
    }
    if bind_info.mr.is_null() && (bind_info.addr != 0 || bind_info.length != 0) {
        return libc::EINVAL;
    }
    // SAFETY: a non-null `bind_info.mr` is a live memory region (caller guarantee).
    if !bind_info.mr.is_null() && mw_pd != unsafe { (*bind_info.mr).pd } {
        return libc::EPERM;
    }
    let op = classic_op!(ctx, bind_mw);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(qp, mw, mw_bind) }
}

/// Port of `ibv_advise_mr`: gives the provider advice (prefetch) about `num_sge` ranges of
/// on-demand-paging memory regions.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `advise_mr`).
///
/// # Safety
///
/// `pd` must be a live protection domain and `sg_list` readable for `num_sge` entries.
#[inline]
pub unsafe fn ibv_advise_mr(
    pd: *mut ibv_pd,
    advice: ib_uverbs_advise_mr_advice,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    // SAFETY: `pd` is live, so its context is too.
    let ctx = unsafe { (*pd).context };
    let op = ctx_op!(ctx, advise_mr, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(pd, advice, flags, sg_list, num_sge) }
}

/// Port of `ibv_alloc_dm`: allocates device memory.
///
/// Returns the device memory, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `alloc_dm`).
///
/// # Safety
///
/// `context` must be a live context and `attr` a valid `ibv_alloc_dm_attr`.
#[inline]
pub unsafe fn ibv_alloc_dm(context: *mut ibv_context, attr: *mut ibv_alloc_dm_attr) -> *mut ibv_dm {
    let op = ctx_op!(context, alloc_dm, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, attr) }
}

/// Port of `ibv_free_dm`: frees device memory.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `free_dm`).
///
/// # Safety
///
/// `dm` must be live device memory, not used afterwards if this succeeds.
#[inline]
pub unsafe fn ibv_free_dm(dm: *mut ibv_dm) -> c_int {
    // SAFETY: `dm` is live, so its context is too.
    let ctx = unsafe { (*dm).context };
    let op = ctx_op!(ctx, free_dm, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(dm) }
}

/// Port of `ibv_memcpy_to_dm`: copies `length` bytes from `host_addr` to offset `dm_offset` of
/// device memory.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `memcpy_to_dm`).
///
/// # Safety
///
/// `dm` must be live device memory and `host_addr` readable for `length` bytes.
#[inline]
pub unsafe fn ibv_memcpy_to_dm(
    dm: *mut ibv_dm,
    dm_offset: u64,
    host_addr: *const c_void,
    length: usize,
) -> c_int {
    let op = obj_op!(dm, memcpy_to_dm, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(dm, dm_offset, host_addr, length) }
}

/// Port of `ibv_memcpy_from_dm`: copies `length` bytes from offset `dm_offset` of device memory
/// to `host_addr`.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `memcpy_from_dm`).
///
/// # Safety
///
/// `dm` must be live device memory and `host_addr` writable for `length` bytes.
#[inline]
pub unsafe fn ibv_memcpy_from_dm(
    host_addr: *mut c_void,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
) -> c_int {
    let op = obj_op!(dm, memcpy_from_dm, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(host_addr, dm, dm_offset, length) }
}

/// Port of `ibv_alloc_null_mr`: allocates a null memory region (writes are dropped, reads
/// return zeroes).
///
/// Returns the region, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `alloc_null_mr`).
///
/// # Safety
///
/// `pd` must be a live protection domain.
#[inline]
pub unsafe fn ibv_alloc_null_mr(pd: *mut ibv_pd) -> *mut ibv_mr {
    // SAFETY: `pd` is live, so its context is too.
    let ctx = unsafe { (*pd).context };
    let op = ctx_op!(ctx, alloc_null_mr, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantee.
    unsafe { op(pd) }
}

/// Port of `ibv_reg_dm_mr`: registers `length` bytes of device memory, from `dm_offset`, as a
/// memory region.
///
/// Returns the region, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `reg_dm_mr`).
///
/// # Safety
///
/// `pd` must be a live protection domain and `dm` live device memory of the same context.
#[inline]
pub unsafe fn ibv_reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: `pd` is live, so its context is too.
    let ctx = unsafe { (*pd).context };
    let op = ctx_op!(ctx, reg_dm_mr, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    unsafe { op(pd, dm, dm_offset, length, access) }
}

// ---------------------------------------------------------------------------------------------
// Counters
// ---------------------------------------------------------------------------------------------

/// Port of `ibv_create_counters`: creates a counters object.
///
/// Returns the object, or null with `errno` set (`EOPNOTSUPP` when the provider lacks
/// `create_counters`).
///
/// # Safety
///
/// `context` must be a live context and `init_attr` a valid `ibv_counters_init_attr`.
#[inline]
pub unsafe fn ibv_create_counters(
    context: *mut ibv_context,
    init_attr: *mut ibv_counters_init_attr,
) -> *mut ibv_counters {
    let op = ctx_op!(context, create_counters, null_with_errno(libc::EOPNOTSUPP));
    // SAFETY: forwarded caller guarantees.
    unsafe { op(context, init_attr) }
}

/// Port of `ibv_destroy_counters`: destroys a counters object.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `destroy_counters`).
///
/// # Safety
///
/// `counters` must be a live counters object, not used afterwards if this succeeds.
#[inline]
pub unsafe fn ibv_destroy_counters(counters: *mut ibv_counters) -> c_int {
    // SAFETY: `counters` is live, so its context is too.
    let ctx = unsafe { (*counters).context };
    let op = ctx_op!(ctx, destroy_counters, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantee.
    unsafe { op(counters) }
}

/// Port of `ibv_attach_counters_point_flow`: attaches a counter description to a flow.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks
/// `attach_counters_point_flow`).
///
/// # Safety
///
/// `counters` must be a live counters object, `attr` readable, and `flow` null or a live flow.
#[inline]
pub unsafe fn ibv_attach_counters_point_flow(
    counters: *mut ibv_counters,
    attr: *mut ibv_counter_attach_attr,
    flow: *mut ibv_flow,
) -> c_int {
    // SAFETY: `counters` is live, so its context is too.
    let ctx = unsafe { (*counters).context };
    let op = ctx_op!(ctx, attach_counters_point_flow, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(counters, attr, flow) }
}

/// Port of `ibv_read_counters`: reads up to `ncounters` counter values into `counters_value`.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` when the provider lacks `read_counters`).
///
/// # Safety
///
/// `counters` must be a live counters object and `counters_value` writable for `ncounters`
/// values.
#[inline]
pub unsafe fn ibv_read_counters(
    counters: *mut ibv_counters,
    counters_value: *mut u64,
    ncounters: u32,
    flags: u32,
) -> c_int {
    // SAFETY: `counters` is live, so its context is too.
    let ctx = unsafe { (*counters).context };
    let op = ctx_op!(ctx, read_counters, libc::EOPNOTSUPP);
    // SAFETY: forwarded caller guarantees.
    unsafe { op(counters, counters_value, ncounters, flags) }
}

// ---------------------------------------------------------------------------------------------
// Pure helpers
// ---------------------------------------------------------------------------------------------

/// Port of `ibv_is_qpt_supported`: 1 if bit `qpt` of the capability mask `caps` is set, else 0.
///
/// A `qpt` of 32 or more (such as `IBV_QPT_DRIVER`), undefined behaviour in C, gives 0 here.
///
/// # Safety
///
/// None: the function only computes on its arguments; it is `unsafe` like the other ports.
#[inline]
pub unsafe fn ibv_is_qpt_supported(caps: u32, qpt: ibv_qp_type) -> c_int {
    let bit = 1u32.checked_shl(qpt).unwrap_or(0);
    c_int::from(caps & bit != 0)
}

/// Port of `ibv_flow_label_to_udp_sport`: the RoCE v2 UDP source port derived from an IPv6
/// flow label (in the range `0xC000..=0xFFFF`).
///
/// # Safety
///
/// None: the function only computes on its argument; it is `unsafe` like the other ports.
#[inline]
pub unsafe fn ibv_flow_label_to_udp_sport(fl: u32) -> u16 {
    /// `IB_ROCE_UDP_ENCAP_VALID_PORT_MIN`.
    const VALID_PORT_MIN: u32 = 0xC000;
    let fl_high = fl & 0xFC000;
    let fl_low = (fl & 0x03FFF) ^ (fl_high >> 14);
    (fl_low | VALID_PORT_MIN) as u16
}

// ---------------------------------------------------------------------------------------------
// Connection manager (`rdma/rdma_cma.h`)
// ---------------------------------------------------------------------------------------------

/// Port of `rdma_get_local_addr`: the identifier's local address (its route's source).
///
/// # Safety
///
/// `id` must be a live identifier; the result points into it.
#[inline]
pub unsafe fn rdma_get_local_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    // SAFETY: `id` is live (the caller's guarantee); only the field's address is taken.
    unsafe { std::ptr::addr_of_mut!((*id).route.addr.__bindgen_anon_1.src_addr) }
}

/// Port of `rdma_get_peer_addr`: the identifier's peer address (its route's destination).
///
/// # Safety
///
/// `id` must be a live identifier; the result points into it.
#[inline]
pub unsafe fn rdma_get_peer_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    // SAFETY: `id` is live (the caller's guarantee); only the field's address is taken.
    unsafe { std::ptr::addr_of_mut!((*id).route.addr.__bindgen_anon_2.dst_addr) }
}
