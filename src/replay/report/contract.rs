//! report.json `contract`: what was tested, with what and how — the candidate's named
//! fields (`--contract`, else the profile header), the profile, the load and the SLO.

use std::collections::BTreeMap;

use super::{
    Inputs,
    json::{
        BurstOut, ClassTargets, Contract, CostConfigOut, GateThresholds, LoadOut, PercentileOut,
        ProfileId, RampOut, StepOut,
    },
};
use crate::replay::{cli::Mode, describe::redact_text};

/// `--contract` keys with a field of their own besides the recorded six.
pub const NAMED_FIELDS: [&str; 14] = [
    "parameters",
    "architecture",
    "task",
    "batching",
    "prefix_cache",
    "kv_cache",
    "speculative_decoding",
    "cards",
    "nodes",
    "interconnect",
    "driver_version",
    "framework_version",
    "container_image",
    "run_id",
];

pub(super) fn contract(i: &Inputs<'_>, steps: &[StepOut], run_s: f64) -> Contract {
    let a = i.args;
    // The fault command is recorded as run, but never with a credential in it.
    let secrets: Vec<String> = a
        .api_key_env
        .as_deref()
        .and_then(|v| std::env::var(v).ok())
        .into_iter()
        .collect();
    let recorded = i
        .profile
        .files
        .first()
        .map(|f| f.header.contract.clone())
        .unwrap_or_default();
    let mut sources = BTreeMap::new();
    let mut extra: BTreeMap<String, String> = a.contract.iter().cloned().collect();
    let mut pick = |key: &str, recorded: &Option<String>| {
        if let Some(v) = extra.remove(key) {
            sources.insert(key.to_owned(), "flag");
            Some(v)
        } else {
            recorded.clone().inspect(|_| {
                sources.insert(key.to_owned(), "profile");
            })
        }
    };
    let model_revision = pick("model_revision", &recorded.model_revision);
    let engine = pick("engine", &recorded.engine);
    let engine_version = pick("engine_version", &recorded.engine_version);
    let hardware = pick("hardware", &recorded.hardware);
    let precision = pick("precision", &recorded.precision);
    let notes = pick("notes", &recorded.notes);
    let mut named: BTreeMap<&'static str, String> = BTreeMap::new();
    for key in NAMED_FIELDS {
        if let Some(v) = pick(key, &None) {
            named.insert(key, v);
        }
    }
    let mut take = |k: &'static str| named.remove(k);
    let run_id = take("run_id").unwrap_or_else(|| {
        let at = humantime::format_rfc3339_seconds(i.started_at).to_string();
        let compact: String = at.chars().filter(char::is_ascii_alphanumeric).collect();
        format!("{compact}-{:08x}", rand::random::<u32>())
    });
    let mut models: BTreeMap<String, u64> = BTreeMap::new();
    for s in i.samples {
        *models.entry(i.tables.name(s.model).to_owned()).or_insert(0) += 1;
    }
    let model = models
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(m, _)| m.clone());
    let slo = i
        .config
        .slo
        .all_classes()
        .map(|c| ClassTargets {
            name: c.name.to_string(),
            ttft_ms: c.targets.ttft_ms,
            tpot_ms: c.targets.tpot_ms,
            e2e_ms: c.targets.e2e_ms,
            attainment: c.attainment,
            percentiles: c
                .percentiles
                .iter()
                .map(|p| PercentileOut {
                    metric: p.metric.as_str(),
                    quantile: p.quantile,
                    max_ms: p.max_ms,
                })
                .collect(),
        })
        .collect();
    Contract {
        target: i.target.to_owned(),
        model: a.model.clone().or(model),
        models,
        model_revision,
        engine,
        engine_version,
        hardware,
        precision,
        notes,
        parameters: take("parameters"),
        architecture: take("architecture"),
        task: take("task"),
        batching: take("batching"),
        prefix_cache: take("prefix_cache"),
        kv_cache: take("kv_cache"),
        speculative_decoding: take("speculative_decoding"),
        cards: take("cards"),
        nodes: take("nodes"),
        interconnect: take("interconnect"),
        driver_version: take("driver_version"),
        framework_version: take("framework_version"),
        container_image: take("container_image"),
        run_id,
        extra,
        sources,
        profile: ProfileId {
            files: i
                .profile
                .files
                .iter()
                .map(|f| f.path.display().to_string())
                .collect(),
            salt_id: i.profile.common_salt_id().map(str::to_owned),
            hash: i.profile_hash.clone(),
            requests: i.profile.entries.len(),
            recorded_contract: recorded,
            summary: crate::profile::Summary::of(i.profile),
        },
        load: LoadOut {
            mode: a.mode.as_str(),
            concurrency: (a.mode == Mode::Steps).then(|| a.concurrency.clone()),
            rates: (a.mode == Mode::Ramp).then(|| steps.iter().filter_map(|s| s.rate).collect()),
            rate_scale: a.rate_scale,
            step_duration_s: a.step_duration.as_secs_f64(),
            warmup_s: a.warmup.as_secs_f64(),
            soak_duration_s: (a.mode == Mode::Soak).then_some(a.soak_duration.as_secs_f64()),
            soak_rate: i.soak_rate,
            required_concurrency: i.required_concurrency,
            required_rate: i.required_rate,
            max_requests: a.max_requests,
            max_in_flight: a.max_in_flight,
            repeat: if a.mode == Mode::Steps { a.repeat } else { 1 },
            seed: a.seed,
            ignore_eos: a.ignore_eos,
            idle_timeout_s: a.idle_timeout.as_secs_f64(),
            prompt_lengths: i.prompt_lengths.clone(),
            block_bytes: i.workload.block_bytes,
            // A soak without --soak-rate finds its rate with a quick ramp.
            ramp: (a.mode == Mode::Ramp || (a.mode == Mode::Soak && a.soak_rate.is_none()))
                .then_some(RampOut {
                    start: a.ramp_start,
                    factor: a.ramp_factor,
                    steps: a.ramp_steps,
                }),
            soak_rate_source: (a.mode == Mode::Soak).then_some(if a.soak_rate.is_some() {
                "flag"
            } else {
                "knee"
            }),
            burst: a.burst.map(|(rate, d)| BurstOut {
                rate,
                duration_s: d.as_secs_f64(),
            }),
            inject: a.inject.iter().map(|(k, s)| (k.as_str(), *s)).collect(),
            context_tokens: a.context_tokens,
            fault_cmd: a.fault_cmd.as_deref().map(|c| redact_text(c, &secrets)),
            fault_at_s: a.fault_at.map(|d| d.as_secs_f64()),
            probes: a.probes.as_ref().map(|p| p.display().to_string()),
            probe_share: a.probes.as_ref().map(|_| a.probe_share),
        },
        started_at: humantime::format_rfc3339_millis(i.started_at).to_string(),
        duration_s: run_s,
        goodput_version: env!("CARGO_PKG_VERSION").into(),
        slo,
        gates: GateThresholds {
            quality_min: a.quality_min(),
            isolation_max_drop_points: a.isolation_max_drop,
            recovery_deadline_s: a
                .fault_cmd
                .as_ref()
                .map(|_| a.recovery_deadline.as_secs_f64()),
            soak_max_kv_growth: a.soak_max_kv_growth,
            soak_max_waiting_growth: a.soak_max_waiting_growth,
            soak_max_jitter_growth: a.soak_max_jitter_growth,
            max_throttle_share: a.max_throttle_share,
            max_preemptions: a.max_preemptions,
            host_memory_min_share: a.host_memory_min_share,
            allow_unjudged: {
                let mut g: Vec<&'static str> =
                    a.allow_unjudged.iter().map(|g| g.as_str()).collect();
                g.sort_unstable();
                g.dedup();
                g
            },
        },
        cost: i.config.cost.as_ref().map(|c| CostConfigOut {
            currency: c.currency.clone(),
            per_hour: c.per_hour,
            components: c.components.iter().cloned().collect(),
        }),
    }
}
