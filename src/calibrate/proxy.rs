//! The proxy's side of the comparison: cumulative sums and counts of its own measurements
//! per model label, added to by the aggregator (the single consumer of finished records,
//! so the lock is never contended by the data path) and read by the scraper once per
//! scrape. Only requests an engine also counts as finished are added: outcome `ok` with a
//! recognized generation API.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use super::{Cumulative, Quantity, engines::Series};
use crate::measure::{Outcome, RequestRecord};

/// The four quantities the proxy measures, in this order.
const MEASURED: [Quantity; 4] = [Quantity::Ttft, Quantity::E2e, Quantity::Tpot, Quantity::Itl];

#[derive(Debug, Default)]
pub struct ProxyTotals {
    by_model: Mutex<HashMap<String, [Cumulative; 4]>>,
}

impl ProxyTotals {
    /// Adds one finished request. `model` is its (bounded) metric label; `gaps_us` its
    /// inter-token gaps in microseconds.
    pub fn observe(&self, model: &str, record: &RequestRecord, gaps_us: &[u32]) {
        if record.outcome != Outcome::Ok || record.api == "unknown" {
            return;
        }
        let one = |ms: f64| Cumulative {
            sum: ms / 1000.0,
            count: 1.0,
        };
        let itl = Cumulative {
            sum: gaps_us.iter().map(|&g| f64::from(g)).sum::<f64>() / 1e6,
            count: gaps_us.len() as f64,
        };
        let add = [
            record.ttft_ms.map(one),
            Some(one(record.e2e_ms)),
            record.tpot_ms.map(one),
            Some(itl),
        ];
        let mut map = self.by_model.lock().unwrap_or_else(PoisonError::into_inner);
        let totals = match map.get_mut(model) {
            Some(t) => t,
            None => map.entry(model.to_owned()).or_default(),
        };
        for (total, add) in totals.iter_mut().zip(add) {
            if let Some(add) = add {
                total.add(add);
            }
        }
    }

    /// The totals so far by quantity and model, plus every quantity under the model `""`:
    /// all models together (what an engine series without a model label is compared with).
    pub fn snapshot(&self) -> Series {
        let map = self.by_model.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Series::with_capacity((map.len() + 1) * MEASURED.len());
        let mut all = [Cumulative::default(); 4];
        for (model, totals) in map.iter() {
            for (i, q) in MEASURED.iter().enumerate() {
                out.insert((*q, model.clone()), totals[i]);
                all[i].add(totals[i]);
            }
        }
        for (i, q) in MEASURED.iter().enumerate() {
            // A model literally named "" is already the sum of itself; keep the total.
            out.insert((*q, String::new()), all[i]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(outcome: Outcome, ttft: Option<f64>, e2e: f64, tpot: Option<f64>) -> RequestRecord {
        RequestRecord {
            model: Some("m".into()),
            outcome,
            ttft_ms: ttft,
            tpot_ms: tpot,
            e2e_ms: e2e,
            upload_ms: None,
            ttft_after_upload_ms: ttft,
            e2e_after_upload_ms: e2e,
            input_tokens: None,
            output_tokens: None,
            events: 0,
            slo_class: "default".into(),
            slo_met: None,
            tenant: None,
            ..crate::measure::record::example::record()
        }
    }

    #[test]
    fn adds_ok_requests_per_model_and_in_total() {
        let t = ProxyTotals::default();
        t.observe(
            "a",
            &record(Outcome::Ok, Some(100.0), 1000.0, Some(10.0)),
            &[10_000, 30_000],
        );
        t.observe("b", &record(Outcome::Ok, None, 500.0, None), &[]);
        t.observe(
            "a",
            &record(Outcome::UpstreamError, Some(1.0), 1.0, None),
            &[],
        );
        let s = t.snapshot();
        let get = |q, m: &str| s[&(q, m.to_owned())];
        assert_eq!(
            get(Quantity::Ttft, "a"),
            Cumulative {
                sum: 0.1,
                count: 1.0
            }
        );
        assert_eq!(get(Quantity::Ttft, "b").count, 0.0);
        assert_eq!(get(Quantity::E2e, "").count, 2.0);
        assert!((get(Quantity::E2e, "").sum - 1.5).abs() < 1e-12);
        assert_eq!(
            get(Quantity::Tpot, "a"),
            Cumulative {
                sum: 0.01,
                count: 1.0
            }
        );
        let itl = get(Quantity::Itl, "a");
        assert_eq!(itl.count, 2.0);
        assert!((itl.sum - 0.04).abs() < 1e-12);
    }
}
