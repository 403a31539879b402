//! The missing-operation convention of the ported inline functions, checked without a device.
//!
//! The objects here are zeroed (`Default`) structures standing in for a provider's: a zeroed op
//! table is a provider that implements nothing. Where an operation is present it is a fake
//! `extern "C"` function that records its call, so the tests prove both that a missing
//! operation is reported (never called through a null pointer) and that a present one is
//! called, with the arguments the C inline function would pass.

use std::cell::{Cell, RefCell};
use std::mem::{offset_of, size_of};
use std::ptr;

use libc::{EINVAL, ENOENT, EOPNOTSUPP, EPERM};
use rdma_verbs_sys as ffi;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn clear_errno() {
    // SAFETY: `__errno_location` is the calling thread's errno, writable for its whole life.
    unsafe { *libc::__errno_location() = 0 };
}

thread_local! {
    /// The names of the fake provider operations called on this thread, in order.
    static CALLS: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
    /// The `size` argument the last fake `query_device_ex` / `query_port` received.
    static LAST_SIZE: Cell<usize> = const { Cell::new(0) };
    /// What the fake `query_device_ex` and `start_poll` return.
    static RETURN_CODE: Cell<i32> = const { Cell::new(0) };
    /// The object the fake `create_wq` returns.
    static NEXT_WQ: Cell<*mut ffi::ibv_wq> = const { Cell::new(ptr::null_mut()) };
}

fn record(name: &'static str) {
    CALLS.with(|c| c.borrow_mut().push(name));
}

/// The fake operations called since the last `take_calls`, emptying the record.
fn take_calls() -> Vec<&'static str> {
    CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()))
}

/// A heap object owned through a raw pointer, so that raw pointers into it stay valid while the
/// tests hand them around; freed on drop.
struct Heap<T>(*mut T);

impl<T: Default> Heap<T> {
    fn zeroed() -> Self {
        Self(Box::into_raw(Box::default()))
    }
}

impl<T> Heap<T> {
    fn ptr(&self) -> *mut T {
        self.0
    }
}

impl<T> Drop for Heap<T> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::into_raw` and is freed once.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// A context opened through the extended ABI whose provider structure is `sz` bytes long
/// (counted back from the `ibv_context`, as `verbs_context::sz` is). All operations are null.
fn extended(sz: usize) -> Heap<ffi::verbs_context> {
    let vctx = Heap::<ffi::verbs_context>::zeroed();
    // SAFETY: freshly allocated and exclusively ours.
    unsafe {
        (*vctx.ptr()).sz = sz;
        (*vctx.ptr()).context.abi_compat = ffi::VERBS_ABI_IS_EXTENDED;
    }
    vctx
}

/// The `ibv_context` embedded in an extended context.
fn ctx_of(vctx: &Heap<ffi::verbs_context>) -> *mut ffi::ibv_context {
    // SAFETY: `vctx` is live; this only computes a field address.
    unsafe { &raw mut (*vctx.ptr()).context }
}

/// The size of `verbs_context` from `op_offset` (the offset of an operation) to its end: the
/// smallest `sz` for which the operation exists.
fn sz_holding(op_offset: usize) -> usize {
    size_of::<ffi::verbs_context>() - op_offset
}

// Objects whose only meaningful field is `context`.
macro_rules! object_on {
    ($ty:ty, $ctx:expr) => {{
        let object = Heap::<$ty>::zeroed();
        // SAFETY: freshly allocated and exclusively ours.
        unsafe { (*object.ptr()).context = $ctx };
        object
    }};
}

// ---------------------------------------------------------------------------------------------
// Fake provider operations
// ---------------------------------------------------------------------------------------------

/// A distinctive non-null pointer returned by fake creators; never dereferenced.
fn sentinel<T>() -> *mut T {
    ptr::without_provenance_mut(0x5eed_0000)
}

unsafe extern "C" fn fake_create_cq_ex(
    _context: *mut ffi::ibv_context,
    _attr: *mut ffi::ibv_cq_init_attr_ex,
) -> *mut ffi::ibv_cq_ex {
    record("create_cq_ex");
    sentinel()
}

unsafe extern "C" fn fake_advise_mr(
    _pd: *mut ffi::ibv_pd,
    _advice: ffi::ib_uverbs_advise_mr_advice,
    _flags: u32,
    _sg_list: *mut ffi::ibv_sge,
    _num_sge: u32,
) -> i32 {
    record("advise_mr");
    0
}

unsafe extern "C" fn fake_create_qp_ex(
    _context: *mut ffi::ibv_context,
    _attr: *mut ffi::ibv_qp_init_attr_ex,
) -> *mut ffi::ibv_qp {
    record("create_qp_ex");
    sentinel()
}

unsafe extern "C" fn fake_create_srq_ex(
    _context: *mut ffi::ibv_context,
    _attr: *mut ffi::ibv_srq_init_attr_ex,
) -> *mut ffi::ibv_srq {
    record("create_srq_ex");
    sentinel()
}

unsafe extern "C" fn fake_query_device_ex(
    _context: *mut ffi::ibv_context,
    _input: *const ffi::ibv_query_device_ex_input,
    _attr: *mut ffi::ibv_device_attr_ex,
    attr_size: usize,
) -> i32 {
    record("query_device_ex");
    LAST_SIZE.set(attr_size);
    RETURN_CODE.get()
}

unsafe extern "C" fn fake_query_port(
    _context: *mut ffi::ibv_context,
    port_num: u8,
    port_attr: *mut ffi::ibv_port_attr,
    port_attr_len: usize,
) -> i32 {
    record("query_port");
    LAST_SIZE.set(port_attr_len);
    // SAFETY: the port under test passes a writable ibv_port_attr.
    unsafe { (*port_attr).lid = u16::from(port_num) * 100 };
    0
}

unsafe extern "C" fn fake_create_wq(
    _context: *mut ffi::ibv_context,
    _attr: *mut ffi::ibv_wq_init_attr,
) -> *mut ffi::ibv_wq {
    record("create_wq");
    NEXT_WQ.get()
}

unsafe extern "C" fn fake_bind_mw(
    _qp: *mut ffi::ibv_qp,
    _mw: *mut ffi::ibv_mw,
    _mw_bind: *mut ffi::ibv_mw_bind,
) -> i32 {
    record("bind_mw");
    0
}

unsafe extern "C" fn fake_post_send(
    _qp: *mut ffi::ibv_qp,
    _wr: *mut ffi::ibv_send_wr,
    _bad_wr: *mut *mut ffi::ibv_send_wr,
) -> i32 {
    record("post_send");
    0
}

unsafe extern "C" fn fake_wr_start(_qp: *mut ffi::ibv_qp_ex) {
    record("wr_start");
}

unsafe extern "C" fn fake_wr_send(_qp: *mut ffi::ibv_qp_ex) {
    record("wr_send");
}

unsafe extern "C" fn fake_wr_set_sge(qp: *mut ffi::ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    record("wr_set_sge");
    // Stash the arguments where the test can see them.
    // SAFETY: the test passes its own live ibv_qp_ex.
    unsafe { (*qp).wr_id = u64::from(lkey) ^ addr ^ u64::from(length) };
}

unsafe extern "C" fn fake_wr_complete(_qp: *mut ffi::ibv_qp_ex) -> i32 {
    record("wr_complete");
    EINVAL
}

unsafe extern "C" fn fake_start_poll(
    _cq: *mut ffi::ibv_cq_ex,
    _attr: *mut ffi::ibv_poll_cq_attr,
) -> i32 {
    record("start_poll");
    RETURN_CODE.get()
}

unsafe extern "C" fn fake_read_byte_len(_cq: *mut ffi::ibv_cq_ex) -> u32 {
    record("read_byte_len");
    4242
}

unsafe extern "C" fn fake_read_imm_data(_cq: *mut ffi::ibv_cq_ex) -> ffi::__be32 {
    record("read_imm_data");
    0x0102_0304_u32.to_be()
}

unsafe extern "C" fn fake_end_poll(_cq: *mut ffi::ibv_cq_ex) {
    record("end_poll");
}

// ---------------------------------------------------------------------------------------------
// Every verbs_get_ctx_op-based port on a context without the operation
// ---------------------------------------------------------------------------------------------

/// Calls every port that reads an extended operation of `ctx`'s `verbs_context`, and checks
/// that each reports the operation as missing; `what` names the context in failure messages.
fn assert_all_extended_ops_missing(ctx: *mut ffi::ibv_context, what: &str) {
    let pd = object_on!(ffi::ibv_pd, ctx);
    let cq = object_on!(ffi::ibv_cq, ctx);
    let qp = object_on!(ffi::ibv_qp, ctx);
    let srq = object_on!(ffi::ibv_srq, ctx);
    let wq = object_on!(ffi::ibv_wq, ctx);
    let xrcd = object_on!(ffi::ibv_xrcd, ctx);
    let td = object_on!(ffi::ibv_td, ctx);
    let dm = object_on!(ffi::ibv_dm, ctx);
    let flow = object_on!(ffi::ibv_flow, ctx);
    let action = object_on!(ffi::ibv_flow_action, ctx);
    let counters = object_on!(ffi::ibv_counters, ctx);
    let table = object_on!(ffi::ibv_rwq_ind_table, ctx);

    let mut cq_attr = ffi::ibv_cq_init_attr_ex::default();
    let mut qp_attr = ffi::ibv_qp_init_attr_ex {
        comp_mask: ffi::IBV_QP_INIT_ATTR_PD | ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS,
        ..Default::default()
    };
    let mut srq_attr = ffi::ibv_srq_init_attr_ex {
        comp_mask: ffi::IBV_SRQ_INIT_ATTR_TYPE
            | ffi::IBV_SRQ_INIT_ATTR_PD
            | ffi::IBV_SRQ_INIT_ATTR_XRCD
            | ffi::IBV_SRQ_INIT_ATTR_CQ,
        srq_type: ffi::IBV_SRQT_XRC,
        ..Default::default()
    };
    let mut open_attr = ffi::ibv_qp_open_attr::default();
    let mut xrcd_attr = ffi::ibv_xrcd_init_attr::default();
    let mut wq_attr = ffi::ibv_wq_init_attr::default();
    let mut wq_mod = ffi::ibv_wq_attr::default();
    let mut table_attr = ffi::ibv_rwq_ind_table_init_attr::default();
    let mut td_attr = ffi::ibv_td_init_attr::default();
    let mut parent_attr = ffi::ibv_parent_domain_init_attr::default();
    let mut flow_attr = ffi::ibv_flow_attr::default();
    let mut esp = ffi::ibv_flow_action_esp_attr::default();
    let mut dm_attr = ffi::ibv_alloc_dm_attr::default();
    let mut counters_attr = ffi::ibv_counters_init_attr::default();
    let mut attach = ffi::ibv_counter_attach_attr::default();
    let mut values = ffi::ibv_values_ex::default();
    let mut moderate = ffi::ibv_modify_cq_attr::default();
    let mut rate = ffi::ibv_qp_rate_limit_attr::default();
    let mut sge = ffi::ibv_sge::default();
    let mut srq_num = 0u32;
    let mut counter_values = [0u64; 4];

    // Pointer-returning ports: null, errno EOPNOTSUPP.
    macro_rules! null_eopnotsupp {
        ($name:literal, $call:expr) => {{
            clear_errno();
            let result = $call;
            assert!(result.is_null(), "{what}: {} must return null", $name);
            assert_eq!(errno(), EOPNOTSUPP, "{what}: errno after {}", $name);
        }};
    }
    // SAFETY: the objects are live zeroed stand-ins on `ctx`; the ports
    // under test read only their `context` field and the missing operation.
    unsafe {
        null_eopnotsupp!("ibv_create_cq_ex", ffi::ibv_create_cq_ex(ctx, &mut cq_attr));
        null_eopnotsupp!("ibv_create_qp_ex", ffi::ibv_create_qp_ex(ctx, &mut qp_attr));
        null_eopnotsupp!(
            "ibv_create_srq_ex",
            ffi::ibv_create_srq_ex(ctx, &mut srq_attr)
        );
        null_eopnotsupp!("ibv_open_qp", ffi::ibv_open_qp(ctx, &mut open_attr));
        null_eopnotsupp!("ibv_open_xrcd", ffi::ibv_open_xrcd(ctx, &mut xrcd_attr));
        null_eopnotsupp!("ibv_create_wq", ffi::ibv_create_wq(ctx, &mut wq_attr));
        null_eopnotsupp!(
            "ibv_create_rwq_ind_table",
            ffi::ibv_create_rwq_ind_table(ctx, &mut table_attr)
        );
        null_eopnotsupp!("ibv_alloc_td", ffi::ibv_alloc_td(ctx, &mut td_attr));
        null_eopnotsupp!(
            "ibv_alloc_parent_domain",
            ffi::ibv_alloc_parent_domain(ctx, &mut parent_attr)
        );
        null_eopnotsupp!(
            "ibv_create_flow",
            ffi::ibv_create_flow(qp.ptr(), &mut flow_attr)
        );
        null_eopnotsupp!(
            "ibv_create_flow_action_esp",
            ffi::ibv_create_flow_action_esp(ctx, &mut esp)
        );
        null_eopnotsupp!("ibv_alloc_dm", ffi::ibv_alloc_dm(ctx, &mut dm_attr));
        null_eopnotsupp!("ibv_alloc_null_mr", ffi::ibv_alloc_null_mr(pd.ptr()));
        null_eopnotsupp!(
            "ibv_reg_dm_mr",
            ffi::ibv_reg_dm_mr(pd.ptr(), dm.ptr(), 0, 64, 0)
        );
        null_eopnotsupp!(
            "ibv_create_counters",
            ffi::ibv_create_counters(ctx, &mut counters_attr)
        );
    }

    // int-returning ports: EOPNOTSUPP.
    let results = [
        // SAFETY: as above.
        ("ibv_modify_cq", unsafe {
            ffi::ibv_modify_cq(cq.ptr(), &mut moderate)
        }),
        // SAFETY: as above.
        ("ibv_get_srq_num", unsafe {
            ffi::ibv_get_srq_num(srq.ptr(), &mut srq_num)
        }),
        // SAFETY: as above.
        ("ibv_modify_qp_rate_limit", unsafe {
            ffi::ibv_modify_qp_rate_limit(qp.ptr(), &mut rate)
        }),
        // SAFETY: as above.
        ("ibv_close_xrcd", unsafe { ffi::ibv_close_xrcd(xrcd.ptr()) }),
        // SAFETY: as above.
        ("ibv_modify_wq", unsafe {
            ffi::ibv_modify_wq(wq.ptr(), &mut wq_mod)
        }),
        // SAFETY: as above.
        ("ibv_destroy_wq", unsafe { ffi::ibv_destroy_wq(wq.ptr()) }),
        // SAFETY: as above.
        ("ibv_destroy_rwq_ind_table", unsafe {
            ffi::ibv_destroy_rwq_ind_table(table.ptr())
        }),
        // SAFETY: as above.
        ("ibv_dealloc_td", unsafe { ffi::ibv_dealloc_td(td.ptr()) }),
        // SAFETY: as above.
        ("ibv_destroy_flow", unsafe {
            ffi::ibv_destroy_flow(flow.ptr())
        }),
        // SAFETY: as above.
        ("ibv_modify_flow_action_esp", unsafe {
            ffi::ibv_modify_flow_action_esp(action.ptr(), &mut esp)
        }),
        // SAFETY: as above.
        ("ibv_destroy_flow_action", unsafe {
            ffi::ibv_destroy_flow_action(action.ptr())
        }),
        // SAFETY: as above.
        ("ibv_advise_mr", unsafe {
            ffi::ibv_advise_mr(
                pd.ptr(),
                ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
                0,
                &mut sge,
                1,
            )
        }),
        // SAFETY: as above.
        ("ibv_free_dm", unsafe { ffi::ibv_free_dm(dm.ptr()) }),
        // SAFETY: as above.
        ("ibv_destroy_counters", unsafe {
            ffi::ibv_destroy_counters(counters.ptr())
        }),
        // SAFETY: as above.
        ("ibv_attach_counters_point_flow", unsafe {
            ffi::ibv_attach_counters_point_flow(counters.ptr(), &mut attach, flow.ptr())
        }),
        // SAFETY: as above.
        ("ibv_read_counters", unsafe {
            ffi::ibv_read_counters(counters.ptr(), counter_values.as_mut_ptr(), 4, 0)
        }),
        // SAFETY: as above.
        ("ibv_query_rt_values_ex", unsafe {
            ffi::ibv_query_rt_values_ex(ctx, &mut values)
        }),
    ];
    for (name, rc) in results {
        assert_eq!(rc, EOPNOTSUPP, "{what}: {name}");
    }

    // ibv_post_srq_ops also reports the first operation as not posted.
    let mut op = ffi::ibv_ops_wr::default();
    let mut bad_op: *mut ffi::ibv_ops_wr = ptr::null_mut();
    // SAFETY: as above; `op` and `bad_op` are live locals.
    let rc = unsafe { ffi::ibv_post_srq_ops(srq.ptr(), &mut op, &mut bad_op) };
    assert_eq!(rc, EOPNOTSUPP, "{what}: ibv_post_srq_ops");
    assert_eq!(
        bad_op, &raw mut op,
        "{what}: ibv_post_srq_ops must set *bad_op to op"
    );

    assert!(
        take_calls().is_empty(),
        "{what}: no fake operation may be called"
    );
}

#[test]
fn classic_context_lacks_every_extended_op() {
    // abi_compat is null: the context was not opened through the extended ABI.
    let ctx = Heap::<ffi::ibv_context>::zeroed();
    // SAFETY: live, zeroed context.
    assert!(unsafe { ffi::verbs_get_ctx(ctx.ptr()) }.is_null());
    assert_all_extended_ops_missing(ctx.ptr(), "classic context");
}

#[test]
fn extended_context_with_null_ops_lacks_every_op() {
    let vctx = extended(size_of::<ffi::verbs_context>());
    let ctx = ctx_of(&vctx);
    // SAFETY: live extended context.
    assert_eq!(unsafe { ffi::verbs_get_ctx(ctx) }, vctx.ptr());
    assert_all_extended_ops_missing(ctx, "extended context without ops");
}

#[test]
fn extended_context_too_small_lacks_every_op_even_when_set() {
    // A provider structure that ends just before `close_xrcd` (the oldest operation): every
    // operation lies outside it, so set pointers must not be read, let alone called.
    let vctx = extended(sz_holding(offset_of!(ffi::verbs_context, close_xrcd)) - 1);
    // SAFETY: the allocation is a full verbs_context, exclusively ours.
    unsafe {
        (*vctx.ptr()).create_cq_ex = Some(fake_create_cq_ex);
        (*vctx.ptr()).create_qp_ex = Some(fake_create_qp_ex);
        (*vctx.ptr()).create_srq_ex = Some(fake_create_srq_ex);
        (*vctx.ptr()).advise_mr = Some(fake_advise_mr);
        (*vctx.ptr()).create_wq = Some(fake_create_wq);
    }
    assert_all_extended_ops_missing(ctx_of(&vctx), "extended context with sz too small");
}

// ---------------------------------------------------------------------------------------------
// verbs_get_ctx_op's size check
// ---------------------------------------------------------------------------------------------

#[test]
fn sz_decides_whether_an_op_exists() {
    let offset = offset_of!(ffi::verbs_context, create_cq_ex);
    let vctx = extended(sz_holding(offset) - 1);
    let ctx = ctx_of(&vctx);
    // SAFETY: the allocation is a full verbs_context, exclusively ours.
    unsafe { (*vctx.ptr()).create_cq_ex = Some(fake_create_cq_ex) };
    let mut attr = ffi::ibv_cq_init_attr_ex::default();

    // One byte short: reported missing, not called.
    assert!(
        !has_create_cq_ex(ctx),
        "an op beyond sz must be reported missing"
    );
    clear_errno();
    // SAFETY: live extended context, valid attributes.
    let cq = unsafe { ffi::ibv_create_cq_ex(ctx, &mut attr) };
    assert!(cq.is_null());
    assert_eq!(errno(), EOPNOTSUPP);
    assert_eq!(
        take_calls(),
        Vec::<&str>::new(),
        "create_cq_ex beyond sz must not be called"
    );

    // Exactly large enough: found and called.
    // SAFETY: exclusively ours.
    unsafe { (*vctx.ptr()).sz = sz_holding(offset) };
    assert!(has_create_cq_ex(ctx));
    // SAFETY: live extended context, valid attributes; the fake returns a sentinel.
    let cq = unsafe { ffi::ibv_create_cq_ex(ctx, &mut attr) };
    assert_eq!(cq, sentinel());
    assert_eq!(take_calls(), ["create_cq_ex"]);

    // Large enough but null: missing.
    // SAFETY: exclusively ours.
    unsafe { (*vctx.ptr()).create_cq_ex = None };
    assert!(!has_create_cq_ex(ctx));
}

#[test]
fn sz_check_for_an_int_returning_op() {
    // advise_mr is the second-newest operation: it needs all but the first 8 bytes.
    let offset = offset_of!(ffi::verbs_context, advise_mr);
    assert_eq!(offset, 8, "advise_mr follows query_port");
    let vctx = extended(sz_holding(offset) - 1);
    // SAFETY: the allocation is a full verbs_context, exclusively ours.
    unsafe { (*vctx.ptr()).advise_mr = Some(fake_advise_mr) };
    let pd = object_on!(ffi::ibv_pd, ctx_of(&vctx));
    let mut sge = ffi::ibv_sge::default();

    // SAFETY: live PD on a live extended context; `sge` is one readable entry.
    let rc = unsafe { ffi::ibv_advise_mr(pd.ptr(), 0, 0, &mut sge, 1) };
    assert_eq!(rc, EOPNOTSUPP);
    assert!(
        take_calls().is_empty(),
        "advise_mr beyond sz must not be called"
    );

    // SAFETY: exclusively ours.
    unsafe { (*vctx.ptr()).sz = sz_holding(offset) };
    // SAFETY: as above.
    let rc = unsafe { ffi::ibv_advise_mr(pd.ptr(), 0, 0, &mut sge, 1) };
    assert_eq!(rc, 0);
    assert_eq!(take_calls(), ["advise_mr"]);
}

#[test]
fn query_port_uses_the_extended_op_with_the_struct_size() {
    // query_port is the newest operation: only a full-size verbs_context has it. (The fallback,
    // the exported compat symbol, needs a real device, so only the extended path runs here.)
    let vctx = extended(size_of::<ffi::verbs_context>());
    // SAFETY: exclusively ours.
    unsafe { (*vctx.ptr()).query_port = Some(fake_query_port) };
    let mut attr = ffi::ibv_port_attr {
        state: 99,
        ..Default::default()
    };
    // SAFETY: live extended context, writable attributes.
    let rc = unsafe { ffi::ibv_query_port(ctx_of(&vctx), 3, &mut attr) };
    assert_eq!(rc, 0);
    assert_eq!(take_calls(), ["query_port"]);
    assert_eq!(LAST_SIZE.get(), size_of::<ffi::ibv_port_attr>());
    assert_eq!(attr.lid, 300, "the provider wrote the attributes");
    assert_eq!(
        attr.state, 99,
        "the extended path does not zero the attributes first"
    );
}

// ---------------------------------------------------------------------------------------------
// Fallbacks and argument checks of the C bodies
// ---------------------------------------------------------------------------------------------

#[test]
fn query_device_ex_checks_input_and_passes_size() {
    let vctx = extended(size_of::<ffi::verbs_context>());
    let ctx = ctx_of(&vctx);
    // SAFETY: exclusively ours.
    unsafe { (*vctx.ptr()).query_device_ex = Some(fake_query_device_ex) };
    let mut attr = ffi::ibv_device_attr_ex::default();

    // A non-zero input comp_mask is refused before anything else.
    let input = ffi::ibv_query_device_ex_input { comp_mask: 1 };
    // SAFETY: live context, readable input, writable attributes.
    let rc = unsafe { ffi::ibv_query_device_ex(ctx, &input, &mut attr) };
    assert_eq!(rc, EINVAL);
    assert!(take_calls().is_empty());

    // The provider's answer is returned, with the attribute size passed along.
    for code in [0, EINVAL, EPERM] {
        RETURN_CODE.set(code);
        // SAFETY: live context, null input allowed, writable attributes.
        let rc = unsafe { ffi::ibv_query_device_ex(ctx, ptr::null(), &mut attr) };
        assert_eq!(rc, code);
        assert_eq!(take_calls(), ["query_device_ex"]);
        assert_eq!(LAST_SIZE.get(), size_of::<ffi::ibv_device_attr_ex>());
    }
    // (EOPNOTSUPP / ENOSYS would fall back to the exported ibv_query_device, which needs a real
    // device; the device tests cover that path.)
}

#[test]
fn create_qp_ex_and_create_srq_ex_route_extended_requests_to_the_provider() {
    let vctx = extended(size_of::<ffi::verbs_context>());
    let ctx = ctx_of(&vctx);
    // SAFETY: exclusively ours.
    unsafe {
        (*vctx.ptr()).create_qp_ex = Some(fake_create_qp_ex);
        (*vctx.ptr()).create_srq_ex = Some(fake_create_srq_ex);
    }
    // Any comp_mask other than exactly PD goes to create_qp_ex. (Exactly PD would go to the
    // exported ibv_create_qp, which needs a real protection domain.)
    for comp_mask in [
        0,
        ffi::IBV_QP_INIT_ATTR_PD | ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    ] {
        let mut attr = ffi::ibv_qp_init_attr_ex {
            comp_mask,
            ..Default::default()
        };
        // SAFETY: live context, valid attributes.
        let qp = unsafe { ffi::ibv_create_qp_ex(ctx, &mut attr) };
        assert_eq!(qp, sentinel());
        assert_eq!(take_calls(), ["create_qp_ex"], "comp_mask {comp_mask:#x}");
    }
    // A non-basic SRQ type, an extra mask bit, or no PD goes to create_srq_ex.
    let cases = [
        (
            ffi::IBV_SRQ_INIT_ATTR_PD | ffi::IBV_SRQ_INIT_ATTR_TYPE,
            ffi::IBV_SRQT_XRC,
        ),
        (
            ffi::IBV_SRQ_INIT_ATTR_PD | ffi::IBV_SRQ_INIT_ATTR_CQ,
            ffi::IBV_SRQT_BASIC,
        ),
        (ffi::IBV_SRQ_INIT_ATTR_TYPE, ffi::IBV_SRQT_BASIC),
        (0, ffi::IBV_SRQT_BASIC),
    ];
    for (comp_mask, srq_type) in cases {
        let mut attr = ffi::ibv_srq_init_attr_ex {
            comp_mask,
            srq_type,
            ..Default::default()
        };
        // SAFETY: live context, valid attributes.
        let srq = unsafe { ffi::ibv_create_srq_ex(ctx, &mut attr) };
        assert_eq!(srq, sentinel());
        assert_eq!(
            take_calls(),
            ["create_srq_ex"],
            "comp_mask {comp_mask:#x}, type {srq_type}"
        );
    }
}

#[test]
fn create_wq_initializes_the_new_queue() {
    let vctx = extended(size_of::<ffi::verbs_context>());
    let ctx = ctx_of(&vctx);
    // SAFETY: exclusively ours.
    unsafe { (*vctx.ptr()).create_wq = Some(fake_create_wq) };
    let wq = Heap::<ffi::ibv_wq>::zeroed();
    // SAFETY: exclusively ours; a stale counter the port must reset.
    unsafe { (*wq.ptr()).events_completed = 7 };
    NEXT_WQ.set(wq.ptr());
    let mut user_data = 0u8;
    let mut attr = ffi::ibv_wq_init_attr {
        wq_context: (&raw mut user_data).cast(),
        ..Default::default()
    };
    // SAFETY: live context, valid attributes; the fake returns `wq`.
    let created = unsafe { ffi::ibv_create_wq(ctx, &mut attr) };
    assert_eq!(created, wq.ptr());
    assert_eq!(take_calls(), ["create_wq"]);
    // SAFETY: `wq` is live and no longer touched by the port.
    let (wq_context, events) = unsafe { ((*wq.ptr()).wq_context, (*wq.ptr()).events_completed) };
    assert_eq!(wq_context, (&raw mut user_data).cast());
    assert_eq!(events, 0);
    // The mutex was initialized: it can be locked and unlocked.
    // SAFETY: the bindings' pthread_mutex_t has libc's layout; the mutex is initialized.
    unsafe {
        let mutex = (&raw mut (*wq.ptr()).mutex).cast::<libc::pthread_mutex_t>();
        assert_eq!(libc::pthread_mutex_lock(mutex), 0);
        assert_eq!(libc::pthread_mutex_unlock(mutex), 0);
        libc::pthread_mutex_destroy(mutex);
        libc::pthread_cond_destroy((&raw mut (*wq.ptr()).cond).cast());
    }

    // A failed creation is returned as is.
    NEXT_WQ.set(ptr::null_mut());
    // SAFETY: as above; the fake returns null.
    assert!(unsafe { ffi::ibv_create_wq(ctx, &mut attr) }.is_null());
    assert_eq!(take_calls(), ["create_wq"]);
}

// ---------------------------------------------------------------------------------------------
// The classic op table (ibv_context_ops)
// ---------------------------------------------------------------------------------------------

#[test]
fn classic_ops_missing() {
    let ctx = Heap::<ffi::ibv_context>::zeroed();
    let cq = object_on!(ffi::ibv_cq, ctx.ptr());
    let qp = object_on!(ffi::ibv_qp, ctx.ptr());
    let srq = object_on!(ffi::ibv_srq, ctx.ptr());
    let pd = object_on!(ffi::ibv_pd, ctx.ptr());
    let mw = object_on!(ffi::ibv_mw, ctx.ptr());
    // SAFETY: exclusively ours.
    unsafe { (*mw.ptr()).type_ = ffi::IBV_MW_TYPE_1 };
    let mut send_wr = ffi::ibv_send_wr::default();
    let mut bad_send: *mut ffi::ibv_send_wr = ptr::null_mut();
    let mut recv_wr = ffi::ibv_recv_wr::default();
    let mut bad_recv: *mut ffi::ibv_recv_wr = ptr::null_mut();
    let mut wc = [ffi::ibv_wc::default(); 4];
    let mut bind = ffi::ibv_mw_bind::default();

    // SAFETY: the objects are live zeroed stand-ins on `ctx`, whose classic
    // op table is empty; the ports read only `context` and the missing operation.
    unsafe {
        assert_eq!(
            ffi::ibv_post_send(qp.ptr(), &mut send_wr, &mut bad_send),
            EOPNOTSUPP
        );
        assert_eq!(
            ffi::ibv_post_recv(qp.ptr(), &mut recv_wr, &mut bad_recv),
            EOPNOTSUPP
        );
        assert_eq!(
            ffi::ibv_post_srq_recv(srq.ptr(), &mut recv_wr, &mut bad_recv),
            EOPNOTSUPP
        );
        assert_eq!(ffi::ibv_poll_cq(cq.ptr(), 4, wc.as_mut_ptr()), -EOPNOTSUPP);
        assert_eq!(ffi::ibv_req_notify_cq(cq.ptr(), 0), EOPNOTSUPP);
        clear_errno();
        assert!(ffi::ibv_alloc_mw(pd.ptr(), ffi::IBV_MW_TYPE_2).is_null());
        assert_eq!(errno(), EOPNOTSUPP);
        assert_eq!(ffi::ibv_dealloc_mw(mw.ptr()), EOPNOTSUPP);
        assert_eq!(ffi::ibv_bind_mw(qp.ptr(), mw.ptr(), &mut bind), EOPNOTSUPP);
    }

    // With post_send present, it is called.
    // SAFETY: exclusively ours.
    unsafe { (*ctx.ptr()).ops.post_send = Some(fake_post_send) };
    // SAFETY: as above, with the fake post_send.
    let rc = unsafe { ffi::ibv_post_send(qp.ptr(), &mut send_wr, &mut bad_send) };
    assert_eq!(rc, 0);
    assert_eq!(take_calls(), ["post_send"]);
}

#[test]
fn bind_mw_checks_before_calling_the_provider() {
    let ctx = Heap::<ffi::ibv_context>::zeroed();
    // SAFETY: exclusively ours.
    unsafe { (*ctx.ptr()).ops.bind_mw = Some(fake_bind_mw) };
    let qp = object_on!(ffi::ibv_qp, ctx.ptr());
    let pd = object_on!(ffi::ibv_pd, ctx.ptr());
    let other_pd = object_on!(ffi::ibv_pd, ctx.ptr());
    let mw = object_on!(ffi::ibv_mw, ctx.ptr());
    let mr = object_on!(ffi::ibv_mr, ctx.ptr());
    // SAFETY: exclusively ours.
    unsafe {
        (*mw.ptr()).pd = pd.ptr();
        (*mr.ptr()).pd = other_pd.ptr();
    }
    let bind_mw = |mw_type, mr: *mut ffi::ibv_mr, addr, length| {
        // SAFETY: exclusively ours.
        unsafe { (*mw.ptr()).type_ = mw_type };
        let mut bind = ffi::ibv_mw_bind::default();
        bind.bind_info.mr = mr;
        bind.bind_info.addr = addr;
        bind.bind_info.length = length;
        // SAFETY: live stand-ins; `bind` is a live local.
        unsafe { ffi::ibv_bind_mw(qp.ptr(), mw.ptr(), &mut bind) }
    };

    assert_eq!(
        bind_mw(ffi::IBV_MW_TYPE_2, ptr::null_mut(), 0, 0),
        EINVAL,
        "type 2 window"
    );
    assert_eq!(
        bind_mw(ffi::IBV_MW_TYPE_1, ptr::null_mut(), 0x1000, 0),
        EINVAL,
        "addr, no mr"
    );
    assert_eq!(
        bind_mw(ffi::IBV_MW_TYPE_1, ptr::null_mut(), 0, 64),
        EINVAL,
        "length, no mr"
    );
    assert_eq!(
        bind_mw(ffi::IBV_MW_TYPE_1, mr.ptr(), 0x1000, 64),
        EPERM,
        "other PD"
    );
    assert!(
        take_calls().is_empty(),
        "rejected binds must not reach the provider"
    );

    // SAFETY: exclusively ours.
    unsafe { (*mr.ptr()).pd = pd.ptr() };
    assert_eq!(bind_mw(ffi::IBV_MW_TYPE_1, mr.ptr(), 0x1000, 64), 0);
    assert_eq!(
        bind_mw(ffi::IBV_MW_TYPE_1, ptr::null_mut(), 0, 0),
        0,
        "unbind"
    );
    assert_eq!(take_calls(), ["bind_mw", "bind_mw"]);
}

// ---------------------------------------------------------------------------------------------
// Objects with their own function tables: ibv_qp_ex, ibv_cq_ex, ibv_dm, ibv_wq
// ---------------------------------------------------------------------------------------------

#[test]
fn wr_builders_report_missing_ops_and_call_present_ones() {
    let qpx = Heap::<ffi::ibv_qp_ex>::zeroed();
    let qp = qpx.ptr();
    let sge = ffi::ibv_sge::default();
    let buf = ffi::ibv_data_buf::default();
    let bind_info = ffi::ibv_mw_bind_info::default();
    let mut payload = [0u8; 8];
    let data = payload.as_mut_ptr().cast();

    // SAFETY: `qp` is a live zeroed ibv_qp_ex; with every operation null the
    // ports call nothing.
    let results = unsafe {
        [
            ("ibv_wr_start", ffi::ibv_wr_start(qp)),
            (
                "ibv_wr_atomic_cmp_swp",
                ffi::ibv_wr_atomic_cmp_swp(qp, 1, 2, 3, 4),
            ),
            (
                "ibv_wr_atomic_fetch_add",
                ffi::ibv_wr_atomic_fetch_add(qp, 1, 2, 3),
            ),
            (
                "ibv_wr_bind_mw",
                ffi::ibv_wr_bind_mw(qp, ptr::null_mut(), 1, &bind_info),
            ),
            ("ibv_wr_local_inv", ffi::ibv_wr_local_inv(qp, 1)),
            ("ibv_wr_rdma_read", ffi::ibv_wr_rdma_read(qp, 1, 2)),
            ("ibv_wr_rdma_write", ffi::ibv_wr_rdma_write(qp, 1, 2)),
            (
                "ibv_wr_rdma_write_imm",
                ffi::ibv_wr_rdma_write_imm(qp, 1, 2, 3),
            ),
            ("ibv_wr_send", ffi::ibv_wr_send(qp)),
            ("ibv_wr_send_imm", ffi::ibv_wr_send_imm(qp, 1)),
            ("ibv_wr_send_inv", ffi::ibv_wr_send_inv(qp, 1)),
            ("ibv_wr_send_tso", ffi::ibv_wr_send_tso(qp, data, 8, 1000)),
            (
                "ibv_wr_set_ud_addr",
                ffi::ibv_wr_set_ud_addr(qp, ptr::null_mut(), 1, 2),
            ),
            ("ibv_wr_set_xrc_srqn", ffi::ibv_wr_set_xrc_srqn(qp, 1)),
            (
                "ibv_wr_set_inline_data",
                ffi::ibv_wr_set_inline_data(qp, data, 8),
            ),
            (
                "ibv_wr_set_inline_data_list",
                ffi::ibv_wr_set_inline_data_list(qp, 1, &buf),
            ),
            ("ibv_wr_set_sge", ffi::ibv_wr_set_sge(qp, 1, 2, 3)),
            ("ibv_wr_set_sge_list", ffi::ibv_wr_set_sge_list(qp, 1, &sge)),
            (
                "ibv_wr_atomic_write",
                ffi::ibv_wr_atomic_write(qp, 1, 2, data.cast_const()),
            ),
            ("ibv_wr_complete", ffi::ibv_wr_complete(qp)),
            ("ibv_wr_abort", ffi::ibv_wr_abort(qp)),
        ]
    };
    for (name, rc) in results {
        assert_eq!(rc, EOPNOTSUPP, "{name} on a provider without it");
    }

    // SAFETY: exclusively ours.
    unsafe {
        (*qp).wr_start = Some(fake_wr_start);
        (*qp).wr_send = Some(fake_wr_send);
        (*qp).wr_set_sge = Some(fake_wr_set_sge);
        (*qp).wr_complete = Some(fake_wr_complete);
    }
    // SAFETY: `qp` is live; the fakes only record (and write `wr_id`).
    let results = unsafe {
        [
            ffi::ibv_wr_start(qp),
            ffi::ibv_wr_send(qp),
            ffi::ibv_wr_set_sge(qp, 0x10, 0x2000, 0x300),
            ffi::ibv_wr_complete(qp),
        ]
    };
    assert_eq!(
        results,
        [0, 0, 0, EINVAL],
        "void ops give 0; wr_complete's answer is returned"
    );
    assert_eq!(
        take_calls(),
        ["wr_start", "wr_send", "wr_set_sge", "wr_complete"]
    );
    // SAFETY: `qp` is live.
    let wr_id = unsafe { (*qp).wr_id };
    assert_eq!(wr_id, 0x10 ^ 0x2000 ^ 0x300, "arguments passed through");
    // SAFETY: `qp` is live; wr_abort is still null.
    assert_eq!(unsafe { ffi::ibv_wr_abort(qp) }, EOPNOTSUPP);
}

#[test]
fn cq_ex_polling_reports_missing_ops_and_readers() {
    let cqx = Heap::<ffi::ibv_cq_ex>::zeroed();
    let cq = cqx.ptr();
    let mut attr = ffi::ibv_poll_cq_attr::default();
    let mut tm = ffi::ibv_wc_tm_info::default();

    // SAFETY: `cq` is live; this is a cast.
    let base = unsafe { ffi::ibv_cq_ex_to_cq(cq) };
    assert_eq!(base, cq.cast::<ffi::ibv_cq>());

    // SAFETY: `cq` is a live zeroed ibv_cq_ex; with every operation null the
    // ports call nothing.
    unsafe {
        assert_eq!(ffi::ibv_start_poll(cq, &mut attr), EOPNOTSUPP);
        assert_eq!(ffi::ibv_next_poll(cq), EOPNOTSUPP);
        assert_eq!(ffi::ibv_end_poll(cq), EOPNOTSUPP);
        assert_eq!(ffi::ibv_wc_read_tm_info(cq, &mut tm), EOPNOTSUPP);
        assert_eq!(ffi::ibv_wc_read_opcode(cq), None);
        assert_eq!(ffi::ibv_wc_read_vendor_err(cq), None);
        assert_eq!(ffi::ibv_wc_read_byte_len(cq), None);
        assert_eq!(ffi::ibv_wc_read_imm_data(cq), None);
        assert_eq!(ffi::ibv_wc_read_invalidated_rkey(cq), None);
        assert_eq!(ffi::ibv_wc_read_qp_num(cq), None);
        assert_eq!(ffi::ibv_wc_read_src_qp(cq), None);
        assert_eq!(ffi::ibv_wc_read_wc_flags(cq), None);
        assert_eq!(ffi::ibv_wc_read_slid(cq), None);
        assert_eq!(ffi::ibv_wc_read_sl(cq), None);
        assert_eq!(ffi::ibv_wc_read_dlid_path_bits(cq), None);
        assert_eq!(ffi::ibv_wc_read_completion_ts(cq), None);
        assert_eq!(ffi::ibv_wc_read_completion_wallclock_ns(cq), None);
        assert_eq!(ffi::ibv_wc_read_cvlan(cq), None);
        assert_eq!(ffi::ibv_wc_read_flow_tag(cq), None);
    }
    assert!(take_calls().is_empty());

    // SAFETY: exclusively ours.
    unsafe {
        (*cq).start_poll = Some(fake_start_poll);
        (*cq).end_poll = Some(fake_end_poll);
        (*cq).read_byte_len = Some(fake_read_byte_len);
        (*cq).read_imm_data = Some(fake_read_imm_data);
    }
    RETURN_CODE.set(ENOENT);
    // SAFETY: `cq` is live; the fakes only record.
    unsafe {
        assert_eq!(
            ffi::ibv_start_poll(cq, &mut attr),
            ENOENT,
            "start_poll's answer"
        );
        assert_eq!(ffi::ibv_wc_read_byte_len(cq), Some(4242));
        assert_eq!(ffi::ibv_wc_read_imm_data(cq), Some(0x0102_0304_u32.to_be()));
        assert_eq!(
            ffi::ibv_wc_read_invalidated_rkey(cq),
            Some(0x0102_0304_u32.to_be())
        );
        assert_eq!(ffi::ibv_wc_read_qp_num(cq), None);
        assert_eq!(ffi::ibv_end_poll(cq), 0);
    }
    assert_eq!(
        take_calls(),
        [
            "start_poll",
            "read_byte_len",
            "read_imm_data",
            "read_imm_data",
            "end_poll"
        ]
    );
}

#[test]
fn dm_and_wq_ops_missing() {
    let ctx = Heap::<ffi::ibv_context>::zeroed();
    let dm = object_on!(ffi::ibv_dm, ctx.ptr());
    let wq = object_on!(ffi::ibv_wq, ctx.ptr());
    let mut host = [0u8; 16];
    let mut recv_wr = ffi::ibv_recv_wr::default();
    let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
    // SAFETY: live zeroed stand-ins; every operation is null.
    unsafe {
        assert_eq!(
            ffi::ibv_memcpy_to_dm(dm.ptr(), 0, host.as_ptr().cast(), 16),
            EOPNOTSUPP
        );
        assert_eq!(
            ffi::ibv_memcpy_from_dm(host.as_mut_ptr().cast(), dm.ptr(), 0, 16),
            EOPNOTSUPP
        );
        assert_eq!(
            ffi::ibv_post_wq_recv(wq.ptr(), &mut recv_wr, &mut bad),
            EOPNOTSUPP
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Pure helpers
// ---------------------------------------------------------------------------------------------

#[test]
fn pure_helpers_match_the_c() {
    // SAFETY: these only compute on their arguments.
    unsafe {
        assert_eq!(ffi::ibv_inc_rkey(0x1234_5678), 0x1234_5679);
        assert_eq!(
            ffi::ibv_inc_rkey(0x1234_56ff),
            0x1234_5600,
            "the tag wraps in 8 bits"
        );
        assert_eq!(
            ffi::ibv_inc_rkey(u32::MAX),
            0xffff_ff00,
            "no overflow panic"
        );
        assert_eq!(ffi::ibv_inc_rkey(0), 1);

        let caps = (1 << ffi::IBV_QPT_RC) | (1 << ffi::IBV_QPT_UD);
        assert_eq!(ffi::ibv_is_qpt_supported(caps, ffi::IBV_QPT_RC), 1);
        assert_eq!(ffi::ibv_is_qpt_supported(caps, ffi::IBV_QPT_UD), 1);
        assert_eq!(ffi::ibv_is_qpt_supported(caps, ffi::IBV_QPT_UC), 0);
        assert_eq!(ffi::ibv_is_qpt_supported(u32::MAX, 31), 1);
        assert_eq!(
            ffi::ibv_is_qpt_supported(u32::MAX, ffi::IBV_QPT_DRIVER),
            0,
            "no shift panic"
        );

        assert_eq!(ffi::ibv_flow_label_to_udp_sport(0), 0xC000);
        assert_eq!(ffi::ibv_flow_label_to_udp_sport(0x1), 0xC001);
        assert_eq!(
            ffi::ibv_flow_label_to_udp_sport(0x4000),
            0xC001,
            "high bits fold in"
        );
        assert_eq!(ffi::ibv_flow_label_to_udp_sport(0xF_FFFF), 0xFFC0);
        assert_eq!(ffi::ibv_flow_label_to_udp_sport(0x12345), 0xE341);
        assert_eq!(
            ffi::ibv_flow_label_to_udp_sport(0xFFF0_0000),
            0xC000,
            "bits above the 20-bit label are ignored"
        );
    }
}

/// Whether `verbs_get_ctx_op` finds `create_cq_ex` on `ctx`.
fn has_create_cq_ex(ctx: *mut ffi::ibv_context) -> bool {
    // SAFETY: callers pass a live context; the offset is the named field's.
    unsafe {
        ffi::verbs_get_ctx_op(ctx, offset_of!(ffi::verbs_context, create_cq_ex), |v| {
            &v.create_cq_ex
        })
    }
    .is_some()
}

// ---------------------------------------------------------------------------------------------
// A provider built against an older rdma-core: a shorter verbs_context
// ---------------------------------------------------------------------------------------------

/// A provider's `verbs_context` exactly as long as an older rdma-core's: it holds our layout's
/// fields from `first_op` on (the older operations, `sz` and `context`), and its allocation
/// starts right there. The page before it is inaccessible, so a port that read a field the
/// provider's structure lacks (one of our newer operations, in front of it) would fault rather
/// than read a neighbour's memory. (Forming a pointer out there without reading it, which the
/// ports also must not do, is not observable without Miri: the ports compute every address
/// from `ctx` with wrapping byte arithmetic and read only `sz` and fields the size check
/// proved present.)
struct OldProvider {
    map: *mut u8,
    len: usize,
    start: *mut u8,
    first_op: usize,
}

impl OldProvider {
    fn new(first_op: usize) -> Self {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let sz = size_of::<ffi::verbs_context>() - first_op;
        let len = page + sz.div_ceil(page) * page;
        // SAFETY: a fresh anonymous mapping; checked below.
        let map = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap");
        let map = map.cast::<u8>();
        // SAFETY: the first page of our own mapping.
        let ret = unsafe { libc::mprotect(map.cast(), page, libc::PROT_NONE) };
        assert_eq!(ret, 0, "mprotect");
        let old = Self {
            map,
            len,
            start: map.wrapping_add(page),
            first_op,
        };
        // SAFETY: both fields lie inside the accessible part of the mapping (zeroed), which
        // only this object uses; they are 8-byte aligned (page start + multiple of 8).
        unsafe {
            old.field::<usize>(offset_of!(ffi::verbs_context, sz))
                .write(sz);
            (*old.ctx()).abi_compat = ffi::VERBS_ABI_IS_EXTENDED;
        }
        old
    }

    /// Our layout's field at `offset`, in the provider's (shorter) structure.
    fn field<T>(&self, offset: usize) -> *mut T {
        assert!(
            offset >= self.first_op,
            "the old provider has no such field"
        );
        self.start.wrapping_add(offset - self.first_op).cast()
    }

    fn ctx(&self) -> *mut ffi::ibv_context {
        self.field(offset_of!(ffi::verbs_context, context))
    }
}

impl Drop for OldProvider {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.map.cast(), self.len) };
    }
}

#[test]
fn an_older_providers_shorter_context_is_read_only_inside() {
    // A provider whose newest operation is create_cq_ex: every operation in front of it in our
    // layout (query_port .. query_rt_values) is missing from its structure.
    let offset = offset_of!(ffi::verbs_context, create_cq_ex);
    let old = OldProvider::new(offset);
    let ctx = old.ctx();
    // SAFETY: the provider's own field, inside the mapping.
    unsafe {
        old.field::<Option<unsafe extern "C" fn(_, _) -> _>>(offset)
            .write(Some(fake_create_cq_ex as unsafe extern "C" fn(_, _) -> _))
    };

    // verbs_get_ctx's address lies in the inaccessible page: computed, never read.
    // SAFETY: live extended context.
    let vctx = unsafe { ffi::verbs_get_ctx(ctx) };
    assert_eq!(vctx as usize, old.start as usize - offset);

    assert!(
        has_create_cq_ex(ctx),
        "create_cq_ex is inside the provider's structure"
    );
    let mut attr = ffi::ibv_cq_init_attr_ex::default();
    // SAFETY: live extended context, valid attributes; the fake returns a sentinel.
    let cq = unsafe { ffi::ibv_create_cq_ex(ctx, &mut attr) };
    assert_eq!(cq, sentinel());
    assert_eq!(take_calls(), ["create_cq_ex"]);

    // Newer operations lie before the allocation: reported missing, never read.
    let mut wq_attr = ffi::ibv_wq_init_attr::default();
    clear_errno();
    // SAFETY: live extended context, valid attributes.
    let wq = unsafe { ffi::ibv_create_wq(ctx, &mut wq_attr) };
    assert!(wq.is_null());
    assert_eq!(errno(), EOPNOTSUPP);
    let pd = object_on!(ffi::ibv_pd, ctx);
    let mut sge = ffi::ibv_sge::default();
    // SAFETY: live PD on a live extended context; one readable entry.
    let rc = unsafe { ffi::ibv_advise_mr(pd.ptr(), 0, 0, &mut sge, 1) };
    assert_eq!(rc, EOPNOTSUPP);
    assert!(take_calls().is_empty());
}

#[test]
fn a_provider_context_with_no_operations_is_read_only_inside() {
    // The shortest extended structure: `sz` and `context` alone. Every port must report its
    // operation missing without reading in front of `sz`.
    let old = OldProvider::new(offset_of!(ffi::verbs_context, sz));
    assert_all_extended_ops_missing(old.ctx(), "provider structure of sz and context only");
}
