//! Services as child processes, the one way the project starts them: `psctl local`, the
//! cross-service tests and the crash tests all go through [`Service`].
//!
//! A child is started with its output in a log file and `--ready-file` pointing into the same
//! folder; [`Service::ready`] waits until the child has written that file (it then serves on
//! the addresses it names), or fails with the child's last log lines when it exits first.
//! Services bind port 0 themselves and report the port they got, so no free port is guessed,
//! handed on and raced for. [`Service::stop`] is SIGTERM and a grace period (the services'
//! clean shutdown); [`Service::kill`] is SIGKILL, a crash. A child is killed when dropped.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
pub use ps_runtime::ready::Ready;

/// How often a waiting launcher looks at a child's ready file and exit status.
const POLL: Duration = Duration::from_millis(20);

/// The directory of the workspace's binaries: the running executable's, or the one above it
/// (a test executable lives in `target/<profile>/deps`).
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("the executable's directory")?;
    [Some(dir), dir.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .with_context(|| {
            format!(
                "{name} is not in {} or the folder above: build the workspace first \
                 (cargo build --release --workspace)",
                dir.display()
            )
        })
}

/// A child process of the launcher, with its log file. Killed when dropped.
#[derive(Debug)]
pub struct Service {
    name: String,
    child: Child,
    log: PathBuf,
    ready_file: PathBuf,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    /// Starts `bin` with `args`, its stdout and stderr going to `<logs>/<name>.log` (appended
    /// to, so a restarted service keeps its history), and `--ready-file <logs>/<name>.ready`
    /// added when `ready_file` is set (services take it; the worker does not).
    pub fn spawn(
        bin: &Path,
        name: &str,
        args: &[String],
        logs: &Path,
        ready_file: bool,
    ) -> anyhow::Result<Self> {
        Self::spawn_with_env(bin, name, args, logs, ready_file, &[])
    }

    /// [`Service::spawn`] with `env` set for the child besides what it inherits (an OTLP
    /// collector's address, say).
    pub fn spawn_with_env(
        bin: &Path,
        name: &str,
        args: &[String],
        logs: &Path,
        ready_file: bool,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(logs).with_context(|| format!("creating {}", logs.display()))?;
        let log = logs.join(format!("{name}.log"));
        let ready = logs.join(format!("{name}.ready"));
        // A file a previous run left must not pass for this one's.
        match std::fs::remove_file(&ready) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", ready.display())),
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.args(args);
        if ready_file {
            cmd.arg("--ready-file").arg(&ready);
        }
        cmd.envs(env.iter().copied());
        let child = cmd
            .env("NO_COLOR", "1")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log,
            ready_file: ready,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// User + system CPU seconds the child has used so far (Linux: `/proc/<pid>/stat`).
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        stat_cpu_seconds(Path::new(&format!("/proc/{}/stat", self.id())))
    }

    /// User + system CPU seconds the child's threads whose names start with `prefix` have used
    /// so far (Linux: `/proc/<pid>/task/<tid>/stat`; a thread that has ended counts no more).
    pub fn threads_cpu_seconds(&self, prefix: &str) -> anyhow::Result<f64> {
        let mut total = 0.0;
        for task in std::fs::read_dir(format!("/proc/{}/task", self.id()))? {
            let dir = task?.path();
            // A thread may end between the listing and the reads.
            let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
                continue;
            };
            if comm.starts_with(prefix)
                && let Ok(cpu) = stat_cpu_seconds(&dir.join("stat"))
            {
                total += cpu;
            }
        }
        Ok(total)
    }

    /// The log file the child writes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Waits until the child announces it is ready, and returns its addresses. Fails when it
    /// exits first (with its last log lines) or after `timeout`.
    pub async fn ready(&mut self, timeout: Duration) -> anyhow::Result<Ready> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = Ready::read(&self.ready_file).filter(|r| r.pid == self.id()) {
                return Ok(r);
            }
            self.check()?;
            if Instant::now() > deadline {
                bail!(
                    "{} was not ready within {timeout:?}; its log ends:\n{}",
                    self.name,
                    self.tail()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Kills the process at once (SIGKILL), as a crash would, and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits up to `grace` for the process to exit (killing it after that).
    /// Returns its exit status when it exited by itself.
    pub async fn stop(mut self, grace: Duration) -> Option<ExitStatus> {
        self.terminate();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            tokio::time::sleep(POLL).await;
        }
        None
    }

    /// Sends SIGTERM and returns at once.
    pub fn terminate(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }

    /// Waits up to `timeout` for the process to exit by itself; its status when it did.
    pub async fn wait(&mut self, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(Some(s));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The exit status, when the process has exited.
    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// An error (with the log's last lines) when the process has exited.
    pub fn check(&mut self) -> anyhow::Result<()> {
        if let Some(s) = self.child.try_wait()? {
            bail!(
                "{} exited with {s}; its log ends:\n{}",
                self.name,
                self.tail()
            );
        }
        Ok(())
    }

    /// The last lines of the process's log.
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

/// User + system CPU seconds in a `/proc` stat file (a process's or a thread's).
fn stat_cpu_seconds(path: &Path) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(path)?;
    let after = stat
        .rsplit_once(')')
        .ok_or_else(|| anyhow::anyhow!("{}: no command field", path.display()))?
        .1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| -> anyhow::Result<f64> {
        Ok(f.get(i)
            .ok_or_else(|| anyhow::anyhow!("{}: short", path.display()))?
            .parse::<f64>()?)
    };
    // utime and stime, in clock ticks (USER_HZ, 100 on Linux).
    Ok((field(11)? + field(12)?) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_busy_childs_cpu_is_counted_and_its_threads_by_name() {
        let dir = tempfile::tempdir().unwrap();
        // A shell spinning (no child processes: their CPU is not the shell's), its one thread
        // named after its command; it is killed long before it counts to the end.
        let args = [
            "-c".to_owned(),
            "i=0; while [ $i -lt 1000000000 ]; do i=$((i + 1)); done".to_owned(),
        ];
        let mut s = Service::spawn(Path::new("/bin/sh"), "sh", &args, dir.path(), false).unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let (all, sh, none) = (
            s.cpu_seconds().unwrap(),
            s.threads_cpu_seconds("sh").unwrap(),
            s.threads_cpu_seconds("no-such-thread").unwrap(),
        );
        s.kill();
        assert!(all >= 0.2, "{all}");
        assert!(sh > 0.0 && sh <= all + 0.05, "{sh} of {all}");
        assert_eq!(none, 0.0);
    }

    #[tokio::test]
    async fn a_child_that_exits_before_it_is_ready_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let args = ["-c".to_owned(), "echo 'no such flag'; exit 3".to_owned()];
        let mut s = Service::spawn(Path::new("/bin/sh"), "sh", &args, dir.path(), false).unwrap();
        let e = s.ready(Duration::from_secs(10)).await.unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains("sh exited") && e.contains("no such flag"), "{e}");
    }

    #[tokio::test]
    async fn a_ready_file_of_another_process_is_not_taken_for_the_childs() {
        let dir = tempfile::tempdir().unwrap();
        // The child writes a file naming another pid, then one naming itself.
        let stale = r#"{"pid":1,"grpc":"127.0.0.1:1","metrics":null,"bulk":null}"#;
        let script = format!(
            "printf '%s' '{stale}' > \"$1\"; sleep 0.3; \
             printf '{{\"pid\":%d,\"grpc\":\"127.0.0.1:2\",\"metrics\":null,\"bulk\":null}}' $$ > \"$1\"; sleep 5"
        );
        let ready = dir.path().join("sh.ready");
        let args = [
            "-c".to_owned(),
            script,
            "sh".to_owned(),
            ready.display().to_string(),
        ];
        let mut s = Service::spawn(Path::new("/bin/sh"), "sh", &args, dir.path(), false).unwrap();
        let r = s.ready(Duration::from_secs(10)).await.unwrap();
        assert_eq!(r.grpc.port(), 2);
        s.kill();
        assert!(s.exited().unwrap().is_some());
    }
}
