//! The job record and its state machine: queued → running → succeeded | failed | cancelled.

use serde::{Deserialize, Serialize};

use crate::chat::Answer;
use crate::clock::Timestamp;
use crate::error::{ApiError, ErrorBody};
use crate::ids::JobId;

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Accepted, waiting for its Hold and a place to run.
    Queued,
    /// Holding tokens, generating.
    Running,
    /// Finished with a Completion.
    Succeeded,
    /// Finished with an error object.
    Failed,
    /// Stopped by a cancel request.
    Cancelled,
}

impl JobStatus {
    /// Whether the job has ended.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled
        )
    }

    /// The lowercase name, as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// Parses the lowercase name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            JobStatus::Queued,
            JobStatus::Running,
            JobStatus::Succeeded,
            JobStatus::Failed,
            JobStatus::Cancelled,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }
}

/// A state change that the state machine does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job {id}: cannot {action} a job that is {from:?}")]
pub struct TransitionError {
    /// The job.
    pub id: JobId,
    /// Its status.
    pub from: JobStatus,
    /// What was tried.
    pub action: &'static str,
}

impl From<TransitionError> for ApiError {
    fn from(e: TransitionError) -> Self {
        ApiError::internal(e.to_string())
    }
}

/// What a finished job keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobResult {
    /// A succeeded job's answer: a Completion, or a chat completion for a chat body.
    Completion(Answer),
    /// A failed job's error, answered with its own status.
    Error(ErrorBody),
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It produced its answer.
    Succeeded(Answer),
    /// It failed with this error.
    Failed(ApiError),
    /// A cancel request stopped it.
    Cancelled,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// UUIDv7.
    pub id: JobId,
    /// The API key it belongs to.
    pub key_id: String,
    /// The model id as requested.
    pub model: String,
    /// Where it stands.
    pub status: JobStatus,
    /// A cancel was asked for.
    pub cancel_requested: bool,
    /// When it was accepted.
    pub created_at: Timestamp,
    /// When its current run started.
    pub started_at: Option<Timestamp>,
    /// When it ended.
    pub finished_at: Option<Timestamp>,
    /// When its result stops being kept.
    pub expires_at: Option<Timestamp>,
    /// Running, or ended and not yet charged.
    pub usage_pending: bool,
    /// The request body, canonical JSON.
    pub body: String,
    /// How many times it was started (more than once after a restart).
    pub runs: u32,
}

impl Job {
    /// A queued job.
    pub fn new(id: JobId, key_id: &str, model: &str, body: String, now: Timestamp) -> Self {
        Job {
            id,
            key_id: key_id.to_owned(),
            model: model.to_owned(),
            status: JobStatus::Queued,
            cancel_requested: false,
            created_at: now,
            started_at: None,
            finished_at: None,
            expires_at: None,
            usage_pending: false,
            body,
            runs: 0,
        }
    }

    fn refuse(&self, action: &'static str) -> TransitionError {
        TransitionError {
            id: self.id,
            from: self.status,
            action,
        }
    }

    /// The id of the Hold this job takes while it runs.
    pub fn hold_id(&self) -> String {
        self.id.request_id()
    }

    /// queued → running; its usage is pending from now on.
    pub fn start(&mut self, now: Timestamp) -> Result<(), TransitionError> {
        if self.status != JobStatus::Queued {
            return Err(self.refuse("start"));
        }
        self.status = JobStatus::Running;
        self.started_at = Some(now);
        self.usage_pending = true;
        self.runs += 1;
        Ok(())
    }

    /// running → queued, for a run that a crash cut short; it will run again.
    pub fn requeue(&mut self) -> Result<(), TransitionError> {
        if self.status != JobStatus::Running {
            return Err(self.refuse("requeue"));
        }
        self.status = JobStatus::Queued;
        self.started_at = None;
        self.usage_pending = false;
        Ok(())
    }

    /// Ends the job with `status`; its result is kept for `retention_ms`.
    /// A queued job may only end as failed or cancelled, a running one any way.
    pub fn finish(
        &mut self,
        status: JobStatus,
        now: Timestamp,
        retention_ms: i64,
    ) -> Result<(), TransitionError> {
        let allowed = match self.status {
            JobStatus::Running => status.is_final(),
            JobStatus::Queued => matches!(status, JobStatus::Failed | JobStatus::Cancelled),
            _ => false,
        };
        if !allowed {
            return Err(self.refuse("finish"));
        }
        self.status = status;
        self.finished_at = Some(now);
        self.expires_at = Some(now.plus_millis(retention_ms));
        self.usage_pending = false;
        Ok(())
    }

    /// Whether the result is past `expires_at`.
    pub fn result_expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|e| now >= e)
    }

    /// The job object the API shows.
    pub fn view(&self, now: Timestamp) -> JobObject {
        let id = self.id.to_string();
        JobObject {
            status_url: format!("/v1/completion-jobs/{id}"),
            result_url: format!("/v1/completion-jobs/{id}/result"),
            request_id: self.id.request_id(),
            id,
            model: self.model.clone(),
            status: self.status,
            cancel_requested: self.cancel_requested,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            expires_at: self.expires_at,
            result_expired: self.result_expired(now),
            usage_pending: self.usage_pending,
        }
    }
}

/// The job object of the API, with exactly the tutorial's fields in its order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobObject {
    /// UUIDv7, dashed.
    pub id: String,
    /// `req_job_<id without dashes>`.
    pub request_id: String,
    /// The model id as requested.
    pub model: String,
    /// Where it stands.
    pub status: JobStatus,
    /// A cancel was asked for.
    pub cancel_requested: bool,
    /// When it was accepted.
    pub created_at: Timestamp,
    /// When its run started.
    pub started_at: Option<Timestamp>,
    /// When it ended.
    pub finished_at: Option<Timestamp>,
    /// `finished_at` + retention.
    pub expires_at: Option<Timestamp>,
    /// The result is gone.
    pub result_expired: bool,
    /// `/v1/completion-jobs/{id}`.
    pub status_url: String,
    /// `/v1/completion-jobs/{id}/result`.
    pub result_url: String,
    /// Running, or ended and not yet charged.
    pub usage_pending: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        let t = Timestamp::parse("2026-11-02T18:35:08.037+00:00").unwrap();
        Job::new(JobId::new_v7(t, [1; 10]), "k", "llama-8b", "{}".into(), t)
    }

    #[test]
    fn runs_through_the_happy_path() {
        let mut j = job();
        j.start(Timestamp(j.created_at.0 + 28)).unwrap();
        assert!(j.usage_pending);
        assert_eq!(j.status, JobStatus::Running);
        j.finish(
            JobStatus::Succeeded,
            Timestamp(j.created_at.0 + 95),
            Timestamp::DAY_MS,
        )
        .unwrap();
        assert!(!j.usage_pending);
        assert_eq!(
            j.expires_at.unwrap().to_string(),
            "2026-11-03T18:35:08.132+00:00"
        );
    }

    #[test]
    fn refuses_illegal_transitions() {
        let mut j = job();
        assert!(j.finish(JobStatus::Succeeded, Timestamp(0), 1).is_err());
        assert!(j.requeue().is_err());
        j.start(Timestamp(1)).unwrap();
        assert!(j.start(Timestamp(2)).is_err());
        j.finish(JobStatus::Cancelled, Timestamp(3), 1).unwrap();
        assert!(j.finish(JobStatus::Failed, Timestamp(4), 1).is_err());
        assert!(j.start(Timestamp(5)).is_err());
    }

    #[test]
    fn requeue_after_a_crash_runs_again() {
        let mut j = job();
        j.start(Timestamp(1)).unwrap();
        j.requeue().unwrap();
        assert_eq!(
            (j.status, j.started_at, j.usage_pending),
            (JobStatus::Queued, None, false)
        );
        j.start(Timestamp(2)).unwrap();
        assert_eq!(j.runs, 2);
    }

    #[test]
    fn result_expires_at_expires_at() {
        let mut j = job();
        j.start(Timestamp(10)).unwrap();
        j.finish(JobStatus::Succeeded, Timestamp(20), 100).unwrap();
        assert!(!j.result_expired(Timestamp(119)));
        assert!(j.result_expired(Timestamp(120)));
        assert!(j.view(Timestamp(120)).result_expired);
    }
}
