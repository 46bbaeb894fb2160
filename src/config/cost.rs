//! `[cost]`: what serving costs an hour, from running costs, one-time costs amortized over
//! months, energy, and the idle and failure shares. The file's section, its validation
//! and the runtime value the cost engine divides by goodput.

use serde::Deserialize;

use super::Problem;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostSection {
    pub currency: String,
    pub per_hour: PerHourSection,
    /// One-time costs by name (migration, integration, upgrade, ...), spread over
    /// `amortize_months`.
    pub one_time: std::collections::BTreeMap<String, f64>,
    pub amortize_months: f64,
    /// Power drawn by the serving system, kW; with `energy_price_per_kwh` the energy cost.
    pub kw: Option<f64>,
    pub energy_price_per_kwh: Option<f64>,
    /// Share of paid hours the system stands idle, and share lost to failures and
    /// maintenance: the hours that serve carry the cost of the others.
    pub idle_share: f64,
    pub failure_share: f64,
    /// Usage prices, as a hosted API bills: per million input tokens (those served from
    /// the prefix cache at `per_million_cached_input_tokens` when set), per million output
    /// tokens, per request. Beside or instead of the hourly ones.
    pub per_million_input_tokens: Option<f64>,
    pub per_million_cached_input_tokens: Option<f64>,
    pub per_million_output_tokens: Option<f64>,
    pub per_request: Option<f64>,
}

/// Months one-time costs are spread over unless set (a three-year depreciation).
pub const DEFAULT_AMORTIZE_MONTHS: f64 = 36.0;

impl Default for CostSection {
    fn default() -> Self {
        Self {
            currency: "USD".into(),
            per_hour: PerHourSection::default(),
            one_time: std::collections::BTreeMap::new(),
            amortize_months: DEFAULT_AMORTIZE_MONTHS,
            kw: None,
            energy_price_per_kwh: None,
            idle_share: 0.0,
            failure_share: 0.0,
            per_million_input_tokens: None,
            per_million_cached_input_tokens: None,
            per_million_output_tokens: None,
            per_request: None,
        }
    }
}

/// Cost of the serving system per hour, by component; each optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerHourSection {
    pub hardware: Option<f64>,
    pub power: Option<f64>,
    pub hosting: Option<f64>,
    pub licences: Option<f64>,
    pub operations: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Cost {
    pub currency: String,
    /// Sum of the components.
    pub per_hour: f64,
    pub components: Vec<(String, f64)>,
    /// What is billed by use, beside the hours.
    pub usage: UsagePrices,
    /// The one-time items as configured (their amortized sum is the `one_time` component).
    pub one_time: Vec<(String, f64)>,
    /// The energy price: with `kw` it is the `energy` component; without, a replay with
    /// `--gpu-metrics` prices the power it measured.
    pub energy_price_per_kwh: Option<f64>,
    /// `idle_share + failure_share`: the serving hours carry the others' cost.
    pub lost_share: f64,
}

/// `[cost]`'s usage prices; `None` where not billed.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct UsagePrices {
    pub per_million_input_tokens: Option<f64>,
    pub per_million_cached_input_tokens: Option<f64>,
    pub per_million_output_tokens: Option<f64>,
    pub per_request: Option<f64>,
}

/// What was used over a span, for [`UsagePrices::cost`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Used {
    pub requests: f64,
    pub input_tokens: f64,
    /// Of `input_tokens`, those served from the prefix cache.
    pub cached_input_tokens: f64,
    pub output_tokens: f64,
}

impl Cost {
    /// The components and their sum per hour with the energy drawn at `kw` (measured),
    /// in place of the configured `energy` line, the idle and failure uplift redone on
    /// the new base. `None` without an energy price.
    pub fn with_measured_power(&self, kw: f64) -> Option<(Vec<(String, f64)>, f64)> {
        let price = self.energy_price_per_kwh?;
        let mut components: Vec<(String, f64)> = self
            .components
            .iter()
            .filter(|(k, _)| k != "energy" && k != "idle_and_failure")
            .cloned()
            .collect();
        components.push(("energy".to_owned(), kw * price));
        let base: f64 = components.iter().map(|(_, v)| v).sum();
        if self.lost_share > 0.0 {
            components.push((
                "idle_and_failure".to_owned(),
                base * self.lost_share / (1.0 - self.lost_share),
            ));
        }
        let per_hour = components.iter().map(|(_, v)| v).sum();
        Some((components, per_hour))
    }
}

impl UsagePrices {
    /// Some usage price is set.
    pub fn any(&self) -> bool {
        *self != UsagePrices::default()
    }

    /// What `used` costs. Cached input tokens are priced at the input price unless a
    /// cached price is set.
    pub fn cost(&self, used: Used) -> f64 {
        let input = self.per_million_input_tokens.unwrap_or(0.0);
        let cached = self.per_million_cached_input_tokens.unwrap_or(input);
        let cached_tokens = used.cached_input_tokens.min(used.input_tokens);
        ((used.input_tokens - cached_tokens) * input
            + cached_tokens * cached
            + used.output_tokens * self.per_million_output_tokens.unwrap_or(0.0))
            / 1e6
            + used.requests * self.per_request.unwrap_or(0.0)
    }
}

pub fn validate_cost(c: &CostSection, problems: &mut Vec<Problem>) -> Cost {
    let p = &c.per_hour;
    let components: Vec<(String, f64)> = [
        ("hardware", p.hardware),
        ("power", p.power),
        ("hosting", p.hosting),
        ("licences", p.licences),
        ("operations", p.operations),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
    .collect();
    for (k, v) in &components {
        if !(v.is_finite() && *v >= 0.0) {
            problems.push(Problem::invalid(
                format!("cost.per_hour.{k}"),
                "must be ≥ 0",
            ));
        }
    }
    if c.currency.is_empty() || !c.currency.bytes().all(|b| b.is_ascii_alphanumeric()) {
        problems.push(Problem::invalid(
            "cost.currency",
            "must be a currency code like USD",
        ));
    }
    let mut components = components;
    let mut one_time = 0.0;
    for (k, v) in &c.one_time {
        if v.is_finite() && *v >= 0.0 {
            one_time += v;
        } else {
            problems.push(Problem::invalid(
                format!("cost.one_time.{k}"),
                "must be ≥ 0",
            ));
        }
    }
    if !(c.amortize_months.is_finite() && c.amortize_months > 0.0) {
        problems.push(Problem::invalid(
            "cost.amortize_months",
            "must be a positive number of months",
        ));
    } else if one_time > 0.0 {
        components.push((
            "one_time".to_owned(),
            one_time / (c.amortize_months * HOURS_PER_MONTH),
        ));
    }
    match (c.kw, c.energy_price_per_kwh) {
        (Some(kw), Some(price)) => {
            for (k, v) in [("kw", kw), ("energy_price_per_kwh", price)] {
                if !(v.is_finite() && v >= 0.0) {
                    problems.push(Problem::invalid(format!("cost.{k}"), "must be ≥ 0"));
                }
            }
            components.push(("energy".to_owned(), kw * price));
        }
        (None, None) => {}
        // Priced, not sized: a replay with --gpu-metrics measures the power.
        (None, Some(price)) => {
            if !(price.is_finite() && price >= 0.0) {
                problems.push(Problem::invalid("cost.energy_price_per_kwh", "must be ≥ 0"));
            }
        }
        (Some(_), None) => problems.push(Problem::invalid(
            "cost.kw",
            "cost.kw and cost.energy_price_per_kwh go together (energy = kW × price per kWh)",
        )),
    }
    for (k, v) in [
        ("idle_share", c.idle_share),
        ("failure_share", c.failure_share),
    ] {
        if !(v.is_finite() && (0.0..1.0).contains(&v)) {
            problems.push(Problem::invalid(format!("cost.{k}"), "must be in [0, 1)"));
        }
    }
    let lost = c.idle_share + c.failure_share;
    if lost.is_nan() || lost >= 1.0 {
        problems.push(Problem::invalid(
            "cost.idle_share",
            "cost.idle_share + cost.failure_share must be below 1",
        ));
    }
    let usage = UsagePrices {
        per_million_input_tokens: c.per_million_input_tokens,
        per_million_cached_input_tokens: c.per_million_cached_input_tokens,
        per_million_output_tokens: c.per_million_output_tokens,
        per_request: c.per_request,
    };
    for (k, v) in [
        ("per_million_input_tokens", usage.per_million_input_tokens),
        (
            "per_million_cached_input_tokens",
            usage.per_million_cached_input_tokens,
        ),
        ("per_million_output_tokens", usage.per_million_output_tokens),
        ("per_request", usage.per_request),
    ] {
        if v.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
            problems.push(Problem::invalid(format!("cost.{k}"), "must be ≥ 0"));
        }
    }
    let base: f64 = components.iter().map(|(_, v)| v).sum();
    if lost > 0.0 && lost < 1.0 {
        // The serving hours carry the cost of the idle and failed ones.
        components.push(("idle_and_failure".to_owned(), base * lost / (1.0 - lost)));
    }
    Cost {
        currency: c.currency.clone(),
        per_hour: components.iter().map(|(_, v)| v).sum(),
        components,
        usage,
        one_time: c.one_time.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        energy_price_per_kwh: c.energy_price_per_kwh,
        lost_share: if lost > 0.0 && lost < 1.0 { lost } else { 0.0 },
    }
}

/// Hours per month for amortization (8,760 h / 12), as the cost engine's.
/// Hours per month (8,760 h / 12): one-time costs are amortized over them, and the cost
/// engine's "per month" figures use them.
pub const HOURS_PER_MONTH: f64 = 730.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_sums_components() {
        let c: CostSection = toml::from_str(
            "currency = \"EUR\"\nper_hour = { hardware = 9.8, power = 0.6, operations = 1.2 }\n",
        )
        .unwrap();
        let mut problems = Vec::new();
        let cost = validate_cost(&c, &mut problems);
        assert!(problems.is_empty());
        assert!((cost.per_hour - 11.6).abs() < 1e-9);
        assert_eq!(cost.components.len(), 3);
    }

    #[test]
    fn one_time_energy_and_idle_costs_become_components() {
        let c: CostSection = toml::from_str(
            "per_hour = { hardware = 4.0 }\none_time = { migration = 21900, integration = 4380 }\n\
             amortize_months = 12\nkw = 10\nenergy_price_per_kwh = 0.2\nidle_share = 0.3\nfailure_share = 0.2\n",
        )
        .unwrap();
        let mut problems = Vec::new();
        let cost = validate_cost(&c, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let get = |k: &str| cost.components.iter().find(|(n, _)| n == k).unwrap().1;
        // 26,280 over 12 × 730 h = 3/h; 10 kW × 0.2 = 2/h; (4 + 3 + 2) / (1 − 0.5) = 18/h.
        assert!((get("one_time") - 3.0).abs() < 1e-9);
        assert!((get("energy") - 2.0).abs() < 1e-9);
        assert!((get("idle_and_failure") - 9.0).abs() < 1e-9);
        assert!((cost.per_hour - 18.0).abs() < 1e-9);
    }

    #[test]
    fn measured_power_replaces_the_configured_energy_and_redoes_the_uplift() {
        let c: CostSection = toml::from_str(
            "per_hour = { hardware = 4.0 }\nkw = 10\nenergy_price_per_kwh = 0.2\nidle_share = 0.5\n",
        )
        .unwrap();
        let mut problems = Vec::new();
        let cost = validate_cost(&c, &mut problems);
        // (4 + 2) / 0.5 = 12 configured; measured 5 kW: (4 + 1) / 0.5 = 10.
        assert!((cost.per_hour - 12.0).abs() < 1e-9);
        let (components, per_hour) = cost.with_measured_power(5.0).unwrap();
        assert!((per_hour - 10.0).abs() < 1e-9, "{components:?}");
        let energy = components.iter().find(|(k, _)| k == "energy").unwrap().1;
        assert!((energy - 1.0).abs() < 1e-9);
    }

    #[test]
    fn usage_prices_cost_what_was_used() {
        let c: CostSection = toml::from_str(
            "per_million_input_tokens = 3.0\nper_million_cached_input_tokens = 0.3\n\
             per_million_output_tokens = 15.0\nper_request = 0.001\n",
        )
        .unwrap();
        let mut problems = Vec::new();
        let cost = validate_cost(&c, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(cost.per_hour, 0.0);
        assert!(cost.usage.any());
        // 2M input of which 1M cached, 1M output, 1,000 requests:
        // 1 × 3 + 1 × 0.3 + 1 × 15 + 1,000 × 0.001 = 19.3.
        let used = Used {
            requests: 1000.0,
            input_tokens: 2e6,
            cached_input_tokens: 1e6,
            output_tokens: 1e6,
        };
        assert!((cost.usage.cost(used) - 19.3).abs() < 1e-9);
        // Without a cached price, cached tokens cost what other input tokens do.
        let plain = UsagePrices {
            per_million_input_tokens: Some(3.0),
            ..UsagePrices::default()
        };
        assert!((plain.cost(used) - 6.0).abs() < 1e-9);
        let bad: CostSection = toml::from_str("per_million_output_tokens = -1\n").unwrap();
        let mut problems = Vec::new();
        validate_cost(&bad, &mut problems);
        assert!(
            problems
                .iter()
                .any(|p| p.to_string().contains("per_million_output_tokens"))
        );
    }

    #[test]
    fn bad_cost_keys_are_each_named() {
        let c: CostSection = toml::from_str(
            "per_hour = { power = 1.0 }\none_time = { upgrade = -1 }\namortize_months = 0\nkw = 3\n\
             energy_price_per_kwh = 0.1\nidle_share = 0.7\nfailure_share = 0.4\n",
        )
        .unwrap();
        let mut problems = Vec::new();
        validate_cost(&c, &mut problems);
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        let all = text.join("\n");
        for needle in ["cost.one_time.upgrade", "cost.amortize_months", "below 1"] {
            assert!(all.contains(needle), "{needle} missing in:\n{all}");
        }
        let priced: CostSection = toml::from_str("energy_price_per_kwh = 0.2\n").unwrap();
        let mut problems = Vec::new();
        let cost = validate_cost(&priced, &mut problems);
        assert!(
            problems.is_empty(),
            "a price alone waits for measured power"
        );
        assert!(cost.components.is_empty());
        let half: CostSection = toml::from_str("kw = 3\n").unwrap();
        let mut problems = Vec::new();
        validate_cost(&half, &mut problems);
        assert!(
            problems[0].to_string().contains("go together"),
            "{problems:?}"
        );
    }
}
