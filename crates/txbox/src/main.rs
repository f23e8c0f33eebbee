//! The `txbox` binary: parse the command line, call the library, render, exit.

mod cli;
mod demo;
mod doctor;
mod hook;
mod mcp;
mod serve;
mod shim;

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The sandbox helper is re-exec'd on every run: dispatch it before any argument parsing.
    if args.get(1).is_some_and(|a| a == "__stage2") {
        txbox_sandbox::stage2::main(&args[2..]);
    }
    // A warm sandbox server (see txbox_sandbox::warm), started by a run for the next ones. It
    // deletes retired transaction directories when idle (those in the state directory's
    // `txbox_txn::layout::RETIRED`), and lays overlays only on transactions' layers.
    if args.get(1).is_some_and(|a| a == "__warm") {
        let layout = txbox_sandbox::warm::StateLayout {
            retired: std::path::Path::new(txbox_txn::layout::RETIRED),
            layer: |rel| {
                txbox_txn::layout::layer_name(rel).map(|l| txbox_sandbox::warm::LayerName {
                    tx: l.id,
                    step: l.step,
                    upper: l.upper,
                })
            },
        };
        txbox_sandbox::warm::server::main(&args[2..], layout);
    }
    // The network proxy of one command (txbox_netproxy::process): a broker and, forked from it,
    // the confined proxy. Started by the engine for a command with an allowlist.
    if args.get(1).is_some_and(|a| a == txbox_netproxy::process::SUBCOMMAND) {
        txbox_netproxy::process::main();
    }
    // Background deletion of retired layers and the retention budget (txbox::collect), started
    // by runs for their state directory.
    if args.get(1).is_some_and(|a| a == txbox::collect::SUBCOMMAND) {
        txbox::collect::main(&args[2..]);
    }
    std::process::exit(cli::main(args));
}
