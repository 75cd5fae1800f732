package testenv

import (
	"io"
	"log"
	"strings"
	"sync"
	"testing"
)

// ServerPanic is how net/http reports a handler or connection panic it recovered.
const ServerPanic = "http: panic serving"

// PanicLog keeps the ServerPanic reports written through it (passing everything on to next, if
// any). A server that recovers panics must have none: the test or package then fails.
type PanicLog struct {
	mu     sync.Mutex
	next   io.Writer
	panics []string
}

func (l *PanicLog) Write(p []byte) (int, error) {
	if strings.Contains(string(p), ServerPanic) {
		l.mu.Lock()
		l.panics = append(l.panics, string(p))
		l.mu.Unlock()
	}
	if l.next != nil {
		return l.next.Write(p)
	}
	return len(p), nil
}

// Panics returns the ServerPanic reports written so far.
func (l *PanicLog) Panics() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.panics...)
}

// WatchDefaultLog tees the standard logger's output into a PanicLog: every http.Server
// without an ErrorLog (httptest's included) reports its recovered panics there. For TestMain:
// fail the package when Panics is not empty after m.Run.
func WatchDefaultLog() *PanicLog {
	l := &PanicLog{next: log.Writer()}
	log.SetOutput(l)
	return l
}

// ServerErrorLog is an http.Server's ErrorLog for a server of t: its lines go on to the
// standard logger's output, and t fails at its cleanup if the server recovered a panic (register it before the server's own
// cleanup, which closes it, so that the check runs after the close).
func ServerErrorLog(t testing.TB) *log.Logger {
	t.Helper()
	l := &PanicLog{next: log.Writer()}
	t.Cleanup(func() {
		for _, p := range l.Panics() {
			t.Errorf("the server recovered a panic:\n%s", p)
		}
	})
	return log.New(l, "", log.LstdFlags)
}
