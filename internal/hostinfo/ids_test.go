package hostinfo

import (
	"strings"
	"testing"
)

func TestParseIDFile(t *testing.T) {
	t.Parallel()
	passwd := "root:x:0:0:root:/root:/bin/bash\n" +
		"alice:x:1000:1001:Alice:/home/alice:/bin/bash\n" +
		"big:x:300000:300001::/:/bin/sh\n" +
		"# comment\n\nbroken:x:zz:1\n"
	got := parseIDFile(strings.NewReader(passwd), "/etc/passwd", []int{2, 3}, false)
	want := []int64{0, 0, 1000, 1001, 300000, 300001, 1}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i, r := range got {
		if r.First != want[i] || r.Count != 1 || !strings.HasPrefix(r.Source, "/etc/passwd (") {
			t.Errorf("%d: %+v, want id %d", i, r, want[i])
		}
	}
	sub := "alice:100000:65536\nbob:165536:65536\nbad:1\nneg:-5:10\nzero:5:0\n"
	got = parseIDFile(strings.NewReader(sub), "/etc/subuid", nil, true)
	if len(got) != 2 || got[0] != (IDRange{First: 100000, Count: 65536, Source: "/etc/subuid (alice)"}) || got[1].First != 165536 {
		t.Fatalf("subuid: %+v", got)
	}
}

func TestReservedIDsThisHost(t *testing.T) {
	t.Parallel()
	rs := ReservedIDs()
	root := false
	for _, r := range rs {
		root = root || r.First == 0
	}
	if !root {
		t.Errorf("root's uid 0 not reserved: %+v", rs)
	}
}
