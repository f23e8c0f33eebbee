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
    // A warm sandbox server (see txbox_sandbox::warm), started by a run for the next ones.
    if args.get(1).is_some_and(|a| a == "__warm") {
        txbox_sandbox::warm::server::main(&args[2..]);
    }
    // Background deletion of rolled-back layers (see engine::drop_tx).
    if args.get(1).is_some_and(|a| a == "__gc") {
        if let Some(root) = args.get(2) {
            // Detach from the caller's session so its terminal signals do not stop us.
            let _ = rustix::process::setsid();
            let _ = txbox_txn::StateDir { root: root.into() }.collect_garbage(std::time::Duration::ZERO);
        }
        std::process::exit(0);
    }
    let code = match cli::main(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("txbox: error: {e:#}");
            125
        }
    };
    std::process::exit(code);
}
