//! Library side of the `xrnic` command line: each subcommand's arguments (clap) and its
//! `run` function returning the process exit code, so that tests can call them directly.

pub mod sim;
