package fsdiff

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/pmezard/go-difflib/difflib"
)

// Change is one path that differs between the old and the new side.
type Change struct {
	Path   string `json:"path"`
	Change string `json:"change"` // Added, Modified, Deleted
	// Type, Size, Mode and Target are the new side's (the old side's for a deletion); a
	// deletion seen only as a whiteout is TypeUnknown with no mode.
	Type   string `json:"type"`
	Size   int64  `json:"size"`
	Mode   string `json:"mode"`
	Target string `json:"target,omitempty"`

	old, new *Entry
	om, nm   *Manifest
}

// Options configure Diff.
type Options struct {
	Limits
	// Cursor continues after this path (the NextCursor of the previous page).
	Cursor string
	// Limit is the most changes returned (default 1000).
	Limit int
	// Unified asks for a unified diff of the page's text files, at most MaxDiffBytes
	// (default DefaultDiffBytes, at most MaxMaxDiffBytes).
	Unified      bool
	MaxDiffBytes int64
}

// Result is a page of a diff.
type Result struct {
	Changes []Change
	// NextCursor is set when more changes may follow: pass it as Options.Cursor.
	NextCursor string
	// ContentFallback: Limits.MaxCompareBytes was reached, so some files of equal size and
	// metadata were compared by mtime, not content.
	ContentFallback bool
	// Examined is how many paths the two walks examined.
	Examined      int
	Diff          string
	DiffTruncated bool
	// Skipped are changed files the unified diff leaves out: binary, or larger than
	// MaxTextFileBytes.
	Skipped []string
}

// Diff compares side old with side new (each a list of trees; an empty list is the image).
func Diff(ctx context.Context, old, new []Tree, opt Options) (Result, error) {
	opt.Limits = opt.Limits.withDefaults()
	if opt.Limit <= 0 {
		opt.Limit = 1000
	}
	if opt.MaxDiffBytes <= 0 {
		opt.MaxDiffBytes = DefaultDiffBytes
	}
	opt.MaxDiffBytes = min(opt.MaxDiffBytes, MaxMaxDiffBytes)
	om, err := BuildManifest(ctx, old, opt.Cursor, opt.Limits)
	if err != nil {
		return Result{}, err
	}
	nm, err := BuildManifest(ctx, new, opt.Cursor, opt.Limits)
	if err != nil {
		return Result{}, err
	}
	res := Result{Examined: len(om.Entries) + len(nm.Entries)}
	cmp := newComparer(opt.MaxCompareBytes)
	defer cmp.close()
	same := func(o, n *Entry) bool {
		if !metaEqual(o, n, false) {
			return false
		}
		if o.Type != TypeFile || o.Size == 0 {
			return true
		}
		eq, fellBack := cmp.equal(om.Trees[o.tree].Dir, o.rel, nm.Trees[n.tree].Dir, n.rel)
		if fellBack {
			res.ContentFallback = true
			return o.Mtime == n.Mtime
		}
		return eq
	}
	join(om, nm, same, func(c Change) bool {
		if len(res.Changes) == opt.Limit {
			res.NextCursor = res.Changes[len(res.Changes)-1].Path
			return false
		}
		res.Changes = append(res.Changes, c)
		return true
	})
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if opt.Unified {
		res.Diff, res.DiffTruncated, res.Skipped = unified(res.Changes, opt.MaxDiffBytes)
	}
	return res, nil
}

// CompareManifests lists what differs from before to after by metadata alone (type, mode,
// owner, size, target, mtime, ctime, inode), in path order, at most limit changes
// (truncated says more were left out).
func CompareManifests(before, after *Manifest, limit int) (changes []Change, truncated bool) {
	join(before, after, func(o, n *Entry) bool { return metaEqual(o, n, true) }, func(c Change) bool {
		if len(changes) == limit {
			truncated = true
			return false
		}
		changes = append(changes, c)
		return true
	})
	return changes, truncated
}

func metaEqual(o, n *Entry, times bool) bool {
	if o.Type != n.Type || o.Mode != n.Mode || o.UID != n.UID || o.GID != n.GID || o.Target != n.Target || o.Opaque != n.Opaque {
		return false
	}
	if o.Type == TypeFile && o.Size != n.Size {
		return false
	}
	if times && (o.Mtime != n.Mtime || o.Ctime != n.Ctime || o.Ino != n.Ino) {
		return false
	}
	return true
}

// join walks both manifests in path order and calls emit for each change until it returns
// false.
func join(om, nm *Manifest, same func(o, n *Entry) bool, emit func(Change) bool) {
	i, j := 0, 0
	for i < len(om.Entries) || j < len(nm.Entries) {
		var o, n *Entry
		switch {
		case j >= len(nm.Entries):
			o = &om.Entries[i]
			i++
		case i >= len(om.Entries):
			n = &nm.Entries[j]
			j++
		default:
			switch c := PathCompare(om.Entries[i].Path, nm.Entries[j].Path); {
			case c < 0:
				o = &om.Entries[i]
				i++
			case c > 0:
				n = &nm.Entries[j]
				j++
			default:
				o, n = &om.Entries[i], &nm.Entries[j]
				i, j = i+1, j+1
			}
		}
		if (o != nil && o.context) || (n != nil && n.context) {
			continue
		}
		var p string
		if o != nil {
			p = o.Path
		} else {
			p = n.Path
		}
		os, ns := stPresent, stPresent
		if o == nil {
			os = om.absentState(p)
		} else if o.Whiteout {
			os = stGone
		}
		if n == nil {
			ns = nm.absentState(p)
		} else if n.Whiteout {
			ns = stGone
		}
		c := Change{Path: p, old: o, new: n, om: om, nm: nm}
		switch {
		case os == stPresent && ns == stPresent:
			if same(o, n) {
				continue
			}
			c.Change = Modified
		case ns == stPresent:
			c.Change = Added
		case os == stPresent:
			c.Change = Deleted
		case os == stGone && ns == stLower:
			c.Change, c.Type = Added, TypeUnknown
		case os == stLower && ns == stGone:
			c.Change, c.Type = Deleted, TypeUnknown
		default:
			continue
		}
		if c.Type == "" {
			e := n
			if c.Change == Deleted {
				e = o
			}
			c.Type, c.Size, c.Mode, c.Target = e.Type, e.Size, e.ModeString(), e.Target
		}
		if !emit(c) {
			return
		}
	}
}

// comparer compares files' content for one Diff: the trees' directories opened once, two
// buffers, and the byte budget.
type comparer struct {
	dirs   map[string]int
	ba, bb []byte
	budget int64
}

func newComparer(budget int64) *comparer {
	return &comparer{dirs: map[string]int{}, ba: make([]byte, 64<<10), bb: make([]byte, 64<<10), budget: budget}
}

// equal streams both files and stops at the first difference. It spends the budget (bytes
// read, both files); when the budget runs out first it reports fellBack. A file that is gone
// or not regular any more differs.
func (c *comparer) equal(odir, orel, ndir, nrel string) (eq, fellBack bool) {
	a, err := c.open(odir, orel)
	if err != nil {
		return false, false
	}
	defer a.Close()
	b, err := c.open(ndir, nrel)
	if err != nil {
		return false, false
	}
	defer b.Close()
	for {
		chunk := min(int64(len(c.ba)), c.budget/2)
		if chunk <= 0 {
			return false, true
		}
		na, ea := io.ReadFull(a, c.ba[:chunk])
		nb, eb := io.ReadFull(b, c.bb[:chunk])
		c.budget -= int64(na + nb)
		if na != nb || !bytes.Equal(c.ba[:na], c.bb[:nb]) {
			return false, false
		}
		aEnd := ea == io.EOF || errors.Is(ea, io.ErrUnexpectedEOF)
		bEnd := eb == io.EOF || errors.Is(eb, io.ErrUnexpectedEOF)
		if ea != nil && !aEnd || eb != nil && !bEnd {
			return false, false // unreadable: differs
		}
		if aEnd || bEnd {
			return aEnd == bEnd, false
		}
	}
}

// readText reads a change side's file for the unified diff: ok false when it is not text or
// too large.
func readText(m *Manifest, e *Entry) (string, bool) {
	if e == nil {
		return "", true
	}
	if e.Type != TypeFile {
		return "", false
	}
	if e.Size > MaxTextFileBytes {
		return "", false
	}
	f, err := openBeneath(m.Trees[e.tree].Dir, e.rel)
	if err != nil {
		return "", false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxTextFileBytes+1))
	if err != nil || len(b) > MaxTextFileBytes {
		return "", false
	}
	if bytes.IndexByte(b[:min(len(b), textSniffBytes)], 0) >= 0 || !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

// unified makes a unified diff of the changed text files, at most maxBytes bytes.
// splitLines splits s after each newline for difflib, which wants every line to end in one:
// difflib.SplitLines adds an empty last line to text that ends in a newline (a one-line file
// read as two lines), so this drops it, and ends an unterminated last line with one.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		return lines[:len(lines)-1]
	}
	lines[len(lines)-1] += "\n"
	return lines
}

func unified(changes []Change, maxBytes int64) (diff string, truncated bool, skipped []string) {
	var sb strings.Builder
	for _, c := range changes {
		if c.Type != TypeFile {
			continue
		}
		var o, n *Entry
		if c.old != nil && !c.old.Whiteout && c.old.Type == TypeFile {
			o = c.old
		}
		if c.new != nil && !c.new.Whiteout && c.new.Type == TypeFile {
			n = c.new
		}
		if (o != nil && o.Size > MaxTextFileBytes) || (n != nil && n.Size > MaxTextFileBytes) {
			skipped = append(skipped, c.Path)
			continue
		}
		if truncated {
			continue // DiffTruncated says the rest is left out
		}
		a, okA := readText(c.om, o)
		b, okB := readText(c.nm, n)
		if !okA || !okB {
			skipped = append(skipped, c.Path)
			continue
		}
		from, to := "a"+c.Path, "b"+c.Path
		if o == nil {
			from = "/dev/null"
		}
		if n == nil {
			to = "/dev/null"
		}
		d, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{A: splitLines(a), B: splitLines(b),
			FromFile: from, ToFile: to, Context: 3})
		if err != nil || d == "" {
			continue
		}
		if int64(sb.Len()+len(d)) > maxBytes {
			room := max(int(maxBytes)-sb.Len(), 0)
			if cut := strings.LastIndexByte(d[:room], '\n'); cut >= 0 {
				sb.WriteString(d[:cut+1])
			}
			truncated = true
			continue
		}
		sb.WriteString(d)
	}
	return sb.String(), truncated, skipped
}
