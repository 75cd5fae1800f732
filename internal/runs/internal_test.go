package runs

import (
	"encoding/base64"
	"reflect"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/sandbox"
)

func TestMatchGlob(t *testing.T) {
	cases := []struct {
		pat, name string
		want      bool
	}{
		{"*.txt", "a.txt", true}, {"*.txt", "d/a.txt", false}, {"**/*.txt", "a.txt", true},
		{"**/*.txt", "d/e/a.txt", true}, {"out/**", "out/a/b", true}, {"out/**/x", "out/x", true},
		{"out/**/x", "out/a/b/x", true}, {"out/**/x", "other/x", false}, {"a/?.log", "a/1.log", true},
		{"a/[ab].log", "a/c.log", false}, {"report.json", "report.json", true},
	}
	for _, c := range cases {
		if got := matchGlob(c.pat, c.name); got != c.want {
			t.Errorf("matchGlob(%q, %q) = %v", c.pat, c.name, got)
		}
	}
	if checkGlob("a/[") == nil {
		t.Error("a bad pattern passed")
	}
}

func TestParseNameStatus(t *testing.T) {
	out := "M\x00edit.txt\x00A\x00new file\x00D\x00gone\x00R100\x00old\x00moved\x00"
	got, more := parseNameStatus(out)
	want := []ChangedFile{{Path: "edit.txt", Status: "modified"}, {Path: "new file", Status: "added"},
		{Path: "gone", Status: "deleted"}, {Path: "moved", Status: "renamed", From: "old"}}
	if more || !reflect.DeepEqual(got, want) {
		t.Errorf("parseNameStatus = %+v %v", got, more)
	}
	var b strings.Builder
	for range MaxChangedFiles + 5 {
		b.WriteString("A\x00f\x00")
	}
	if got, more := parseNameStatus(b.String()); len(got) != MaxChangedFiles || !more {
		t.Errorf("bound: %d, %v", len(got), more)
	}
}

// The network checkout's plan: the repo's host added to the run's policy only at create, the
// run's own policy (empty for none) after; the repo secret's hosts default to the repo's host;
// git gets the placeholder as Basic credentials in its environment.
func TestCheckoutPlan(t *testing.T) {
	x := &exe{r: Run{Spec: Spec{RepoURL: "https://git.example.com:8443/o/r.git", RepoSecret: "TOKEN",
		Secrets: map[string]sandbox.SecretSpec{"TOKEN": {From: "env:T"}, "OTHER": {From: "env:O", Hosts: []string{"api.example.com"}}}}}}
	n := x.createNetwork()
	if n == nil || n.Policy == nil || !reflect.DeepEqual(n.Policy.Allow, []string{"git.example.com:8443"}) {
		t.Errorf("create network = %+v", n)
	}
	if p := x.ownPolicy(); len(p.Allow) != 0 || p.Allow == nil {
		t.Errorf("own policy of a run with network none = %+v", p)
	}
	sec := x.createSecrets()
	if !reflect.DeepEqual(sec["TOKEN"].Hosts, []string{"git.example.com"}) || !reflect.DeepEqual(sec["OTHER"].Hosts, []string{"api.example.com"}) {
		t.Errorf("secrets = %+v", sec)
	}
	if x.r.Spec.Secrets["TOKEN"].Hosts != nil {
		t.Error("the spec's secrets were changed")
	}
	x.r.Spec.Network = &sandbox.Network{Policy: &egress.Policy{Allow: []string{"pypi.org"}}}
	if n := x.createNetwork(); !reflect.DeepEqual(n.Policy.Allow, []string{"pypi.org", "git.example.com:8443"}) {
		t.Errorf("create network over a policy = %+v", n.Policy)
	}
	if p := x.ownPolicy(); !reflect.DeepEqual(p.Allow, []string{"pypi.org"}) {
		t.Errorf("own policy = %+v", p)
	}
	env := basicAuthEnv("agentbox-secret-abc")
	v := env["GIT_CONFIG_VALUE_0"]
	dec, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(v, "Authorization: Basic "))
	if env["GIT_CONFIG_KEY_0"] != "http.extraHeader" || err != nil || string(dec) != "x-access-token:agentbox-secret-abc" {
		t.Errorf("env = %v", env)
	}
	// A file:// repo needs no network.
	x.r.Spec = Spec{RepoURL: "file:///repos/r"}
	if n := x.createNetwork(); n != nil {
		t.Errorf("file:// run's network = %+v", n)
	}
}
