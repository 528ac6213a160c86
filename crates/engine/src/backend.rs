//! The backend interface: where batches of compression jobs run. The CPU pool implements it;
//! an accelerator (nvCOMP, QAT, IAA) implements it the same way and drops in without changes
//! above the engine, as long as it produces zmem's object format (raw deflate is what they
//! all share, and it decodes on the CPU).

use crate::{Job, Sink};

/// A backend's own failure (device error, lost context, driver refusal).
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct BackendError(pub String);

/// A batch the backend did not take; the jobs come back untouched so the engine can run them
/// elsewhere.
pub enum Rejected {
    /// Queue full: try elsewhere now, try again later.
    Saturated(Vec<Job>),
    /// The backend failed; counts towards taking it out of service.
    Failed(Vec<Job>, BackendError),
    /// Jobs the backend cannot do (a codec it does not have): the CPU takes them, and nothing
    /// counts against the backend.
    Unsupported(Vec<Job>),
}

pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Takes a batch; every accepted job completes exactly once through `sink`, with an
    /// encoded object or an error (the engine then redoes it on the CPU).
    fn submit(&self, jobs: Vec<Job>, sink: Sink) -> Result<(), Rejected>;
    /// Returns once every accepted job has completed.
    fn drain(&self);
}

/// An accelerator backend to hand to whoever builds an engine (a store's configuration), with
/// the `Clone` and `Debug` those configurations need.
#[derive(Clone)]
pub struct SharedBackend(pub std::sync::Arc<dyn Backend>);

impl std::fmt::Debug for SharedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBackend({})", self.0.name())
    }
}
