package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// TestServePoolFlag: serve's --pool is repeatable and refuses a bad value at parse time, naming
// the key.
func TestServePoolFlag(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	pools := registerPoolFlags(fs)
	if err := fs.Parse([]string{"--pool", "name=a,size=2", "--pool", "name=b,image=python:3.12,cpu=0.5,memory_mb=256,size=1"}); err != nil {
		t.Fatal(err)
	}
	if len(*pools) != 2 || (*pools)[0].Name != "a" || (*pools)[0].Size != 2 || (*pools)[1].Image != "python:3.12" || (*pools)[1].CPU != 0.5 || (*pools)[1].MemoryMB != 256 {
		t.Fatalf("pools: %+v", *pools)
	}
	for _, tc := range []struct{ v, want string }{
		{"name=a", "name and size are required"},
		{"name=a,size=two", "size must be a number"},
		{"name=a,size=1,memory=5", `unknown key "memory"`},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		registerPoolFlags(fs)
		if err := fs.Parse([]string{"--pool", tc.v}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--pool %q: %v; want %q", tc.v, err, tc.want)
		}
	}
}
