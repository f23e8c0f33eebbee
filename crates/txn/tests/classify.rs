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
    let copied = txbox_txn::meta::user_xattrs_of_upper(&f.upper.join("d")).unwrap();
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
fn overlay_xattrs_are_dropped_and_escaped_ones_restored() {
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
    assert!(
        cs.fixups.contains(&Fixup::Unescape {
            path: "f".into(),
            escaped: OsString::from("user.overlay.overlay.mine"),
            real: OsString::from("user.overlay.mine")
        }),
        "{:#?}",
        cs.fixups
    );
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
        cs.fixups.contains(&Fixup::Unescape {
            path: "gen/sub/y".into(),
            escaped: OsString::from("user.overlay.overlay.mine"),
            real: OsString::from("user.overlay.mine")
        }),
        "{:#?}",
        cs.fixups
    );
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
