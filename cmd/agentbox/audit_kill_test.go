package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestAuditSurvivesSIGKILL: every audited call whose reply came back has its record in the
// store, even when the server is killed (SIGKILL) right after the last reply: records are
// committed before replies leave, not queued in memory.
func TestAuditSurvivesSIGKILL(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abak")
	t.Cleanup(func() { removeCgroupParent("abtest-" + filepath.Base(dir)) })
	srv := testenv.StartServer(t, dir, testToken)
	const n = 20
	for i := range n {
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/v1/capacity?call=%d", srv.URL, i), nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("call %d: HTTP %d", i, resp.StatusCode)
		}
	}
	srv.Kill() // at once: the last reply is a few microseconds old

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, _, err := st.ListAudit(ctx, audit.Filter{Tool: "GET /v1/capacity", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n {
		t.Fatalf("%d audit records of %d answered calls survived the SIGKILL", len(recs), n)
	}
}
