/// Infrastructure failures of the worker. A task that fails is not an `Error`: it is an
/// [`queue::Outcome`] recorded in the queue.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Queue(#[from] queue::Error),
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error("{0}")]
    Repo(String),
    /// The agent changed git metadata TaskBridge relies on (a worktree's `.git`, its admin
    /// directory, its HEAD): what changed. TaskBridge read and wrote nothing through it.
    #[error("tampered: {0}")]
    Tampered(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("{0}")]
    Config(String),
    #[error("a background job stopped unexpectedly: {0}")]
    Join(String),
    #[error("could not write the metrics: {0}")]
    Metrics(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// True when the caller's input was at fault (a bad repo, ref, prompt or id).
    pub fn is_user_error(&self) -> bool {
        match self {
            Error::Queue(e) => e.is_user_error(),
            Error::Repo(_) | Error::Config(_) => true,
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
