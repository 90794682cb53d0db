//! The user's key file, from which jobs started by a launcher that shares no secret with
//! its tasks (Slurm's `srun`) derive their job secret: `DSM_KEY_FILE`, by default
//! `~/.config/dsm/job-key`. It holds 128 random bits in hex and is readable by its owner
//! only; the first job that needs it makes it, atomically, so concurrent ranks on one host
//! all read the same key. A key file others can read is refused rather than trusted.

use dsm_proto::env_vars;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where the key lives: `DSM_KEY_FILE`, else `$HOME/.config/dsm/job-key`.
pub fn key_path() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(env_vars::KEY_FILE).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or("HOME is not set; set DSM_KEY_FILE to the key file's path")?;
    Ok(Path::new(&home).join(".config/dsm/job-key"))
}

/// Reads the user's key, making the file first if it does not exist.
pub fn load_or_create() -> Result<String, String> {
    load_or_create_at(&key_path()?)
}

/// [`load_or_create`] at an explicit path.
pub fn load_or_create_at(path: &Path) -> Result<String, String> {
    let shown = path.display();
    if !path.exists() {
        let dir = path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        // Written in full under a private name, then linked into place: a concurrent
        // reader sees either no file or the whole key, and the first link wins.
        let bytes: [u8; 16] = rand::random();
        let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let tmp = dir.join(format!(".job-key.{}", std::process::id()));
        let written = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(format!("{key}\n").as_bytes()));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(format!(
                "cannot write a new key file {}: {e}",
                tmp.display()
            ));
        }
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create the key file {shown}: {e}")),
        }
    }
    let meta = fs::metadata(path).map_err(|e| format!("cannot read the key file {shown}: {e}"))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "the key file {shown} is readable by others (mode {:o}); `chmod 600 {shown}`",
            meta.permissions().mode() & 0o777
        ));
    }
    // Another user's key would key jobs that user can join.
    let uid = fs::metadata("/proc/self").map(|m| m.uid()).ok();
    if uid.is_some_and(|u| u != meta.uid()) {
        return Err(format!("the key file {shown} belongs to another user"));
    }
    let key = fs::read_to_string(path)
        .map_err(|e| format!("cannot read the key file {shown}: {e}"))?
        .trim()
        .to_owned();
    if key.len() < 16 {
        return Err(format!(
            "the key file {shown} holds no key (fewer than 16 characters); delete it to get a new one"
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_made_once_privately_and_read_back() {
        let dir = std::env::temp_dir().join(format!("dsm-key-test-{}", std::process::id()));
        let path = dir.join("sub/job-key");
        let a = load_or_create_at(&path).unwrap();
        assert_eq!(a.len(), 32);
        assert_eq!(load_or_create_at(&path).unwrap(), a);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = load_or_create_at(&path).unwrap_err();
        assert!(err.contains("readable by others"), "{err}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, "short\n").unwrap();
        assert!(load_or_create_at(&path)
            .unwrap_err()
            .contains("holds no key"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
