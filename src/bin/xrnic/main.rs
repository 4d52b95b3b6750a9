//! The `xrnic` command line (subcommands are added as they are built).
fn main() {
    eprintln!("xrnic: no subcommands yet");
    std::process::exit(2);
}
