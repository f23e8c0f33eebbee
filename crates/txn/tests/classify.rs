//! The change-set classifier on hand-made upper layers that encode what overlayfs writes:
//! whiteouts sharing one inode, opaque directories, escaped and internal xattrs, copy-ups that
//! changed nothing, type changes in both directions, repairs inside new directories.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use txbox_txn::changeset::{Change, ChangeOp, ChangeSet, Fixup};
use txbox_txn::meta::Kind;

mod fixture;
use fixture::{copy_up, set_mtime, write, Fixture};

fn whiteout(p: &Path) -> bool {
    rustix::fs::mknodat(rustix::fs::CWD, p, rustix::fs::FileType::CharacterDevice, rustix::fs::Mode::empty(), 0).is_ok()
}

fn has(cs: &ChangeSet, path: &str, op: ChangeOp) -> bool {
    cs.changes.contains(&Change { path: PathBuf::from(path), op })
}

#[test]
fn whiteouts_sharing_one_inode_each_delete_their_name() {
    let f = Fixture::new("whiteouts");
    write(&f.lower.join("a.txt"), "a");
    write(&f.lower.join("dir/b.txt"), "b");
    write(&f.lower.join("keep.txt"), "k");
    if !whiteout(&f.upper.join("a.txt")) {
        eprintln!("SKIP whiteout fixtures: mknod of a 0:0 char device needs CAP_MKNOD (run as root)");
        return;
    }
    // overlayfs on 6.x makes every whiteout a hard link to one shared inode.
    std::fs::hard_link(f.upper.join("a.txt"), f.upper.join("dir")).unwrap();
    assert_eq!(std::fs::symlink_metadata(f.upper.join("dir")).unwrap().nlink(), 2);
    let cs = f.classify();
    assert!(has(&cs, "a.txt", ChangeOp::Delete { old: Kind::File }), "{cs:#?}");
    assert!(has(&cs, "dir", ChangeOp::Delete { old: Kind::Dir }), "{cs:#?}");
    assert_eq!(cs.deleted, vec![PathBuf::from("a.txt"), PathBuf::from("dir")]);
    assert!(cs.added.is_empty() && cs.modified.is_empty(), "{cs:#?}");
}

#[test]
fn an_opaque_directory_replaces_the_lower_one_entirely() {
    let f = Fixture::new("opaque");
    write(&f.lower.join("d/old1"), "1");
    write(&f.lower.join("d/sub/old2"), "2");
    write(&f.lower.join("d/same"), "same");
    std::fs::create_dir_all(f.upper.join("d")).unwrap();
    rustix::fs::lsetxattr(f.upper.join("d").as_path(), "user.overlay.opaque", b"y", rustix::fs::XattrFlags::empty())
        .unwrap();
    write(&f.upper.join("d/new"), "n");
    copy_up(&f, "d/same");
    let cs = f.classify();
    assert!(has(&cs, "d/old1", ChangeOp::Delete { old: Kind::File }), "{cs:#?}");
    assert!(has(&cs, "d/sub", ChangeOp::Delete { old: Kind::Dir }), "{cs:#?}");
    assert!(has(&cs, "d/new", ChangeOp::Put { new: Kind::File, old: None }), "{cs:#?}");
    assert!(!cs.changes.iter().any(|c| c.path == Path::new("d/same")), "identical entry reported: {cs:#?}");
    // The directory itself stays (its attributes are copied over), but overlay's opaque
    // marker is not among the attributes a commit copies.
    let copied = txbox_txn::meta::committed_xattrs_of_upper(&f.upper.join("d")).unwrap();
    assert!(copied.iter().all(|(n, _)| n != "user.overlay.opaque"), "{copied:?}");
}

#[test]
fn copied_up_but_unchanged_files_are_not_changes() {
    let f = Fixture::new("noop");
    write(&f.lower.join("src/main.rs"), "fn main() {}\n");
    write(&f.lower.join("src/lib.rs"), "pub fn f() {}\n");
    copy_up(&f, "src/main.rs");
    copy_up(&f, "src/lib.rs");
    std::fs::write(f.upper.join("src/lib.rs"), "pub fn g() {}\n").unwrap();
    set_mtime(&f.upper.join("src"), &std::fs::metadata(f.lower.join("src")).unwrap());
    let cs = f.classify();
    assert_eq!(cs.modified, vec![PathBuf::from("src/lib.rs")], "{cs:#?}");
    assert!(cs.added.is_empty() && cs.deleted.is_empty());
}

#[test]
fn overlay_xattrs_and_the_commands_own_overlay_names_are_removed() {
    let f = Fixture::new("xattrs");
    write(&f.lower.join("f"), "old");
    write(&f.upper.join("f"), "new");
    let set = |name: &str, v: &[u8]| {
        rustix::fs::lsetxattr(f.upper.join("f").as_path(), name, v, rustix::fs::XattrFlags::empty()).unwrap()
    };
    set("user.overlay.origin", b"\x00\xfbhandle");
    set("user.overlay.overlay.mine", b"escaped");
    set("user.plain", b"kept");
    let cs = f.classify();
    assert!(
        cs.fixups.contains(&Fixup::RemoveXattr("f".into(), OsString::from("user.overlay.origin"))),
        "{:#?}",
        cs.fixups
    );
    // The command's own `user.overlay.mine` (stored escaped) would be read by every later
    // overlay of the workspace: removed, and reported under the name the command used.
    assert!(
        cs.fixups.contains(&Fixup::RemoveXattr("f".into(), OsString::from("user.overlay.overlay.mine"))),
        "{:#?}",
        cs.fixups
    );
    assert_eq!(cs.dropped_xattrs, vec![(PathBuf::from("f"), OsString::from("user.overlay.mine"))]);
    assert!(!cs.fixups.iter().any(|x| matches!(x, Fixup::RemoveXattr(_, n) if n == "user.plain")));
}

#[test]
fn overlay_xattrs_and_setuid_bits_inside_new_directories_are_repaired() {
    // Objects below a new directory are read through their directory's handle
    // (`listxattrat`), not by path: the same repairs must come out, at every depth.
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new("new-tree-fixups");
    std::fs::create_dir_all(f.upper.join("gen/sub")).unwrap();
    write(&f.upper.join("gen/x"), "x");
    write(&f.upper.join("gen/sub/y"), "y");
    let set = |rel: &str, name: &str, v: &[u8]| {
        rustix::fs::lsetxattr(f.upper.join(rel).as_path(), name, v, rustix::fs::XattrFlags::empty()).unwrap()
    };
    set("gen/x", "user.overlay.origin", b"\x00\xfbhandle");
    set("gen/x", "user.plain", b"kept");
    set("gen/sub", "user.overlay.impure", b"y");
    set("gen/sub/y", "user.overlay.overlay.mine", b"escaped");
    std::fs::set_permissions(f.upper.join("gen/sub/y"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let cs = f.classify();
    assert!(has(&cs, "gen", ChangeOp::Put { new: Kind::Dir, old: None }));
    for p in ["gen", "gen/x", "gen/sub", "gen/sub/y"] {
        assert!(cs.added.contains(&PathBuf::from(p)), "{p}: {:?}", cs.added);
    }
    assert!(
        cs.fixups.contains(&Fixup::RemoveXattr("gen/x".into(), OsString::from("user.overlay.origin"))),
        "{:#?}",
        cs.fixups
    );
    assert!(
        cs.fixups.contains(&Fixup::RemoveXattr("gen/sub".into(), OsString::from("user.overlay.impure"))),
        "{:#?}",
        cs.fixups
    );
    assert!(
        cs.fixups.contains(&Fixup::RemoveXattr("gen/sub/y".into(), OsString::from("user.overlay.overlay.mine"))),
        "{:#?}",
        cs.fixups
    );
    assert_eq!(cs.dropped_xattrs, vec![(PathBuf::from("gen/sub/y"), OsString::from("user.overlay.mine"))]);
    assert!(cs.fixups.contains(&Fixup::Chmod("gen/sub/y".into(), 0o755)), "{:#?}", cs.fixups);
    assert!(!cs.fixups.iter().any(|x| matches!(x, Fixup::RemoveXattr(_, n) if n == "user.plain")));
}

#[test]
fn type_changes_in_both_directions() {
    let f = Fixture::new("types");
    write(&f.lower.join("was_dir/inner"), "i");
    write(&f.lower.join("was_file"), "f");
    std::os::unix::fs::symlink("target", f.lower.join("was_link")).unwrap();
    write(&f.upper.join("was_dir"), "now a file");
    std::fs::create_dir_all(f.upper.join("was_file")).unwrap();
    rustix::fs::lsetxattr(
        f.upper.join("was_file").as_path(),
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    write(&f.upper.join("was_file/x"), "x");
    write(&f.upper.join("was_link"), "a file where a symlink was");
    let cs = f.classify();
    assert!(has(&cs, "was_dir", ChangeOp::Put { new: Kind::File, old: Some(Kind::Dir) }), "{cs:#?}");
    assert!(has(&cs, "was_file", ChangeOp::Put { new: Kind::Dir, old: Some(Kind::File) }), "{cs:#?}");
    assert!(has(&cs, "was_link", ChangeOp::Put { new: Kind::File, old: Some(Kind::Symlink) }), "{cs:#?}");
    // The new directory moves whole; its content is reported and its opaque marker dropped.
    assert!(cs.added.contains(&PathBuf::from("was_file/x")));
    assert!(
        cs.fixups.contains(&Fixup::RemoveXattr("was_file".into(), OsString::from("user.overlay.opaque"))),
        "{:#?}",
        cs.fixups
    );
}

#[test]
fn special_files_and_stray_whiteouts_inside_new_directories_are_not_moved() {
    let f = Fixture::new("special");
    std::fs::create_dir_all(f.upper.join("gen")).unwrap();
    write(&f.upper.join("gen/ok"), "ok");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.upper.join("gen/fifo").as_path(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let wh = whiteout(&f.upper.join("gen/wh"));
    let cs = f.classify();
    assert!(has(&cs, "gen", ChangeOp::Put { new: Kind::Dir, old: None }));
    assert_eq!(cs.skipped, vec![PathBuf::from("gen/fifo")]);
    assert!(cs.fixups.contains(&Fixup::RemoveNode("gen/fifo".into())));
    if wh {
        assert!(cs.fixups.contains(&Fixup::RemoveNode("gen/wh".into())));
        assert!(!cs.added.contains(&PathBuf::from("gen/wh")));
    }
}

#[test]
fn the_state_directory_is_never_part_of_a_change_set() {
    let f = Fixture::new("exclude");
    write(&f.upper.join(".txbox/audit.log"), "forged");
    write(&f.upper.join("real"), "r");
    let cs = f.classify();
    assert_eq!(cs.added, vec![PathBuf::from("real")]);
    assert!(!cs.changes.iter().any(|c| c.path.starts_with(".txbox")));
}

fn set_xattr(p: &Path, name: &str, v: &[u8]) -> bool {
    rustix::fs::lsetxattr(p, name, v, rustix::fs::XattrFlags::empty()).is_ok()
}

fn dropped(cs: &ChangeSet) -> Vec<(String, String)> {
    cs.dropped_xattrs
        .iter()
        .map(|(p, n)| (p.to_string_lossy().into_owned(), n.to_string_lossy().into_owned()))
        .collect()
}

fn removes(cs: &ChangeSet, path: &str, name: &str) -> bool {
    cs.fixups.contains(&Fixup::RemoveXattr(path.into(), OsString::from(name)))
}

/// Names only root may set (file capabilities, `trusted.*`, `security.*` labels): set
/// directly on a hand-made upper layer, every kind of object the commit moves in loses them,
/// and each is reported. The allowlisted ones (`user.*`, POSIX ACLs) stay.
#[test]
fn only_allowlisted_xattrs_are_committed_on_every_kind_of_object() {
    if !txbox_txn_is_root() {
        eprintln!("SKIP privileged xattr names: setting security.* and trusted.* needs root");
        return;
    }
    let f = Fixture::new("allowlist");
    write(&f.lower.join("replaced"), "old");
    write(&f.lower.join("dir/keep"), "k");
    write(&f.upper.join("new"), "new");
    write(&f.upper.join("replaced"), "new content");
    write(&f.upper.join("tree/sub/deep"), "deep");
    std::fs::create_dir_all(f.upper.join("dir")).unwrap();
    set_mtime(&f.upper.join("dir"), &std::fs::metadata(f.lower.join("dir")).unwrap());
    // A file capability in the kernel's own format (v2: magic, permitted, inheritable).
    let cap = [0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let never = [
        ("security.capability", &cap[..]),
        ("security.selinux", b"system_u:object_r:shadow_t:s0\0"),
        ("security.SMACK64", b"_"),
        ("security.ima", b"\x03\x02"),
        ("trusted.x", b"t"),
        ("trusted.overlay.redirect", b"/etc"),
    ];
    let objects = ["new", "replaced", "tree", "tree/sub", "tree/sub/deep", "dir", ""];
    for rel in objects {
        let p = if rel.is_empty() { f.upper.clone() } else { f.upper.join(rel) };
        for (name, v) in never {
            // A capability only fits a regular file; labels on the upper root would be
            // taken for the host LSM's (see `labels_on_the_upper_root_are_the_hosts_lsm_labels`).
            if (name == "security.capability" && !p.is_file()) || (rel.is_empty() && name.starts_with("security.")) {
                continue;
            }
            assert!(set_xattr(&p, name, v), "{rel}: set {name}");
        }
        assert!(set_xattr(&p, "user.kept", rel.as_bytes()));
    }
    let cs = f.classify();
    let got = dropped(&cs);
    for rel in objects {
        let p = if rel.is_empty() { f.upper.clone() } else { f.upper.join(rel) };
        for (name, _) in never {
            if (name == "security.capability" && !p.is_file()) || (rel.is_empty() && name.starts_with("security.")) {
                continue;
            }
            assert!(got.contains(&(rel.to_string(), name.to_string())), "{rel} {name} not reported: {got:?}");
            // Directories present on both sides only get allowlisted names copied over;
            // objects moved in lose the others first.
            if !matches!(rel, "dir" | "") {
                assert!(removes(&cs, rel, name), "{rel} {name} not removed: {:#?}", cs.fixups);
            }
        }
        assert!(!removes(&cs, rel, "user.kept") && !got.iter().any(|(_, n)| n == "user.kept"));
    }
    let dir_attrs = txbox_txn::meta::committed_xattrs_of_upper(&f.upper.join("dir")).unwrap();
    assert_eq!(dir_attrs, vec![(OsString::from("user.kept"), b"dir".to_vec())]);
}

fn txbox_txn_is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Labels the host's LSM gives every new file are on the transaction's own upper root too:
/// they are the LSM's to keep, neither removed nor reported (file capabilities never are).
#[test]
fn labels_on_the_upper_root_are_the_hosts_lsm_labels() {
    if !txbox_txn_is_root() {
        eprintln!("SKIP LSM labels: setting security.* needs root");
        return;
    }
    let f = Fixture::new("lsm-labels");
    assert!(set_xattr(&f.upper, "security.selinux", b"unconfined_u:object_r:user_tmp_t:s0\0"));
    write(&f.upper.join("new"), "n");
    assert!(set_xattr(&f.upper.join("new"), "security.selinux", b"unconfined_u:object_r:user_tmp_t:s0\0"));
    assert!(set_xattr(&f.upper.join("new"), "security.SMACK64", b"x"));
    let cs = f.classify();
    assert_eq!(dropped(&cs), vec![("new".to_string(), "security.SMACK64".to_string())]);
    assert!(!removes(&cs, "new", "security.selinux"));
}

/// The command's `user.overlay.*` names (opaque, redirect, origin, metacopy, whiteout: what a
/// later overlay would act on) are never committed, on files, new directories and directories
/// present on both sides; a plain `user.*` name is committed exactly.
#[test]
fn the_commands_overlay_names_never_reach_the_workspace() {
    let f = Fixture::new("overlay-names");
    write(&f.lower.join("dir/x"), "x");
    write(&f.upper.join("new"), "n");
    write(&f.upper.join("newdir/inner"), "i");
    std::fs::create_dir_all(f.upper.join("dir")).unwrap();
    set_mtime(&f.upper.join("dir"), &std::fs::metadata(f.lower.join("dir")).unwrap());
    let names = ["redirect", "opaque", "origin", "metacopy", "whiteout", "overlay.deeper"];
    for rel in ["new", "newdir", "newdir/inner", "dir"] {
        for n in names {
            assert!(set_xattr(&f.upper.join(rel), &format!("user.overlay.overlay.{n}"), b"y"));
        }
        assert!(set_xattr(&f.upper.join(rel), "user.plain", b"v"));
    }
    let cs = f.classify();
    let got = dropped(&cs);
    for rel in ["new", "newdir", "newdir/inner", "dir"] {
        for n in names {
            assert!(got.contains(&(rel.to_string(), format!("user.overlay.{n}"))), "{rel} {n}: {got:?}");
            if rel != "dir" {
                assert!(removes(&cs, rel, &format!("user.overlay.overlay.{n}")), "{rel} {n}");
            }
        }
    }
    // The directory on both sides changes (a new attribute) and carries only the plain one.
    assert!(has(&cs, "dir", ChangeOp::DirMeta { visible: true }), "{cs:#?}");
    let dir_attrs = txbox_txn::meta::committed_xattrs_of_upper(&f.upper.join("dir")).unwrap();
    assert_eq!(dir_attrs, vec![(OsString::from("user.plain"), b"v".to_vec())]);
    // An escaped opaque marker is the command's, not overlay's: the directory is merged.
    assert!(!cs.changes.iter().any(|c| c.path == Path::new("dir/x")), "{cs:#?}");
}

/// A `trusted.overlay.opaque` set by the command (as root) does not make a directory replace
/// the workspace's: only overlay's own `userxattr` marker does.
#[test]
fn only_overlays_own_marker_makes_a_directory_opaque() {
    if !txbox_txn_is_root() {
        eprintln!("SKIP trusted.overlay.opaque: setting trusted.* needs root");
        return;
    }
    let f = Fixture::new("trusted-opaque");
    write(&f.lower.join("d/keep"), "k");
    std::fs::create_dir_all(f.upper.join("d")).unwrap();
    assert!(set_xattr(&f.upper.join("d"), "trusted.overlay.opaque", b"y"));
    write(&f.upper.join("d/new"), "n");
    let cs = f.classify();
    assert!(!cs.deleted.contains(&PathBuf::from("d/keep")), "{cs:#?}");
    assert!(dropped(&cs).contains(&("d".to_string(), "trusted.overlay.opaque".to_string())));
}

/// An unchanged copy-up is not committed, but what the command set on it off the allowlist is
/// still reported; what the workspace object already carried is not.
#[test]
fn drops_on_unchanged_copies_are_reported_and_inherited_ones_are_not() {
    let f = Fixture::new("noop-drops");
    write(&f.lower.join("a"), "a");
    write(&f.lower.join("b"), "b");
    assert!(set_xattr(&f.lower.join("b"), "user.overlay.overlay.x", b"old damage"));
    copy_up(&f, "a");
    copy_up(&f, "b");
    assert!(set_xattr(&f.upper.join("a"), "user.overlay.overlay.redirect", b"/x"));
    assert!(set_xattr(&f.upper.join("b"), "user.overlay.overlay.x", b"old damage"));
    let cs = f.classify();
    assert!(cs.changes.is_empty(), "{cs:#?}");
    assert_eq!(dropped(&cs), vec![("a".to_string(), "user.overlay.redirect".to_string())]);
}

/// The bytes a commit adds: allocated blocks of what moves in, a sparse file's data only,
/// `fallocate`d space in full, a hard-linked inode once, unchanged copies not at all.
#[test]
fn bytes_count_allocated_blocks_of_what_the_commit_moves_in() {
    let f = Fixture::new("bytes");
    write(&f.lower.join("same"), &"s".repeat(100_000));
    copy_up(&f, "same");
    let sparse = std::fs::File::create(f.upper.join("sparse")).unwrap();
    sparse.set_len(1 << 30).unwrap();
    let big = std::fs::File::create(f.upper.join("fallocated")).unwrap();
    rustix::fs::fallocate(&big, rustix::fs::FallocateFlags::empty(), 0, 8 << 20).unwrap();
    write(&f.upper.join("tree/a"), &"a".repeat(10_000));
    std::fs::hard_link(f.upper.join("tree/a"), f.upper.join("tree/b")).unwrap();
    let cs = f.classify();
    let blocks = |p: &str| std::fs::symlink_metadata(f.upper.join(p)).unwrap().blocks() * 512;
    let want = blocks("sparse") + blocks("fallocated") + blocks("tree") + blocks("tree/a");
    assert_eq!(cs.bytes, want, "{cs:#?}");
    assert!(blocks("fallocated") >= 8 << 20 && blocks("sparse") < 1 << 20);
}
