//! The linker wrapper `tools/link-txbox`: what it hands to `cc` for the txbox executable and for
//! everything else, its fallback to a dynamic link, and that the binary under test came out of
//! it static (DEVIATIONS.md: why txbox is linked statically).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fake `cc` that records each invocation's arguments (one per line, invocations separated
/// by a `--` line) and fails when given `-static` if `fail_static`.
fn fake_cc(dir: &Path, fail_static: bool) -> PathBuf {
    let log = dir.join("calls");
    let cc = dir.join("cc");
    let refuse = if fail_static {
        r#"for a in "$@"; do [ "$a" = -static ] && { echo "cannot find -lc" >&2; exit 1; }; done"#
    } else {
        ""
    };
    let script = format!("#!/bin/sh\nprintf '%s\\n' \"$@\" -- >> '{}'\n{refuse}\nexit 0\n", log.display());
    std::fs::write(&cc, script).expect("write fake cc");
    let status = Command::new("chmod").arg("+x").arg(&cc).status().expect("chmod");
    assert!(status.success());
    cc
}

/// Run the wrapper with `args` against a fake cc; the argument lists cc received, in order.
fn link(args: &[&str], fail_static: bool, env: &[(&str, &str)]) -> Vec<Vec<String>> {
    let dir = tempdir();
    let cc = fake_cc(&dir, fail_static);
    let mut cmd = Command::new(repo().join("tools/link-txbox"));
    cmd.args(args).env("TXBOX_LINK_CC", &cc).env_remove("TXBOX_DYNAMIC").env_remove("TXBOX_PIE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run tools/link-txbox");
    assert!(out.status.success(), "wrapper failed: {}", String::from_utf8_lossy(&out.stderr));
    let calls = std::fs::read_to_string(dir.join("calls")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let mut all = vec![Vec::new()];
    for line in calls.lines() {
        if line == "--" {
            all.push(Vec::new());
        } else if let Some(last) = all.last_mut() {
            last.push(line.to_string());
        }
    }
    all.pop();
    all
}

fn tempdir() -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("txbox-link-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// The library part of a dynamic rustc link line, as rustc 1.9x writes it for this target.
const RUSTC_ARGS: [&str; 12] = [
    "-m64",
    "main.o",
    "-Wl,-Bdynamic",
    "-lgcc_s",
    "-lutil",
    "-lc",
    "-o",
    "OUT",
    "-pie",
    "-Wl,-z,relro,-z,now",
    "-nodefaultlibs",
    "-no-pie",
];

fn with_output(out: &str) -> Vec<&str> {
    RUSTC_ARGS.iter().map(|a| if *a == "OUT" { out } else { a }).collect()
}

#[test]
fn other_links_reach_cc_unchanged() {
    for out in [
        "target/release/deps/serde_derive-1234.so",
        "target/debug/deps/run-abcd",
        "target/release/build/x/build_script_build-9",
    ] {
        let args = with_output(out);
        let calls = link(&args, false, &[]);
        assert_eq!(calls, vec![args.iter().map(|s| s.to_string()).collect::<Vec<_>>()], "{out}");
    }
}

#[test]
fn the_txbox_executable_links_statically() {
    let calls = link(&with_output("target/release/deps/txbox-0123abcd"), false, &[]);
    assert_eq!(calls.len(), 1, "one static link: {calls:?}");
    let a = &calls[0];
    let has = |s: &str| a.iter().any(|x| x == s);
    assert!(has("-Wl,-Bstatic") && !has("-Wl,-Bdynamic"), "libraries searched statically: {a:?}");
    assert!(!has("-lgcc_s") && has("-lgcc_eh") && has("-lgcc"), "unwinder from libgcc_eh: {a:?}");
    assert!(!has("-pie"), "no PIE: {a:?}");
    let libs = a.iter().skip_while(|x| *x != "-lutil").take(5).map(String::as_str).collect::<Vec<_>>();
    assert_eq!(libs, ["-lutil", "-lc", "-lgcc_eh", "-lgcc", "-lc"], "libgcc_eh after libc, then libc again: {a:?}");
    assert_eq!(a[a.len() - 2..], ["-static", "-no-pie"], "a static position-dependent executable: {a:?}");
}

#[test]
fn a_failed_static_link_falls_back_to_the_dynamic_one() {
    let args = with_output("target/release/deps/txbox-0123abcd");
    let calls = link(&args, true, &[]);
    assert_eq!(calls.len(), 2, "static try, then dynamic: {calls:?}");
    assert!(calls[0].iter().any(|x| x == "-static"));
    assert_eq!(calls[1], args.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "the original link, unchanged");
}

#[test]
fn dynamic_and_pie_builds_can_be_asked_for() {
    let args = with_output("target/release/deps/txbox-0123abcd");
    for var in ["TXBOX_DYNAMIC", "TXBOX_PIE"] {
        let calls = link(&args, false, &[(var, "1")]);
        assert_eq!(calls, vec![args.iter().map(|s| s.to_string()).collect::<Vec<_>>()], "{var}=1");
    }
}

/// The binary these tests run is the wrapper's work: no program interpreter (PT_INTERP). Skips,
/// saying so, where no static libc is installed (the wrapper then links dynamically) or when the
/// build asked for a dynamic one.
#[test]
fn the_binary_under_test_is_static() {
    if !cfg!(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")) {
        eprintln!("SKIP: .cargo/config.toml installs tools/link-txbox for x86_64-unknown-linux-gnu only");
        return;
    }
    if std::env::var_os("TXBOX_DYNAMIC").is_some() || std::env::var_os("TXBOX_PIE").is_some() {
        eprintln!("SKIP: TXBOX_DYNAMIC/TXBOX_PIE set, a dynamic txbox was asked for");
        return;
    }
    let libc_a = Command::new("cc")
        .arg("-print-file-name=libc.a")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if !libc_a.as_deref().is_ok_and(|p| Path::new(p).is_absolute() && Path::new(p).exists()) {
        eprintln!("SKIP: no static libc (libc.a) on this machine; tools/link-txbox links txbox dynamically here");
        return;
    }
    let bin = std::fs::read(env!("CARGO_BIN_EXE_txbox")).expect("read the txbox binary");
    assert!(has_interp(&bin) == Some(false), "txbox has a program interpreter: it was linked dynamically");
}

/// Whether an ELF64 little-endian image has a PT_INTERP program header (None: not such an ELF).
fn has_interp(elf: &[u8]) -> Option<bool> {
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u64_at = |o: usize| elf.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    let phoff = u64_at(0x20)? as usize;
    let phentsize = u16_at(0x36)? as usize;
    let phnum = u16_at(0x38)? as usize;
    let mut interp = false;
    for i in 0..phnum {
        let p_type = elf.get(phoff + i * phentsize..phoff + i * phentsize + 4)?;
        interp |= u32::from_le_bytes([p_type[0], p_type[1], p_type[2], p_type[3]]) == 3;
    }
    Some(interp)
}
