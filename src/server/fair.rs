//! Places on the heavy pool, given fairly across tenants (docs/reliability.md, "Tenants"): when
//! every place is taken, a freed one goes to the next tenant in turn that has a job waiting, not
//! to whichever job came first. A tenant sending fifty screenshots a second waits behind its own
//! jobs; another tenant's one job waits for at most one job per tenant ahead of it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::tenant::Tenant;

struct State {
    free: usize,
    /// Each waiting tenant's jobs, oldest first.
    waiting: HashMap<Tenant, VecDeque<oneshot::Sender<()>>>,
    /// Tenants with jobs waiting, in the order they are served.
    turns: VecDeque<Tenant>,
}

/// `places` jobs at once, handed out in turn across tenants.
pub(super) struct FairPlaces {
    state: Mutex<State>,
}

/// A held place; given to the next tenant in turn when dropped.
pub(super) struct Place(Arc<FairPlaces>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

/// A job waiting for its place. Dropped before it got one, it leaves the queue; dropped just
/// after one was handed to it, it hands that place on.
struct Waiting {
    places: Arc<FairPlaces>,
    rx: oneshot::Receiver<()>,
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.rx.close();
        if self.rx.try_recv().is_ok() {
            self.places.give_back();
        }
    }
}

impl FairPlaces {
    pub(super) fn new(places: usize) -> Arc<FairPlaces> {
        Arc::new(FairPlaces {
            state: Mutex::new(State {
                free: places,
                waiting: HashMap::new(),
                turns: VecDeque::new(),
            }),
        })
    }

    /// A place for a job of `tenant`: at once when one is free and nobody waits, else in turn.
    pub(super) async fn take(self: &Arc<Self>, tenant: &Tenant) -> Place {
        let rx = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.free > 0 && state.turns.is_empty() {
                state.free -= 1;
                return Place(self.clone());
            }
            let (tx, rx) = oneshot::channel();
            match state.waiting.get_mut(tenant) {
                Some(queue) => queue.push_back(tx),
                None => {
                    state.waiting.insert(tenant.clone(), VecDeque::from([tx]));
                    state.turns.push_back(tenant.clone());
                }
            }
            rx
        };
        let mut waiting = Waiting {
            places: self.clone(),
            rx,
            done: false,
        };
        // The sender is only dropped unsent by `give_back` skipping a closed receiver, which
        // this one is not: either way the place is ours.
        let _ = (&mut waiting.rx).await;
        waiting.done = true;
        Place(self.clone())
    }

    /// A place came free: to the next tenant in turn with a job still waiting, else back.
    fn give_back(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(tenant) = state.turns.pop_front() {
            let Some(queue) = state.waiting.get_mut(&tenant) else {
                continue;
            };
            let next = queue.pop_front();
            if queue.is_empty() {
                state.waiting.remove(&tenant);
            } else {
                state.turns.push_back(tenant);
            }
            if let Some(tx) = next {
                if tx.send(()).is_ok() {
                    return;
                }
            }
        }
        state.free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// docs/reliability.md "Tenants": with one place, a noisy tenant's ten queued jobs do not
    /// keep a quiet tenant's one job waiting behind all of them: it runs second.
    #[tokio::test]
    async fn a_freed_place_goes_to_the_next_tenant_in_turn() {
        let places = FairPlaces::new(1);
        let (noisy, quiet) = (Tenant::from_credential(b"n"), Tenant::from_credential(b"q"));
        let first = places.take(&noisy).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut jobs = tokio::task::JoinSet::new();
        for i in 0..10 {
            let (places, noisy, order) = (places.clone(), noisy.clone(), order.clone());
            jobs.spawn(async move {
                let _place = places.take(&noisy).await;
                order.lock().unwrap().push(format!("noisy{i}"));
            });
            tokio::task::yield_now().await;
        }
        let (p, q, o) = (places.clone(), quiet.clone(), order.clone());
        jobs.spawn(async move {
            let _place = p.take(&q).await;
            o.lock().unwrap().push("quiet".into());
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        while let Some(job) = jobs.join_next().await {
            job.unwrap();
        }
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 11);
        assert_eq!(order[0], "noisy0");
        assert_eq!(order[1], "quiet", "{order:?}");
        assert_eq!(places.state.lock().unwrap().free, 1);
    }

    /// A job that gives up waiting (its request ended) leaves no place lost.
    #[tokio::test]
    async fn a_job_that_stops_waiting_loses_no_place() {
        let places = FairPlaces::new(1);
        let a = Tenant::from_credential(b"a");
        let held = places.take(&a).await;
        let gave_up = tokio::time::timeout(Duration::from_millis(10), places.take(&a)).await;
        assert!(gave_up.is_err());
        drop(held);
        let again = tokio::time::timeout(Duration::from_secs(5), places.take(&a)).await;
        assert!(again.is_ok());
        drop(again);
        let state = places.state.lock().unwrap();
        assert_eq!(state.free, 1);
        assert!(state.turns.is_empty() && state.waiting.is_empty());
    }
}
