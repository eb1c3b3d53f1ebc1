//! Waiting for a file another process writes, as `inotifywait` would.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// Waits until `path` exists, woken by its directory's inotify events (a file written
/// atomically arrives by rename). False once `timeout` has passed.
pub fn wait_for_file(path: &Path, timeout: Duration) -> nix::Result<bool> {
    let directory = path.parent().unwrap_or(Path::new("."));
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
    // Watching starts before the first look, so a file made in between still wakes us.
    inotify.add_watch(
        directory,
        AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO,
    )?;
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut ready = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
        poll(
            &mut ready,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        )?;
        // Only the wake-up matters; what woke us is read away so the next poll waits again.
        match inotify.read_events() {
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(true)
}
