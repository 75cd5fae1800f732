package sqlite_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestFullDiskIsUnavailable: on a full file system the store's writes fail UNAVAILABLE (what
// every surface answers 503 with a Retry-After), never an untyped INTERNAL.
func TestFullDiskIsUnavailable(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	big := json.RawMessage(`{"x":"` + strings.Repeat("y", 8000) + `"}`)
	for i := 0; ; i++ {
		err := st.AppendAudit(t.Context(), []audit.Record{{Time: time.Now(), Surface: "rest", Tool: "t", Action: "exec", Outcome: "ok", Summary: big}})
		if err == nil {
			if i > 10000 {
				t.Fatal("2 MiB took 10000 records of 8 KB")
			}
			continue
		}
		if !errcode.Is(err, errcode.Unavailable) {
			t.Fatalf("write on a full disk: %v (code %s); want UNAVAILABLE", err, errcode.Of(err))
		}
		return
	}
}
