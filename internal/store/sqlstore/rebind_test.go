package sqlstore

import "testing"

func TestRebind(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`SELECT 1`, `SELECT 1`},
		{`SELECT a FROM t WHERE x = ? AND y IN (?, ?) LIMIT ?`, `SELECT a FROM t WHERE x = $1 AND y IN ($2, $3) LIMIT $4`},
		{`SELECT '?', "a?b" FROM t WHERE x = ?`, `SELECT '?', "a?b" FROM t WHERE x = $1`},
		{`SELECT 'it''s ?' WHERE x = ?`, `SELECT 'it''s ?' WHERE x = $1`},
		{"SELECT ? -- a comment?\nFROM t WHERE y = ?", "SELECT $1 -- a comment?\nFROM t WHERE y = $2"},
		{`SELECT 'unterminated ?`, `SELECT 'unterminated ?`},
	} {
		if got := Rebind(tc.in); got != tc.want {
			t.Errorf("Rebind(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
