//! The measurement path's data-path half: a tower [`MeasureLayer`] that stamps
//! `t_arrival`, keeps or assigns the request id, and wraps both bodies; the
//! [`MeasuredBody`] that timestamps every upstream frame (with the time of the read that
//! brought it, where the connection keeps a [`ReadClock`]); and the per-request [`Tap`] that
//! emits once, at end of stream or on drop, into the bounded [`Recorder`] channel.
//! [`record`] defines the finished record, built off the hot path in [`finish`].

mod body;
mod clock;
mod delivery;
pub mod finish;
mod layer;
mod metrics;
mod mirror;
pub mod record;
mod request_id;
mod sink;
mod tap;
mod traceparent;
mod upgrade;
pub mod verdict;

pub use body::{MeasuredBody, RequestCapture, RequestTap};
pub use clock::{ClientReads, Clock, ReadClock};
pub use delivery::{Delivery, Mark};
pub use layer::{Measure, MeasureLayer, Settings, header_targets};
pub use metrics::RequestMetrics;
pub use mirror::{Mirror, MirrorHead, MirrorTicket, Unmirrored};
pub use record::{
    Fault, Outcome, Pairing, RequestRecord, RequestTrace, ShadowCut, Target, TokenCount,
    TokenSource, WallClock,
};
pub use request_id::REQUEST_ID;
pub use sink::{Arrival, Held, Recorder};
pub use tap::{
    Delivered, Ending, HeadInfo, IdleTimeout, Pending, ProxyFailure, SlowBody, Tap, Timeline,
};
pub use traceparent::TraceParent;
pub use upgrade::{TunnelDone, Upgraded};
