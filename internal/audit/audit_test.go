package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

func TestDigestCanonical(t *testing.T) {
	a := audit.Digest(json.RawMessage(`{"path": "/a", "content": "x", "mode": "0644", "n": {"b": 1, "a": 2.50}}`))
	b := audit.Digest(json.RawMessage(`{"n":{"a":2.50,"b":1},"mode":"0644","content":"x","path":"/a"}`))
	if a != b {
		t.Errorf("same arguments, other key order and spacing: %s != %s", a, b)
	}
	if got := string(audit.Canonical(json.RawMessage(`{"b":"<&>", "a":[1, 2]}`))); got != `{"a":[1,2],"b":"<&>"}` {
		t.Errorf("canonical = %s", got)
	}
	for _, other := range []string{`{"path":"/a","content":"y","mode":"0644","n":{"a":2.50,"b":1}}`,
		`{"path":"/b","content":"x","mode":"0644","n":{"a":2.50,"b":1}}`, `{"path":"/a","content":"x","mode":"0644","n":{"a":2.5,"b":1}}`} {
		if audit.Digest(json.RawMessage(other)) == a {
			t.Errorf("%s digests as the original", other)
		}
	}
	if audit.Digest(nil) != audit.Digest(json.RawMessage(`{}`)) || audit.Digest(json.RawMessage(`null`)) != audit.Digest(nil) {
		t.Error("absent, null and {} arguments digest differently")
	}
	if len(a) != 64 {
		t.Errorf("digest %q is not hex SHA-256", a)
	}
}

const (
	fileContent = "FILE-CONTENT-7f3a91 the body of a file nobody may read from the audit log"
	secretValue = "SECRET-VALUE-c0ffee42"
	stdinText   = "STDIN-TEXT-5e5e5e"
)

func summary(t *testing.T, surface, args string) map[string]any {
	t.Helper()
	s := audit.Summarize(surface, json.RawMessage(args))
	for _, leak := range []string{fileContent, secretValue, stdinText} {
		if strings.Contains(string(s), leak) {
			t.Errorf("summary of %s holds %q: %s", args, leak, s)
		}
	}
	var m map[string]any
	if err := json.Unmarshal(s, &m); err != nil {
		t.Fatalf("summary %s: %v", s, err)
	}
	return m
}

func TestSummarizeRedacts(t *testing.T) {
	args, _ := json.Marshal(map[string]any{"sandbox_id": "sb-1", "path": "/w/a.txt", "content": fileContent, "mode": "0600"})
	m := summary(t, gate.SurfaceMCP, string(args))
	c, _ := m["content"].(map[string]any)
	if m["path"] != "/w/a.txt" || c["bytes"] != float64(len(fileContent)) || len(c["sha256"].(string)) != 64 {
		t.Errorf("file_write summary %v", m)
	}
	args, _ = json.Marshal(map[string]any{"sandbox_id": "sb-1", "command": []string{"sh", "-c", "echo hi"},
		"env": map[string]string{"API_TOKEN": secretValue, "MODE": "x"}, "stdin": stdinText,
		"secrets": map[string]any{"T": map[string]any{"from": "env:T"}}, "password": secretValue, "idempotency_key": "k1"})
	m = summary(t, gate.SurfaceMCP, string(args))
	env, _ := m["env"].(map[string]any)
	if env["API_TOKEN"] != audit.Redacted || env["MODE"] != audit.Redacted || m["password"] != audit.Redacted ||
		m["idempotency_key"] != "k1" || m["secrets"] != audit.Redacted {
		t.Errorf("exec summary %v", m)
	}
	if cmd, _ := m["command"].([]any); len(cmd) != 3 || cmd[2] != "echo hi" {
		t.Errorf("argv %v", m["command"])
	}
	long := strings.Repeat("a", 400)
	args, _ = json.Marshal(map[string]any{"command": []string{long, long, "tail"}, "note": strings.Repeat("n", 1000)})
	s := audit.Summarize(gate.SurfaceMCP, args)
	m = summary(t, gate.SurfaceMCP, string(args))
	cmdJSON, _ := json.Marshal(m["command"])
	if n := strings.Count(string(cmdJSON), "a"); n != audit.MaxArgvBytes {
		t.Errorf("argv keeps %d bytes of its strings, want %d: %s", n, audit.MaxArgvBytes, cmdJSON)
	}
	if note := m["note"].(string); len(note) > audit.MaxStringBytes+32 || !strings.Contains(note, "(1000 bytes)") {
		t.Errorf("long string kept as %q", note)
	}
	if len(s) > audit.MaxSummaryBytes {
		t.Errorf("summary of %d bytes", len(s))
	}
	// REST: method, path, query with secret-named values redacted, the JSON body like MCP
	// arguments, a streamed body by its length.
	args, _ = json.Marshal(map[string]any{"method": "POST", "path": "/v1/sandboxes/sb-1/exec",
		"query": map[string][]string{"access_token": {secretValue}, "wait": {"1"}},
		"body":  map[string]any{"command": []string{"true"}, "stdin": stdinText, "env": map[string]string{"K": secretValue}}})
	m = summary(t, gate.SurfaceREST, string(args))
	q, _ := m["query"].(map[string]any)
	body, _ := m["body"].(map[string]any)
	if m["method"] != "POST" || q["access_token"] != audit.Redacted || q["wait"].([]any)[0] != "1" || body["stdin"].(map[string]any)["bytes"] != float64(len(stdinText)) {
		t.Errorf("REST summary %v", m)
	}
	m = summary(t, gate.SurfaceREST, `{"method":"PUT","path":"/v1/sandboxes/sb-1/files","query":{"path":["/a"]},"body_bytes":73}`)
	if m["body_bytes"] != float64(73) {
		t.Errorf("streamed body summary %v", m)
	}
	// A huge object keeps only its argument names.
	big := map[string]any{}
	for i := range 60 {
		big[strings.Repeat("k", 10)+string(rune('A'+i))] = strings.Repeat("v", 250)
	}
	args, _ = json.Marshal(big)
	if s := audit.Summarize(gate.SurfaceMCP, args); len(s) > audit.MaxSummaryBytes || !strings.Contains(string(s), `"truncated":true`) {
		t.Errorf("big summary (%d bytes) %.200s", len(s), s)
	}
}

func openStore(t *testing.T) (*sqlite.Store, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, dir
}

func call(tool string, args string) *gate.Call {
	return &gate.Call{Surface: gate.SurfaceMCP, Tool: tool, Action: tool, Args: json.RawMessage(args), SandboxID: "sb-0123456789ab",
		Caller: gate.Caller{ID: "key-7", Name: "ci", Scope: "operate"}, Started: time.Now()}
}

// TestRecorderRecordsAndNeverLeaks: calls through the gate become records with their fields
// and outcomes, and the database's bytes (file, WAL) never hold a file's content, a secret
// value or stdin; Close writes what is queued before it returns.
func TestRecorderRecordsAndNeverLeaks(t *testing.T) {
	st, dir := openStore(t)
	r := audit.New(st, audit.Config{}, nil)
	enter := func(c *gate.Call, outcome error) {
		exit, err := r.Enter(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
		exit(outcome)
	}
	fw, _ := json.Marshal(map[string]any{"sandbox_id": "sb-0123456789ab", "path": "/w/f", "content": fileContent})
	enter(call("file_write", string(fw)), nil)
	ex, _ := json.Marshal(map[string]any{"sandbox_id": "sb-0123456789ab", "command": []string{"env"},
		"env": map[string]string{"TOKEN": secretValue}, "stdin": stdinText})
	enter(call("exec", string(ex)), errcode.New(errcode.CommandTimeout, "timed out"))
	enter(call("health", `{}`), nil)
	if err := r.Close(); err != nil { // flushes: nothing waits for the 100 ms tick
		t.Fatal(err)
	}
	recs, _, err := st.ListAudit(t.Context(), audit.Filter{Limit: 10})
	if err != nil || len(recs) != 3 {
		t.Fatalf("records %d, %v; want 3", len(recs), err)
	}
	w := recs[1]
	if w.Tool != "exec" || w.Action != "exec" || w.Surface != "mcp" || w.CallerID != "key-7" || w.CallerName != "ci" ||
		w.SandboxID != "sb-0123456789ab" || w.Outcome != string(errcode.CommandTimeout) || w.DurationMS < 1 ||
		w.ArgsSHA256 != audit.Digest(ex) || !strings.Contains(string(w.Summary), `"TOKEN":"[redacted]"`) {
		t.Errorf("exec record %+v summary %s", w, w.Summary)
	}
	if recs[0].Outcome != "ok" || !strings.Contains(string(recs[0].Summary), `"path":"/w/f"`) {
		t.Errorf("file_write record %+v summary %s", recs[0], recs[0].Summary)
	}
	// After Close, a call's record is dropped and counted.
	enter(call("health", `{}`), nil)
	if r.Dropped() != 1 {
		t.Errorf("dropped after close = %d, want 1", r.Dropped())
	}
	st.Close()
	grepDir(t, dir, fileContent, secretValue, stdinText)
}

// grepDir fails if any file under dir holds one of leaks.
func grepDir(t *testing.T, dir string, leaks ...string) {
	t.Helper()
	files := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files++
		for _, l := range leaks {
			if bytes.Contains(b, []byte(l)) {
				t.Errorf("%s holds %q", p, l)
			}
		}
		return nil
	})
	if files == 0 {
		t.Fatalf("no database files under %s", dir)
	}
}

// blockedStore is a store whose writes wait until released (a store that falls behind), and
// counts its transactions.
type blockedStore struct {
	audit.Store
	release chan struct{}
	mu      sync.Mutex
	written int
	txns    int
}

func (b *blockedStore) AppendAudit(ctx context.Context, rs []audit.Record) error {
	select {
	case <-b.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	b.mu.Lock()
	b.written += len(rs)
	b.txns++
	b.mu.Unlock()
	return nil
}

func (b *blockedStore) PruneAudit(context.Context, time.Time, int) (int64, error) { return 0, nil }

func (b *blockedStore) counts() (written, txns int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.written, b.txns
}

// TestExitReturnsOnceCommitted: a call's exit (after which its reply leaves) returns only once
// the store has committed its record — and concurrent calls share transactions (group commit).
func TestExitReturnsOnceCommitted(t *testing.T) {
	bs := &blockedStore{release: make(chan struct{})}
	r := audit.New(bs, audit.Config{CommitWait: time.Minute}, nil)
	defer r.Close()
	const n = 200
	var exited atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			exit, _ := r.Enter(t.Context(), call("health", `{}`))
			exit(nil)
			exited.Add(1)
		}()
	}
	// Every call is in the recorder's hands before the store lets a write through.
	for deadline := time.Now().Add(10 * time.Second); r.Waiting() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls reached the recorder", r.Waiting(), n)
		}
	}
	if e := exited.Load(); e != 0 {
		t.Fatalf("%d calls returned before the store wrote anything", e)
	}
	close(bs.release)
	wg.Wait()
	written, txns := bs.counts()
	if written != n || r.Dropped() != 0 || r.Late() != 0 {
		t.Fatalf("written %d of %d (dropped %d, late %d)", written, n, r.Dropped(), r.Late())
	}
	// The first call's record went alone (or nearly); the other calls waited behind it and
	// shared a transaction or two (BatchSize records each).
	if txns > 1+(n+audit.BatchSize-1)/audit.BatchSize+1 {
		t.Errorf("%d calls took %d transactions: no group commit", n, txns)
	}
}

// TestHungStoreBoundsTheWait: with the store hung, a call waits Config.CommitWait and is then
// not acknowledged (counted late, its NotRecorded UNAVAILABLE); its record is written once the
// store answers, not dropped.
func TestHungStoreBoundsTheWait(t *testing.T) {
	bs := &blockedStore{release: make(chan struct{})}
	r := audit.New(bs, audit.Config{CommitWait: 50 * time.Millisecond}, nil)
	t0 := time.Now()
	c := call("health", `{}`)
	exit, _ := r.Enter(t.Context(), c)
	exit(nil)
	if el := time.Since(t0); el < 50*time.Millisecond {
		t.Errorf("the call returned after %v, before its record was written or CommitWait passed", el)
	}
	if !errcode.Is(c.NotRecorded, errcode.Unavailable) {
		t.Errorf("NotRecorded = %v, want UNAVAILABLE: a call whose record is not committed must not be acknowledged", c.NotRecorded)
	}
	if r.Late() != 1 {
		t.Errorf("late = %d, want 1", r.Late())
	}
	close(bs.release)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if written, _ := bs.counts(); written != 1 || r.Dropped() != 0 {
		t.Errorf("written %d (dropped %d), want the late record written", written, r.Dropped())
	}
}

// TestRetentionAndRowBound: at start the recorder prunes records older than its retention,
// then the oldest beyond its row bound.
func TestRetentionAndRowBound(t *testing.T) {
	st, _ := openStore(t)
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	var rs []audit.Record
	for i := range 1500 {
		at := now.Add(-time.Duration(1500-i) * time.Minute) // one a minute: 25 h back to now
		rs = append(rs, audit.Record{Time: at, Surface: "mcp", Tool: "health", Action: "health", Outcome: "ok", Summary: json.RawMessage(`{}`)})
	}
	if err := st.AppendAudit(t.Context(), rs); err != nil {
		t.Fatal(err)
	}
	r := audit.New(st, audit.Config{Retention: 24 * time.Hour, MaxRows: 1000, Now: func() time.Time { return now }}, nil)
	defer r.Close()
	var got []audit.Record
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		var omitted int64
		page, omitted, err := st.ListAudit(t.Context(), audit.Filter{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 1 && omitted+1 == 1000 {
			got, _, _ = st.ListAudit(t.Context(), audit.Filter{Limit: 1000})
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(got) != 1000 || !got[0].Time.Equal(now.Add(-1000*time.Minute)) || !got[999].Time.Equal(now.Add(-time.Minute)) {
		t.Fatalf("after the start's prune: %d records (want the newest 1000)", len(got))
	}
	// The time bound alone: a retention of 10 h keeps the 600 records of the last 10 h.
	n, err := st.PruneAudit(t.Context(), now.Add(-10*time.Hour), 1000)
	if err != nil || n != 400 {
		t.Errorf("prune to 10 h: %d, %v; want 400", n, err)
	}
}

// TestStoreErrorCounted: a batch the store refuses at every try within CommitWait is counted
// as dropped, its call is not acknowledged (NotRecorded: UNAVAILABLE), and the recorder goes on.
func TestStoreErrorCounted(t *testing.T) {
	fs := &failingStore{failures: 1 << 30}
	r := audit.New(fs, audit.Config{CommitWait: 300 * time.Millisecond}, nil)
	c := call("health", `{}`)
	exit, _ := r.Enter(t.Context(), c)
	exit(nil)
	if err := r.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r.Dropped() != 1 {
		t.Errorf("dropped %d, want 1", r.Dropped())
	}
	if !errcode.Is(c.NotRecorded, errcode.Unavailable) {
		t.Errorf("NotRecorded = %v, want UNAVAILABLE", c.NotRecorded)
	}
	if n := fs.tries.Load(); n < 2 {
		t.Errorf("the store was tried %d times: a refused batch is retried within CommitWait", n)
	}
	r.Close()
}

// TestStoreRefusalRetried: a store that refuses a batch a few times and then takes it loses
// nothing and fails no call.
func TestStoreRefusalRetried(t *testing.T) {
	fs := &failingStore{failures: 3}
	r := audit.New(fs, audit.Config{CommitWait: 5 * time.Second}, nil)
	defer r.Close()
	c := call("health", `{}`)
	exit, _ := r.Enter(t.Context(), c)
	exit(nil)
	if c.NotRecorded != nil || r.Dropped() != 0 || fs.written.Load() != 1 {
		t.Errorf("NotRecorded %v, dropped %d, written %d; want the record written on the 4th try", c.NotRecorded, r.Dropped(), fs.written.Load())
	}
}

// failingStore refuses the first failures batches ("disk full"), then takes them.
type failingStore struct {
	audit.Store
	failures       int64
	tries, written atomic.Int64
}

func (f *failingStore) AppendAudit(_ context.Context, recs []audit.Record) error {
	if f.tries.Add(1) <= f.failures {
		return errors.New("disk full")
	}
	f.written.Add(int64(len(recs)))
	return nil
}
func (*failingStore) PruneAudit(context.Context, time.Time, int) (int64, error) {
	return 0, nil
}

// TestRecordedDigestIsDigest: the recorder's one-decode digest and summary equal Digest and
// Summarize.
func TestRecordedDigestIsDigest(t *testing.T) {
	st, _ := openStore(t)
	r := audit.New(st, audit.Config{}, nil)
	args := []string{`{"b": [1, 2.50, "x<y"], "a": {"z": null, "content": "c"}}`, ``, `null`, `not json`, `{"env": {"K": "v"}}`}
	for _, a := range args {
		exit, _ := r.Enter(t.Context(), call("exec", a))
		exit(nil)
	}
	r.Close()
	recs, _, err := st.ListAudit(t.Context(), audit.Filter{Limit: 10})
	if err != nil || len(recs) != len(args) {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	for i, a := range args {
		if d := audit.Digest(json.RawMessage(a)); recs[i].ArgsSHA256 != d {
			t.Errorf("%q: recorded digest %s, Digest %s", a, recs[i].ArgsSHA256, d)
		}
		if s := audit.Summarize(gate.SurfaceMCP, json.RawMessage(a)); string(recs[i].Summary) != string(s) {
			t.Errorf("%q: recorded summary %s, Summarize %s", a, recs[i].Summary, s)
		}
	}
}

func BenchmarkRecord(b *testing.B) {
	bs := &blockedStore{release: make(chan struct{})}
	close(bs.release)
	r := audit.New(bs, audit.Config{}, nil)
	defer r.Close()
	args := `{"sandbox_id":"sb-0123456789ab","command":["sh","-c","echo hi"],"env":{"K":"v"},"timeout_seconds":30}`
	for b.Loop() {
		exit, _ := r.Enter(b.Context(), call("exec", args))
		exit(nil)
	}
}
