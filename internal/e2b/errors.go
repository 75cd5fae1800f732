package e2b

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/internal/errcode"
)

// apiError is the error body of E2B's API and of envd's HTTP routes: {code, message}.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// statusOf is the HTTP status err is answered with: agentbox's own for its code.
func statusOf(err error) int {
	if errors.Is(err, errNotFoundRoute) {
		return http.StatusNotFound
	}
	return errcode.HTTPStatus(errcode.Of(err))
}

var errNotFoundRoute = errcode.New(errcode.InvalidArgument, "no such route")

// WriteError answers a request of this surface that failed with err, in the shape its caller
// expects: a Connect error for an envd RPC, plain text for the interpreter (what its SDK reads),
// E2B's {code, message} otherwise. The API server calls it for the errors of its own gate
// (authentication, scopes, ownership, approvals) on these routes.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	setOutcome(w, err)
	p := r.URL.Path
	inSandbox := strings.HasPrefix(p, PathPrefix)
	if c := errcode.Of(err); inSandbox && (c == errcode.SandboxNotFound || c == errcode.SandboxNotRunning) {
		// E2B's edge answers 502 for a sandbox that is not there (the SDK's isRunning reads it
		// as "not running", the interpreter's as "timed out"), before envd sees the call.
		writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": errcode.Message(err), "sandboxId": sandboxOfPath(p)})
		return
	}
	switch {
	case strings.HasPrefix(p, PathPrefix+"envd/") && (strings.Contains(p, "process.Process/") || strings.Contains(p, "filesystem.Filesystem/")):
		writeConnectError(w, r, toConnect(err))
	case strings.HasPrefix(p, PathPrefix+"code/"):
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(statusOf(err))
		_, _ = w.Write([]byte(errcode.Message(err)))
	default:
		writeAPIError(w, err)
	}
}

// setOutcome tells the gate's recorder (the API server's) that the call failed with err, so
// that the audit log records its code rather than a bare HTTP status.
func setOutcome(w http.ResponseWriter, err error) {
	if o, ok := w.(interface{ SetOutcome(error) }); ok {
		o.SetOutcome(err)
	}
}

// sandboxOfPath is the sandbox an /e2b/{envd,code}/{id}/… path names.
func sandboxOfPath(p string) string {
	parts := strings.SplitN(strings.TrimPrefix(p, PathPrefix), "/", 3)
	if len(parts) < 2 {
		return ""
	}
	return parts[1]
}

// writeAPIError writes E2B's {code, message} with err's status.
func writeAPIError(w http.ResponseWriter, err error) {
	setOutcome(w, err)
	st := statusOf(err)
	writeJSON(w, st, apiError{Code: st, Message: errcode.Message(err)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// toConnect maps an agentbox error onto a Connect error, keeping its message.
func toConnect(err error) *connect.Error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	code := connect.CodeInternal
	switch errcode.Of(err) {
	case errcode.SandboxNotFound, errcode.FileNotFound, errcode.JobNotFound:
		code = connect.CodeNotFound
	case errcode.InvalidArgument, errcode.FileTooLarge, errcode.OutputLimitExceeded:
		code = connect.CodeInvalidArgument
	case errcode.AuthFailed:
		code = connect.CodeUnauthenticated
	case errcode.PermissionDenied, errcode.ApprovalRefused:
		code = connect.CodePermissionDenied
	case errcode.SandboxNotRunning:
		code = connect.CodeFailedPrecondition
	case errcode.Conflict:
		code = connect.CodeAlreadyExists
	case errcode.UnsupportedOp:
		code = connect.CodeUnimplemented
	case errcode.CommandTimeout:
		code = connect.CodeDeadlineExceeded
	case errcode.CapacityUnavailable, errcode.RateLimited:
		code = connect.CodeResourceExhausted
	}
	return connect.NewError(code, errors.New(errcode.Message(err)))
}

// writeConnectError writes a Connect error outside a handler (the gate refused the call): a
// unary call's JSON error with its HTTP status, or a stream's end message.
func writeConnectError(w http.ResponseWriter, r *http.Request, ce *connect.Error) {
	body := map[string]string{"code": ce.Code().String(), "message": ce.Message()}
	if ct := r.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/connect+") {
		end, _ := json.Marshal(map[string]any{"error": body})
		frame := make([]byte, 5+len(end))
		frame[0] = 0x02 // end of stream
		binary.BigEndian.PutUint32(frame[1:5], uint32(len(end)))
		copy(frame[5:], end)
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(frame)
		return
	}
	st := connectHTTPStatus(ce.Code())
	writeJSON(w, st, body)
}

// connectHTTPStatus is the HTTP status the Connect protocol gives a unary error of code.
func connectHTTPStatus(c connect.Code) int {
	switch c {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	case connect.CodeAlreadyExists, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeCanceled:
		return 499
	}
	return http.StatusInternalServerError
}
