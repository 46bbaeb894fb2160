//! Host metrics (`--node-metrics URL`, one per engine host's Prometheus node_exporter):
//! scraped once a second beside the GPU exporters ([`super::gpu::GpuWatch`]), read into
//! each step's and the run's `resources.host`: the lowest share of memory available
//! (`node_memory_MemAvailable_bytes` / `node_memory_MemTotal_bytes`, the fullest host's),
//! the CPUs' mean busy share (`node_cpu_seconds_total`: 1 − the idle and iowait seconds'
//! share of all, over each host's window, averaged over hosts) and the network errors
//! (`node_network_{receive,transmit}_errs_total`, their increase summed over hosts and
//! devices). A figure no host served is `null` and named in `absent`, never zero.

use serde::Serialize;

use super::gpu::Timed;
use crate::calibrate::exposition::parse_line;

/// One node_exporter answer's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostReading {
    pub t_s: f64,
    /// `--node-metrics` index.
    pub node: usize,
    pub memory_available: Option<f64>,
    pub memory_total: Option<f64>,
    /// Seconds of every CPU in every mode, and of those idle or waiting on I/O.
    pub cpu_total: Option<f64>,
    pub cpu_idle: Option<f64>,
    /// Receive and transmit errors of every device, counted since the host booted.
    pub network_errors: Option<f64>,
}

impl Timed for HostReading {
    fn t_s(&self) -> f64 {
        self.t_s
    }
}

fn add(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.unwrap_or(0.0) + v);
}

/// The reading of a node_exporter answer at `t_s` from endpoint `node` (one element,
/// or none when the text has none of the series).
pub fn parse(text: &str, node: usize, t_s: f64) -> Vec<HostReading> {
    let mut r = HostReading {
        t_s,
        node,
        ..HostReading::default()
    };
    for line in text.lines() {
        let Ok(Some(s)) = parse_line(line) else {
            continue;
        };
        if !s.value.is_finite() {
            continue;
        }
        match s.name {
            "node_memory_MemAvailable_bytes" => r.memory_available = Some(s.value),
            "node_memory_MemTotal_bytes" => r.memory_total = Some(s.value),
            "node_cpu_seconds_total" => {
                add(&mut r.cpu_total, s.value);
                if matches!(s.label("mode"), Some("idle" | "iowait")) {
                    add(&mut r.cpu_idle, s.value);
                }
            }
            "node_network_receive_errs_total" | "node_network_transmit_errs_total" => {
                add(&mut r.network_errors, s.value)
            }
            _ => {}
        }
    }
    let any = r.memory_available.is_some()
        || r.memory_total.is_some()
        || r.cpu_total.is_some()
        || r.network_errors.is_some();
    if any { vec![r] } else { Vec::new() }
}

/// The hosts' figures over one window (`steps[].resources.host`, `resources.host`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HostFigures {
    pub hosts: usize,
    pub scrapes: usize,
    /// The lowest share of memory available on any host.
    pub memory_available_min_share: Option<f64>,
    /// The CPUs' busy share, each host's over the window, averaged over the hosts.
    pub cpu_busy_mean: Option<f64>,
    /// Network receive and transmit errors during the window, over every host.
    pub network_errors: Option<f64>,
    pub absent: Vec<&'static str>,
    /// The run's figures also say how the exporters answered.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub exporters: Option<HostScrapes>,
}

/// The figures of the readings in `[lo, hi]`.
pub fn figures(all: &[HostReading], lo: f64, hi: f64) -> HostFigures {
    let inside: Vec<&HostReading> = all.iter().filter(|r| r.t_s >= lo && r.t_s <= hi).collect();
    let memory_available_min_share = inside
        .iter()
        .filter_map(|r| {
            let (a, t) = (r.memory_available?, r.memory_total?);
            (t > 0.0).then(|| a / t)
        })
        .reduce(f64::min);
    let mut nodes: Vec<usize> = inside.iter().map(|r| r.node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let mut busy = Vec::new();
    let mut errors: Option<f64> = None;
    for n in &nodes {
        let mine: Vec<&&HostReading> = inside.iter().filter(|r| r.node == *n).collect();
        let cpu: Vec<(f64, f64)> = mine
            .iter()
            .filter_map(|r| Some((r.cpu_total?, r.cpu_idle.unwrap_or(0.0))))
            .collect();
        if let (Some(first), Some(last)) = (cpu.first(), cpu.last()) {
            let total = last.0 - first.0;
            if total > 0.0 {
                busy.push((1.0 - (last.1 - first.1) / total).clamp(0.0, 1.0));
            }
        }
        let errs: Vec<f64> = mine.iter().filter_map(|r| r.network_errors).collect();
        if let (Some(first), Some(last)) = (errs.first(), errs.last()) {
            // A counter that went down was reset (a reboot): count from zero.
            let grew = if last >= first { last - first } else { *last };
            add(&mut errors, grew);
        }
    }
    let mut scrapes: Vec<f64> = inside.iter().map(|r| r.t_s).collect();
    scrapes.dedup();
    let cpu_busy_mean = (!busy.is_empty()).then(|| busy.iter().sum::<f64>() / busy.len() as f64);
    let named = [
        ("memory_available", memory_available_min_share.is_none()),
        ("cpu_busy", cpu_busy_mean.is_none()),
        ("network_errors", errors.is_none()),
    ];
    HostFigures {
        hosts: nodes.len(),
        scrapes: scrapes.len(),
        memory_available_min_share,
        cpu_busy_mean,
        network_errors: errors,
        absent: named.iter().filter(|(_, a)| *a).map(|(n, _)| *n).collect(),
        exporters: None,
    }
}

/// The node exporters and their scrapes over the run (`resources.host` only).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HostScrapes {
    pub urls: Vec<String>,
    pub scrape_attempts: u64,
    pub failed_scrapes: u64,
    pub last_error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// node_exporter 1.x's text, cut down: the series read and their neighbours.
    pub const FIXTURE: &str = "\
# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.
# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu=\"0\",mode=\"idle\"} 1000
node_cpu_seconds_total{cpu=\"0\",mode=\"iowait\"} 10
node_cpu_seconds_total{cpu=\"0\",mode=\"system\"} 40
node_cpu_seconds_total{cpu=\"0\",mode=\"user\"} 50
node_cpu_seconds_total{cpu=\"1\",mode=\"idle\"} 1100
node_cpu_seconds_total{cpu=\"1\",mode=\"user\"} 0
# HELP node_memory_MemAvailable_bytes Memory information field MemAvailable_bytes.
# TYPE node_memory_MemAvailable_bytes gauge
node_memory_MemAvailable_bytes 2.147483648e+09
# TYPE node_memory_MemTotal_bytes gauge
node_memory_MemTotal_bytes 1.7179869184e+10
node_memory_MemFree_bytes 1.0e+09
# TYPE node_network_receive_errs_total counter
node_network_receive_errs_total{device=\"eth0\"} 3
node_network_receive_errs_total{device=\"lo\"} 0
node_network_transmit_errs_total{device=\"eth0\"} 1
";

    #[test]
    fn the_series_are_read_from_node_exporter_text() {
        let r = parse(FIXTURE, 1, 2.5);
        assert_eq!(r.len(), 1);
        let r = &r[0];
        assert_eq!((r.node, r.t_s), (1, 2.5));
        assert_eq!(r.memory_available, Some(2_147_483_648.0));
        assert_eq!(r.memory_total, Some(17_179_869_184.0));
        assert_eq!(r.cpu_total, Some(2200.0));
        assert_eq!(r.cpu_idle, Some(2110.0));
        assert_eq!(r.network_errors, Some(4.0));
        assert!(parse("# nothing\nother_metric 1\n", 0, 0.0).is_empty());
    }

    #[test]
    fn figures_over_a_window_and_absent_series() {
        let at = |t_s: f64, avail: f64, total: f64, idle: f64, errs: f64| HostReading {
            t_s,
            node: 0,
            memory_available: Some(avail),
            memory_total: Some(100.0),
            cpu_total: Some(total),
            cpu_idle: Some(idle),
            network_errors: Some(errs),
        };
        let all = [
            at(0.0, 50.0, 100.0, 90.0, 0.0),
            at(1.0, 20.0, 110.0, 95.0, 2.0),
            at(2.0, 4.0, 120.0, 100.0, 5.0),
            at(9.0, 1.0, 200.0, 100.0, 9.0),
        ];
        let f = figures(&all, 0.5, 2.5);
        assert_eq!((f.hosts, f.scrapes), (1, 2));
        assert_eq!(f.memory_available_min_share, Some(0.04));
        // 10 CPU seconds, 5 of them idle.
        assert_eq!(f.cpu_busy_mean, Some(0.5));
        assert_eq!(f.network_errors, Some(3.0));
        assert!(f.absent.is_empty());
        let memory_only = [HostReading {
            memory_available: Some(1.0),
            memory_total: Some(2.0),
            ..HostReading::default()
        }];
        let f = figures(&memory_only, 0.0, 1.0);
        assert_eq!(f.memory_available_min_share, Some(0.5));
        assert_eq!(f.absent, ["cpu_busy", "network_errors"]);
    }
}
