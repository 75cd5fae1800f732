package storetest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

// auditTests cover audit.Store.
var auditTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"AuditRoundTripAndPaging", testAuditPaging},
	{"AuditFilter", testAuditFilter},
	{"AuditPrune", testAuditPrune},
	{"AuditBadPage", testAuditBadPage},
}

func auditRecord(i int, at time.Time) audit.Record {
	tool, action := "exec", "exec"
	if i%2 == 1 {
		tool, action = "POST /v1/sandboxes/{id}/exec", "exec"
	}
	if i%3 == 2 {
		tool, action = "health", "health"
	}
	return audit.Record{Time: at.Add(time.Duration(i) * time.Millisecond), Surface: "mcp", CallerID: "key-1", CallerName: "ci",
		Tool: tool, Action: action, SandboxID: fmt.Sprintf("sb-%012d", i%2), ArgsSHA256: fmt.Sprintf("%064x", i),
		Summary: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), Outcome: "ok", DurationMS: 1.25 + float64(i), ApprovalID: ""}
}

func mustAppendAudit(t *testing.T, s store.Store, n int, at time.Time) []audit.Record {
	t.Helper()
	var rs []audit.Record
	for i := range n {
		rs = append(rs, auditRecord(i, at))
	}
	if err := s.AppendAudit(t.Context(), rs); err != nil {
		t.Fatalf("AppendAudit: %v", err)
	}
	return rs
}

func testAuditPaging(t *testing.T, s store.Store) {
	want := mustAppendAudit(t, s, 10, base())
	want[3].ApprovalID = "ap-1"
	if err := s.AppendAudit(t.Context(), []audit.Record{want[3]}); err != nil {
		t.Fatal(err)
	}
	got, omitted, err := s.ListAudit(t.Context(), audit.Filter{Limit: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || omitted != 7 {
		t.Fatalf("newest 4: %d records, omitted %d; want 4 and 7", len(got), omitted)
	}
	last := got[3]
	if last.ApprovalID != "ap-1" || last.Tool != want[3].Tool || !last.Time.Equal(want[3].Time) || last.Time.Location() != time.UTC {
		t.Errorf("newest record %+v", last)
	}
	all, omitted, err := s.ListAudit(t.Context(), audit.Filter{After: 0, Limit: 1000})
	if err != nil || len(all) != 11 || omitted != 0 {
		t.Fatalf("all: %d records, omitted %d, %v", len(all), omitted, err)
	}
	for i, r := range all[:10] {
		w := want[i]
		w.Seq = r.Seq
		w.Time = w.Time.UTC()
		w.ApprovalID = r.ApprovalID
		if r.Seq <= 0 || (i > 0 && r.Seq <= all[i-1].Seq) || r.Surface != w.Surface || r.CallerID != w.CallerID ||
			r.CallerName != w.CallerName || r.Tool != w.Tool || r.Action != w.Action || r.SandboxID != w.SandboxID ||
			r.ArgsSHA256 != w.ArgsSHA256 || string(r.Summary) != string(w.Summary) || r.Outcome != w.Outcome ||
			r.DurationMS != w.DurationMS || !r.Time.Equal(w.Time) {
			t.Errorf("record %d = %+v, want %+v", i, r, w)
		}
	}
	page, _, err := s.ListAudit(t.Context(), audit.Filter{After: all[2].Seq, Limit: 3})
	if err != nil || len(page) != 3 || page[0].Seq != all[3].Seq || page[2].Seq != all[5].Seq {
		t.Fatalf("page after %d: %+v %v", all[2].Seq, page, err)
	}
}

func testAuditFilter(t *testing.T, s store.Store) {
	mustAppendAudit(t, s, 12, base())
	count := func(f audit.Filter) int {
		t.Helper()
		f.Limit = 1000
		rs, _, err := s.ListAudit(t.Context(), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if f.Tool != "" && r.Tool != f.Tool && r.Action != f.Tool {
				t.Errorf("filter %+v matched %+v", f, r)
			}
			if f.SandboxID != "" && r.SandboxID != f.SandboxID {
				t.Errorf("filter %+v matched %+v", f, r)
			}
		}
		return len(rs)
	}
	if n := count(audit.Filter{Tool: "exec"}); n != 8 { // by action: the MCP tool and the REST route
		t.Errorf("tool exec: %d records, want 8", n)
	}
	if n := count(audit.Filter{Tool: "POST /v1/sandboxes/{id}/exec"}); n != 4 {
		t.Errorf("the REST route: %d records, want 4", n)
	}
	if n := count(audit.Filter{Tool: "health", SandboxID: "sb-000000000000"}); n != 2 {
		t.Errorf("health in sb-0: %d records, want 2", n)
	}
	rs, omitted, err := s.ListAudit(t.Context(), audit.Filter{Tool: "exec", Limit: 3})
	if err != nil || len(rs) != 3 || omitted != 5 {
		t.Errorf("newest 3 exec: %d records, omitted %d (want 3, 5), %v", len(rs), omitted, err)
	}
}

func testAuditPrune(t *testing.T, s store.Store) {
	old := base().Add(-48 * time.Hour)
	mustAppendAudit(t, s, 5, old)
	mustAppendAudit(t, s, 20, base())
	n, err := s.PruneAudit(t.Context(), base().Add(-time.Hour), 1000)
	if err != nil || n != 5 {
		t.Fatalf("prune by time: %d, %v; want 5", n, err)
	}
	n, err = s.PruneAudit(t.Context(), base().Add(-time.Hour), 8)
	if err != nil || n != 12 {
		t.Fatalf("prune to 8 rows: %d, %v; want 12", n, err)
	}
	rs, _, err := s.ListAudit(t.Context(), audit.Filter{Limit: 1000})
	if err != nil || len(rs) != 8 {
		t.Fatalf("after prune: %d records, %v", len(rs), err)
	}
	for i, r := range rs {
		if want := fmt.Sprintf("%064x", 12+i); r.ArgsSHA256 != want { // the newest 8 kept
			t.Errorf("kept record %d: %s, want %s", i, r.ArgsSHA256, want)
		}
	}
	maxSeq := rs[7].Seq
	mustAppendAudit(t, s, 1, base())
	rs, _, err = s.ListAudit(t.Context(), audit.Filter{After: maxSeq, Limit: 10})
	if err != nil || len(rs) != 1 || rs[0].Seq <= maxSeq {
		t.Fatalf("after prune, a new record: %+v %v", rs, err)
	}
	if _, err := s.PruneAudit(t.Context(), base(), 0); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("prune to 0 rows: %v, want INVALID_ARGUMENT", err)
	}
}

func testAuditBadPage(t *testing.T, s store.Store) {
	for _, f := range []audit.Filter{{Limit: 0}, {Limit: audit.MaxPage + 1}, {Limit: 5, After: -1}} {
		if _, _, err := s.ListAudit(t.Context(), f); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("ListAudit(%+v): %v, want INVALID_ARGUMENT", f, err)
		}
	}
}
