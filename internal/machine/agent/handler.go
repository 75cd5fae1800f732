package agent

import (
	"encoding/json"
	"log"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/agentbox/agentbox/internal/hostfiles"
	"github.com/agentbox/agentbox/internal/hostjobs"
	"github.com/agentbox/agentbox/internal/remoteexec"
	"github.com/agentbox/agentbox/internal/screenshot"
	"github.com/agentbox/agentbox/internal/version"
)

// HandlerOptions configures the machine-side handler.
type HandlerOptions struct {
	// StateDir is the agent's state dir (feature handlers keep their files under it).
	StateDir string
	Logger   *slog.Logger
}

// Info is GET /agent/info's reply.
type Info struct {
	Hostname     string    `json:"hostname"`
	Platform     string    `json:"platform"`
	Arch         string    `json:"arch"`
	AgentVersion string    `json:"agent_version"`
	PID          int       `json:"pid"`
	StartedAt    time.Time `json:"started_at"`
}

var started = time.Now().UTC()

// Handler is the one http.Handler the agent serves over its session. GET /agent/info tells
// who answers. Each feature package mounts its handler at its prefix (full path kept), one
// line each:
//
//	/exec        internal/remoteexec  (remote_exec)
//	/screenshot  internal/screenshot  (remote_screenshot)
//	/files/      internal/hostfiles   (remote_pull, remote_push)
//	/jobs/       internal/hostjobs    (remote_job_*)
func Handler(opts HandlerOptions) http.Handler {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /agent/info", func(w http.ResponseWriter, r *http.Request) {
		h, _ := os.Hostname()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(Info{Hostname: h, Platform: runtime.GOOS, Arch: runtime.GOARCH,
			AgentVersion: version.Version, PID: os.Getpid(), StartedAt: started})
	})
	// Feature handlers mount here:
	mux.Handle("/jobs/", jobsHandler(opts))
	mux.Handle(hostfiles.Prefix, hostfiles.NewHandler(hostfiles.Options{Logger: opts.Logger}))
	mux.Handle("/exec", remoteexec.NewHandler(remoteexec.Options{Logger: opts.Logger}))
	mux.Handle("/screenshot", screenshot.NewHandler(screenshot.Options{Logger: opts.Logger}))
	return mux
}

// jobsHandler serves remote jobs from StateDir/jobs (re-adopted from there after a restart); a
// state dir it cannot use answers every jobs call with why.
func jobsHandler(opts HandlerOptions) http.Handler {
	m, err := hostjobs.NewManager(hostjobs.Options{Dir: filepath.Join(opts.StateDir, "jobs"), Logger: opts.Logger})
	if err != nil {
		opts.Logger.Error("remote jobs unavailable", "err", err)
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "remote jobs unavailable on this machine: "+err.Error(), http.StatusInternalServerError)
		})
	}
	return hostjobs.NewHandler(m)
}

// slogLogger adapts l for http.Server's ErrorLog.
func slogLogger(l *slog.Logger) *log.Logger { return slog.NewLogLogger(l.Handler(), slog.LevelDebug) }
