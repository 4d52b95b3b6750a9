//! The `xrnic` command line as a library crate (`xrnic-cli`, manifest src/cli/Cargo.toml):
//! the subcommands in [`cli`], the binary in main.rs. The engine library (`xrnic`, the
//! root package) depends on none of clap, ctrlc or plotters; they live here.
//!
//! The glob re-export keeps the subcommands' `crate::proto::...`, `crate::driver::...`
//! paths naming the library's modules, so the code reads as it did inside the library.

pub use xrnic::*;

#[path = "mod.rs"]
pub mod cli;
