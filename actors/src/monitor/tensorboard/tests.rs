use prost::Message;

use super::*;
use crate::monitor::StepMetrics;

fn events(bytes: &[u8]) -> Vec<Event> {
    read_records(bytes)
        .expect("intact records")
        .into_iter()
        .map(|r| Event::decode(r).expect("an Event"))
        .collect()
}

fn scalars(events: &[Event]) -> Vec<(String, i64, f32)> {
    events
        .iter()
        .filter_map(|e| e.summary.as_ref().map(|s| (e.step, s)))
        .flat_map(|(step, s)| {
            s.value
                .iter()
                .map(move |v| (v.tag.clone(), step, v.simple_value.expect("a scalar")))
        })
        .collect()
}

#[test]
fn reads_the_event_file_pytorch_writes() {
    // tools/tensorboard_check.py fixture: torch.utils.tensorboard.SummaryWriter's file
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tensorboard/torch_summary_writer.tfevents"
    );
    let events = events(&std::fs::read(path).unwrap());
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    assert_eq!(
        scalars(&events),
        vec![
            ("loss".to_string(), 1, 0.5),
            ("lr".to_string(), 1, 1e-3),
            ("loss".to_string(), 2, 0.25)
        ]
    );
}

#[test]
fn a_run_logs_a_version_a_session_start_and_every_metric_of_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = TensorBoardLog::create(dir.path()).unwrap();
    log.append(&StepMetrics::new(4).with("loss", 1.5).with("kl", 0.01))
        .unwrap();
    log.append(&StepMetrics::new(5).with("loss", f64::NAN))
        .unwrap();
    let path = log.path().to_path_buf();
    assert_eq!(path.parent().unwrap(), dir.path().join(TENSORBOARD_DIR));
    assert!(path
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("events.out.tfevents."));
    let events = events(&std::fs::read(&path).unwrap());
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    let start = events[1].session_log.as_ref().expect("a session start");
    assert_eq!((start.status, events[1].step), (SessionLog::START, 4));
    let got = scalars(&events);
    assert_eq!(
        &got[..2],
        &[("kl".into(), 4, 0.01), ("loss".into(), 4, 1.5)]
    );
    assert_eq!((got[2].0.as_str(), got[2].1), ("loss", 5));
    assert!(got[2].2.is_nan(), "NaN is logged as NaN");
    assert!(events[2].wall_time > 1.6e9, "seconds since the epoch");
}

#[test]
fn damaged_or_cut_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = TensorBoardLog::create(dir.path()).unwrap();
    log.append(&StepMetrics::new(1).with("loss", 2.0)).unwrap();
    let bytes = std::fs::read(log.path()).unwrap();
    let mut flipped = bytes.clone();
    let last = flipped.len() - 6;
    flipped[last] ^= 1;
    assert!(matches!(
        read_records(&flipped),
        Err(RecordError::Checksum { what: "data", .. })
    ));
    let mut bad_len = bytes.clone();
    bad_len[0] ^= 1;
    assert!(matches!(
        read_records(&bad_len),
        Err(RecordError::Checksum {
            offset: 0,
            what: "length"
        })
    ));
    assert!(matches!(
        read_records(&bytes[..bytes.len() - 1]),
        Err(RecordError::Truncated { .. })
    ));
}
