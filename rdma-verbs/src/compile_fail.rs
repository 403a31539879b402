//! Compile-fail cases, run as doc tests: each misuse the typestate and the borrows are meant to
//! stop must fail to compile with the named error code, so the test fails if the code compiles
//! or fails for another reason. Only error codes are compared, never the compiler's wording or
//! help text. The `_ok` cases are the controls: the same code without the misuse compiles.
//!
//! Stable rustdoc compares the error code only when it runs as a nightly compiler: `cargo xtask
//! test` runs this module a second time with `RUSTC_BOOTSTRAP=1` (in a target directory of its
//! own), and that run is the one that proves the codes. A plain `cargo test --doc` only proves
//! that each case fails to compile.
//!
//! The cases themselves are the files of `rdma-verbs/tests/ui/`.

/// Build a doc-test item from a case file: `case!(Name, "file.rs", "compile_fail,E0599")`.
macro_rules! case {
    ($name:ident, $file:literal, $fence:literal) => {
        #[doc = concat!("```", $fence)]
        #[doc = include_str!(concat!("../tests/ui/", $file))]
        #[doc = "```"]
        #[allow(dead_code)]
        struct $name;
    };
}

// Typestate: operations exist only in the states that allow them.
case!(PostSendInInit, "post_send_in_init.rs", "compile_fail,E0599");
case!(
    PostSendOneInInit,
    "post_send_one_in_init.rs",
    "compile_fail,E0599"
);
case!(PostSendInRtr, "post_send_in_rtr.rs", "compile_fail,E0599");
case!(
    PostSendOneInRtr,
    "post_send_one_in_rtr.rs",
    "compile_fail,E0599"
);
case!(
    PostRecvInReset,
    "post_recv_in_reset.rs",
    "compile_fail,E0599"
);
case!(
    PostRecvOneInReset,
    "post_recv_one_in_reset.rs",
    "compile_fail,E0599"
);
case!(
    IntoRtrFromReset,
    "into_rtr_from_reset.rs",
    "compile_fail,E0599"
);
case!(
    IntoRtsFromReset,
    "into_rts_from_reset.rs",
    "compile_fail,E0599"
);
case!(RcAttrForUd, "rc_attr_for_ud.rs", "compile_fail,E0308");
case!(
    UseAfterTransition,
    "use_after_transition.rs",
    "compile_fail,E0382"
);
case!(
    QueuePairNotClone,
    "queue_pair_not_clone.rs",
    "compile_fail,E0277"
);
case!(TypestateOk, "typestate_ok.rs", "rust");

// Borrows: memory outlives what names it.
case!(
    MrSliceOutlivesRegion,
    "mr_slice_outlives_region.rs",
    "compile_fail,E0597"
);
case!(
    SendListOutlivesRegion,
    "send_list_outlives_region.rs",
    "compile_fail,E0505"
);
case!(BorrowsOk, "borrows_ok.rs", "rust");

// PostScope: posted memory stays borrowed, and alive, until the scope ends.
case!(
    ScopeRequestOutlivesScope,
    "scope_request_outlives_scope.rs",
    "compile_fail,E0597"
);
case!(
    ScopeRegionUsedWhilePosted,
    "scope_region_used_while_posted.rs",
    "compile_fail,E0502"
);
case!(
    ScopeRegionUsedWhilePostedOk,
    "scope_region_used_while_posted_ok.rs",
    "rust"
);

// Owned requests: an operation's type says what it can carry.
case!(
    OwnedReadWithImm,
    "owned_read_with_imm.rs",
    "compile_fail,E0599"
);
case!(OwnedWriteToUd, "owned_write_to_ud.rs", "compile_fail,E0599");
case!(
    BorrowedRequestPostedOwned,
    "borrowed_request_posted_owned.rs",
    "compile_fail,E0308"
);
case!(
    SlotRequestPostedOwned,
    "slot_request_posted_owned.rs",
    "compile_fail,E0308"
);
case!(
    OwnedRequestInList,
    "owned_request_in_list.rs",
    "compile_fail,E0277"
);
case!(OwnedOpsOk, "owned_ops_ok.rs", "rust");
case!(
    BorrowedReceivePostedOwned,
    "borrowed_receive_posted_owned.rs",
    "compile_fail,E0308"
);
case!(
    OwnedReceiveInList,
    "owned_receive_in_list.rs",
    "compile_fail,E0277"
);
case!(
    ReceiveIntoBytes,
    "receive_into_bytes.rs",
    "compile_fail,E0277"
);
case!(
    SlotReceiveInList,
    "slot_receive_in_list.rs",
    "compile_fail,E0277"
);
case!(ReceiveOpsOk, "receive_ops_ok.rs", "rust");
case!(
    RequestAtomicWithImm,
    "request_atomic_with_imm.rs",
    "compile_fail,E0599"
);
case!(
    RequestWriteToUd,
    "request_write_to_ud.rs",
    "compile_fail,E0599"
);
case!(
    RequestInvalidateWithImm,
    "request_invalidate_with_imm.rs",
    "compile_fail,E0599"
);
case!(
    SendListReadOutlivesRegion,
    "send_list_read_outlives_region.rs",
    "compile_fail,E0505"
);
case!(RequestOpsOk, "request_ops_ok.rs", "rust");
case!(
    OwnedBindWindowDropped,
    "owned_bind_window_dropped.rs",
    "compile_fail,E0505"
);
case!(
    OwnedBindWindowDroppedOk,
    "owned_bind_window_dropped_ok.rs",
    "rust"
);

// Slot rings: a slot's bytes are read or written, not both at once.
case!(
    SlotBytesWhileWritten,
    "slot_bytes_while_written.rs",
    "compile_fail,E0502"
);
case!(SlotBytesOk, "slot_bytes_ok.rs", "rust");
case!(
    SrqSlotBytesWhileWritten,
    "srq_slot_bytes_while_written.rs",
    "compile_fail,E0502"
);
case!(SrqSlotBytesOk, "srq_slot_bytes_ok.rs", "rust");

// Requests of slots: the vocabulary of every request, posted by the slot path only.
case!(SlotWriteToUd, "slot_write_to_ud.rs", "compile_fail,E0599");
case!(
    SlotRequestInList,
    "slot_request_in_list.rs",
    "compile_fail,E0277"
);
case!(
    SlotRequestPostedUnsafe,
    "slot_request_posted_unsafe.rs",
    "compile_fail,E0308"
);
case!(
    RequestAtomicIntoList,
    "request_atomic_into_list.rs",
    "compile_fail,E0277"
);
case!(SlotRequestOpsOk, "slot_request_ops_ok.rs", "rust");

// Values that do nothing unless used (`#[must_use]`). A lint has no error code: the control,
// which differs only in using the value, shows that nothing else fails.
case!(RequestUnused, "request_unused.rs", "compile_fail");
case!(RequestUnusedOk, "request_unused_ok.rs", "rust");
