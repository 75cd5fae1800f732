//go:build linux

package guest

import (
	"strings"
	"testing"
)

func TestLookupUserIn(t *testing.T) {
	t.Parallel()
	passwd := "root:x:0:0:root:/root:/bin/sh\n" +
		"agent:x:1000:1000:agent:/home/agent:/bin/sh\n" +
		"broken:x:abc:1:broken:/x:/bin/sh\n" +
		"short:x:1\n"
	u, err := lookupUserIn(strings.NewReader(passwd), "agent")
	if err != nil || u != (User{Name: "agent", UID: 1000, GID: 1000, Home: "/home/agent"}) {
		t.Fatalf("agent: %+v %v", u, err)
	}
	for _, name := range []string{"nobody", "broken", "short", ""} {
		if _, err := lookupUserIn(strings.NewReader(passwd), name); err == nil {
			t.Errorf("%q: no error", name)
		}
	}
}

func TestExecTags(t *testing.T) {
	t.Parallel()
	var tags execTags
	seen := map[uint32]bool{}
	for range 5 {
		tag := tags.acquire()
		if tag == 0 || seen[tag] {
			t.Fatalf("tag %d (seen %v)", tag, seen)
		}
		seen[tag] = true
	}
	// Every tag in use: none is handed out twice.
	var all []uint32
	for {
		tag := tags.acquire()
		if tag == 0 {
			break
		}
		if seen[tag] {
			t.Fatalf("tag %d handed out twice", tag)
		}
		seen[tag] = true
		all = append(all, tag)
	}
	if len(seen) != execTagCount {
		t.Fatalf("%d tags, want %d", len(seen), execTagCount)
	}
	tags.release(all[10])
	if got := tags.acquire(); got != all[10] {
		t.Fatalf("after a release got %d, want %d", got, all[10])
	}
}

func TestParseUser(t *testing.T) {
	t.Parallel()
	passwd := "root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1001:node:/home/node:/bin/sh\n"
	group := "root:x:0:\nstaff:x:50:\n"
	for spec, want := range map[string]User{
		"node":       {Name: "node", UID: 1000, GID: 1001, Home: "/home/node"},
		"1000":       {Name: "node", UID: 1000, GID: 1001, Home: "/home/node"},
		"4242":       {Name: "4242", UID: 4242, GID: 4242, Home: "/"},
		"4242:7":     {Name: "4242", UID: 4242, GID: 7, Home: "/"},
		"node:staff": {Name: "node", UID: 1000, GID: 50, Home: "/home/node"},
		"0:0":        {Name: "root", UID: 0, GID: 0, Home: "/root"},
	} {
		if u, err := parseUser(spec, passwd, group); err != nil || u != want {
			t.Errorf("%q: %+v %v, want %+v", spec, u, err, want)
		}
	}
	for _, spec := range []string{"", ":", "ghost", "node:", "node:ghosts", "70000", "1:70000"} {
		if u, err := parseUser(spec, passwd, group); err == nil {
			t.Errorf("%q: %+v, want an error", spec, u)
		}
	}
}

func TestCommandOOMScoreAdj(t *testing.T) {
	for _, tc := range []struct{ agent, want int }{{-998, 0}, {-1, 0}, {0, 500}, {300, 800}, {700, 1000}, {1000, 1000}} {
		if got := commandOOMScoreAdj(tc.agent); got != tc.want {
			t.Errorf("commandOOMScoreAdj(%d) = %d, want %d", tc.agent, got, tc.want)
		}
	}
}
