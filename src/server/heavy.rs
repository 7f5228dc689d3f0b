//! The threads CPU-heavy projection runs on: image decoding, checks and downscales, the front of
//! a large body, request bodies' decompression. They are tokio blocking threads of their own
//! (`sluice-heavy`), scheduled below the I/O workers (10 nice levels lower), so that a worker woken while
//! every core decodes a picture gets a core at once instead of waiting out the decoder's time
//! slice. How many run at once is bounded by the caller (the `heavy` semaphore); this pool only
//! gives them their threads and their priority.

use std::sync::OnceLock;

/// How many nice levels the heavy threads sit below the process's. At +10 a heavy thread
/// weighs a tenth of a worker, so on a busy core the scheduler runs a waking worker first,
/// while the heavy job still gets about a tenth of a core that the workers keep busy (it is
/// not starved, as under `SCHED_IDLE`).
const NICE: i32 = 10;

/// Idle heavy threads end after this long.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(30);

/// The pool, built once per process; `None` if tokio could not build it (the jobs then run on
/// the calling runtime's blocking pool, at the usual priority).
static POOL: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();

fn pool() -> Option<&'static tokio::runtime::Runtime> {
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let built = tokio::runtime::Builder::new_current_thread()
            .thread_name("sluice-heavy")
            .max_blocking_threads(cores)
            .thread_keep_alive(KEEP_ALIVE)
            .on_thread_start(lower_priority)
            .enable_all()
            .build();
        match built {
            Ok(runtime) => Some(runtime),
            Err(e) => {
                tracing::warn!(error = %e, "cannot build the heavy pool; heavy work runs at the workers' priority");
                None
            }
        }
    })
    .as_ref()
}

/// Lowers the calling thread's priority by [`NICE`] levels from the one it started with (a
/// sluice run under `nice` keeps its heavy threads below its workers). On Linux a nice value
/// is the thread's own, so this touches no other thread. Raising a nice value needs no
/// privilege; where it fails anyway the thread keeps the usual priority.
fn lower_priority() {
    let now = rustix::process::getpriority_process(None).unwrap_or(0);
    if let Err(e) = rustix::process::setpriority_process(None, (now + NICE).min(19)) {
        tracing::debug!(error = %e, "cannot lower a heavy thread's priority");
    }
}

/// Runs `job` on a heavy thread and waits for it without holding the calling worker.
pub(super) async fn run<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    match pool() {
        Some(pool) => pool.spawn_blocking(job).await,
        None => tokio::task::spawn_blocking(job).await,
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn heavy_jobs_run_on_their_own_threads_at_a_lower_priority() {
        let (name, nice) = super::run(|| {
            let name = std::thread::current().name().map(str::to_owned);
            (name, rustix::process::getpriority_process(None))
        })
        .await
        .unwrap();
        assert_eq!(name.as_deref(), Some("sluice-heavy"));
        let base = rustix::process::getpriority_process(None).unwrap();
        assert_eq!(nice.unwrap(), (base + super::NICE).min(19));
    }
}
