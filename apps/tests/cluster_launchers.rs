//! dsm programs started by real cluster launchers, without dsmrun and with no `DSM_*`
//! variable set by hand: Open MPI's `mpirun` (Debian's openmpi-bin, installed here when
//! missing and this is root) and Slurm's `srun` (a local slurmctld + slurmd + munged set up
//! by scripts/slurm-local.sh). Each rank finds its rank, the job size, rank 0's rendezvous
//! and the job secret from the launcher's own environment; SOR's result is verified
//! against the sequential reference. Where a launcher cannot run, the test says why.

use dsm_testkit as kit;
use std::path::Path;
use std::process::{Command, Stdio};

/// The tests install packages (apt-get holds one lock) and run daemons: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Installs the Debian `packages` when `binary` is missing (root only).
fn ensure_installed(binary: &str, packages: &[&str]) -> Result<(), String> {
    dsm_testkit::ensure_installed(&[binary], packages)
}

/// A command with every `DSM_*` variable removed, so nothing is set by hand.
fn without_dsm_vars(program: &str) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("DSM_") {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

#[test]
fn mpirun_starts_sor_without_dsmrun() {
    const TEST: &str = "mpirun_starts_sor_without_dsmrun";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(why) = ensure_installed("/usr/bin/mpirun", &["openmpi-bin"]) {
        kit::skip(TEST, &format!("Open MPI is not available: {why}"));
        return;
    }
    let mut cmd = without_dsm_vars("/usr/bin/mpirun");
    if is_root() {
        cmd.arg("--allow-run-as-root");
    }
    // 4 ranks on a 2-core machine; the shared-memory transport is not needed by dsm.
    cmd.args(["--oversubscribe", "-n", "4"])
        .arg(kit::bin("sor"))
        .args(["--size", "256", "--iters", "10"]);
    let r = kit::run(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout
            .contains("verified: sor 256x256, 10 iterations, 4 nodes: bitwise identical"),
        "{r:?}"
    );
}

/// The local Slurm of scripts/slurm-local.sh in a temporary directory; stopped on drop.
struct LocalSlurm {
    script: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl LocalSlurm {
    fn start() -> Result<LocalSlurm, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/slurm-local.sh");
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let slurm = LocalSlurm { script, dir };
        // Ports of its own, so that it cannot meet another run's daemons.
        let base = 17_000 + (std::process::id() % 1000) * 2;
        let out = Command::new("sh")
            .arg(&slurm.script)
            .arg("start")
            .arg(slurm.dir.path())
            .env("SLURMCTLD_PORT", base.to_string())
            .env("SLURMD_PORT", (base + 1).to_string())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", slurm.script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} start failed ({}): {}",
                slurm.script.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(slurm)
    }

    fn conf(&self) -> std::path::PathBuf {
        self.dir.path().join("slurm.conf")
    }
}

impl Drop for LocalSlurm {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .arg(&self.script)
            .arg("stop")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .status();
    }
}

#[test]
fn srun_starts_sor_without_dsmrun() {
    const TEST: &str = "srun_starts_sor_without_dsmrun";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        kit::skip(TEST, "the local Slurm (slurmd) needs root");
        return;
    }
    let slurm = match LocalSlurm::start() {
        Ok(s) => s,
        Err(why) => {
            kit::skip(TEST, &format!("cannot run a local Slurm here: {why}"));
            return;
        }
    };
    // The job secret comes from the user's key file; a home of the test's own keeps the
    // key it makes out of the real one. No DSM_* variable is set.
    let home = slurm.dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = without_dsm_vars("srun");
    cmd.env("SLURM_CONF", slurm.conf())
        .env("HOME", &home)
        .args(["-n", "4", "--overcommit", "--time", "2"])
        .arg(kit::bin("sor"))
        .args(["--size", "256", "--iters", "10"]);
    let r = kit::run(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout
            .contains("verified: sor 256x256, 10 iterations, 4 nodes: bitwise identical"),
        "{r:?}"
    );
    let key = home.join(".config/dsm/job-key");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", key.display());
}
