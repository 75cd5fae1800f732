package hostinfo

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// IDRange is a block of host user or group ids: Count ids from First.
type IDRange struct {
	First int64 `json:"first"`
	Count int64 `json:"count"`
	// Source says where the range comes from, e.g. "/etc/subuid (alice)".
	Source string `json:"source"`
}

// ReservedIDs returns the host ids that no sandbox may be given: every uid and gid in
// /etc/passwd and /etc/group, and the ranges /etc/subuid and /etc/subgid delegate (to rootless
// containers, say). Files that do not exist reserve nothing.
func ReservedIDs() []IDRange {
	var out []IDRange
	for _, f := range []struct {
		path   string
		fields []int // fields holding an id (colon-separated, from 0)
		sub    bool  // name:first:count
	}{
		{"/etc/passwd", []int{2, 3}, false},
		{"/etc/group", []int{2}, false},
		{"/etc/subuid", nil, true},
		{"/etc/subgid", nil, true},
	} {
		file, err := os.Open(f.path)
		if err != nil {
			continue
		}
		out = append(out, parseIDFile(file, f.path, f.fields, f.sub)...)
		file.Close()
	}
	return out
}

// parseIDFile reads the ids of a passwd(5)/group(5) file (fields) or the ranges of a
// subuid(5)/subgid(5) file (sub); malformed lines are skipped.
func parseIDFile(r io.Reader, path string, fields []int, sub bool) []IDRange {
	var out []IDRange
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if sub {
			if len(f) != 3 {
				continue
			}
			first, err1 := strconv.ParseInt(f[1], 10, 64)
			count, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 == nil && err2 == nil && first >= 0 && count > 0 {
				out = append(out, IDRange{First: first, Count: count, Source: path + " (" + f[0] + ")"})
			}
			continue
		}
		for _, i := range fields {
			if i >= len(f) {
				continue
			}
			if id, err := strconv.ParseInt(f[i], 10, 64); err == nil && id >= 0 {
				out = append(out, IDRange{First: id, Count: 1, Source: path + " (" + f[0] + ")"})
			}
		}
	}
	return out
}
