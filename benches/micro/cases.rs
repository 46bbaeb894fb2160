//! A benchmark case: a closure that processes a known number of events (and bytes), shared
//! by the divan benchmarks and the summary table.

use std::time::{Duration, Instant};

pub struct Case {
    /// `group/name`, also the divan argument.
    pub name: &'static str,
    /// Events one call of `run` handles; per-event cost = time / events.
    pub events: u64,
    /// Body bytes one call handles (0 where bytes are not the point).
    pub bytes: u64,
    /// What one call stands for, for the summary's last column.
    pub unit: &'static str,
    pub run: Box<dyn FnMut()>,
}

impl Case {
    pub fn new(
        name: &'static str,
        events: u64,
        bytes: u64,
        unit: &'static str,
        run: impl FnMut() + 'static,
    ) -> Case {
        Case {
            name,
            events,
            bytes,
            unit,
            run: Box::new(run),
        }
    }

    /// Median nanoseconds per call over `batches` batches of about `batch_time` each.
    fn median_ns_per_call(&mut self, batches: usize, batch_time: Duration) -> f64 {
        // Warm up, and size a batch.
        let start = Instant::now();
        let mut calls: u64 = 0;
        while start.elapsed() < batch_time {
            (self.run)();
            calls += 1;
        }
        let mut samples: Vec<f64> = (0..batches)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..calls {
                    (self.run)();
                }
                t.elapsed().as_nanos() as f64 / calls as f64
            })
            .collect();
        samples.sort_by(f64::total_cmp);
        samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
    }
}

/// The per-event summary: ns per event, events/s, MB/s, and the cost of one call.
pub fn print_summary(cases: Vec<Case>) {
    println!();
    println!("per-event cost (median of 15 batches of ~40 ms, one thread)");
    println!(
        "{:<40} {:>9} {:>11} {:>8} {:>11}  one call is",
        "case", "ns/event", "events/s", "MB/s", "ns/call"
    );
    for mut case in cases {
        let per_call = case.median_ns_per_call(15, Duration::from_millis(40));
        let per_event = per_call / case.events as f64;
        let mb_s = if case.bytes > 0 {
            format!("{:.0}", case.bytes as f64 / per_call * 1e3)
        } else {
            "-".to_owned()
        };
        println!(
            "{:<40} {:>9.1} {:>11.0} {:>8} {:>11.0}  {}",
            case.name,
            per_event,
            1e9 / per_event,
            mb_s,
            per_call,
            case.unit
        );
    }
}

/// Runs the case named `name` `calls` times, for a profiler; lists the names if unknown.
pub fn profile(cases: Vec<Case>, name: &str, calls: u64) {
    let names: Vec<&str> = cases.iter().map(|c| c.name).collect();
    let Some(mut case) = cases.into_iter().find(|c| c.name == name) else {
        eprintln!("micro: no case {name:?}; cases: {names:?}");
        return;
    };
    for _ in 0..calls {
        (case.run)();
    }
    println!("{}: {} calls of {} events", case.name, calls, case.events);
}
