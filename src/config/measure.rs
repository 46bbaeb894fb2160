//! `[measure]`: what the measurement inspects and keeps. The file's section, its
//! validation and the runtime value.

use serde::Deserialize;

use super::restart::Changed;
use super::{Problem, validate::positive};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeasureSection {
    pub request_inspect_limit: u64,
    pub response_inspect_limit: u64,
    pub channel_capacity: usize,
    pub recent_requests: usize,
    pub max_models: usize,
    /// Time request arrivals and upstream reads by the kernel's receive stamps.
    pub kernel_timestamps: bool,
}

impl Default for MeasureSection {
    fn default() -> Self {
        Self {
            request_inspect_limit: 8 << 20,
            response_inspect_limit: 8 << 20,
            channel_capacity: 8192,
            recent_requests: 1000,
            max_models: 50,
            kernel_timestamps: true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Measure {
    pub request_inspect_limit: usize,
    pub response_inspect_limit: usize,
    pub channel_capacity: usize,
    pub recent_requests: usize,
    pub max_models: usize,
    /// Reads timed by the kernel's receive stamps where it gives them (`proxy::wire`).
    pub kernel_timestamps: bool,
}

impl Measure {
    /// The channel, the recent ring, the model labels and the sockets' options.
    pub(super) fn restart_only(&self, new: &Measure, changed: &mut Changed) {
        changed.check(
            &self.kernel_timestamps,
            &new.kernel_timestamps,
            "measure.kernel_timestamps",
        );
        changed.check(
            &self.channel_capacity,
            &new.channel_capacity,
            "measure.channel_capacity",
        );
        changed.check(
            &self.recent_requests,
            &new.recent_requests,
            "measure.recent_requests",
        );
        changed.check(&self.max_models, &new.max_models, "measure.max_models");
    }
}

/// The runtime `[measure]`.
pub(super) fn validate(m: &MeasureSection, problems: &mut Vec<Problem>) -> Measure {
    positive(
        "measure.channel_capacity",
        m.channel_capacity as u64,
        problems,
    );
    positive(
        "measure.recent_requests",
        m.recent_requests as u64,
        problems,
    );
    positive("measure.max_models", m.max_models as u64, problems);
    Measure {
        request_inspect_limit: usize::try_from(m.request_inspect_limit).unwrap_or(usize::MAX),
        response_inspect_limit: usize::try_from(m.response_inspect_limit).unwrap_or(usize::MAX),
        channel_capacity: m.channel_capacity,
        recent_requests: m.recent_requests,
        max_models: m.max_models,
        kernel_timestamps: m.kernel_timestamps,
    }
}
