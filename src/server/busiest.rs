//! Which tenants get a label of their own in `sluice_tenant_inflight_requests` (docs/metrics.md):
//! the busiest few by recent requests, found with a fixed-size space-saving sketch, so the
//! series stay bounded however many tenants call. Every other tenant counts under `other`.
//!
//! A label is the first 12 hex digits of the tenant's storage namespace (`Tenant::namespace`,
//! the prefix of its keys in the store): it names neither the credential nor its fingerprint.
//! A tenant's series exists while it has requests in flight, and at most [`LABELLED`] tenants
//! have one at once, however the busiest change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus::IntGaugeVec;

use crate::tenant::Tenant;

/// Tenants the sketch counts; a new one takes the place of the least counted.
const COUNTED: usize = 64;
/// Of those, how many of the most counted have their own label.
pub(super) const LABELLED: usize = 10;
/// Counts halve this often, so the busiest are the busiest of the last minutes.
const HALF_LIFE: Duration = Duration::from_secs(60);
/// The label of every tenant without its own.
pub(super) const OTHER: &str = "other";

struct Counted {
    tenant: Tenant,
    count: u64,
    /// The count inherited from the tenant it replaced: `count - error` is what it surely sent.
    error: u64,
}

impl Counted {
    fn sure(&self) -> u64 {
        self.count - self.error
    }
}

struct State {
    counted: Vec<Counted>,
    /// Labels with a series, and how many requests each has in flight.
    live: HashMap<Arc<str>, u64>,
    halved: Instant,
}

/// The sketch and the gauge it labels.
pub(super) struct Busiest {
    gauge: IntGaugeVec,
    state: Mutex<State>,
}

impl Busiest {
    /// `other` is there from the start, at zero, so the gauge is exported before any request.
    pub(super) fn new(gauge: IntGaugeVec) -> Busiest {
        gauge.with_label_values(&[OTHER]);
        Busiest {
            gauge,
            state: Mutex::new(State {
                counted: Vec::with_capacity(COUNTED),
                live: HashMap::new(),
                halved: Instant::now(),
            }),
        }
    }

    /// Counts a request of `tenant` in, and returns the label its gauge is raised under, to be
    /// given back to [`Busiest::leave`] when the request ends.
    pub(super) fn enter(&self, tenant: &Tenant, now: Instant) -> Arc<str> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if now.saturating_duration_since(state.halved) >= HALF_LIFE {
            state.halved = now;
            for c in &mut state.counted {
                c.count /= 2;
                c.error /= 2;
            }
        }
        let at = match state.counted.iter().position(|c| c.tenant == *tenant) {
            Some(at) => at,
            None if state.counted.len() < COUNTED => {
                state.counted.push(Counted {
                    tenant: tenant.clone(),
                    count: 0,
                    error: 0,
                });
                state.counted.len() - 1
            }
            None => {
                // Space-saving: the newcomer inherits the least count, an overestimate that
                // lets a tenant that turns busy climb past the quiet ones.
                let least = (0..state.counted.len())
                    .min_by_key(|&i| state.counted[i].count)
                    .unwrap_or(0);
                let slot = &mut state.counted[least];
                slot.tenant = tenant.clone();
                slot.error = slot.count;
                least
            }
        };
        state.counted[at].count += 1;
        let sure = state.counted[at].sure();
        let above = state.counted.iter().filter(|c| c.sure() > sure).count();
        let namespace = tenant.namespace();
        let own: Arc<str> = Arc::from(namespace.get(..12).unwrap_or(&namespace));
        // At most LABELLED tenants have a series of their own at once, whatever the churn.
        let labelled = state.live.len() - usize::from(state.live.contains_key(OTHER));
        let label = match state.live.get_key_value(&own) {
            Some((known, _)) => known.clone(),
            None if above < LABELLED && labelled < LABELLED => own,
            None => match state.live.get_key_value(OTHER) {
                Some((known, _)) => known.clone(),
                None => Arc::from(OTHER),
            },
        };
        *state.live.entry(label.clone()).or_insert(0) += 1;
        self.gauge.with_label_values(&[&label]).inc();
        label
    }

    /// A request counted under `label` ended; a tenant's own label loses its series once
    /// nothing of it is in flight.
    pub(super) fn leave(&self, label: &Arc<str>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.gauge.with_label_values(&[label]).dec();
        let Some(n) = state.live.get_mut(label) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n > 0 || **label == *OTHER {
            return;
        }
        state.live.remove(label);
        // Its series goes; should the tenant come back among the busiest, it gets it again.
        let _ = self.gauge.remove_label_values(&[label]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauge() -> IntGaugeVec {
        IntGaugeVec::new(prometheus::Opts::new("t", "t"), &["tenant"]).unwrap()
    }

    fn series(g: &IntGaugeVec) -> Vec<(String, i64)> {
        use prometheus::core::Collector;
        let mut out: Vec<(String, i64)> = g
            .collect()
            .iter()
            .flat_map(|f| f.get_metric().to_vec())
            .map(|m| {
                let label = m.get_label()[0].value().to_owned();
                (label, m.get_gauge().get_value() as i64)
            })
            .collect();
        out.sort();
        out
    }

    /// docs/metrics.md: the busiest tenants have their own series, a thousand quiet ones share
    /// `other`, the series stay bounded, and every gauge returns to zero.
    #[test]
    fn the_busiest_tenants_are_labelled_and_the_rest_are_other() {
        let g = gauge();
        let busiest = Busiest::new(g.clone());
        let now = Instant::now();
        let loud: Vec<Tenant> = (0..3)
            .map(|i| Tenant::from_credential(format!("loud-{i}").as_bytes()))
            .collect();
        for _ in 0..50 {
            for t in &loud {
                let label = busiest.enter(t, now);
                busiest.leave(&label);
            }
        }
        let held: Vec<Arc<str>> = loud.iter().map(|t| busiest.enter(t, now)).collect();
        let mut quiet = Vec::new();
        for i in 0..1000 {
            let t = Tenant::from_credential(format!("quiet-{i}").as_bytes());
            quiet.push(busiest.enter(&t, now));
        }
        for (label, t) in held.iter().zip(&loud) {
            assert_eq!(&**label, &t.namespace()[..12]);
        }
        let s = series(&g);
        assert!(s.len() <= LABELLED + 1, "{s:?}");
        let other = s.iter().find(|(l, _)| l == OTHER).map_or(0, |(_, n)| *n);
        assert!(other >= 1000 - LABELLED as i64, "{s:?}");
        for label in held.iter().chain(&quiet) {
            busiest.leave(label);
        }
        let s = series(&g);
        assert_eq!(s, vec![(OTHER.to_owned(), 0)]);
    }

    /// Counts halve every minute: a tenant busy an hour ago does not keep its label against
    /// one busy now.
    #[test]
    fn old_counts_fade() {
        let busiest = Busiest::new(gauge());
        let t0 = Instant::now();
        let old = Tenant::from_credential(b"old");
        for _ in 0..1000 {
            let l = busiest.enter(&old, t0);
            busiest.leave(&l);
        }
        let later = t0 + HALF_LIFE * 12;
        for minute in 0..12 {
            let l = busiest.enter(&old, t0 + HALF_LIFE * minute);
            busiest.leave(&l);
        }
        let state = busiest.state.lock().unwrap();
        let count = state
            .counted
            .iter()
            .find(|c| c.tenant == old)
            .unwrap()
            .count;
        assert!(count < 10, "{count}");
        drop(state);
        let _ = busiest.enter(&Tenant::from_credential(b"new"), later);
    }
}
