//! Unit tests of [`super`]: the exporter's own text format, blanks and absent series.

use super::*;

/// Two GPUs as dcgm-exporter 3.x serves them (labels as it writes them, a space after a
/// comma as in its README, DCGM's int64 blank on a series the GPU does not support).
fn exporter(util: [u32; 2], fb_used: [u32; 2], xid: [u32; 2], clock: u32) -> String {
    let mut t = String::new();
    for (name, help) in [
        ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
        ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
        (
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
        ),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
        (
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
            "Current clock throttle reasons.",
        ),
    ] {
        t.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for gpu in 0..2 {
            let value = match name {
                "DCGM_FI_DEV_SM_CLOCK" => clock.to_string(),
                "DCGM_FI_DEV_MEMORY_TEMP" => "9223372036854775794".into(),
                "DCGM_FI_DEV_GPU_TEMP" => (60 + gpu).to_string(),
                "DCGM_FI_DEV_POWER_USAGE" => format!("{}.5", 300 + gpu * 10),
                "DCGM_FI_DEV_GPU_UTIL" => util[gpu].to_string(),
                "DCGM_FI_DEV_XID_ERRORS" => xid[gpu].to_string(),
                "DCGM_FI_DEV_FB_FREE" => (81920 - fb_used[gpu]).to_string(),
                // Idle (0x1): no trouble.
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" => "1".into(),
                _ => fb_used[gpu].to_string(),
            };
            t.push_str(&format!(
                "{name}{{gpu=\"{gpu}\", UUID=\"GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e5{gpu}\",device=\"nvidia{gpu}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"}} {value}\n"
            ));
        }
    }
    t
}

#[test]
fn the_exporters_format_is_read_per_gpu() {
    let r = parse(&exporter([80, 40], [70000, 1000], [0, 0], 1980), 0, 1.0);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].gpu, (0, "0".to_owned()));
    assert_eq!(r[0].values[UTIL], Some(80.0));
    assert_eq!(r[1].values[FB_USED], Some(1000.0));
    assert_eq!(r[1].values[POWER], Some(310.5));
    assert_eq!(r[0].values[XID], Some(0.0));
}

#[test]
fn figures_over_a_window() {
    let mut all = Vec::new();
    for (t, util, xid) in [
        (0.0, [10, 20], [0, 0]),
        (1.0, [80, 90], [0, 0]),
        (2.0, [100, 60], [0, 79]),
        (3.0, [50, 50], [0, 79]),
        (9.0, [0, 0], [0, 79]),
    ] {
        all.extend(parse(&exporter(util, [5000, 6000], xid, 1500), 0, t));
    }
    let f = figures(&all, 1.0, 3.0);
    assert_eq!((f.gpus, f.scrapes), (2, 3));
    assert_eq!(f.gpu_utilization_mean, Some(430.0 / 6.0));
    assert_eq!(f.gpu_utilization_p95, Some(100.0));
    assert_eq!(f.gpu_memory_used_max_mib, Some(6000.0));
    assert_eq!(f.gpu_power_mean_w, Some(305.5));
    assert_eq!(f.gpu_temperature_max_c, Some(61.0));
    assert_eq!(f.gpu_sm_clock_min_mhz, Some(1500.0));
    // XID 79 (fallen off the bus) appeared once; the same value after is the same error.
    assert_eq!(f.gpu_xid_errors, Some(1));
    assert!(f.absent.is_empty());
    assert_eq!(figures(&all, 3.0, 9.0).gpu_xid_errors, Some(0));
}

#[test]
fn absent_series_are_absent_not_zero() {
    let text = "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 42\n\
                DCGM_FI_DEV_POWER_USAGE{gpu=\"0\"} 140737488355328\n";
    let all = parse(text, 0, 0.5);
    let f = figures(&all, 0.0, 1.0);
    assert_eq!(f.gpu_utilization_mean, Some(42.0));
    assert_eq!(f.gpu_power_mean_w, None);
    assert_eq!(f.gpu_xid_errors, None);
    assert_eq!(
        f.absent,
        [
            "gpu_memory_used",
            "gpu_power",
            "gpu_temperature",
            "gpu_sm_clock",
            "gpu_xid_errors",
            "throttle_share"
        ]
    );
    let json = serde_json::to_value(&f).unwrap();
    assert_eq!(json["gpu_xid_errors"], serde_json::Value::Null);
    let none = figures(&[], 0.0, 1.0);
    assert_eq!((none.gpus, none.gpu_utilization_mean), (0, None));
}

#[test]
fn throttling_is_the_worst_gpus_share_of_samples_with_a_reason_that_matters() {
    // GPU 0: idle (0x1) and application clocks (0x2) only; GPU 1: a hardware slowdown
    // (0x8) in one sample of five, under the newer series name.
    let mut all = Vec::new();
    for i in 0..5u32 {
        let gpu1 = if i == 2 { 0x8 | 0x1 } else { 0 };
        let text = format!(
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{gpu=\"0\"}} 3\n\
             DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{gpu=\"1\"}} {gpu1}\n"
        );
        all.extend(parse(&text, 0, f64::from(i)));
    }
    let f = figures(&all, 0.0, 4.0);
    assert_eq!(f.throttle_share, Some(0.2));
}

#[test]
fn an_xid_latched_before_the_run_is_counted_apart() {
    let mut all = Vec::new();
    for t in 0..3 {
        all.extend(parse(
            &exporter([50, 50], [9000, 9000], [0, 3], 1900),
            0,
            f64::from(t),
        ));
    }
    assert_eq!(xid_before_run(&all), Some(1));
    // Already there at the first scrape: not new during the window.
    assert_eq!(figures(&all, 1.0, 2.0).gpu_xid_errors, Some(0));
    assert_eq!(xid_before_run(&[]), None);
}

#[test]
fn a_soak_whose_gpu_memory_grows_fails() {
    let mut all = Vec::new();
    for i in 0..20 {
        let used = 10_000 + i * 1000;
        all.extend(parse(
            &exporter([50, 50], [used, used], [0, 0], 1900),
            0,
            f64::from(i),
        ));
    }
    let s = soak(&all, 0.0, 19.0, 0.1);
    assert_eq!(s.holds, Some(false), "{s:?}");
    assert!(
        s.reasons[0].starts_with("GPU memory used grew from"),
        "{s:?}"
    );
    let flat: Vec<Reading> = (0..20)
        .flat_map(|i| {
            parse(
                &exporter([50, 50], [9000, 9000], [0, 0], 1900),
                0,
                f64::from(i),
            )
        })
        .collect();
    assert_eq!(soak(&flat, 0.0, 19.0, 0.1).holds, Some(true));
    assert_eq!(soak(&flat[..4], 0.0, 1.0, 0.1).holds, None);
}
