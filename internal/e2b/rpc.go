package e2b

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/internal/e2b/envd/filesystem/filesystemconnect"
	"github.com/agentbox/agentbox/internal/e2b/envd/process/processconnect"
)

type sandboxKey struct{}
type userKey struct{}

func sandboxFrom(ctx context.Context) string {
	id, _ := ctx.Value(sandboxKey{}).(string)
	return id
}

// userFrom is the user an envd call runs as: "root" when the SDK asks for root
// (Authorization: Basic base64("root:")), else "" — the sandbox's default user.
func userFrom(ctx context.Context) string {
	u, _ := ctx.Value(userKey{}).(string)
	return u
}

// basicUser reads the user the SDK selects with "Authorization: Basic base64(user:)".
func basicUser(r *http.Request) string {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return ""
	}
	name, _, _ := strings.Cut(string(b), ":")
	if name == "root" {
		return "root"
	}
	return ""
}

// rpcHandlers returns the Connect-RPC handlers by "service/Method": each serves the request
// for the sandbox its route names (/e2b/envd/{id}/service/Method).
func (s *Server) rpcHandlers() map[string]http.HandlerFunc {
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(processService{s}, connect.WithCodec(jsonCodec{})))
	mux.Handle(filesystemconnect.NewFilesystemHandler(filesystemService{s}))
	out := map[string]http.HandlerFunc{}
	for _, m := range RPCMethods {
		out[m] = func(w http.ResponseWriter, r *http.Request) {
			if _, err := s.live(r, r.PathValue("id")); err != nil {
				WriteError(w, r, err) // 502, as E2B's edge answers for a sandbox not there
				return
			}
			ctx := context.WithValue(r.Context(), sandboxKey{}, r.PathValue("id"))
			ctx = context.WithValue(ctx, userKey{}, basicUser(r))
			sw := &streamWriter{ResponseWriter: w}
			ctx = context.WithValue(ctx, streamWriterKey{}, sw)
			r2 := r.Clone(ctx)
			r2.URL.Path = "/" + m
			r2.URL.RawPath = ""
			mux.ServeHTTP(sw, r2)
			sw.release()
		}
	}
	return out
}

type streamWriterKey struct{}

// streamWriter is the response writer a Connect handler writes through. Connect flushes after
// every message of a stream; once a stream's last event is on its way (holdFlush) the flush
// waits for the end-of-stream message the handler's return writes, so that the two leave in
// one write (release, as the handler returns) rather than two.
type streamWriter struct {
	http.ResponseWriter
	held bool // flushes wait for release
}

func (w *streamWriter) Flush() {
	if w.held {
		return
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *streamWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// release sends what a held flush kept back.
func (w *streamWriter) release() {
	if w.held {
		w.held = false
		w.Flush()
	}
}

// holdFlush keeps the flushes of ctx's stream back until its handler returns (the stream's
// last event is being sent: its end-of-stream message follows at once).
func holdFlush(ctx context.Context) {
	if w, ok := ctx.Value(streamWriterKey{}).(*streamWriter); ok {
		w.held = true
	}
}
