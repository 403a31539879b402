//! The extended send path: queue pairs created by `ibv_create_qp_ex` with send-ops flags, whose
//! send lists go to the device through the `ibv_wr_*` builders instead of `ibv_post_send`.
//!
//! The crate's requests are still built into `ibv_send_wr` chains (see `wr/`); posting on an
//! extended queue pair walks the chain and replays each request as `wr_id`/`wr_flags`, an
//! opcode builder and its setters, between one `ibv_wr_start` and one `ibv_wr_complete` (one
//! doorbell). Nothing is allocated.
//!
//! # When the classic call is used instead
//!
//! The classic `ibv_post_send` stays valid on a queue pair made by `ibv_create_qp_ex`: the
//! `ibv_wr_post(3)` manual allows batches of both APIs on one queue pair as long as neither is
//! posted inside the other's `ibv_wr_start` .. `ibv_wr_complete` region, which `&mut self` on
//! every post guarantees. A list goes to `ibv_post_send` when it holds an operation the queue
//! pair was not created for (memory-window operations where the provider refused them), or a
//! request the builders cannot express as the classic call would (inline data over the granted
//! `max_inline_data`, inline data spread over more than 16 entries (or over several on
//! Soft-RoCE: see `ExtendedSend`), more entries than
//! `max_send_sge`, an opcode without a builder). The translation finds these before
//! `ibv_wr_complete`, aborts the batch (nothing reaches the device) and posts the list with the
//! classic call, whose error then names the request at fault.

use std::ffi::c_void;
use std::ptr::NonNull;

use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::wr::op;

use super::QpCaps;

/// How a queue pair posts its send requests: see
/// [`QpBuilder::send_path`](super::QpBuilder::send_path).
///
/// Receives are posted with `ibv_post_recv` whatever the path.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SendPath {
    /// `ibv_create_qp`, and sends with `ibv_post_send` (the default): works with every provider.
    #[default]
    Classic,
    /// The extended path where the provider offers it, else the classic one, decided when the
    /// queue pair is created ([`QueuePair::uses_extended_post`](super::QueuePair::uses_extended_post)
    /// tells which).
    ///
    /// Creation tries `ibv_create_qp_ex` with the send-ops flags of every operation of the
    /// transport (atomic write only where the device reports it), then without the
    /// memory-window operations (`BIND_MW`, `LOCAL_INV`, `SEND_WITH_INV`), then without atomic
    /// write either, and falls back to `ibv_create_qp` when the provider lacks `create_qp_ex` or
    /// refuses every attempt (`EOPNOTSUPP`, `ENOSYS`, `EINVAL`). It also stays classic
    /// when the queue pair it gets has no `ibv_qp_ex` or lacks a builder it needs.
    Auto,
    /// The extended path or nothing: as [`Auto`](Self::Auto), but where `Auto` would fall back,
    /// creation fails (with [`Error::Unsupported`] when the provider lacks the API).
    Extended,
}

/// The extended side of a queue pair: its `ibv_qp_ex` and the crate operations (bits of
/// [`op`]) it was created for and has builders for.
#[derive(Copy, Clone, Debug)]
pub(super) struct ExtendedSend {
    qpx: NonNull<ffi::ibv_qp_ex>,
    ops: u32,
    /// Whether inline gather lists go through `ibv_wr_set_inline_data_list`: not on
    /// Soft-RoCE, whose provider sent them with length 0 until rdma-core 64 (it copied the
    /// bytes but never added up their length; upstream commit 1e8ed0aff), in versions that
    /// cannot be told apart at run time. There they take `ibv_post_send`.
    inline_lists: bool,
}

impl ExtendedSend {
    /// Whether a list whose operations are `ops` can go through the builders.
    #[inline]
    pub(super) fn covers(&self, ops: u32) -> bool {
        ops & !self.ops == 0
    }
}

/// The most entries of an inline gather list the builders carry
/// (`ibv_wr_set_inline_data_list`); a longer one goes to `ibv_post_send`.
const INLINE_LIST_MAX: usize = 16;

/// The memory-window operations, asked for only in the first creation attempt.
const MW_OPS: u32 = op::BIND_MW | op::LOCAL_INV | op::SEND_WITH_INV;

/// The `IBV_QP_EX_WITH_*` flags of the crate operations `ops`.
fn send_ops_flags(ops: u32) -> u64 {
    let pairs = [
        (op::SEND, ffi::IBV_QP_EX_WITH_SEND),
        (op::SEND_WITH_IMM, ffi::IBV_QP_EX_WITH_SEND_WITH_IMM),
        (op::WRITE, ffi::IBV_QP_EX_WITH_RDMA_WRITE),
        (op::WRITE_WITH_IMM, ffi::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM),
        (op::READ, ffi::IBV_QP_EX_WITH_RDMA_READ),
        (
            op::ATOMIC,
            ffi::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | ffi::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        ),
        (op::BIND_MW, ffi::IBV_QP_EX_WITH_BIND_MW),
        (op::LOCAL_INV, ffi::IBV_QP_EX_WITH_LOCAL_INV),
        (op::SEND_WITH_INV, ffi::IBV_QP_EX_WITH_SEND_WITH_INV),
        (op::ATOMIC_WRITE, ffi::IBV_QP_EX_WITH_ATOMIC_WRITE),
    ];
    pairs
        .iter()
        .filter(|(bit, _)| ops & bit != 0)
        .fold(0, |flags, &(_, with)| flags | u64::from(with))
}

/// What [`create`] got.
pub(super) enum Created {
    /// A queue pair (extended or not), with the capacities the provider granted.
    Qp {
        raw: NonNull<ffi::ibv_qp>,
        cap: ffi::ibv_qp_cap,
        extended: Option<ExtendedSend>,
    },
    /// The provider lacks `create_qp_ex` or refused every attempt, with this errno (the last).
    Refused(Errno),
}

/// `ibv_create_qp_ex` (through `create_ex`) with the attributes of `init` and the send-ops
/// flags of the transport's operations `ops` (first all, then without the memory-window
/// operations, then without atomic write either); inline gather lists go through the builders if `inline_lists` (see
/// [`ExtendedSend`]).
///
/// # Errors
///
/// [`Error::Verb`] for a failure a classic creation would not avoid (`ENOMEM`, ...).
///
/// # Safety
///
/// `pd` is live, and the CQs and SRQ `init` names are live and belong to its context;
/// `create_ex` creates a queue pair from the attributes it is given as `ibv_create_qp_ex` on
/// that context does (null with `errno` on failure).
pub(super) unsafe fn create(
    pd: *mut ffi::ibv_pd,
    init: &ffi::ibv_qp_init_attr,
    ops: u32,
    datagram: bool,
    inline_lists: bool,
    create_ex: &mut dyn FnMut(&mut ffi::ibv_qp_init_attr_ex) -> *mut ffi::ibv_qp,
) -> Result<Created> {
    // Every operation; then without the memory-window ones; then without atomic write too.
    let mut attempts = [ops, ops & !MW_OPS, ops & !MW_OPS & !op::ATOMIC_WRITE];
    let mut count = 1;
    for i in 1..attempts.len() {
        if attempts[i] != attempts[count - 1] {
            attempts[count] = attempts[i];
            count += 1;
        }
    }
    let mut refused = Errno::OPNOTSUPP;
    for &wanted in &attempts[..count] {
        let mut attr = attr_ex(init, pd);
        attr.comp_mask |= ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        attr.send_ops_flags = send_ops_flags(wanted);
        // `create_ex` is `ibv_create_qp_ex` on the PD's context, or a library that calls it:
        // the PD, CQs and SRQ are live and of that context (the caller's guarantee), `attr` is
        // valid and writable, and the pointers its comp_mask selects (the PD) are live.
        let raw = create_ex(&mut attr);
        let Some(raw) = NonNull::new(raw) else {
            let errno = Errno::last();
            if errno == Errno::OPNOTSUPP || errno == Errno::NOSYS || errno == Errno::INVAL {
                refused = errno;
                continue;
            }
            return Err(Error::verb("ibv_create_qp_ex", errno));
        };
        // SAFETY: a live queue pair just created.
        let qpx = NonNull::new(unsafe { ffi::ibv_qp_to_qp_ex(raw.as_ptr()) });
        let extended = qpx.and_then(|qpx| {
            // SAFETY: the live `ibv_qp_ex` of the queue pair, only read.
            let qpx_ref = unsafe { qpx.as_ref() };
            let ops = usable_ops(qpx_ref, wanted, datagram);
            let inline_lists = inline_lists && qpx_ref.wr_set_inline_data_list.is_some();
            (ops != 0).then_some(ExtendedSend {
                qpx,
                ops,
                inline_lists,
            })
        });
        return Ok(Created::Qp {
            raw,
            cap: attr.cap,
            extended,
        });
    }
    Ok(Created::Refused(refused))
}

/// The extended creation attributes of `init` in protection domain `pd`, with no extension.
pub(super) fn attr_ex(
    init: &ffi::ibv_qp_init_attr,
    pd: *mut ffi::ibv_pd,
) -> ffi::ibv_qp_init_attr_ex {
    ffi::ibv_qp_init_attr_ex {
        qp_context: init.qp_context,
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        srq: init.srq,
        cap: init.cap,
        qp_type: init.qp_type,
        sq_sig_all: init.sq_sig_all,
        comp_mask: ffi::IBV_QP_INIT_ATTR_PD,
        pd,
        ..Default::default()
    }
}

/// The operations of `wanted` whose builders `qpx` has, or 0 when it lacks a batch or data
/// function every post needs.
fn usable_ops(qpx: &ffi::ibv_qp_ex, wanted: u32, datagram: bool) -> u32 {
    let batch = qpx.wr_start.is_some() && qpx.wr_complete.is_some() && qpx.wr_abort.is_some();
    let data = qpx.wr_set_sge.is_some()
        && qpx.wr_set_sge_list.is_some()
        && qpx.wr_set_inline_data.is_some();
    if !batch || !data || (datagram && qpx.wr_set_ud_addr.is_none()) {
        return 0;
    }
    let builders = [
        (op::SEND, qpx.wr_send.is_some()),
        (op::SEND_WITH_IMM, qpx.wr_send_imm.is_some()),
        (op::WRITE, qpx.wr_rdma_write.is_some()),
        (op::WRITE_WITH_IMM, qpx.wr_rdma_write_imm.is_some()),
        (op::READ, qpx.wr_rdma_read.is_some()),
        (
            op::ATOMIC,
            qpx.wr_atomic_cmp_swp.is_some() && qpx.wr_atomic_fetch_add.is_some(),
        ),
        (op::BIND_MW, qpx.wr_bind_mw.is_some()),
        (op::LOCAL_INV, qpx.wr_local_inv.is_some()),
        (op::SEND_WITH_INV, qpx.wr_send_inv.is_some()),
        (op::ATOMIC_WRITE, qpx.wr_atomic_write.is_some()),
    ];
    builders
        .iter()
        .filter(|&&(_, present)| present)
        .fold(0, |ops, &(bit, _)| ops | bit)
        & wanted
}

/// Posts the chain at `head` through the builders of `ex`, in one batch.
///
/// Returns `None`, with the batch aborted and nothing posted, when a request cannot be
/// expressed (see the module documentation): the caller then posts the chain with
/// `ibv_post_send`. Otherwise the result of `ibv_wr_complete`, which posts all or nothing:
/// [`Error::QueueFull`] (`ENOMEM`, or rxe's `ENOSPC`) or [`Error::Post`], both with index 0.
///
/// # Safety
///
/// `ex` belongs to a live queue pair with no batch open, which the caller holds exclusively
/// for the call; `ex.covers` the operations of every request of the chain; `head` is a valid,
/// null-terminated chain built by `SendWr::fill` (on a datagram queue pair, each with an
/// address handle); and the caller keeps the memory the requests name valid as
/// `QueuePair::post_send` requires.
///
/// Kept out of line: inlined, its loop of builder calls made the classic path's post calls
/// save and restore every callee-saved register (counted with `cargo xtask instructions`).
#[inline(never)]
pub(super) unsafe fn post(
    ex: ExtendedSend,
    caps: &QpCaps,
    datagram: bool,
    head: *const ffi::ibv_send_wr,
) -> Option<Result<()>> {
    let qpx = ex.qpx.as_ptr();
    // SAFETY: the live `ibv_qp_ex` of a queue pair created with send-ops flags, no batch open
    // (the caller's guarantee); `wr_start` is present (checked at creation).
    if unsafe { ffi::ibv_wr_start(qpx) } != 0 {
        return None;
    }
    let mut wr = head;
    while !wr.is_null() {
        // SAFETY: `wr` is an element of the caller's valid chain.
        let raw = unsafe { &*wr };
        // SAFETY: the batch started above is live; the request comes from the crate and its
        // memory is kept valid by the caller.
        if !unsafe { build(qpx, raw, caps, datagram, ex.inline_lists) } {
            // SAFETY: the batch is live; aborting ends it with nothing posted.
            unsafe { ffi::ibv_wr_abort(qpx) };
            return None;
        }
        wr = raw.next;
    }
    // SAFETY: the batch is live; completing ends it.
    let ret = unsafe { ffi::ibv_wr_complete(qpx) };
    let verb = super::EXTENDED_POST_VERB;
    Some(match Errno::result(ret) {
        Ok(()) => Ok(()),
        Err(Errno::NOMEM | Errno::NOSPC) => Err(Error::QueueFull { verb, index: 0 }),
        Err(errno) => Err(Error::Post {
            verb,
            index: 0,
            errno,
        }),
    })
}

/// Adds `raw` to the live batch of `qpx`: `wr_id` and `wr_flags`, the opcode's builder, the
/// datagram address and the data setter. Returns `false`, having built nothing or only part of
/// the request, when the request cannot be expressed here.
///
/// `wr_flags` keeps `IBV_SEND_INLINE` when the payload is inline: rxe's kernel side reads the
/// bit to find the payload in the request, and other providers ignore it in `wr_flags`.
///
/// # Safety
///
/// As [`post`], for one request, with the batch of `qpx` live.
#[inline]
unsafe fn build(
    qpx: *mut ffi::ibv_qp_ex,
    raw: &ffi::ibv_send_wr,
    caps: &QpCaps,
    datagram: bool,
    inline_lists: bool,
) -> bool {
    let inline = raw.send_flags & ffi::IBV_SEND_INLINE != 0;
    let Ok(num_sge) = usize::try_from(raw.num_sge) else {
        return false;
    };
    let single = if num_sge == 1 {
        // SAFETY: a request with one entry points at it (the list's storage or the caller's).
        Some(unsafe { *raw.sg_list })
    } else {
        None
    };
    let fits = match (inline, single) {
        // Nothing to copy (an atomic write, an empty payload): the flag asks nothing.
        (_, None) if num_sge == 0 => true,
        (true, Some(sge)) => sge.length <= caps.max_inline_data,
        (true, None) if inline_lists && (2..=INLINE_LIST_MAX).contains(&num_sge) => {
            // SAFETY: a request of `num_sge` entries points at that many (the list's storage
            // or the caller's slice).
            let entries = unsafe { std::slice::from_raw_parts(raw.sg_list, num_sge) };
            let total: u64 = entries.iter().map(|sge| u64::from(sge.length)).sum();
            total <= u64::from(caps.max_inline_data)
        }
        (true, None) => false,
        (false, _) => num_sge <= caps.max_send_sge as usize,
    };
    if !fits {
        return false;
    }
    // SAFETY: the live `ibv_qp_ex`, held exclusively by the caller: the builder reads both
    // fields next.
    unsafe {
        (*qpx).wr_id = raw.wr_id;
        (*qpx).wr_flags = raw.send_flags;
    }
    // SAFETY: the unions hold the variant `SendWr::fill` wrote for the opcode and zeros
    // elsewhere, and every variant is plain integers and pointers, so each read is defined. The
    // batch is live, and the queue pair was created with the send-ops flag of each operation
    // built here (`ExtendedSend::covers`); the memory the requests name is the caller's to keep
    // valid.
    let (ret, data) = unsafe {
        let imm = raw.__bindgen_anon_1.imm_data;
        let rdma = raw.wr.rdma;
        match raw.opcode {
            ffi::IBV_WR_SEND => (ffi::ibv_wr_send(qpx), true),
            ffi::IBV_WR_SEND_WITH_IMM => (ffi::ibv_wr_send_imm(qpx, imm), true),
            ffi::IBV_WR_RDMA_WRITE => (
                ffi::ibv_wr_rdma_write(qpx, rdma.rkey, rdma.remote_addr),
                true,
            ),
            ffi::IBV_WR_RDMA_WRITE_WITH_IMM => (
                ffi::ibv_wr_rdma_write_imm(qpx, rdma.rkey, rdma.remote_addr, imm),
                true,
            ),
            ffi::IBV_WR_RDMA_READ => (
                ffi::ibv_wr_rdma_read(qpx, rdma.rkey, rdma.remote_addr),
                true,
            ),
            ffi::IBV_WR_ATOMIC_CMP_AND_SWP => {
                let a = raw.wr.atomic;
                let ret =
                    ffi::ibv_wr_atomic_cmp_swp(qpx, a.rkey, a.remote_addr, a.compare_add, a.swap);
                (ret, true)
            }
            ffi::IBV_WR_ATOMIC_FETCH_AND_ADD => {
                let a = raw.wr.atomic;
                let ret = ffi::ibv_wr_atomic_fetch_add(qpx, a.rkey, a.remote_addr, a.compare_add);
                (ret, true)
            }
            ffi::IBV_WR_ATOMIC_WRITE => {
                let a = raw.wr.atomic;
                // The provider copies the 8 bytes during the call.
                let value = a.compare_add.to_ne_bytes();
                let ret = ffi::ibv_wr_atomic_write(
                    qpx,
                    a.rkey,
                    a.remote_addr,
                    value.as_ptr().cast::<c_void>(),
                );
                (ret, false)
            }
            ffi::IBV_WR_SEND_WITH_INV => (
                ffi::ibv_wr_send_inv(qpx, raw.__bindgen_anon_1.invalidate_rkey),
                true,
            ),
            ffi::IBV_WR_LOCAL_INV => (
                ffi::ibv_wr_local_inv(qpx, raw.__bindgen_anon_1.invalidate_rkey),
                false,
            ),
            ffi::IBV_WR_BIND_MW => {
                // The region is live (the request borrows it); the window is allocated: an owned
                // bind holds its lock through the post (`mw.rs`), and a `SendRequest` bind's
                // post promises it.
                let bind = &raw.__bindgen_anon_2.bind_mw;
                let ret = ffi::ibv_wr_bind_mw(qpx, bind.mw, bind.rkey, &bind.bind_info);
                (ret, false)
            }
            _ => return false,
        }
    };
    if ret != 0 {
        return false;
    }
    if datagram {
        // SAFETY: on a datagram queue pair every request has a destination (checked before
        // posting), whose address handle the request borrows; the batch is live.
        let ret = unsafe {
            let ud = raw.wr.ud;
            ffi::ibv_wr_set_ud_addr(qpx, ud.ah, ud.remote_qpn, ud.remote_qkey)
        };
        if ret != 0 {
            return false;
        }
    }
    if !data {
        return true;
    }
    // SAFETY: the batch is live and its last request takes data; inline bytes are read during
    // the call only, entries name registered memory the caller keeps valid, and a list of
    // `num_sge` entries is readable (the list's storage or the caller's slice).
    let ret = unsafe {
        match (inline, single) {
            (true, Some(sge)) => ffi::ibv_wr_set_inline_data(
                qpx,
                sge.addr as usize as *mut c_void,
                sge.length as usize,
            ),
            (_, Some(sge)) => ffi::ibv_wr_set_sge(qpx, sge.lkey, sge.addr, sge.length),
            // A zero-length request still gets its data setter, which some providers (mlx5)
            // need to finish the request.
            // No entry at all: an entry of length 0 may be read as 2 GiB (see `Payload::fill`).
            _ if num_sge == 0 => ffi::ibv_wr_set_sge_list(qpx, 0, std::ptr::null()),
            (true, None) => set_inline_list(qpx, raw.sg_list, num_sge),
            _ => ffi::ibv_wr_set_sge_list(qpx, num_sge, raw.sg_list),
        }
    };
    ret == 0
}

/// `ibv_wr_set_inline_data_list` with the `num_sge` (2 to [`INLINE_LIST_MAX`]) entries at
/// `sg_list` as host buffers. Out of line: the common requests do not pay for its array.
///
/// # Safety
///
/// The batch of `qpx` is live and its last request takes data; `sg_list` is readable for
/// `num_sge` entries, each naming host memory readable during the call.
#[cold]
#[inline(never)]
unsafe fn set_inline_list(
    qpx: *mut ffi::ibv_qp_ex,
    sg_list: *const ffi::ibv_sge,
    num_sge: usize,
) -> i32 {
    let mut gather = [ffi::ibv_data_buf {
        addr: std::ptr::null_mut(),
        length: 0,
    }; INLINE_LIST_MAX];
    // SAFETY: readable for `num_sge` entries (the caller's guarantee).
    let entries = unsafe { std::slice::from_raw_parts(sg_list, num_sge) };
    for (buf, sge) in gather.iter_mut().zip(entries) {
        *buf = ffi::ibv_data_buf {
            addr: sge.addr as usize as *mut c_void,
            length: sge.length as usize,
        };
    }
    let count = num_sge.min(INLINE_LIST_MAX);
    // SAFETY: the batch is live; the buffers are host memory readable during the call, which
    // copies them into the request.
    unsafe { ffi::ibv_wr_set_inline_data_list(qpx, count, gather.as_ptr()) }
}
