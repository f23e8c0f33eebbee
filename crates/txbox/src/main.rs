//! The `txbox` binary: parse the command line, call the library, render, exit.

mod cli;
mod demo;
mod doctor;
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
    // Background deletion of retired layers (see txbox::collect::drop_tx) and the retention budget, in a
    // state directory txbox made (anything else is refused by opening it).
    if args.get(1).is_some_and(|a| a == "__gc") {
        // Nothing the caller left open lives on here (a pipe would never see its end).
        txbox_sandbox::fds::close_from_except(3, &[]);
        if let Some(root) = args.get(2) {
            // Detach from the caller's session so its terminal signals do not stop us.
            let _ = rustix::process::setsid();
            if let Ok(Some(state)) = txbox_txn::StateDir::open_existing(std::path::Path::new(root)) {
                let _ = state.collect_retired();
                // Retained undo data: measure what waits, apply the budget (crate txn::retain).
                if let Ok(budget) = txbox::retention::budget() {
                    let _ = txbox_txn::retain::collect(&state, &budget);
                }
                let _ = state.collect_retired();
            }
        }
        std::process::exit(0);
    }
    std::process::exit(cli::main(args));
}
