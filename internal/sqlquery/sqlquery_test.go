package sqlquery

import (
	"os"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
)

// The contract's table in docs/ARCHITECTURE.md lists every view with every column, in order.
func TestViewsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, v := range Views {
		i := strings.Index(doc, "| `"+v.Name+"` |")
		if i < 0 {
			t.Errorf("docs/ARCHITECTURE.md has no row for the view %s", v.Name)
			continue
		}
		line := doc[i : i+strings.Index(doc[i:], "\n")]
		at := 0
		for _, c := range v.Columns {
			j := strings.Index(line[at:], "`"+c.Name+"`")
			if j < 0 {
				t.Errorf("view %s: column %s missing from (or out of order in) its docs row: %s", v.Name, c.Name, line)
				break
			}
			at += j
		}
	}
}

func TestCheck(t *testing.T) {
	if n, err := Check("SELECT 1", 0); err != nil || n != DefaultMaxRows {
		t.Errorf("Check default: %d, %v", n, err)
	}
	if n, err := Check("SELECT 1", MaxMaxRows); err != nil || n != MaxMaxRows {
		t.Errorf("Check max: %d, %v", n, err)
	}
	for _, tc := range []struct {
		q    string
		n    int
		want string
	}{{"", 0, "query"}, {"  ", 0, "query"}, {strings.Repeat("x", MaxQueryBytes+1), 0, "query"}, {"SELECT 1", -1, "max_rows"}, {"SELECT 1", MaxMaxRows + 1, "max_rows"}} {
		_, err := Check(tc.q, tc.n)
		if errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(errcode.Message(err), tc.want) {
			t.Errorf("Check(%.10q, %d): %v, want INVALID_ARGUMENT naming %s", tc.q, tc.n, err, tc.want)
		}
	}
}
