package config

import (
	"strings"
	"testing"
)

func TestParseStore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want StoreSpec
	}{
		{"", StoreSpec{Driver: StoreSQLite, Path: "/state/agentbox.db"}},
		{"sqlite:///var/lib/x.db", StoreSpec{Driver: StoreSQLite, Path: "/var/lib/x.db"}},
		{"sqlite:///var/lib/../x.db", StoreSpec{Driver: StoreSQLite, Path: "/var/x.db"}},
		{"postgres://u:pw@db:5432/agentbox?sslmode=require", StoreSpec{Driver: StorePostgres, DSN: "postgres://u:pw@db:5432/agentbox?sslmode=require"}},
		{"postgresql://db/agentbox", StoreSpec{Driver: StorePostgres, DSN: "postgresql://db/agentbox"}},
	} {
		got, err := ParseStore(tc.in, "/state")
		if err != nil || got != tc.want {
			t.Errorf("ParseStore(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, mention string }{
		{"sqlite://rel.db", "absolute"},
		{"sqlite://", "absolute"},
		{"sqlite:///x.db?mode=ro", "parameters"},
		{"postgres://", "host"},
		{"mysql://u:hunter2@h/db", "mysql"},
		{"/var/lib/x.db", "no scheme"},
		{"redis://:hunter2@h", "redis"},
	} {
		_, err := ParseStore(tc.in, "/state")
		if err == nil || !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("ParseStore(%q): %v; want an error mentioning %q", tc.in, err, tc.mention)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ParseStore(%q) repeats the password: %v", tc.in, err)
		}
	}
	c := Default()
	c.StateDir, c.Store = "/state", "mysql://x"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--store") {
		t.Errorf("Validate with a bad --store: %v", err)
	}
}
