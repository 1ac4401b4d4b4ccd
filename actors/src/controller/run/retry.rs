//! Saving a checkpoint again when writing it failed: a full disk or a lost mount often
//! clears within seconds (a log rotated, a mount back), so a save that fails with an I/O
//! error is tried [`SAVE_ATTEMPTS`] times, with a backoff growing from [`SAVE_BACKOFF`],
//! before the run stops (exit code 1). The save itself is `saving.rs`'s.

use crate::controller::context::Ctx;
use crate::controller::error::RunError;
use crate::controller::run::checkpoint::LoopState;
use crate::controller::run::saving::save_checkpoint;
use crate::error::Cause;
use crate::roles::{CriticRole, PolicyRole};
use oxalign_models::ModelError;
use oxalign_rlhf::RlhfError;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

/// Attempts of one checkpoint save, the first included.
pub(crate) const SAVE_ATTEMPTS: u32 = 3;
/// The wait before the second attempt; attempt `k + 1` waits `k` times as long.
pub(crate) const SAVE_BACKOFF: Duration = Duration::from_millis(500);

/// [`save_checkpoint`], tried again after a failed write (see the module doc).
pub(crate) async fn save_checkpoint_retried(
    ctx: &Ctx<'_>,
    policy: &dyn PolicyRole,
    critic: Option<&dyn CriticRole>,
    state: &LoopState,
) -> Result<PathBuf, RunError> {
    retry_writes(SAVE_ATTEMPTS, SAVE_BACKOFF, || {
        save_checkpoint(ctx, policy, critic, state)
    })
    .await
}

/// Runs `save` up to `attempts` times while it fails with a write error, waiting `backoff`,
/// `2 × backoff`, ... in between; any other error is returned at once.
pub(crate) async fn retry_writes<T, F, Fut>(
    attempts: u32,
    backoff: Duration,
    mut save: F,
) -> Result<T, RunError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, RunError>>,
{
    let mut attempt = 1;
    loop {
        match save().await {
            Err(e) if attempt < attempts && is_write_failure(&e) => {
                tracing::warn!("checkpoint attempt {attempt} of {attempts} failed: {e}; retrying");
                tokio::time::sleep(backoff * attempt).await;
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// True when `e` is a failed write (an OS error while writing a file of the checkpoint).
pub(crate) fn is_write_failure(e: &RunError) -> bool {
    match e {
        RunError::Io { .. } => true,
        RunError::Role { source, .. } => matches!(
            source.cause.as_ref(),
            Cause::Io { .. }
                | Cause::Model(ModelError::Io { .. })
                | Cause::Rlhf(RlhfError::Io { .. })
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::error::At;
    use crate::error::RoleError;
    use std::cell::Cell;

    fn enospc() -> RunError {
        RunError::Io {
            action: "seal checkpoint",
            path: "runs/r/checkpoints/.step_000002.tmp-1".into(),
            source: std::io::Error::from_raw_os_error(28),
        }
    }

    #[tokio::test]
    async fn a_failed_write_is_tried_again_then_reported() {
        let calls = Cell::new(0);
        let saved = retry_writes(3, Duration::ZERO, || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n < 3 {
                    Err(enospc())
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(saved.unwrap(), 3, "succeeds on the third attempt");

        calls.set(0);
        let failed = retry_writes(3, Duration::ZERO, || {
            calls.set(calls.get() + 1);
            async { Err::<(), _>(enospc()) }
        })
        .await
        .unwrap_err();
        assert_eq!(calls.get(), 3);
        assert!(
            !failed.is_bad_input(),
            "a full disk is a run failure: exit 1"
        );
    }

    #[tokio::test]
    async fn other_errors_are_not_retried() {
        let calls = Cell::new(0);
        let timeout = RoleError::new("policy", "save", Cause::Timeout { seconds: Some(1.0) });
        let at = At::Checkpoint {
            sft: false,
            step: 2,
        };
        let e = retry_writes(3, Duration::ZERO, || {
            calls.set(calls.get() + 1);
            let e = RunError::role(
                at,
                RoleError::new("policy", "save", Cause::Timeout { seconds: None }),
            );
            async { Err::<(), _>(e) }
        })
        .await
        .unwrap_err();
        assert_eq!(calls.get(), 1, "{e}");
        let model_io = RoleError::new(
            "policy",
            "save",
            ModelError::Io {
                action: "write",
                path: "model.safetensors".into(),
                source: std::io::Error::from_raw_os_error(28),
            },
        );
        assert!(is_write_failure(&RunError::role(at, model_io)));
        assert!(!is_write_failure(&RunError::role(at, timeout)));
    }
}
