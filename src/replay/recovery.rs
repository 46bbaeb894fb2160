//! Recovery: a user command (`--fault-cmd`, run by `sh -c`) is started `--fault-at` after
//! the run started, while the load keeps going; afterwards the requests around it are cut
//! into `BIN_S`-second intervals by send time and the report says what the fault cost and
//! how long the target took to come back.
//!
//! Definitions (also in docs/REPLAY.md):
//! - *attainment target*: the strictest `attainment` of the SLO classes the run's requests
//!   fell in; an interval *holds* when its attainment (met / (met + missed), requests sent
//!   in it) reaches the target; intervals without a verdict neither hold nor break.
//! - *recovered at*: the start of the first interval, from the fault on, that begins
//!   `STABLE_BINS` holding intervals in a row; `recovery_time_s` = that − fault time
//!   (0 when the fault never broke attainment); `null` when the run ended first.
//! - `recovered`: `recovery_time_s` ≤ `--recovery-deadline`.
//! - `failed_requests`: errors (every outcome but `ok`, `client_abort`, `client_error`)
//!   that ended after the fault and were sent before the recovery point (or the run's
//!   end); `requests_cut`: those of them already in flight when the fault started.
//! - the dip: attainment and effective goodput of the requests sent and finished in the
//!   `BASELINE_S` before the fault against the worst interval and the whole span from the fault to the recovery point.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use serde::Serialize;
use tokio::{sync::watch, task::JoinHandle};

use super::{tables::Tables, tally::Sample};
use crate::{measure::Outcome, slo::Slo};

/// The fault command's output, in the report directory.
pub const LOG_FILE: &str = "fault-cmd.log";
/// Interval width of the recovery analysis.
pub const BIN_S: f64 = 1.0;
/// Holding intervals in a row that count as recovered (one good second can be luck).
pub const STABLE_BINS: usize = 3;
/// The window before the fault the dip is measured against.
pub const BASELINE_S: f64 = 10.0;
/// Intervals shown after the recovery point (or the fault, when not recovered).
const BINS_AFTER: f64 = 10.0;

/// What the fault command did.
#[derive(Debug, Clone, Default)]
pub struct FaultRun {
    pub cmd: String,
    pub planned_at_s: f64,
    /// Started, seconds after the run started (`None`: the run ended or was stopped first).
    pub started_s: Option<f64>,
    pub finished_s: Option<f64>,
    pub exit_code: Option<i32>,
    /// Why it could not be started or waited for, or that it was killed.
    pub error: Option<String>,
}

/// The fault command, scheduled.
pub struct Fault {
    task: JoinHandle<FaultRun>,
    started: Arc<OnceLock<f64>>,
}

impl Fault {
    /// Starts `cmd` at `t0 + at` (its output goes to `log`); `abort` turning true before
    /// then cancels it, and kills it while it runs.
    pub fn schedule(
        cmd: &str,
        at: Duration,
        t0: Instant,
        log: PathBuf,
        abort: watch::Receiver<bool>,
    ) -> Fault {
        let started = Arc::new(OnceLock::new());
        let task = tokio::spawn(run(
            cmd.to_owned(),
            at,
            t0,
            log,
            abort,
            Arc::clone(&started),
        ));
        Fault { task, started }
    }

    /// After the load: a command not yet started never will be; a running one is waited
    /// for (killed only by the abort signal).
    pub async fn finish(self, cmd: &str, at: Duration) -> FaultRun {
        if self.started.get().is_none() {
            self.task.abort();
        }
        match self.task.await {
            Ok(run) => run,
            Err(_) => FaultRun {
                cmd: cmd.to_owned(),
                planned_at_s: at.as_secs_f64(),
                started_s: self.started.get().copied(),
                error: self
                    .started
                    .get()
                    .map(|_| "the fault command's task failed".to_owned()),
                ..FaultRun::default()
            },
        }
    }
}

fn open_log(log: &Path) -> std::io::Result<(Stdio, Stdio)> {
    let file = std::fs::File::create(log)?;
    Ok((Stdio::from(file.try_clone()?), Stdio::from(file)))
}

async fn run(
    cmd: String,
    at: Duration,
    t0: Instant,
    log: PathBuf,
    mut abort: watch::Receiver<bool>,
    started: Arc<OnceLock<f64>>,
) -> FaultRun {
    let mut out = FaultRun {
        cmd: cmd.clone(),
        planned_at_s: at.as_secs_f64(),
        ..FaultRun::default()
    };
    tokio::select! {
        () = tokio::time::sleep_until((t0 + at).into()) => {}
        () = stopped(&mut abort) => return out,
    }
    let secs = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
    // The runtime's clock (the same as the system's unless a test paused it).
    let now = secs(tokio::time::Instant::now().into_std());
    let _ = started.set(now);
    out.started_s = Some(now);
    let (stdout, stderr) = match open_log(&log) {
        Ok(s) => s,
        Err(e) => {
            out.error = Some(format!("cannot write {}: {e}", log.display()));
            return out;
        }
    };
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            out.error = Some(format!("cannot start `sh -c`: {e}"));
            return out;
        }
    };
    tokio::select! {
        status = child.wait() => match status {
            Ok(s) => out.exit_code = s.code(),
            Err(e) => out.error = Some(format!("waiting for the fault command: {e}")),
        },
        () = stopped(&mut abort) => {
            let _ = child.kill().await;
            out.error = Some("killed: the run was stopped".to_owned());
        }
    }
    out.finished_s = Some(secs(tokio::time::Instant::now().into_std()));
    out
}

/// Resolves when `abort` turns true (never when its sender is gone).
async fn stopped(abort: &mut watch::Receiver<bool>) {
    if abort.wait_for(|a| *a).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// One interval around the fault.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Bin {
    /// Interval start, seconds after the run started.
    pub t_s: f64,
    pub requests: u64,
    pub errors: u64,
    pub attainment: Option<f64>,
    pub effective_goodput_tokens_per_s: f64,
}

/// `report.json` `recovery`.
#[derive(Debug, Clone, Serialize)]
pub struct Recovery {
    pub fault_cmd: String,
    pub planned_fault_at_s: f64,
    /// When the command started, seconds after the run started; `null`: it never ran.
    pub fault_at_s: Option<f64>,
    pub fault_finished_s: Option<f64>,
    pub fault_exit_code: Option<i32>,
    pub fault_error: Option<String>,
    pub failed_requests: u64,
    pub requests_cut: u64,
    /// Outcomes of the failed requests.
    pub failed_outcomes: BTreeMap<&'static str, u64>,
    pub attainment_target: Option<f64>,
    pub baseline_attainment: Option<f64>,
    pub baseline_goodput_tokens_per_s: Option<f64>,
    /// The worst interval from the fault to the recovery point (or the end).
    pub min_attainment: Option<f64>,
    /// Over the whole span from the fault to the recovery point (or the end).
    pub dip_attainment: Option<f64>,
    pub dip_goodput_tokens_per_s: Option<f64>,
    pub recovered: bool,
    pub recovery_time_s: Option<f64>,
    pub recovery_deadline_s: f64,
    pub bin_s: f64,
    pub stable_bins: usize,
    pub bins: Vec<Bin>,
}

fn is_error(o: Outcome) -> bool {
    !matches!(o, Outcome::Ok | Outcome::ClientAbort | Outcome::ClientError)
}

/// Attainment and effective goodput of `s` over `secs`.
fn judge(s: &[&Sample], secs: f64) -> (Option<f64>, f64) {
    let met = s.iter().filter(|s| s.slo_met == Some(true)).count();
    let judged = s.iter().filter(|s| s.slo_met.is_some()).count();
    let tokens: u64 = s
        .iter()
        .filter(|s| s.effective())
        .filter_map(|s| s.output_tokens())
        .sum();
    let attainment = (judged > 0).then(|| met as f64 / judged as f64);
    let goodput = if secs > 0.0 {
        tokens as f64 / secs
    } else {
        0.0
    };
    (attainment, goodput)
}

fn sent_in(samples: &[Sample], lo: f64, hi: f64) -> Vec<&Sample> {
    samples
        .iter()
        .filter(|s| s.sent_s >= lo && s.sent_s < hi)
        .collect()
}

/// The strictest attainment target of the classes `samples` fell in.
fn target(samples: &[Sample], t: &Tables, slo: &Slo) -> Option<f64> {
    let used: std::collections::HashSet<&str> = samples.iter().map(|s| t.name(s.class)).collect();
    slo.all_classes()
        .filter(|c| used.contains(&*c.name))
        .map(|c| c.attainment)
        .reduce(f64::max)
}

/// The recovery analysis of a run's `samples` (every request, warm-up included).
pub fn analyse(
    samples: &[Sample],
    t: &Tables,
    fault: &FaultRun,
    deadline: Duration,
    slo: &Slo,
) -> Recovery {
    let deadline_s = deadline.as_secs_f64();
    let mut r = Recovery {
        fault_cmd: fault.cmd.clone(),
        planned_fault_at_s: fault.planned_at_s,
        fault_at_s: fault.started_s,
        fault_finished_s: fault.finished_s,
        fault_exit_code: fault.exit_code,
        fault_error: fault.error.clone(),
        failed_requests: 0,
        requests_cut: 0,
        failed_outcomes: BTreeMap::new(),
        attainment_target: target(samples, t, slo),
        baseline_attainment: None,
        baseline_goodput_tokens_per_s: None,
        min_attainment: None,
        dip_attainment: None,
        dip_goodput_tokens_per_s: None,
        recovered: false,
        recovery_time_s: None,
        recovery_deadline_s: deadline_s,
        bin_s: BIN_S,
        stable_bins: STABLE_BINS,
        bins: Vec::new(),
    };
    let Some(f) = fault.started_s else {
        return r;
    };
    let last_sent = samples.iter().map(|s| s.sent_s).fold(f, f64::max);
    let base_lo = (f - BASELINE_S).max(0.0);
    if f > base_lo {
        let before: Vec<&Sample> = sent_in(samples, base_lo, f)
            .into_iter()
            .filter(|s| s.ended_s < f)
            .collect();
        let (a, g) = judge(&before, f - base_lo);
        r.baseline_attainment = a;
        r.baseline_goodput_tokens_per_s = Some(g);
    }
    // Intervals from the fault to the last send (a last partial interval is dropped).
    let n = ((last_sent - f) / BIN_S).floor() as usize;
    let bins: Vec<Bin> = (0..n)
        .map(|k| {
            let lo = f + k as f64 * BIN_S;
            let part = sent_in(samples, lo, lo + BIN_S);
            let (attainment, goodput) = judge(&part, BIN_S);
            Bin {
                t_s: lo,
                requests: part.len() as u64,
                errors: part.iter().filter(|s| is_error(s.outcome)).count() as u64,
                attainment,
                effective_goodput_tokens_per_s: goodput,
            }
        })
        .collect();
    let holds = |b: &Bin| match (b.attainment, r.attainment_target) {
        (Some(a), Some(t)) => Some(a >= t),
        _ => None,
    };
    let recovered_at = (0..bins.len()).find(|&k| {
        holds(&bins[k]) == Some(true)
            && bins[k..]
                .iter()
                .filter_map(holds)
                .take(STABLE_BINS)
                .filter(|h| *h)
                .count()
                == STABLE_BINS
    });
    r.recovery_time_s = recovered_at.map(|k| k as f64 * BIN_S);
    r.recovered = r.recovery_time_s.is_some_and(|t| t <= deadline_s);
    let until = recovered_at.map_or(last_sent + BIN_S, |k| f + k as f64 * BIN_S);
    let span = (until - f).max(BIN_S);
    let dip = sent_in(samples, f, f + span);
    let (a, g) = judge(&dip, span);
    (r.dip_attainment, r.dip_goodput_tokens_per_s) = (a, Some(g));
    r.min_attainment = bins
        .iter()
        .take(recovered_at.unwrap_or(bins.len()).max(1))
        .filter_map(|b| b.attainment)
        .reduce(f64::min);
    for s in samples
        .iter()
        .filter(|s| is_error(s.outcome) && s.ended_s >= f && s.sent_s < until)
    {
        r.failed_requests += 1;
        if s.sent_s < f {
            r.requests_cut += 1;
        }
        *r.failed_outcomes.entry(s.outcome.as_str()).or_insert(0) += 1;
    }
    // Shown: the baseline (whole intervals before the fault) to some time after recovery.
    let shown_until = until + BINS_AFTER;
    let before = ((f - base_lo) / BIN_S).floor() as usize;
    r.bins = (1..=before)
        .rev()
        .map(|k| {
            let lo = f - k as f64 * BIN_S;
            let part = sent_in(samples, lo, lo + BIN_S);
            let (attainment, goodput) = judge(&part, BIN_S);
            Bin {
                t_s: lo,
                requests: part.len() as u64,
                errors: part.iter().filter(|s| is_error(s.outcome)).count() as u64,
                attainment,
                effective_goodput_tokens_per_s: goodput,
            }
        })
        .chain(bins.into_iter().take_while(|b| b.t_s < shown_until))
        .collect();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sent_s: f64, ended_s: f64, outcome: Outcome, met: Option<bool>) -> Sample {
        let mut record = crate::profile::line::tests::record();
        record.outcome = outcome;
        record.slo_met = met;
        record.slo_class = "default".into();
        record.output_tokens = Some(10);
        // Interned first: the class is id 0, as in [`tables`].
        let mut s = Sample::of(&record, &mut Tables::default());
        (s.sent_s, s.ended_s, s.measured) = (sent_s, ended_s, true);
        s
    }

    /// The tables the samples of [`sample`] point into.
    fn tables() -> Tables {
        let mut t = Tables::default();
        t.intern("default");
        t
    }

    fn slo() -> Slo {
        let overrides = crate::config::Overrides {
            upstream: Some("http://127.0.0.1:1".into()),
            ..Default::default()
        };
        let mut slo = crate::config::load(None, &overrides).unwrap().slo;
        slo.default.attainment = 0.9;
        slo.default.name = "default".into();
        slo
    }

    /// The recovery of `samples` from a fault at 5 s, with a deadline of `deadline_s`.
    fn after_fault_at_5(samples: &[Sample], deadline_s: u64) -> Recovery {
        analyse(
            samples,
            &tables(),
            &fault(5.0),
            Duration::from_secs(deadline_s),
            &slo(),
        )
    }

    fn fault(at: f64) -> FaultRun {
        FaultRun {
            cmd: "restart".into(),
            planned_at_s: at,
            started_s: Some(at),
            finished_s: Some(at + 0.5),
            exit_code: Some(0),
            error: None,
        }
    }

    /// Ten requests a second from 0 to `end` s; those sent in `[down_from, down_to)` fail
    /// at once, one in flight at `down_from` is cut.
    fn run(end: f64, down_from: f64, down_to: f64) -> Vec<Sample> {
        let mut v = Vec::new();
        for i in 0..(end * 10.0) as usize {
            let t = i as f64 / 10.0;
            if t >= down_from && t < down_to {
                v.push(sample(t, t + 0.001, Outcome::UpstreamError, Some(false)));
            } else {
                v.push(sample(t, t + 0.05, Outcome::Ok, Some(true)));
            }
        }
        v.push(sample(
            down_from - 0.02,
            down_from + 0.01,
            Outcome::UpstreamReset,
            Some(false),
        ));
        v
    }

    #[test]
    fn an_outage_is_counted_and_recovery_timed() {
        let samples = run(20.0, 5.0, 7.0);
        let r = after_fault_at_5(&samples, 5);
        assert_eq!(r.attainment_target, Some(0.9));
        assert_eq!(r.baseline_attainment, Some(1.0));
        assert_eq!(r.failed_requests, 21);
        assert_eq!(r.requests_cut, 1);
        assert_eq!(r.failed_outcomes.get("upstream_error"), Some(&20));
        assert_eq!(r.recovery_time_s, Some(2.0));
        assert!(r.recovered);
        assert_eq!(r.min_attainment, Some(0.0));
        assert_eq!(r.dip_attainment, Some(0.0));
        assert_eq!(r.dip_goodput_tokens_per_s, Some(0.0));
        assert_eq!(r.baseline_goodput_tokens_per_s, Some(100.0));
        // 5 baseline intervals (0..5 s) and from the fault to 10 s after recovery.
        assert_eq!(r.bins.first().map(|b| b.t_s), Some(0.0));
        assert_eq!(r.bins.len(), 5 + 12);
        assert!(r.bins.iter().all(|b| b.requests >= 10));
    }

    #[test]
    fn a_late_recovery_misses_the_deadline() {
        let samples = run(20.0, 5.0, 9.0);
        let r = after_fault_at_5(&samples, 3);
        assert_eq!(r.recovery_time_s, Some(4.0));
        assert!(!r.recovered);
    }

    #[test]
    fn no_recovery_before_the_end() {
        let samples = run(10.0, 5.0, 100.0);
        let r = after_fault_at_5(&samples, 60);
        assert_eq!(r.recovery_time_s, None);
        assert!(!r.recovered);
        assert_eq!(r.failed_requests, 51);
        assert_eq!(r.dip_attainment, Some(0.0));
    }

    #[test]
    fn a_harmless_fault_recovers_at_once() {
        let samples = run(20.0, 100.0, 100.0);
        let r = after_fault_at_5(&samples, 1);
        assert_eq!(r.recovery_time_s, Some(0.0));
        assert!(r.recovered);
        // The reset sample at 99.98 s is past the end of the shown intervals.
        assert_eq!(r.min_attainment, Some(1.0));
    }

    #[test]
    fn one_good_second_is_not_recovery() {
        let mut samples = run(20.0, 5.0, 10.0);
        // Interval 7..8 s is good, 8..10 s fails again.
        for s in samples
            .iter_mut()
            .filter(|s| s.sent_s >= 7.0 && s.sent_s < 8.0)
        {
            *s = sample(s.sent_s, s.sent_s + 0.05, Outcome::Ok, Some(true));
        }
        let r = after_fault_at_5(&samples, 60);
        assert_eq!(r.recovery_time_s, Some(5.0));
    }

    #[test]
    fn a_fault_that_never_ran_reports_nothing_measured() {
        let samples = run(5.0, 100.0, 100.0);
        let mut f = fault(30.0);
        f.started_s = None;
        let r = analyse(&samples, &tables(), &f, Duration::from_secs(60), &slo());
        assert_eq!(r.fault_at_s, None);
        assert!(!r.recovered);
        assert_eq!(r.failed_requests, 0);
        assert!(r.bins.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_command_runs_at_its_time_and_a_stop_before_cancels_it() {
        let dir = std::env::temp_dir().join(format!("goodput-fault-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (_tx, rx) = watch::channel(false);
        let t0 = Instant::now();
        let f = Fault::schedule(
            "echo hi; exit 3",
            Duration::from_secs(5),
            t0,
            dir.join("a.log"),
            rx.clone(),
        );
        tokio::time::sleep(Duration::from_secs(6)).await;
        let run = f.finish("x", Duration::from_secs(5)).await;
        assert_eq!(run.exit_code, Some(3));
        assert!(run.started_s.is_some_and(|s| s >= 5.0));
        assert_eq!(std::fs::read_to_string(dir.join("a.log")).unwrap(), "hi\n");
        // Not yet due when the load ends: never runs.
        let f = Fault::schedule(
            "touch never",
            Duration::from_secs(50),
            Instant::now(),
            dir.join("b.log"),
            rx,
        );
        let run = f.finish("touch never", Duration::from_secs(50)).await;
        assert_eq!(run.started_s, None);
        assert_eq!(run.planned_at_s, 50.0);
        assert!(!dir.join("b.log").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
