//! Compile the built-in policy's TOML into the JSON `txbox` reads on every start
//! (`Policy::builtin`): parsing 28 KB of TOML cost ~1 ms per process, JSON a tenth of it (#18).
//! The inline examples are left out, as `without_examples` does at run time for the TOML; the
//! test `builtin_strips_only_examples` checks that both forms compile to the same policy.

use std::path::Path;

fn main() {
    println!("cargo::rerun-if-changed=src/builtin.toml");
    let text = match std::fs::read_to_string("src/builtin.toml") {
        Ok(t) => t,
        Err(e) => panic!("read src/builtin.toml: {e}"),
    };
    let stripped: String = text.split_inclusive('\n').filter(|l| !l.starts_with("examples.")).collect();
    let value: toml::Value = match toml::from_str(&stripped) {
        Ok(v) => v,
        Err(e) => panic!("src/builtin.toml is not valid TOML: {e}"),
    };
    let json = match serde_json::to_string(&value) {
        Ok(j) => j,
        Err(e) => panic!("the built-in policy as JSON: {e}"),
    };
    let Some(out) = std::env::var_os("OUT_DIR") else { panic!("OUT_DIR is not set") };
    if let Err(e) = std::fs::write(Path::new(&out).join("builtin.json"), json) {
        panic!("write builtin.json: {e}");
    }
}
