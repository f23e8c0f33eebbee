//! Link the `txbox` binary as a position-dependent executable on Linux with glibc.
//!
//! Every `txbox run` pays for starting this process. As a PIE, a binary of this size applies
//! ~20,000 relocations at start and takes the copy-on-write page faults they cause: ~0.4 ms of
//! a budget of 3 ms (docs/BENCHMARKS.md). The price is a fixed load address for txbox's own
//! code (its libraries, stack and heap stay randomised); txbox runs no untrusted code itself,
//! the sandboxed command is a separate program. Set `TXBOX_PIE=1` when building to keep a PIE.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TXBOX_PIE");
    // Read by tools/link-txbox, the linker: relink when it changes.
    println!("cargo:rerun-if-env-changed=TXBOX_DYNAMIC");
    let target = std::env::var("TARGET").unwrap_or_default();
    let pie = std::env::var_os("TXBOX_PIE").is_some_and(|v| v == "1");
    if target.contains("-linux-gnu") && !pie {
        println!("cargo:rustc-link-arg-bin=txbox=-no-pie");
    }
}
