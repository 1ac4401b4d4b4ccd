//! The protobuf messages of a scalar event file, with TensorFlow's field numbers
//! (`tensorflow/core/util/event.proto`, `tensorflow/core/framework/summary.proto`). The
//! `oneof`s of those files are optional fields here: at most one is set per event, and
//! the bytes on the wire are the same.

/// One record of an event file: the file's version line, a session marker or a summary.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The training step the event belongs to.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// `"brain.Event:2"` in the first record of a file.
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    /// The step's values.
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
    /// A session start: TensorBoard drops what earlier files logged at this step or later
    /// (a resumed run's replayed steps).
    #[prost(message, optional, tag = "7")]
    pub session_log: Option<SessionLog>,
}

/// The values of one step.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    /// One value per tag.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// One tagged scalar.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    /// The chart's name.
    #[prost(string, tag = "1")]
    pub tag: String,
    /// The value (protobuf `float`: TensorBoard's scalars are single precision).
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// A session marker.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionLog {
    /// `SessionLog.SessionStatus`: 1 = START.
    #[prost(int32, tag = "1")]
    pub status: i32,
}

impl SessionLog {
    /// `SessionLog.START`.
    pub const START: i32 = 1;
}
