//! The `xrnic` command line. Each subcommand lives in `xrnic_cli::cli` (src/cli/mod.rs); this file only parses
//! arguments (clap: usage mistakes print a message and exit with status 2).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// xrnic: a RoCE v2 software RNIC in user space over AF_XDP.
#[derive(Debug, Parser)]
#[command(name = "xrnic", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Decode the RoCE v2 packets of a pcap/pcapng capture: one line (or JSON object) per
    /// packet with BTH, extended headers, payload length and ICRC check.
    ///
    /// Exit status: 0 when the file was read (even if some packets are bad, unless
    /// --strict), 1 when the file cannot be read or --strict found a bad ICRC or a
    /// malformed packet, 2 for usage errors.
    Decode(xrnic_cli::cli::decode::DecodeArgs),
    /// Run two RC QPs over a simulated lossy link (virtual time) and verify every byte and
    /// completion. Exit status 1 when data or completions are wrong.
    Sim(xrnic_cli::cli::sim::SimArgs),
    /// Show the xrnic device of a network interface like `ibv_devinfo` (no root needed).
    Devinfo(xrnic_cli::cli::devinfo::DevinfoArgs),
    /// RC ping-pong like `ibv_rc_pingpong`, interoperable with it (root: AF_XDP).
    /// Without SERVER, wait for a client; with it, connect to that server.
    RcPingpong(xrnic_cli::cli::pingpong::PingpongArgs),
    /// perftest's bandwidth tests (ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw),
    /// interoperable with them (root: AF_XDP). Without SERVER, wait for a client; with it,
    /// connect to that server and run the test.
    ///
    /// Exit status: 0 on success, 1 when the run fails, 2 for usage errors.
    Perf(xrnic_cli::cli::perf::PerfArgs),
    /// Device and per-QP counters of an xrnic device running in another process (from
    /// the snapshot its driver writes to /run/xrnic/<netdev>.<netns inode>.json; run it in
    /// the device's network namespace).
    Stat(xrnic_cli::cli::stat::StatArgs),
    /// QPs, MRs or CQs of the xrnic devices running in this network namespace, like
    /// `rdma resource show qp|mr|cq` (from the same snapshots as `stat`): QP state, PSNs,
    /// outstanding WRs; MR keys and pinned length; CQ size and users. Exit status 1 when
    /// a device has no snapshot.
    Res(xrnic_cli::cli::res::ResArgs),
    /// Explain a capture: per QP pair, a ladder diagram (who sent what, PSNs, ACK/NAK,
    /// gaps, retransmissions, RNR waits, CNPs) and a summary. Exit status 1 when the file
    /// cannot be read.
    Explain(xrnic_cli::cli::explain::ExplainArgs),
    /// Two xrnic devices on a veth pair in two network namespaces (root): rc-pingpong and
    /// the verbs API's SEND, WRITE, READ and atomics, every byte verified, the traffic
    /// captured and its ICRCs checked; the namespaces are removed afterwards (also on
    /// Ctrl-C). Exit status 1 on any failure.
    Demo(xrnic_cli::cli::demo::DemoArgs),
    /// Run an unmodified libibverbs program (ibv_devinfo, ibv_rc_pingpong, perftest, ...)
    /// on xrnic: `xrnic exec [--netdev IF]... -- PROGRAM ARGS` puts xrnic's
    /// libibverbs.so.1 first on LD_LIBRARY_PATH, names the interfaces in XRNIC_NETDEV and
    /// becomes the program (its exit status is the program's; 127 when it cannot run).
    Exec(xrnic_cli::cli::exec::ExecArgs),
    /// Draw the CSV time series of `xrnic perf --cc-log` (DCQCN rate, target rate, α and
    /// goodput per QP) as an SVG chart. Exit status 1 when the CSV cannot be read.
    Plot(xrnic_cli::cli::plot::PlotArgs),
    /// Draw bandwidth against message size (CSV `stack,test,bytes,gbps`, as
    /// `make bench-rxe` writes it) as an SVG chart. Exit status 1 when the CSV cannot be read.
    PlotSweep(xrnic_cli::cli::plot_sweep::PlotSweepArgs),
    /// Rewrite the summary table of docs/performance.md (figure, command, latest value,
    /// goal, state) from the benchmark sections of docs/results.md; the bench targets run
    /// it. Exit status 1 when a file cannot be read or has no summary block.
    BenchSummary(xrnic_cli::cli::summary::SummaryArgs),
    /// Start the device service of a network interface (root): one xrnic device shared
    /// by every process of the network namespace, which then need no root (their
    /// `xrnic_IF` goes through it). Returns once the service serves (`--foreground`:
    /// serves in this process until `xrnic down`).
    Up(xrnic_cli::cli::service::UpArgs),
    /// Stop the device service of a network interface.
    Down(xrnic_cli::cli::service::DownArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The library's warnings (a fallback it took, such as single-buffer AF_XDP on a
    // kernel before 6.6) as one line each on stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .without_time()
        .with_target(false)
        .init();
    match cli.command {
        Command::Decode(args) => xrnic_cli::cli::decode::run(&args),
        Command::Devinfo(args) => xrnic_cli::cli::devinfo::run(&args),
        Command::RcPingpong(args) => xrnic_cli::cli::pingpong::run(&args),
        Command::Perf(args) => xrnic_cli::cli::perf::run(&args),
        Command::Stat(args) => xrnic_cli::cli::stat::run(&args),
        Command::Res(args) => xrnic_cli::cli::res::run(&args),
        Command::Explain(args) => xrnic_cli::cli::explain::run(&args),
        Command::Demo(args) => xrnic_cli::cli::demo::run(&args),
        Command::Plot(args) => xrnic_cli::cli::plot::run(&args),
        Command::PlotSweep(args) => xrnic_cli::cli::plot_sweep::run(&args),
        Command::BenchSummary(args) => xrnic_cli::cli::summary::run(&args),
        Command::Exec(args) => xrnic_cli::cli::exec::run(&args),
        Command::Up(args) => xrnic_cli::cli::service::up(&args),
        Command::Down(args) => xrnic_cli::cli::service::down(&args),
        Command::Sim(args) => {
            ExitCode::from(u8::try_from(xrnic_cli::cli::sim::run(&args)).unwrap_or(1))
        }
    }
}
