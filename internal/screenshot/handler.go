package screenshot

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"runtime"
	"strconv"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
	"github.com/agentbox/agentbox/internal/text"
)

// Options configures the machine-side handler.
type Options struct {
	Logger *slog.Logger
}

// NewHandler returns the machine-side handler of GET /screenshot.
func NewHandler(opts Options) http.Handler {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &handler{log: opts.Logger}
}

type handler struct{ log *slog.Logger }

// ParseDisplay reads a display index: "" (none: the machine's default), or 0–MaxDisplay.
func ParseDisplay(s string) (*int, error) {
	if s == "" {
		return nil, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > MaxDisplay {
		return nil, errcode.New(errcode.InvalidArgument, "display %q is not a display index: give 0–%d (0 is the first display; omit it for the machine's default)", text.Clean(s, 32), MaxDisplay)
	}
	return &n, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/screenshot" || r.Method != http.MethodGet {
		peerreply.WriteError(w, errcode.New(errcode.InvalidArgument, "no such endpoint: %s %s (GET /screenshot)", r.Method, r.URL.Path))
		return
	}
	display, err := ParseDisplay(r.URL.Query().Get("display"))
	if err != nil {
		peerreply.WriteError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), captureTimeout)
	defer cancel()
	shot, err := capture(ctx, display)
	if err != nil {
		if _, typed := errcode.As(err); !typed {
			h.log.Warn("screenshot failed", "err", err)
			err = errcode.Wrap(errcode.Internal, err, "the screenshot failed: %s", text.Clean(err.Error(), 300))
		}
		peerreply.WriteError(w, err)
		return
	}
	shot.Platform = runtime.GOOS
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(shot)
}
