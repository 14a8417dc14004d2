//! Acknowledgements as the completer holds them: submits and failure
//! reports waiting for the commit of their batch, and what each came to.

use tessera_lease::{Failure, FencingToken, Principal, Submission, Submitted, TaskState};

use crate::error::Error;
use crate::model::audit::ActionScope;
use crate::model::task::TaskRef;

/// One acknowledgement waiting for its commit.
#[derive(Debug)]
pub(crate) struct Ack {
    pub(crate) scope: ActionScope,
    pub(crate) task: TaskRef,
    pub(crate) kind: AckKind,
}

/// A submission with its output, or a failure report.
#[derive(Debug)]
pub(crate) enum AckKind {
    Submit {
        submission: Submission,
        output: Option<Vec<u8>>,
    },
    Fail {
        holder: Principal,
        token: FencingToken,
        failure: Failure,
    },
}

/// What an acknowledgement came to.
#[derive(Debug, Clone)]
pub(crate) enum Acked {
    Submitted(Submitted),
    Failed(TaskState),
}

/// An acknowledgement's answer: what the rules said of it, inside `Ok`,
/// once its batch committed; the commit's error when the batch did not.
pub(crate) type AckAnswer = Result<Result<Acked, Error>, Error>;
