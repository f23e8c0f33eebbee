//! Kept build output: derived directories of the workspace (`target/`, `__pycache__/`, ...)
//! whose changes are committed even when the command fails, and are exempt from conflict
//! checks (last writer wins). A failing `cargo test` then does not throw its compilation away.
//!
//! The rule is pure: [`KeepRules::root_of`] says which kept directory, if any, a path lies in,
//! by name alone; [`split`] takes a classified change set apart into what lies in kept
//! directories and the rest, looking at the two sides only to refuse a kept directory that is
//! not a real directory on each side (a symlink named `target` keeps nothing).
//!
//! Build output is kept from a failed command only if that command changed no existing path
//! outside kept directories ([`Split::inputs_changed`]): rolled back, such a path gets its old
//! content and times, and output built from its new content would look up to date.
//!
//! What is kept is a change set like any other: the caller judges it with the commit-time
//! policy, holds it to the write limit and commits it through the journal. Every fixup of the
//! whole change set goes with the kept part (a setuid inode linked both inside and outside a
//! kept directory is repaired whichever name recorded the fixup; fixups only touch the upper).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::changeset::{ChangeOp, ChangeSet};

/// The default kept directories: build tools' output and caches inside a project.
pub const DEFAULT: &[&str] =
    &["target", "__pycache__", ".pytest_cache", "node_modules/.cache", ".mypy_cache", ".ruff_cache", ".gradle"];

/// Directories inside which nothing is kept, whatever its name: version control's metadata
/// (hooks and configuration that the host runs) and txbox's own state.
const NEVER_INSIDE: &[&str] = &[".git", ".hg", ".svn", ".bzr", ".jj", "_darcs", ".pijul", ".txbox"];

/// One kept pattern: one or more names, matched as the last components of a directory at any
/// depth of the workspace (`node_modules/.cache` matches `web/node_modules/.cache`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(Vec<OsString>);

impl Pattern {
    /// Parse `target`, `node_modules/.cache` (a trailing `/` is allowed). Refused: empty names,
    /// `.` and `..`, absolute paths, and names of version control's or txbox's directories.
    pub fn parse(s: &str) -> Result<Pattern, String> {
        let trimmed = s.strip_suffix('/').unwrap_or(s);
        if trimmed.is_empty() || trimmed.starts_with('/') {
            return Err(format!("kept path {s:?}: give a directory name relative to the workspace, e.g. target"));
        }
        let mut names = Vec::new();
        for part in trimmed.split('/') {
            if part.is_empty() || part == "." || part == ".." {
                return Err(format!("kept path {s:?}: empty, `.` and `..` components are not allowed"));
            }
            if NEVER_INSIDE.contains(&part) {
                return Err(format!("kept path {s:?}: {part} is never kept"));
            }
            names.push(OsString::from(part));
        }
        Ok(Pattern(names))
    }
}

/// The kept directories in force: empty means nothing is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepRules {
    patterns: Vec<Pattern>,
}

impl Default for KeepRules {
    fn default() -> KeepRules {
        KeepRules::parse(DEFAULT.iter().copied()).unwrap_or_else(|_| KeepRules::none())
    }
}

impl KeepRules {
    /// Nothing is kept: a failed command's changes are all rolled back.
    pub fn none() -> KeepRules {
        KeepRules { patterns: Vec::new() }
    }

    pub fn parse<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Result<KeepRules, String> {
        Ok(KeepRules { patterns: patterns.into_iter().map(Pattern::parse).collect::<Result<_, _>>()? })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether every pattern here is one of the defaults (a configuration naming only these
    /// keeps no more than txbox does without it).
    pub fn within_defaults(&self) -> bool {
        let defaults = KeepRules::default();
        self.patterns.iter().all(|p| defaults.patterns.contains(p))
    }

    /// The kept directory `rel` (relative to the workspace) lies in or is, if any: the
    /// shallowest prefix of `rel` that ends with a pattern's names, with no version control
    /// or state directory above it or in it.
    pub fn root_of(&self, rel: &Path) -> Option<PathBuf> {
        if self.patterns.is_empty() {
            return None;
        }
        let mut names: Vec<&OsStr> = Vec::new();
        for c in rel.components() {
            let Component::Normal(name) = c else { return None };
            if NEVER_INSIDE.iter().any(|n| name.as_bytes() == n.as_bytes()) {
                return None;
            }
            names.push(name);
            if self.patterns.iter().any(|p| names.ends_with(&p.0.iter().map(OsString::as_os_str).collect::<Vec<_>>())) {
                // Nothing inside a kept directory may be version control's either.
                let rest_clean = rel.components().skip(names.len()).all(|c| match c {
                    Component::Normal(n) => !NEVER_INSIDE.iter().any(|v| n.as_bytes() == v.as_bytes()),
                    _ => false,
                });
                return rest_clean.then(|| names.iter().collect());
            }
        }
        None
    }
}

/// Whether an upper layer holds anything inside a kept directory, by names alone (`readdir`'s
/// entry types, no `stat`): the cheap look a rollback takes before it classifies anything.
/// An unreadable directory counts as holding something (the classification then decides).
pub fn upper_has_kept(upper: &Path, rules: &KeepRules) -> bool {
    if rules.is_empty() {
        return false;
    }
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let Ok(dir) = std::fs::read_dir(upper.join(&rel)) else { return true };
        for e in dir.flatten() {
            let p = rel.join(e.file_name());
            if rules.root_of(&p).is_some() {
                return true;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p);
            }
        }
    }
    false
}

/// The two sides' objects at a kept directory, as [`split`] needs them (a seam for tests).
pub trait Sides {
    /// Whether the upper layer holds a real directory (not a symlink) at `rel`.
    fn upper_is_dir(&self, rel: &Path) -> bool;
    /// Whether the workspace holds nothing, or a real directory (not a symlink), at `rel`.
    fn workspace_absent_or_dir(&self, rel: &Path) -> bool;
}

/// The real sides: an upper layer over a workspace, looked at without following symlinks.
pub struct Layers<'a> {
    pub upper: &'a Path,
    pub workspace: &'a Path,
}

impl Sides for Layers<'_> {
    fn upper_is_dir(&self, rel: &Path) -> bool {
        std::fs::symlink_metadata(self.upper.join(rel)).is_ok_and(|m| m.file_type().is_dir())
    }

    fn workspace_absent_or_dir(&self, rel: &Path) -> bool {
        match std::fs::symlink_metadata(self.workspace.join(rel)) {
            Ok(m) => m.file_type().is_dir(),
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    }
}

/// A change set taken apart: what lies in kept directories, and the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// The changes inside kept directories, with every fixup of the whole set. `bytes` is the
    /// whole set's (an upper bound: the kept part is held to the write limit conservatively).
    pub kept: ChangeSet,
    /// The kept directories that changed, sorted.
    pub roots: Vec<PathBuf>,
    /// The paths of the changes that are not kept.
    pub rest: Vec<PathBuf>,
    /// The paths of `rest` that existed and were changed or deleted (not new ones): rolled
    /// back, they get their old content and times again, and build output made from their new
    /// content would look newer than its inputs (cargo compares times), so a failed command
    /// that changed any keeps nothing. A new path rolled back is gone, which tools do notice.
    pub inputs_changed: Vec<PathBuf>,
}

/// Take `cs` apart by `rules`. A change is kept when its path lies in a kept directory that is
/// a real directory in the upper layer and absent or a real directory in the workspace; the
/// directories above a kept one are never changed by keeping it.
pub fn split(cs: &ChangeSet, rules: &KeepRules, sides: &dyn Sides) -> Split {
    let mut out = Split::default();
    let mut roots: Vec<PathBuf> = Vec::new();
    let mut refused: Vec<PathBuf> = Vec::new();
    let mut kept_root = |rel: &Path| -> bool {
        let Some(root) = rules.root_of(rel) else { return false };
        if roots.contains(&root) {
            return true;
        }
        if refused.contains(&root) {
            return false;
        }
        let real = sides.upper_is_dir(&root) && sides.workspace_absent_or_dir(&root);
        if real {
            roots.push(root)
        } else {
            refused.push(root)
        }
        real
    };
    for c in &cs.changes {
        if kept_root(&c.path) {
            out.kept.changes.push(c.clone());
        } else if !matches!(c.op, ChangeOp::DirMeta { visible: false }) {
            out.rest.push(c.path.clone());
            if !matches!(c.op, ChangeOp::Put { old: None, .. }) {
                out.inputs_changed.push(c.path.clone());
            }
        }
    }
    roots.sort();
    let inside = |p: &Path| roots.iter().any(|r| p.starts_with(r));
    let pick = |v: &[PathBuf]| v.iter().filter(|p| inside(p)).cloned().collect::<Vec<_>>();
    out.kept.added = pick(&cs.added);
    out.kept.modified = pick(&cs.modified);
    out.kept.deleted = pick(&cs.deleted);
    out.kept.skipped = pick(&cs.skipped);
    out.kept.dropped_xattrs = cs.dropped_xattrs.iter().filter(|(p, _)| inside(p)).cloned().collect();
    out.kept.fixups = cs.fixups.clone();
    out.kept.bytes = cs.bytes;
    out.roots = roots;
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::changeset::{Change, Fixup};
    use crate::meta::Kind;
    use std::collections::HashSet;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn patterns_parse_and_refuse() {
        assert!(Pattern::parse("target").is_ok());
        assert!(Pattern::parse("target/").is_ok());
        assert!(Pattern::parse("node_modules/.cache").is_ok());
        for bad in ["", "/", "/target", "a//b", ".", "..", "a/../b", ".git", ".git/hooks", "x/.hg", ".txbox"] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(KeepRules::default().within_defaults());
        assert!(!KeepRules::parse(["src"]).unwrap().within_defaults());
        assert!(KeepRules::parse(["target", "src"]).is_ok());
    }

    #[test]
    fn root_of_matches_names_at_any_depth() {
        let r = KeepRules::default();
        assert_eq!(r.root_of(&p("target")), Some(p("target")));
        assert_eq!(r.root_of(&p("target/debug/deps/x.rlib")), Some(p("target")));
        assert_eq!(r.root_of(&p("crates/a/target/debug")), Some(p("crates/a/target")));
        assert_eq!(r.root_of(&p("pkg/sub/__pycache__/m.cpython-312.pyc")), Some(p("pkg/sub/__pycache__")));
        assert_eq!(r.root_of(&p("web/node_modules/.cache/babel/x")), Some(p("web/node_modules/.cache")));
        // The shallowest kept directory wins.
        assert_eq!(r.root_of(&p("target/__pycache__/x")), Some(p("target")));
        // Names that only look alike are not kept.
        for not in ["targets/x", "src/target.rs", "node_modules/x/.cache2", "node_modules", ".cache/x", "", "a/b"] {
            assert_eq!(r.root_of(&p(not)), None, "{not}");
        }
        assert_eq!(KeepRules::none().root_of(&p("target/x")), None);
    }

    #[test]
    fn nothing_inside_version_control_or_state_is_kept() {
        let r = KeepRules::default();
        for path in [
            ".git/hooks/__pycache__/pre-commit",
            ".git/__pycache__",
            ".git/target/x",
            "sub/.git/hooks/target/x",
            ".hg/hgrc/target",
            ".txbox/target/x",
            // A repository inside a kept directory: its hooks are not build output.
            "target/.git/hooks/pre-commit",
            "__pycache__/.git/config",
        ] {
            assert_eq!(r.root_of(&p(path)), None, "{path}");
        }
        // Odd components are never matched.
        assert_eq!(r.root_of(Path::new("/target/x")), None);
        assert_eq!(r.root_of(Path::new("../target/x")), None);
    }

    struct Fake {
        upper_dirs: HashSet<PathBuf>,
        ws_not_dir: HashSet<PathBuf>,
    }

    impl Sides for Fake {
        fn upper_is_dir(&self, rel: &Path) -> bool {
            self.upper_dirs.contains(rel)
        }
        fn workspace_absent_or_dir(&self, rel: &Path) -> bool {
            !self.ws_not_dir.contains(rel)
        }
    }

    fn put(path: &str) -> Change {
        Change { path: p(path), op: ChangeOp::Put { new: Kind::File, old: None } }
    }

    #[test]
    fn split_takes_kept_changes_and_every_fixup() {
        let cs = ChangeSet {
            changes: vec![
                put("src/main.rs"),
                put("target/debug/app"),
                Change { path: p(""), op: ChangeOp::DirMeta { visible: false } },
                Change { path: p("target"), op: ChangeOp::DirMeta { visible: false } },
            ],
            fixups: vec![Fixup::Chmod(p("src/evil"), 0o755)],
            added: vec![p("src/main.rs"), p("target/debug/app")],
            bytes: 4096,
            ..ChangeSet::default()
        };
        let sides = Fake { upper_dirs: [p("target")].into(), ws_not_dir: HashSet::new() };
        let s = split(&cs, &KeepRules::default(), &sides);
        assert_eq!(s.roots, [p("target")]);
        assert_eq!(
            s.kept.changes.iter().map(|c| c.path.clone()).collect::<Vec<_>>(),
            [p("target/debug/app"), p("target")]
        );
        assert_eq!(s.kept.added, [p("target/debug/app")]);
        assert_eq!(s.rest, [p("src/main.rs")], "a root's mtime alone is not a change of its own");
        assert!(s.inputs_changed.is_empty(), "a new file is no changed input");
        // A linked inode's fixup may have been recorded under a name outside: all go along.
        assert_eq!(s.kept.fixups, cs.fixups);
        assert_eq!(s.kept.bytes, 4096);
    }

    #[test]
    fn a_kept_name_that_is_not_a_real_directory_on_both_sides_keeps_nothing() {
        let cs = ChangeSet {
            changes: vec![put("target"), put("a/target/x"), put("b/__pycache__/y")],
            added: vec![p("target"), p("a/target/x"), p("b/__pycache__/y")],
            ..ChangeSet::default()
        };
        // `target` is a symlink (or a file) in the upper; `a/target` is a symlink in the
        // workspace (replaced by a directory in the upper); only b/__pycache__ is real.
        let sides = Fake { upper_dirs: [p("a/target"), p("b/__pycache__")].into(), ws_not_dir: [p("a/target")].into() };
        let s = split(&cs, &KeepRules::default(), &sides);
        assert_eq!(s.roots, [p("b/__pycache__")]);
        assert_eq!(s.kept.added, [p("b/__pycache__/y")]);
        assert_eq!(s.rest, [p("target"), p("a/target/x")]);
    }

    #[test]
    fn changed_and_deleted_paths_outside_are_changed_inputs() {
        let cs = ChangeSet {
            changes: vec![
                Change { path: p("src/lib.rs"), op: ChangeOp::Put { new: Kind::File, old: Some(Kind::File) } },
                Change { path: p("old.rs"), op: ChangeOp::Delete { old: Kind::File } },
                Change { path: p("src"), op: ChangeOp::DirMeta { visible: true } },
                put("new.rs"),
                put("target/x"),
            ],
            ..ChangeSet::default()
        };
        let sides = Fake { upper_dirs: [p("target")].into(), ws_not_dir: HashSet::new() };
        let s = split(&cs, &KeepRules::default(), &sides);
        assert_eq!(s.inputs_changed, [p("src/lib.rs"), p("old.rs"), p("src")]);
        assert_eq!(s.rest.len(), 4);
    }

    #[test]
    fn an_upper_is_looked_at_by_names() {
        let dir = std::env::temp_dir().join(format!("txbox-keep-upper-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src/deep")).unwrap();
        std::fs::write(dir.join("src/deep/target"), "a file named like one").unwrap();
        let rules = KeepRules::default();
        // A file's name matches too: the classification decides that it is no directory.
        assert!(upper_has_kept(&dir, &rules));
        std::fs::remove_file(dir.join("src/deep/target")).unwrap();
        assert!(!upper_has_kept(&dir, &rules));
        std::fs::create_dir_all(dir.join(".git/target")).unwrap();
        assert!(!upper_has_kept(&dir, &rules), "nothing inside .git is kept");
        std::fs::create_dir_all(dir.join("a/__pycache__")).unwrap();
        assert!(upper_has_kept(&dir, &rules));
        assert!(!upper_has_kept(&dir, &KeepRules::none()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn nothing_kept_without_rules() {
        let cs = ChangeSet { changes: vec![put("target/x")], ..ChangeSet::default() };
        let sides = Fake { upper_dirs: [p("target")].into(), ws_not_dir: HashSet::new() };
        let s = split(&cs, &KeepRules::none(), &sides);
        assert!(s.kept.changes.is_empty() && s.roots.is_empty());
        assert_eq!(s.rest, [p("target/x")]);
    }
}
