//! The `xrnic` command line (subcommands are added as they are built).

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "xrnic", version, about = "A RoCE v2 software RNIC")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run two RC QPs over a simulated lossy link and verify every byte and completion.
    Sim(xrnic::cli::sim::SimArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Sim(a) => xrnic::cli::sim::run(&a),
    };
    std::process::exit(code);
}
