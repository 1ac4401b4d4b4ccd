//! TensorBoard event files of a run's step metrics (`[log] tensorboard = true`): every
//! `StepMetrics` becomes one `Event` whose `Summary` holds a scalar per metric, framed as
//! TFRecords in `<run>/tensorboard/events.out.tfevents.*`, which `tensorboard --logdir`
//! reads. The protobuf messages are the few fields of TensorFlow's `event.proto` and
//! `summary.proto` that scalars need ([`proto`]); the framing and its masked CRC-32C are
//! [`record`].

mod proto;
mod record;
mod writer;

pub use proto::{Event, SessionLog, Summary, SummaryValue};
pub use record::{read_records, RecordError};
pub use writer::{TensorBoardLog, TENSORBOARD_DIR};

#[cfg(test)]
mod tests;
