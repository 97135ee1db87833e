//! Reading the push log's pages ahead of its head, on a thread of its own, during the log's
//! first lap in this process: so that the writer, which writes an image of every dense cell
//! (tens of MiB) in one go, writes into page-cache pages that exist instead of waiting while
//! the kernel allocates and zeroes each one.
//!
//! A new page costs its allocation and zeroing: overwriting a cached page is about twice as
//! fast as a first write on bare metal, and on a virtual machine whose memory the host has
//! not yet backed, about twenty times (ps-bench, 16 M floats, 2 shards × 2 clients: an image
//! of 64 MiB took 134-172 ms on the writer thread instead of 12-32 ms, which is what the
//! pushes queued behind it waited). After one lap every page of the log has been written and
//! stays cached while memory allows, so the thread then ends.
//!
//! What it reads is discarded; it never writes, so a page it reads while the writer writes it
//! changes nothing. Any error ends it: warming is an optimisation, never needed.
//!
//! It reads without read-ahead (`POSIX_FADV_RANDOM` on the log's open file, which the log's
//! own writes and reads share), so that the pages it brings in are single pages. Read-ahead
//! brings a file read in order into the cache as large folios (up to 2 MiB with ext4 on Linux
//! 6.18), and a small write into a large folio walks every block of it: a record of 80 bytes,
//! what a group of bulk pushes whose bodies are in the ring logs, took 17 µs of the writing
//! thread (`ext4:ext4_da_write_begin` to `ext4_da_write_end`, 1 M floats, 1 shard × 1 client,
//! durable) where a single page takes about 1 µs. Images, written 1 MiB at a time, lose a
//! little: a MiB into single pages took 0.30 ms against 0.19. Replay, which reads records one
//! by one from a cold cache, still has read-ahead: the advice comes once warming starts, and
//! the thread drops the clean cached pages of each stretch before it reads it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;

/// Read at a time.
const STEP: u64 = 1 << 20;

/// Targets are rounded up to a multiple of this, at least this far past what is asked: a log
/// of small records wakes the thread once per this many bytes, not at every record.
const GRAIN: u64 = 4 << 20;

/// The thread reading a file's pages ahead of a writer, and what it has been asked to reach.
#[derive(Debug)]
pub struct PageWarmer {
    /// Logical positions to read up to (the file offset is the position modulo `capacity`).
    tx: mpsc::Sender<u64>,
    /// The furthest position asked for.
    asked: u64,
    /// Where warming ends: one lap from where it began.
    end: u64,
}

impl PageWarmer {
    /// Starts a thread that reads `file`, a ring of `capacity` bytes, from logical position
    /// `from` on, as far as it is asked ([`PageWarmer::ahead_to`]) and at most one lap. `None`
    /// when the file cannot be shared or the thread cannot start.
    pub fn start(file: &File, capacity: u64, from: u64) -> Option<Self> {
        let file = file.try_clone().ok()?;
        // Best effort: without it the pages come in large folios, and small records cost more.
        let _ = nix::fcntl::posix_fadvise(
            &file,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
        );
        let (tx, rx) = mpsc::channel::<u64>();
        let end = from.saturating_add(capacity);
        std::thread::Builder::new()
            .name("ps-log-warmer".into())
            .spawn(move || warm(&file, capacity, from, end, &rx))
            .ok()?;
        Some(Self {
            tx,
            asked: from,
            end,
        })
    }

    /// Asks for the pages up to logical position `to` (rounded up, see [`GRAIN`]) to be read;
    /// `false` once the lap is asked for (or the thread has ended), when there is nothing
    /// more to ask.
    pub fn ahead_to(&mut self, to: u64) -> bool {
        let to = to
            .saturating_add(GRAIN)
            .next_multiple_of(GRAIN)
            .min(self.end);
        if to > self.asked {
            self.asked = to;
            if self.tx.send(to).is_err() {
                return false;
            }
        }
        self.asked < self.end
    }
}

fn warm(file: &File, capacity: u64, from: u64, end: u64, rx: &mpsc::Receiver<u64>) {
    let mut buf = vec![0u8; STEP as usize];
    let mut at = from;
    while at < end {
        // The furthest position asked for so far; waits when there is none beyond `at`.
        let Ok(mut to) = rx.recv() else { return };
        to = rx.try_iter().fold(to, u64::max);
        while at < to.min(end) {
            let off = at % capacity;
            let n = STEP.min(capacity - off).min(end - at) as usize;
            // Pages cached already (a replay's read-ahead brought them in as large folios)
            // are dropped first, so that the read brings them in again as single pages:
            // clean ones only, so nothing written is lost, and what is ahead of the head is
            // what the log writes over next.
            let _ = nix::fcntl::posix_fadvise(
                file,
                off as i64,
                n as i64,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            );
            if file.read_at(&mut buf[..n], off).is_err() {
                return;
            }
            at += n as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pages of the file at `path` in the page cache, as util-linux's `fincore` counts
    /// them.
    fn cached_pages(path: &std::path::Path) -> u64 {
        let out = std::process::Command::new("fincore")
            .args(["--raw", "--noheadings", "--output", "PAGES"])
            .arg(path)
            .output()
            .expect("fincore (util-linux)");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    #[test]
    fn pages_ahead_of_the_head_are_read_once_asked_for_and_no_further_than_a_lap() {
        // Beside the test binary, on the build's disk: reading a hole of a file in tmpfs (often
        // /tmp) caches nothing.
        let exe = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir_in(exe.parent().unwrap()).unwrap();
        let path = dir.path().join("log");
        let capacity = 128u64 << 20;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        file.set_len(capacity).unwrap();
        // A new sparse file: nothing cached.
        assert_eq!(cached_pages(&path), 0);
        // Begins 2 MiB before the end of the ring: the lap wraps around it. Asked for 1 MiB, it
        // reads to the next multiple of 4 MiB at least 4 MiB further: 6 MiB.
        let from = capacity - (2 << 20);
        let mut w = PageWarmer::start(&file, capacity, from).unwrap();
        assert!(w.ahead_to(from + (1 << 20)));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        // 2 MiB to the end of the file, then 4 MiB from its start: 1536 pages.
        while cached_pages(&path) < 1536 {
            assert!(std::time::Instant::now() < deadline, "not read");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        // And not a page further: it reads without the kernel's read-ahead, which would bring
        // in several MiB more (as large folios, which small writes pay for).
        let cached = cached_pages(&path);
        assert_eq!(cached, 1536, "{cached} pages read");
        // Asking past the lap stops at it, and then there is nothing more to ask for.
        assert!(!w.ahead_to(from + capacity + (1 << 20)));
        while cached_pages(&path) < capacity / 4096 {
            assert!(std::time::Instant::now() < deadline, "the lap not read");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
