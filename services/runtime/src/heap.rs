//! The heap's settings for processes that move megabyte buffers (shards, workers, the
//! benchmark's clients).
//!
//! glibc serves an allocation above its mmap threshold (128 KiB at first, raised as such blocks
//! are freed) with fresh pages from the kernel, and gives a freed block back at once, and it
//! returns free memory at the top of the heap once it exceeds its trim threshold. A shard
//! receiving and answering 1 MiB to 64 MiB requests then paid for page faults and for zeroing
//! new pages on every request (`clear_page_erms` and `exc_page_fault` in `perf`). With blocks up
//! to 32 MiB kept in the heap and up to 64 MiB left free at its top, buffers are reused: in
//! `ps-bench` (durable; medians of three interleaved runs against `GLIBC_TUNABLES=`, which keeps
//! glibc's defaults) dense goodput rose 12% at 1 M floats and 4% at 16 M on 1 x 1, 4% and 9% on
//! 2 x 2, for at most that much memory held free. (Fixing either threshold alone, through
//! glibc's variables, was slower than the defaults: a fixed mmap threshold with the default trim
//! gives memory back after every request, a fixed trim threshold stops the mmap threshold from
//! rising.)

/// Largest block served from the heap rather than mapped on its own (glibc's maximum).
pub const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free bytes at the heap's top that stay before it is trimmed.
pub const TRIM_THRESHOLD: i32 = 64 << 20;

/// Applies the settings above, unless the environment sets glibc's own
/// (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `GLIBC_TUNABLES`); elsewhere than glibc it
/// does nothing. Call it first in `main`.
pub fn keep_large_buffers() {
    let set_by_env = [
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "GLIBC_TUNABLES",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some());
    if set_by_env {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: mallopt only changes the allocator's thresholds; it takes the allocator's lock
    // and is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}
