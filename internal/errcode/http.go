package errcode

import "net/http"

// HTTPStatus is the status code every HTTP edge (REST API, guest protocol) uses for code.
func HTTPStatus(code Code) int {
	switch code {
	case ApprovalRefused: // approvals
		return http.StatusForbidden
	case ApprovalNotFound, SnapshotNotFound:
		return http.StatusNotFound
	case PoolNotFound, ConversationNotFound: // warm pools, conversations
		return http.StatusNotFound
	case MachineNotFound, BlobNotFound: // joined machines
		return http.StatusNotFound
	case MachineOffline, Unavailable: // joined machines; durable state
		return http.StatusServiceUnavailable
	case ResourceExhausted:
		return http.StatusInsufficientStorage
	case GPUBusy:
		return http.StatusConflict
	case RateLimited:
		return http.StatusTooManyRequests
	case SandboxNotFound, FileNotFound, JobNotFound, ImageNotFound, RunNotFound:
		return http.StatusNotFound
	case SandboxNotRunning, Conflict:
		return http.StatusConflict
	case CapacityUnavailable, RuntimeUnavailable:
		return http.StatusServiceUnavailable
	case ImagePullFailed:
		return http.StatusBadGateway
	case CommandTimeout:
		return http.StatusGatewayTimeout
	case OutputLimitExceeded, FileTooLarge:
		return http.StatusRequestEntityTooLarge
	case UnsupportedOp:
		return http.StatusNotImplemented
	case AuthFailed:
		return http.StatusUnauthorized
	case InvalidArgument:
		return http.StatusBadRequest
	case PermissionDenied:
		return http.StatusForbidden
	case LinkExpired:
		return http.StatusGone
	case JobLimitExceeded:
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}
