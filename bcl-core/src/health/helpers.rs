//! The health layer's helper threads: slow work (handshakes, probes, diagnoses, deliveries,
//! slow-node reports) runs on short-lived threads, each bounded by the probe timeout, so that
//! the health thread only heartbeats and reads its links.
//!
//! A helper is started by the spawner thread, never by the thread that asks for it: creating a
//! thread can stall its creator. Measured with 64 ranks on this 2-core machine (bcl-bench
//! allreduce over tcp): one `thread::spawn` on rank 0's health thread took 0.2-2.4 s while
//! the others' slow-node reports arrived, its heartbeats stopped for as long, and 6 runs of 8
//! ended in a false verdict ("rank 0 is unresponsive", or "link between rank 1 and rank 0 is
//! down"). Handing the work over is one channel send.

use super::Inner;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// A helper's thread name and its work.
pub(super) struct Job {
    name: String,
    work: Box<dyn FnOnce() + Send>,
}

/// The channel to the spawner thread.
pub(super) type Spawn = mpsc::Sender<Job>;

/// Start the spawner thread of `rank`: it starts each job's thread until every sender is gone.
pub(super) fn spawner(rank: usize) -> std::io::Result<(Spawn, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<Job>();
    let thread = std::thread::Builder::new()
        .name(format!("bcl-health-spawn-{rank}"))
        .spawn(move || {
            for job in rx {
                start(rank, job);
            }
        })?;
    Ok((tx, thread))
}

/// Run `work` on a helper thread counted in `inner.helpers` (shutdown waits for them), started
/// by the spawner; where there is none (the health channel is off, or shut down), here.
pub(super) fn spawn_helper(inner: &Arc<Inner>, what: &str, work: impl FnOnce() + Send + 'static) {
    struct Count(Arc<Inner>);
    impl Drop for Count {
        fn drop(&mut self) {
            self.0.helpers.fetch_sub(1, Ordering::AcqRel);
        }
    }
    inner.helpers.fetch_add(1, Ordering::AcqRel);
    let count = Count(inner.clone());
    let job = Job {
        name: format!("bcl-health-{what}"),
        work: Box::new(move || {
            let _count = count;
            work();
        }),
    };
    let unsent = match inner.spawn.lock().as_ref() {
        Some(tx) => match tx.send(job) {
            Ok(()) => return,
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    start(inner.rank, unsent);
}

fn start(rank: usize, job: Job) {
    let Job { name, work } = job;
    if let Err(e) = std::thread::Builder::new().name(name).spawn(work) {
        // The closure (and its count) was dropped with the error.
        tracing::warn!(rank, "cannot start a health helper thread: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn jobs_run_on_threads_of_their_own_and_the_spawner_ends_with_its_senders() {
        let (tx, thread) = spawner(3).expect("spawner");
        let (done_tx, done_rx) = channel();
        let caller = std::thread::current().id();
        for i in 0..4 {
            let done_tx = done_tx.clone();
            tx.send(Job {
                name: format!("bcl-health-test-{i}"),
                work: Box::new(move || {
                    let me = std::thread::current();
                    let _ = done_tx.send((me.id(), me.name().map(str::to_owned)));
                }),
            })
            .expect("send");
        }
        let mut names = Vec::new();
        for _ in 0..4 {
            let (id, name) = done_rx
                .recv_timeout(Duration::from_secs(10))
                .expect("a job ran");
            assert_ne!(id, caller, "a job ran on the caller's thread");
            names.push(name.expect("a named thread"));
        }
        names.sort();
        assert_eq!(
            names,
            (0..4)
                .map(|i| format!("bcl-health-test-{i}"))
                .collect::<Vec<_>>()
        );
        drop(tx);
        thread
            .join()
            .expect("the spawner ends once its senders are gone");
    }
}
