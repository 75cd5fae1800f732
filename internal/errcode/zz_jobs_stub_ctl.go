package errcode

// TEMPORARY: the agent branch (jobsagent) adds these codes; deleted by its merge.
const (
	JobNotFound      Code = "JOB_NOT_FOUND"
	JobLimitExceeded Code = "JOB_LIMIT_EXCEEDED"
)
