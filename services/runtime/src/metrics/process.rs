//! The process's own figures, read at each scrape under the names Prometheus's client libraries
//! use: CPU time, resident and virtual memory, open and allowed file descriptors, start time.
//! Linux only (`/proc/self`); elsewhere only the CPU time is known.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use metrics::{describe_gauge, gauge};
use nix::sys::resource::{Resource, UsageWho, getrlimit, getrusage};

/// When the recorder was installed: the start of the service, near enough.
static STARTED: OnceLock<f64> = OnceLock::new();
/// The service's data directory, whose file system's free space is reported.
static DATA_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Reports the free and total bytes of the file system holding `dir` at each scrape
/// (`ps_disk_free_bytes`, `ps_disk_total_bytes`): a service with durable state calls it once.
pub fn watch_disk(dir: &Path) {
    describe_gauge!(
        "ps_disk_free_bytes",
        "Bytes free to the service on the file system of its data directory."
    );
    describe_gauge!(
        "ps_disk_total_bytes",
        "Size of the file system of the service's data directory, in bytes."
    );
    let _ = DATA_DIR.set(dir.to_owned());
    record();
}

pub(super) fn describe() {
    describe_gauge!(
        "process_cpu_seconds_total",
        "User and system CPU time spent by the process, in seconds."
    );
    describe_gauge!(
        "process_resident_memory_bytes",
        "Resident memory of the process, in bytes."
    );
    describe_gauge!(
        "process_virtual_memory_bytes",
        "Virtual memory of the process, in bytes."
    );
    describe_gauge!("process_open_fds", "Open file descriptors.");
    describe_gauge!(
        "process_max_fds",
        "Most file descriptors the process may open."
    );
    describe_gauge!(
        "process_start_time_seconds",
        "Start of the process, in seconds since the Unix epoch."
    );
}

/// The CPU time this process has used so far, in seconds (user and system).
pub fn cpu_seconds() -> f64 {
    getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| {
        let (user, sys) = (u.user_time(), u.system_time());
        user.tv_sec() as f64 + sys.tv_sec() as f64 + (user.tv_usec() + sys.tv_usec()) as f64 / 1e6
    })
}

pub(super) fn record() {
    let started = *STARTED.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    });
    gauge!("process_start_time_seconds").set(started);
    gauge!("process_cpu_seconds_total").set(cpu_seconds());
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<f64>()
                        .ok()
                })
                .map(|k| k * 1024.0)
        };
        if let Some(rss) = kib("VmRSS:") {
            gauge!("process_resident_memory_bytes").set(rss);
        }
        if let Some(vm) = kib("VmSize:") {
            gauge!("process_virtual_memory_bytes").set(vm);
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        gauge!("process_open_fds").set(fds.count() as f64);
    }
    if let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NOFILE) {
        gauge!("process_max_fds").set(soft as f64);
    }
    if let Some(dir) = DATA_DIR.get()
        && let Ok(fs) = nix::sys::statvfs::statvfs(dir)
    {
        let unit = fs.fragment_size() as f64;
        gauge!("ps_disk_free_bytes").set(fs.blocks_available() as f64 * unit);
        gauge!("ps_disk_total_bytes").set(fs.blocks() as f64 * unit);
    }
}
