//! What the simulator does: [`SimConfig`] (the runtime value) and [`SimArgs`] (the
//! `goodput sim` flags that build it).
//!
//! The defaults describe a plausible mid-sized model behind vLLM: a log-normal TTFT with a
//! 150 ms median, ~20 ms between tokens, and output lengths taken from the request's
//! `max_tokens`. Misbehaviour (errors, resets, a concurrency knee) is off unless asked for,
//! so a demo out of the box shows a healthy upstream.

use std::net::SocketAddr;

use super::dist::Dist;

/// Seed used when none is given: runs are reproducible by default, and `--seed` varies them.
pub const DEFAULT_SEED: u64 = 0x600d_9075;

/// How the simulated upstream behaves. Cheap to clone; read-only once the server runs.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Time to first token, in milliseconds.
    pub ttft: Dist,
    /// Gap between consecutive content events, in milliseconds.
    pub itl: Dist,
    /// Output length in tokens; `None` generates exactly the request's `max_tokens`
    /// (128 when the request sets none). Always capped by the request's `max_tokens`.
    pub output_tokens: Option<Dist>,
    /// Tokens carried by one streamed event (speculative decoding and some gateways send
    /// several); the last event of a stream may carry fewer. 0 is read as 1.
    pub tokens_per_event: u32,
    /// In-flight request count above which latency grows; `None` disables the slowdown.
    pub concurrency_knee: Option<u32>,
    /// Above the knee, TTFT and ITL are multiplied by
    /// `1 + slowdown_per_request * (in_flight - knee)`.
    pub slowdown_per_request: f64,
    /// Fraction of generation requests answered with HTTP 500 and an OpenAI error body.
    pub error_rate: f64,
    /// Fraction of streams cut mid-stream, without the terminating chunk.
    pub reset_rate: f64,
    /// Time between a stream's `[DONE]` and the end of its body. Some servers
    /// (llama-cpp-python's) end the body a moment after `[DONE]`; clients that stop
    /// reading at `[DONE]` have gone by then.
    pub pause_after_done: std::time::Duration,
    /// Seed for the per-request random generators.
    pub seed: u64,
    /// Model name reported when the request names none, and listed by `/v1/models`.
    pub model: String,
    /// The server's own cap on output length, like a model's maximum context: a reply
    /// that hits it ends with `finish_reason: "length"`.
    pub max_output_tokens: u32,
    /// The model's context limit on input: a prompt estimated (4 bytes a token) above it
    /// is answered 400 with vLLM's wording; `None` accepts any length.
    pub max_input_tokens: Option<u64>,
    /// Served at `GET /version` as vLLM does (`{"version": ...}`); `None`: no such route.
    pub engine_version: Option<String>,
    /// Keep the time every content event was handed to hyper in [`Truth::event_times`]
    /// (a benchmark measuring each event's transit); off, only the first and last are.
    ///
    /// [`Truth::event_times`]: super::Truth::event_times
    pub record_event_times: bool,
    /// Share of the deterministic requests (`temperature` 0 or a `seed`) answered with
    /// other words than the prompt's usual ones, as a replica whose batching changes the
    /// arithmetic would: exactly this share of every run of them, spread evenly.
    pub vary_share: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            ttft: Dist::LogNormal {
                median: 150.0,
                sigma: 0.5,
            },
            itl: Dist::Normal {
                mean: 20.0,
                sd: 5.0,
            },
            output_tokens: None,
            tokens_per_event: 1,
            concurrency_knee: None,
            // Only takes effect once a knee is set: 2% slower per request above it.
            slowdown_per_request: 0.02,
            error_rate: 0.0,
            reset_rate: 0.0,
            pause_after_done: std::time::Duration::ZERO,
            seed: DEFAULT_SEED,
            model: "sim-model".to_owned(),
            max_output_tokens: 4096,
            max_input_tokens: None,
            engine_version: None,
            record_event_times: false,
            vary_share: 0.0,
        }
    }
}

/// Flags of `goodput sim`.
#[derive(clap::Args, Clone, Debug)]
pub struct SimArgs {
    /// Address to listen on (HTTP/1.1 and h2c with prior knowledge).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Time to first token in ms: fixed:V | normal:MEAN,SD | lognormal:MEDIAN,SIGMA.
    #[arg(long, value_name = "DIST", default_value = "lognormal:150,0.5")]
    pub ttft: Dist,
    /// Inter-token latency in ms (same forms as --ttft).
    #[arg(long, value_name = "DIST", default_value = "normal:20,5")]
    pub itl: Dist,
    /// Output length in tokens; default: the request's max_tokens (128 if unset).
    #[arg(long, value_name = "DIST")]
    pub output_tokens: Option<Dist>,
    /// Tokens per streamed event.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tokens_per_event: u32,
    /// In-flight requests above which latency grows (see --slowdown).
    #[arg(long, value_name = "N")]
    pub concurrency_knee: Option<u32>,
    /// Latency growth per in-flight request above the knee (0.02 = +2% each).
    #[arg(long, value_name = "F", default_value_t = 0.02, value_parser = non_negative)]
    pub slowdown: f64,
    /// Fraction of requests answered with HTTP 500.
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = fraction)]
    pub error_rate: f64,
    /// Fraction of streams reset mid-stream.
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = fraction)]
    pub reset_rate: f64,
    /// Milliseconds between a stream's `[DONE]` and the end of its body (as
    /// llama-cpp-python's server does).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub pause_after_done: u64,
    /// Seed of the per-request random generators.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Model name reported when the request names none.
    #[arg(long, value_name = "NAME", default_value = "sim-model")]
    pub model: String,
    /// The server's cap on output tokens per request.
    #[arg(long, value_name = "N", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_output_tokens: u32,
    /// Context limit on input tokens (estimated at 4 bytes each): longer prompts get 400.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_input_tokens: Option<u64>,
    /// Share of deterministic requests (temperature 0 or a seed) answered with other words
    /// than the same prompt usually gets.
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = fraction)]
    pub vary_share: f64,
    /// Answer `GET /version` with this version, as vLLM does (no such route without it).
    #[arg(long, value_name = "VERSION")]
    pub engine_version: Option<String>,
}

impl SimArgs {
    /// The runtime configuration these flags describe.
    pub fn to_config(&self) -> SimConfig {
        SimConfig {
            ttft: self.ttft.clone(),
            itl: self.itl.clone(),
            output_tokens: self.output_tokens.clone(),
            tokens_per_event: self.tokens_per_event,
            concurrency_knee: self.concurrency_knee,
            slowdown_per_request: self.slowdown,
            error_rate: self.error_rate,
            reset_rate: self.reset_rate,
            pause_after_done: std::time::Duration::from_millis(self.pause_after_done),
            seed: self.seed,
            model: self.model.clone(),
            max_output_tokens: self.max_output_tokens,
            max_input_tokens: self.max_input_tokens,
            engine_version: self.engine_version.clone(),
            // Grows with every event: for the benchmarks that embed the simulator.
            record_event_times: false,
            vary_share: self.vary_share,
        }
    }
}

fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a finite number >= 0")),
    }
}

fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a fraction between 0 and 1")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn defaults_match_sim_config_default() {
        let cli = Cli::try_parse_from(["sim"]).unwrap();
        let from_args = cli.sim.to_config();
        let default = SimConfig::default();
        assert_eq!(from_args.ttft, default.ttft);
        assert_eq!(from_args.itl, default.itl);
        assert_eq!(from_args.output_tokens, default.output_tokens);
        assert_eq!(from_args.tokens_per_event, default.tokens_per_event);
        assert_eq!(from_args.slowdown_per_request, default.slowdown_per_request);
        assert_eq!(from_args.seed, default.seed);
        assert_eq!(from_args.model, default.model);
        assert_eq!(from_args.max_output_tokens, default.max_output_tokens);
        assert_eq!(cli.sim.listen, "127.0.0.1:8000".parse().unwrap());
    }

    #[test]
    fn flags_are_parsed() {
        let cli = Cli::try_parse_from([
            "sim",
            "--listen=127.0.0.1:0",
            "--ttft=fixed:5",
            "--itl=normal:2,1",
            "--output-tokens=lognormal:100,0.3",
            "--tokens-per-event=4",
            "--concurrency-knee=32",
            "--slowdown=0.1",
            "--error-rate=0.25",
            "--reset-rate=0.5",
            "--seed=9",
            "--model=m",
        ])
        .unwrap();
        let cfg = cli.sim.to_config();
        assert_eq!(cfg.ttft, Dist::Fixed(5.0));
        assert_eq!(
            cfg.output_tokens,
            Some(Dist::LogNormal {
                median: 100.0,
                sigma: 0.3
            })
        );
        assert_eq!((cfg.tokens_per_event, cfg.concurrency_knee), (4, Some(32)));
        assert_eq!((cfg.error_rate, cfg.reset_rate, cfg.seed), (0.25, 0.5, 9));
        assert_eq!(cfg.model, "m");
    }

    #[test]
    fn bad_flags_are_rejected() {
        for bad in [
            "--error-rate=1.5",
            "--tokens-per-event=0",
            "--ttft=weird:1",
            "--slowdown=-1",
        ] {
            assert!(Cli::try_parse_from(["sim", bad]).is_err(), "{bad}");
        }
    }
}
