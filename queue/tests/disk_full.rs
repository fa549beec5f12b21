//! A full disk: the database on a tiny tmpfs. Submits fail with a clear error and nothing already
//! stored is damaged. Mounting needs root, so the test is `#[ignore]`d: a plain `cargo test`
//! counts it as ignored, where it shows, and `.ci/run` (root) runs it with `--ignored`, where a
//! mount that fails is a failure, not a skip.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use taskbridge_queue::{Error, Store, TaskId, TaskSpec};

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
#[ignore = "needs root to mount a tmpfs; .ci/run runs it: cargo test --workspace --test disk_full -- --ignored"]
fn a_full_disk_refuses_submits_and_keeps_what_was_stored() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=400k", "tmpfs"])
        .arg(&mnt)
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "cannot mount a tmpfs here: this test needs root (and CAP_SYS_ADMIN)");
    let _mount = Mount(mnt.clone());
    let store = Store::open(mnt.join("q.db")).unwrap();
    let prompt = "x".repeat(8 * 1024);
    let mut stored = Vec::new();
    let err = loop {
        match store.submit(TaskSpec::new(
            prompt.clone(),
            "/tmp/repo",
            "0123456789abcdef0123456789abcdef01234567",
        )) {
            Ok((t, _)) => stored.push(t.id),
            Err(e) => break e,
        }
        assert!(stored.len() < 10_000, "the disk never filled");
    };
    assert!(matches!(err, Error::DiskFull(_)), "{err:?}");
    assert!(
        err.to_string().contains("disk full") && err.to_string().contains("free some space"),
        "{err}"
    );
    assert!(!stored.is_empty());
    // Everything acknowledged before is intact, in this handle and a fresh one.
    assert_eq!(store.integrity_check().unwrap(), "ok");
    drop(store);
    let store = Store::open(mnt.join("q.db")).unwrap();
    assert_eq!(store.integrity_check().unwrap(), "ok");
    for id in &stored {
        assert_eq!(store.get(*id).unwrap().prompt.len(), prompt.len());
    }
    assert!(
        store.get(TaskId(stored.len() as i64 + 1)).is_err(),
        "the refused submit wrote nothing"
    );
}
