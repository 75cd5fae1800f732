// Package errcode defines agentbox's typed errors: one set of codes shared by every surface
// (REST, MCP, CLI, guest protocol), each carrying a message that tells the caller what to change.
package errcode

import (
	"errors"
	"fmt"
)

// Code classifies an error. Codes are public API: add, never rename.
type Code string

const (
	SandboxNotFound     Code = "SANDBOX_NOT_FOUND"
	SandboxNotRunning   Code = "SANDBOX_NOT_RUNNING"
	CapacityUnavailable Code = "CAPACITY_UNAVAILABLE"
	CommandTimeout      Code = "COMMAND_TIMEOUT"
	OutputLimitExceeded Code = "OUTPUT_LIMIT_EXCEEDED"
	FileTooLarge        Code = "FILE_TOO_LARGE"
	FileNotFound        Code = "FILE_NOT_FOUND"
	UnsupportedOp       Code = "UNSUPPORTED_OPERATION"
	RuntimeUnavailable  Code = "RUNTIME_UNAVAILABLE"
	AuthFailed          Code = "AUTH_FAILED"
	InvalidArgument     Code = "INVALID_ARGUMENT"
	Conflict            Code = "CONFLICT"
	Internal            Code = "INTERNAL"
	// JobNotFound: no job of that id in the sandbox.
	JobNotFound Code = "JOB_NOT_FOUND"
	// JobLimitExceeded: the sandbox already runs as many jobs as it may.
	JobLimitExceeded Code = "JOB_LIMIT_EXCEEDED"
	// ImageNotFound: the image is not in the cache (and was not to be pulled), or the registry
	// has no such repository, tag or digest.
	ImageNotFound Code = "IMAGE_NOT_FOUND"
	// ImagePullFailed: the registry could not be reached, refused the credentials, or sent
	// something that failed verification (details.reason says which).
	ImagePullFailed Code = "IMAGE_PULL_FAILED"
	// RunNotFound: no run (or batch) of that id.
	RunNotFound Code = "RUN_NOT_FOUND"
	// LinkExpired: a signed artifact URL past its expiry, or an artifact no longer kept.
	LinkExpired Code = "LINK_EXPIRED"
	// PermissionDenied: the caller's API key is valid but its scope does not cover the call
	// (details.required_scope, details.scope).
	PermissionDenied Code = "PERMISSION_DENIED"
)

// Approvals.
const (
	// ApprovalRefused: a gated call did not run: an operator denied it (details.reason), nobody
	// decided in time (details.unreachable: true), or its approval was already used
	// (details.used: true). details.approval_id names the approval; details.retryable is false.
	ApprovalRefused Code = "APPROVAL_REFUSED"
	// ApprovalNotFound: no approval of that id.
	ApprovalNotFound Code = "APPROVAL_NOT_FOUND"
)

func init() { Codes = append(Codes, ApprovalRefused, ApprovalNotFound) } // approvals

// Codes lists every code, for documentation and tests.
var Codes = []Code{SandboxNotFound, SandboxNotRunning, CapacityUnavailable, CommandTimeout,
	OutputLimitExceeded, FileTooLarge, FileNotFound, UnsupportedOp, RuntimeUnavailable, AuthFailed,
	InvalidArgument, Conflict, Internal, JobNotFound, JobLimitExceeded, ImageNotFound, ImagePullFailed, RunNotFound, LinkExpired,
	PermissionDenied}

// Error is a typed error. Message is safe to show to the caller; Cause is internal detail.
type Error struct {
	Code    Code
	Message string
	// Details carries machine-readable facts (e.g. "size" for FILE_TOO_LARGE).
	Details map[string]any
	Cause   error
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Cause)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Cause }

// New returns an *Error with a formatted message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error that keeps cause for logs and errors.Is/As.
func Wrap(code Code, cause error, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Cause: cause}
}

// With adds a detail and returns e.
func (e *Error) With(key string, value any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[key] = value
	return e
}

// As returns the *Error in err's chain, if any.
func As(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// Of returns err's code: the code of the first *Error in its chain, or Internal.
func Of(err error) Code {
	if err == nil {
		return ""
	}
	if e, ok := As(err); ok {
		return e.Code
	}
	return Internal
}

// Message returns the caller-safe message of err: the typed message, or a generic one for
// untyped errors (whose detail stays in the server's log).
func Message(err error) string {
	if e, ok := As(err); ok {
		return e.Message
	}
	return "internal error; see the server log"
}

// Is reports whether err carries code.
func Is(err error, code Code) bool { return err != nil && Of(err) == code }

// Snapshots.
const (
	// SnapshotNotFound: no snapshot of that id (or it was deleted, or never became ready).
	SnapshotNotFound Code = "SNAPSHOT_NOT_FOUND"
)

func init() { Codes = append(Codes, SnapshotNotFound) } // snapshots

// Warm pools.
const (
	// PoolNotFound: no warm pool of that name.
	PoolNotFound Code = "POOL_NOT_FOUND"
)

func init() { Codes = append(Codes, PoolNotFound) } // warm pools

// Joined machines.
const (
	// MachineNotFound: no joined machine of that id, name or alias (or it was removed).
	MachineNotFound Code = "MACHINE_NOT_FOUND"
	// MachineOffline: the machine is joined but has no live connection to this server now
	// (details.last_seen: its last heartbeat, or null).
	MachineOffline Code = "MACHINE_OFFLINE"
	// GPUBusy: the GPU a remote job asked for (details.gpu_index) is reserved by another job
	// (details.job_id) until that job ends or is canceled.
	GPUBusy Code = "GPU_BUSY"
	// RateLimited: a quota is spent (details.limit names it); details.retry_at says when enough
	// of it frees up.
	RateLimited Code = "RATE_LIMITED"
	// BlobNotFound: no stored blob of that id (or it expired and was deleted).
	BlobNotFound Code = "BLOB_NOT_FOUND"
)

func init() {
	Codes = append(Codes, MachineNotFound, MachineOffline, GPUBusy, RateLimited, BlobNotFound)
} // joined machines

// Durable state.
const (
	// Unavailable: the server's store refuses work now (its disk is full, it is read-only, its
	// database is down or restarting); nothing the call asked for was acknowledged. Retry after
	// the Retry-After the reply carries; an operator frees the store's disk or brings it back.
	Unavailable Code = "UNAVAILABLE"
	// ResourceExhausted: the host has no room for what the call must write (details.path is the
	// full file system, details.need_bytes and details.free_bytes how much it needs and has);
	// nothing changed. Free space there, then retry.
	ResourceExhausted Code = "RESOURCE_EXHAUSTED"
)

func init() { Codes = append(Codes, Unavailable, ResourceExhausted) } // durable state

// RetryAfterSeconds is the Retry-After an UNAVAILABLE reply carries when its error names none
// (details.retry_after_seconds).
const RetryAfterSeconds = 2

// Conversations of `agentbox chat`.
const (
	// ConversationNotFound: no conversation of that id (or another principal's).
	ConversationNotFound Code = "CONVERSATION_NOT_FOUND"
)

func init() { Codes = append(Codes, ConversationNotFound) } // conversations
