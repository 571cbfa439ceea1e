//! The files of the disk tier: which directories it writes into, how a file is written so that no
//! other local user can choose what it overwrites, and how one is read back. Every failure is an
//! [`Error`] naming the argument (`path`, `disk_dir`) and the path, never an I/O error.
//!
//! - A directory written into must exist, be a directory, and not be writable by every user
//!   unless it has the sticky bit (like `/tmp`): in a world-writable directory without it, any
//!   user may rename or replace the files another user made there.
//! - A file is written to a temporary name with a random part, created exclusively
//!   (`O_CREAT | O_EXCL`, mode 0600): an exclusive create fails on any existing name, a symbolic
//!   link included, so nothing planted in advance is followed or overwritten. It is synced, then
//!   renamed over the target (`rename` replaces a link at the target, it never follows it), and
//!   the directory is synced: a reader sees the old file or the new one, never half of one.
//! - A private directory (the host tier's spill directory) is created exclusively, mode 0700,
//!   under a random name inside the directory it is given ([`PrivateDir`]); dropped, it removes
//!   the files it named and then itself, following no link and leaving whatever else is there.

use crate::error::{Error, Result};
use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{ErrorKind as IoKind, Write};
use std::path::{Path, PathBuf};

/// Tries of a random name before giving up (each collides only with a name that exists).
const TRIES: usize = 16;

fn io_error(what: &str, path: &Path, doing: &str, e: &std::io::Error) -> Error {
    let why = match e.kind() {
        IoKind::NotFound => "it does not exist".to_string(),
        IoKind::PermissionDenied => "permission denied".to_string(),
        IoKind::AlreadyExists => "it already exists".to_string(),
        _ => e.to_string(),
    };
    Error::binding(format!("{what}: cannot {doing} {}: {why}", path.display()))
}

/// A fresh random 64-bit value (std's per-process random hash keys, mixed with the time and a
/// counter): the random part of temporary names, and the tag of a host tier's files.
pub fn random_u64() -> u64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// Checks that `dir` (the argument `what`) is a directory files may safely be written into:
/// it exists, is a directory, and is not writable by every user unless its sticky bit is set.
pub fn check_dir(dir: &Path, what: &str) -> Result<()> {
    let meta = fs::metadata(dir).map_err(|e| io_error(what, dir, "use the directory", &e))?;
    if !meta.is_dir() {
        return Err(Error::binding(format!("{what}: {} is not a directory", dir.display())));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if mode & 0o002 != 0 && mode & 0o1000 == 0 {
            return Err(Error::binding(format!(
                "{what}: {} is writable by every user and has no sticky bit (mode {:o}): another user could replace the files \
                 written there; use a directory only this user can write (mode 0700) or one with the sticky bit (like /tmp)",
                dir.display(),
                mode & 0o7777
            )));
        }
    }
    Ok(())
}

/// The directory a file `path` lives in (`.` for a bare name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates a new private directory (mode 0700, created exclusively under a random name
/// `<prefix>-<random>`) inside `dir` (checked with [`check_dir`]); returns its path.
pub fn private_dir(dir: &Path, prefix: &str, what: &str) -> Result<PathBuf> {
    check_dir(dir, what)?;
    let mut builder = fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    for _ in 0..TRIES {
        let p = dir.join(format!("{prefix}-{:016x}", random_u64()));
        match builder.create(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == IoKind::AlreadyExists => continue,
            Err(e) => return Err(io_error(what, &p, "create the directory", &e)),
        }
    }
    Err(Error::binding(format!("{what}: no free name for a private directory in {}", dir.display())))
}

/// A private directory a host tier made ([`private_dir`]), removed when dropped: the files named
/// through [`PrivateDir::file`] that are still regular files there (a link in one's place is left,
/// never followed), then the directory itself when nothing else is left in it and it is still the
/// directory that was made (not a link or another directory put in its place). Nothing outside it
/// is touched: the directory it was made in and whatever else was put inside stay as they are.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    /// The device and inode of the directory made (unix).
    id: Option<(u64, u64)>,
    /// The names of the files handed out for writing.
    names: BTreeSet<String>,
}

#[cfg(unix)]
fn dir_id(m: &fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn dir_id(_: &fs::Metadata) -> Option<(u64, u64)> {
    None
}

impl PrivateDir {
    /// Makes a private directory in `dir` as [`private_dir`] does.
    pub fn create(dir: &Path, prefix: &str, what: &str) -> Result<PrivateDir> {
        let path = private_dir(dir, prefix, what)?;
        let id = fs::symlink_metadata(&path).ok().as_ref().and_then(dir_id);
        Ok(PrivateDir { path, id, names: BTreeSet::new() })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of the file `name` (a bare file name) in the directory, removed with it when
    /// dropped.
    pub fn file(&mut self, name: &str) -> Result<PathBuf> {
        check_bare(name)?;
        self.names.insert(name.to_string());
        Ok(self.path.join(name))
    }

    /// Removes the file `name` (the argument `what`) if it exists, and forgets it: a tier that
    /// spills and removes entries for as long as it runs holds no name it no longer uses. The
    /// name is forgotten only once the file is gone (an error leaves it to be removed on drop).
    pub fn remove_file(&mut self, name: &str, what: &str) -> Result<()> {
        check_bare(name)?;
        remove(&self.path.join(name), what)?;
        self.names.remove(name);
        Ok(())
    }

    /// How many file names the directory holds for removal on drop.
    pub fn names_held(&self) -> usize {
        self.names.len()
    }
}

fn check_bare(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(std::path::is_separator) {
        return Err(Error::binding(format!("{name:?} is not a bare file name")));
    }
    Ok(())
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        match fs::symlink_metadata(&self.path) {
            Ok(m) if m.is_dir() && (self.id.is_none() || dir_id(&m) == self.id) => {}
            _ => return, // gone, or no longer the directory made: nothing is touched
        }
        for name in &self.names {
            let p = self.path.join(name);
            if fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_file()) {
                let _ = fs::remove_file(&p); // unlinks the name, follows nothing
            }
        }
        let _ = fs::remove_dir(&self.path); // only when empty: what else was put there stays
    }
}

/// Writes `parts` back to back to `target` (the argument `what`) atomically, as the module says;
/// returns the bytes written. On any failure the target is unchanged and the temporary removed.
pub fn write_atomic(target: &Path, parts: &[&[u8]], what: &str) -> Result<u64> {
    let dir = parent(target);
    check_dir(dir, what)?;
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if name.is_empty() {
        return Err(Error::binding(format!("{what}: {} names no file", target.display())));
    }
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let (tmp, mut file) = (0..TRIES)
        .find_map(|_| {
            let tmp = dir.join(format!(".{name}.{:016x}.tmp", random_u64()));
            match opts.open(&tmp) {
                Ok(f) => Some(Ok((tmp, f))),
                Err(e) if e.kind() == IoKind::AlreadyExists => None,
                Err(e) => Some(Err(io_error(what, &tmp, "create the temporary file", &e))),
            }
        })
        .unwrap_or_else(|| Err(Error::binding(format!("{what}: no free temporary name in {}", dir.display()))))?;
    let written = (|| -> std::io::Result<u64> {
        let mut n = 0u64;
        for p in parts {
            file.write_all(p)?;
            n += p.len() as u64;
        }
        file.sync_all()?;
        Ok(n)
    })();
    drop(file);
    let done = written.map_err(|e| io_error(what, &tmp, "write", &e)).and_then(|n| {
        fs::rename(&tmp, target).map_err(|e| io_error(what, target, "replace", &e))?;
        Ok(n)
    });
    match done {
        Ok(n) => {
            // The rename is durable once the directory is synced (best effort: some file
            // systems refuse to sync a directory).
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(n)
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The bytes of the file `path` (the argument `what`).
pub fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    let meta = fs::metadata(path).map_err(|e| io_error(what, path, "read", &e))?;
    if !meta.is_file() {
        return Err(Error::binding(format!("{what}: {} is not a regular file", path.display())));
    }
    fs::read(path).map_err(|e| io_error(what, path, "read", &e))
}

/// Removes the file `path` if it exists (the argument `what`).
pub fn remove(path: &Path, what: &str) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == IoKind::NotFound => Ok(()),
        Err(e) => Err(io_error(what, path, "remove", &e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rs-files-{name}-{:x}", random_u64()));
        fs::create_dir(&d).unwrap();
        d
    }

    #[test]
    fn writes_atomically_and_never_follows_a_planted_link() {
        let d = scratch("write");
        let victim = d.join("victim");
        fs::write(&victim, b"keep").unwrap();
        let target = d.join("out.bin");
        // Links at every name a temporary could have had before: none is followed.
        #[cfg(unix)]
        std::os::unix::fs::symlink(&victim, d.join(format!(".out.bin.{}.tmp", std::process::id()))).unwrap();
        assert_eq!(write_atomic(&target, &[b"ab", b"cd"], "path").unwrap(), 4);
        assert_eq!(fs::read(&target).unwrap(), b"abcd");
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        // A link planted at the target itself is replaced, not written through.
        #[cfg(unix)]
        {
            let link = d.join("link.bin");
            std::os::unix::fs::symlink(&victim, &link).unwrap();
            write_atomic(&link, &[b"new"], "path").unwrap();
            assert_eq!(fs::read(&victim).unwrap(), b"keep");
            assert!(!fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        }
        let tmps = fs::read_dir(&d).unwrap().filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().ends_with(".tmp")).count();
        assert_eq!(tmps, usize::from(cfg!(unix))); // only the planted link is left
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_missing_and_unsafe_directories() {
        let d = scratch("dirs");
        let e = write_atomic(&d.join("no/such/f"), &[b"x"], "path").unwrap_err();
        assert!(e.message.starts_with("path: cannot use the directory") && e.message.contains("does not exist"), "{}", e.message);
        assert!(read(&d.join("none"), "path").unwrap_err().message.contains("does not exist"));
        assert!(read(&d, "path").unwrap_err().message.contains("not a regular file"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let open = d.join("open");
            fs::create_dir(&open).unwrap();
            fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
            let m = private_dir(&open, "spill", "disk_dir").unwrap_err().message;
            assert!(m.contains("writable by every user and has no sticky bit"), "{m}");
            fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
            let p = private_dir(&open, "spill", "disk_dir").unwrap();
            assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o700);
        }
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_removed_file_is_forgotten_so_a_long_lived_dir_holds_only_live_names() {
        let d = scratch("forget");
        let mut p = PrivateDir::create(&d, "spill", "disk_dir").unwrap();
        for i in 0..1000 {
            let name = format!("entry-{i}.safetensors");
            fs::write(p.file(&name).unwrap(), b"x").unwrap();
            p.remove_file(&name, "disk_dir").unwrap();
        }
        assert_eq!(p.names_held(), 0, "every removed file's name was forgotten");
        let kept = p.file("entry-kept.safetensors").unwrap();
        fs::write(&kept, b"x").unwrap();
        p.remove_file("entry-never-written.safetensors", "disk_dir").unwrap(); // absent: nothing to do
        assert!(p.remove_file("../x", "disk_dir").is_err());
        assert_eq!(p.names_held(), 1);
        let made = p.path().to_path_buf();
        drop(p);
        assert!(!made.exists(), "the live file went with the directory");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_private_dir_removes_what_it_wrote_and_itself_when_dropped() {
        let d = scratch("private");
        fs::write(d.join("keep"), b"mine").unwrap();
        let mut p = PrivateDir::create(&d, "spill", "disk_dir").unwrap();
        let made = p.path().to_path_buf();
        fs::write(p.file("entry-1.safetensors").unwrap(), b"x").unwrap();
        p.file("entry-2.safetensors").unwrap(); // handed out, never written
        assert!(p.file("../keep").is_err() && p.file("..").is_err() && p.file("").is_err());
        drop(p);
        assert!(!made.exists());
        assert_eq!(fs::read(d.join("keep")).unwrap(), b"mine");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1); // the directory it was made in, as it was
        #[cfg(unix)]
        {
            use std::os::unix::fs::symlink;
            // A link in a written file's place is not followed; what it did not write stays, and
            // so does the directory holding it.
            let victim = d.join("victim");
            fs::create_dir(&victim).unwrap();
            fs::write(victim.join("data"), b"keep").unwrap();
            let mut p = PrivateDir::create(&d, "spill", "disk_dir").unwrap();
            let made = p.path().to_path_buf();
            symlink(victim.join("data"), p.file("entry-1.safetensors").unwrap()).unwrap();
            fs::write(p.file("entry-2.safetensors").unwrap(), b"x").unwrap();
            symlink(&victim, made.join("planted")).unwrap();
            drop(p);
            assert_eq!(fs::read(victim.join("data")).unwrap(), b"keep");
            let mut left: Vec<_> = fs::read_dir(&made).unwrap().map(|e| e.unwrap().file_name()).collect();
            left.sort();
            assert_eq!(left, ["entry-1.safetensors", "planted"]);
            // Another directory put in the made one's place is not touched.
            let mut p = PrivateDir::create(&d, "spill", "disk_dir").unwrap();
            let (made, file) = (p.path().to_path_buf(), p.file("entry-1.safetensors").unwrap());
            fs::rename(&made, d.join("moved")).unwrap();
            fs::create_dir(&made).unwrap();
            fs::write(&file, b"other").unwrap();
            drop(p);
            assert_eq!(fs::read(&file).unwrap(), b"other");
            // A link put in its place is not followed.
            let mut p = PrivateDir::create(&d, "spill", "disk_dir").unwrap();
            let (made, file) = (p.path().to_path_buf(), p.file("data").unwrap());
            fs::remove_dir(&made).unwrap();
            symlink(&victim, &made).unwrap();
            assert!(file.exists());
            drop(p);
            assert_eq!(fs::read(victim.join("data")).unwrap(), b"keep");
        }
        fs::remove_dir_all(&d).unwrap();
    }
}
