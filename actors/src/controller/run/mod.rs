//! A run's files: the run folder claimed by one process ([`folder`]), checkpoints and the
//! loop state they carry ([`checkpoint`]), their checksums ([`checksums`]) and the run files
//! they keep copies of ([`copies`]), writing them ([`saving`], retried on I/O errors by
//! [`retry`]) and choosing the one to resume from ([`resume_point`]).

pub mod checkpoint;
pub(crate) mod checksums;
pub mod copies;
pub mod folder;
pub mod resume_point;
pub(crate) mod retry;
pub(crate) mod saving;
