//! Presets derived by running the real tools against fake configurations in a temporary HOME:
//! what a mirror or company registry in the caller's configuration turns into, and that a
//! configured registry replaces the built-in one. No registry is contacted: cargo's built-in
//! index is learnt from a recording proxy that refuses everything, and a sparse index's
//! `config.json` comes from a server started here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use txbox_netproxy::preset::{derive, Caller};
use txbox_netproxy::Preset;

struct Home(PathBuf);

impl Home {
    fn new(name: &str) -> Home {
        let p = std::env::temp_dir().join(format!("txbox-presets-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Home(p)
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A caller whose HOME is this directory, with this process's PATH and nothing else.
    fn caller(&self, extra: &[(&str, String)]) -> Caller {
        let mut vars = vec![
            ("HOME".to_string(), self.0.display().to_string()),
            ("PATH".to_string(), std::env::var("PATH").unwrap_or_default()),
        ];
        vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        Caller::with_vars(vars, None)
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rules(p: Preset, caller: &Caller) -> Vec<String> {
    derive(p, caller).unwrap_or_else(|e| panic!("{e}")).rules.iter().map(|r| r.to_string()).collect()
}

/// A Python with pip, as the caller would have it on PATH (pip's own configuration is read).
fn has_pip() -> bool {
    std::process::Command::new("python3").args(["-m", "pip", "--version"]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn pip_reads_the_caller_s_pip_conf_and_a_configured_index_replaces_the_default() {
    let home = Home::new("pip");
    let default = rules(Preset::Pypi, &home.caller(&[]));
    assert_eq!(default.len(), 2, "pip's built-in index and file host: {default:?}");
    home.write(
        ".config/pip/pip.conf",
        "[global]\nindex-url = http://mirror.example:8080/simple\nextra-index-url = https://extra.example/simple\n",
    );
    let configured = rules(Preset::Pypi, &home.caller(&[]));
    assert_eq!(configured, ["mirror.example:8080", "extra.example:443"], "with pip: {}", has_pip());
    // The variables pip reads count too.
    let by_env = rules(Preset::Pypi, &home.caller(&[("PIP_INDEX_URL", "https://env.example/simple".into())]));
    assert!(by_env.contains(&"env.example:443".to_string()), "{by_env:?}");
}

#[test]
fn npm_reads_the_caller_s_npmrc_with_scoped_registries() {
    let home = Home::new("npm");
    home.write(".npmrc", "registry=http://npm-mirror.example:4873/\n@corp:registry=https://corp.example/npm/\n");
    let r = rules(Preset::Npm, &home.caller(&[]));
    assert_eq!(r, ["corp.example:443", "npm-mirror.example:4873"]);
}

/// A server answering every request with `body`.
fn serve_json(body: String) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    port
}

fn rustup_home() -> String {
    std::env::var("RUSTUP_HOME")
        .unwrap_or_else(|_| Path::new(&std::env::var("HOME").unwrap_or_default()).join(".rustup").display().to_string())
}

#[test]
fn cargo_reads_source_replacement_and_the_index_config() {
    let home = Home::new("cargo");
    let port = serve_json(r#"{"dl":"https://dl.example/crates","api":"https://api.example:8443"}"#.to_string());
    home.write(
        ".cargo/config.toml",
        &format!(
            "[source.crates-io]\nreplace-with = \"mirror\"\n[source.mirror]\nregistry = \"sparse+http://127.0.0.1:{port}/index/\"\n"
        ),
    );
    let caller = home.caller(&[("RUSTUP_HOME", rustup_home())]);
    let r = rules(Preset::Crates, &caller);
    assert_eq!(r, [format!("127.0.0.1:{port}"), "dl.example:443".into(), "api.example:8443".into()]);
}

#[test]
fn cargo_s_built_in_index_is_learnt_from_cargo_itself() {
    let home = Home::new("cargo-default");
    // A curl that cannot reach anything: the test contacts no registry.
    let curl = home.write("bin/curl", "#!/bin/sh\necho 'curl: (7) no network in tests' >&2\nexit 7\n");
    std::fs::set_permissions(&curl, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", home.0.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let caller = home.caller(&[("RUSTUP_HOME", rustup_home()), ("PATH", path)]);
    let d = derive(Preset::Crates, &caller).unwrap_or_else(|e| panic!("{e}"));
    // Its name is cargo's to say, not ours to write down: one host, over TLS; the hosts of its
    // config.json could not be read, which the notes say.
    let index: Vec<String> = d.rules.iter().map(|r| r.to_string()).collect();
    assert_eq!(index.len(), 1, "{d:?}");
    assert!(index[0].ends_with(":443"), "{d:?}");
    assert!(d.notes.iter().any(|n| n.contains("crate downloads may be refused")), "{d:?}");
}

#[test]
fn go_and_github_from_their_tools_configuration() {
    let home = Home::new("go");
    let bin = home.0.join("bin");
    let go = home.write("bin/go", "#!/bin/sh\necho 'https://goproxy.example,direct'\necho 'sum.example'\n");
    std::fs::set_permissions(&go, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let caller = home.caller(&[("PATH", path)]);
    let d = derive(Preset::Go, &caller).unwrap();
    assert_eq!(d.rules.iter().map(|r| r.to_string()).collect::<Vec<_>>(), ["goproxy.example:443", "sum.example:443"]);
    assert!(d.notes[0].contains("direct"));

    home.write(".config/gh/hosts.yml", "ghe.corp.example:\n    user: me\n");
    assert_eq!(rules(Preset::Github, &home.caller(&[])), ["ghe.corp.example", "api.ghe.corp.example"]);
}

#[test]
fn a_missing_tool_is_an_error_that_says_so() {
    let home = Home::new("missing");
    let caller = Caller::with_vars(
        [("HOME".to_string(), home.0.display().to_string()), ("PATH".to_string(), "/nonexistent".to_string())],
        None,
    );
    let e = derive(Preset::Npm, &caller).unwrap_err();
    assert!(e.to_string().contains("@npm: npm is not on PATH"), "{e}");
}
