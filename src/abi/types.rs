//! The C structures of `<infiniband/verbs.h>`: one definition for the library and the
//! offload backend, in the `xrnic` crate (src/verbs/ibv/abi.rs); `layout.rs` prints their
//! sizes and offsets and a test compares them with a C program compiled against the
//! system header.

pub use xrnic::verbs::ibv::abi::*;
