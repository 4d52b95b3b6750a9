//! The `xrnic` subcommands as library code, so that tests, fuzz targets and the binary
//! share one implementation. The binary (`src/bin/xrnic`) only parses the command line
//! with clap and calls in here.
//!
//! Contract: nothing here panics on bad input (a capture is untrusted data); every failure
//! is a value the binary turns into a clear message on stderr and a non-zero exit code.

pub mod decode;
pub mod demo;
pub mod devinfo;
pub mod explain;
pub mod explain_svg;
pub mod perf;
pub mod pingpong;
pub mod res;
pub mod sim;
pub mod stat;
