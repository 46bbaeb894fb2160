//! `[calibration] gpu_metrics`: dcgm-exporters scraped beside the engine, read back from
//! `GET /api/v1/calibration` `gpus` as the dashboard reads them.

use super::*;

/// Two GPUs as dcgm-exporter serves them (its HELP/TYPE lines and label set).
const DCGM_PAGE: &str = "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n\
DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\",device=\"nvidia0\",modelName=\"NVIDIA L4\",Hostname=\"n1\"} 90\n\
DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",UUID=\"GPU-b\",device=\"nvidia1\",modelName=\"NVIDIA L4\",Hostname=\"n1\"} 70\n\
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\n\
DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-a\",device=\"nvidia0\",modelName=\"NVIDIA L4\",Hostname=\"n1\"} 18000\n\
DCGM_FI_DEV_FB_USED{gpu=\"1\",UUID=\"GPU-b\",device=\"nvidia1\",modelName=\"NVIDIA L4\",Hostname=\"n1\"} 6000\n\
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).\n# TYPE DCGM_FI_DEV_FB_FREE gauge\n\
DCGM_FI_DEV_FB_FREE{gpu=\"0\",UUID=\"GPU-a\",device=\"nvidia0\",modelName=\"NVIDIA L4\",Hostname=\"n1\"} 4000\n\
DCGM_FI_DEV_FB_FREE{gpu=\"1\",UUID=\"GPU-b\",device=\"nvidia1\",modelName=\"NVIDIA L4\",Hostname=\"n1\"} 16000\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_exporters_show_beside_the_engine() {
    let (_sim, sim_url) = start_sim(fast_sim(1.0, 1.0)).await;
    let dcgm = scripted(vec![(Some(200), DCGM_PAGE)]).await;
    let mut cfg = calibrated(&sim_url, None);
    cfg.calibration.gpu_metrics = vec![
        dcgm.url().parse().unwrap(),
        "http://127.0.0.1:9/m".parse().unwrap(),
    ];
    let proxy = start_proxy_with(cfg).await;
    dcgm.wait_served(2).await;
    let g = poll_until!(
        "both GPUs of the exporter that answers",
        Duration::from_secs(15),
        {
            let s = status(&proxy).await;
            (s["gpus"]["gpus"] == 2).then(|| s["gpus"].clone())
        }
    );
    assert_eq!(
        (g["exporters"].as_u64(), g["exporters_up"].as_u64()),
        (Some(2), Some(1)),
        "{g}"
    );
    assert_eq!(
        (
            g["utilization_mean"].as_f64(),
            g["utilization_max"].as_f64()
        ),
        (Some(80.0), Some(90.0))
    );
    assert_eq!(g["memory_used_mib_max"], 18000.0);
    assert_eq!(g["memory_used_share_max"], 18000.0 / 22000.0);
    assert!(
        g["last_error"].as_str().unwrap().contains("127.0.0.1:9"),
        "{g}"
    );
    proxy.shutdown().await;
}
