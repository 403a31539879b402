//! The design records, as the repository's `docs/` has them: read these before relying on a
//! guarantee, or before changing the code they describe.

#[doc = include_str!("../doc/safety.md")]
pub mod safety {}

#[doc = include_str!("../doc/typestate.md")]
pub mod typestate {}

#[doc = include_str!("../doc/data-path.md")]
pub mod data_path {}

#[doc = include_str!("../doc/modules.md")]
pub mod modules {}
