// Package fsdiff compares the files of two sides (a sandbox, a snapshot, an image) and lists
// what was added, modified and deleted, with sizes, modes, symlink targets and, for text
// files, a unified diff. It knows no sandbox: a side is a list of Trees (an in-sandbox path
// prefix, the host directory holding it, whether it is an overlayfs upper layer, and the id
// base its files carry), which the caller gets from a runtime.
//
// The trees are directories a sandbox controls, so the walk trusts nothing in them: it never
// follows a symlink (directories are opened with openat(O_NOFOLLOW|O_DIRECTORY) relative to
// their opened parent, files with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) and checked
// with fstat before a byte is read), opens files O_NONBLOCK (a FIFO never blocks it), and is
// bounded: at most Limits.MaxEntries paths per side (past it the walk stops with a
// *LimitError), at most Limits.MaxCompareBytes of content read per diff (past it, files of
// equal size are compared by metadata and mtime, and Result.ContentFallback says so), at most
// MaxDepth levels, and a unified diff of at most MaxMaxDiffBytes.
//
// Layers. In a Layer tree a 0:0 character device is a whiteout (the path is deleted) and a
// directory with the xattr trusted.overlay.opaque=y (or user.overlay.opaque=y) hides
// everything below it; a path a layer does not hold is its lower's (the image's), which
// fsdiff does not see. A side with no tree covering a path sees the image there. So a sandbox
// against its image (the old side empty) lists everything in its writable trees as added and
// its whiteouts as deleted; against another layer over the same image, a path only one side
// holds is added or deleted (where the image had it too, that is really a modification).
// Trees nested in a layer's path (/workspace in /) win over the layer; a tree's root itself
// (a mount point) is never listed.
//
// Order. Paths are ordered component by component ("/a/b" before "/a-b"): a deterministic
// order a cursor (the last path of a page) continues from.
package fsdiff

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Tree is one directory of a side's files.
type Tree struct {
	// Path is where the tree is in the sandbox ("/", "/workspace").
	Path string
	// Dir is the host directory holding it.
	Dir string
	// Layer says Dir is an overlayfs upper layer (whiteouts, opaque directories, a lower).
	Layer bool
	// UIDBase and GIDBase are the first host ids of the side's range: owners compare relative
	// to them, so two sandboxes with different ranges compare equal for the same in-sandbox
	// owner.
	UIDBase, GIDBase uint32
	// Exclude are in-sandbox paths under Path left out with everything below them (mount
	// points: the tree holds only an empty directory or file there).
	Exclude []string
}

// Types of an Entry or Change.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other"
	// TypeUnknown: a deletion seen only as a whiteout (what was deleted is in the image).
	TypeUnknown = "unknown"
)

// Change kinds.
const (
	Added    = "added"
	Modified = "modified"
	Deleted  = "deleted"
)

// Bounds.
const (
	DefaultMaxEntries      = 200_000
	DefaultMaxCompareBytes = 256 << 20
	MaxDepth               = 256
	// MaxTextFileBytes is the largest file a unified diff shows; a larger one is Skipped.
	MaxTextFileBytes = 256 << 10
	// textSniffBytes is how much of a file decides it is text (valid UTF-8, no NUL).
	textSniffBytes   = 8 << 10
	DefaultDiffBytes = 64 << 10
	MaxMaxDiffBytes  = 1 << 20
	maxLinkTarget    = 4096
)

// Limits bound a walk. Zero fields take the defaults.
type Limits struct {
	// MaxEntries is the most paths examined on one side.
	MaxEntries int
	// MaxCompareBytes is the most file content read (both sides) to compare files of equal
	// size and metadata in one Diff.
	MaxCompareBytes int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	if l.MaxCompareBytes <= 0 {
		l.MaxCompareBytes = DefaultMaxCompareBytes
	}
	return l
}

// LimitError is a walk that met Limits.MaxEntries (or MaxDepth).
type LimitError struct {
	What string // "entries" or "depth"
	Max  int
	Path string // where it stopped
}

func (e *LimitError) Error() string {
	if e.What == "depth" {
		return fmt.Sprintf("%s is more than %d directories deep; files that deep are not compared", e.Path, e.Max)
	}
	return fmt.Sprintf("more than %d paths to examine (stopped at %s); a diff examines at most %d paths a side", e.Max, e.Path, e.Max)
}

// Entry is one path of a side as its tree holds it.
type Entry struct {
	Path string // in the sandbox
	Type string
	// Mode is the permission bits with setuid, setgid and sticky (07777).
	Mode uint32
	Size int64
	// UID and GID are relative to the tree's base.
	UID, GID int64
	Target   string // a symlink's
	Mtime    int64  // ns
	Ctime    int64  // ns
	Ino      uint64
	// Whiteout: a layer's deletion of Path. Opaque: a layer's directory hiding its lower.
	Whiteout bool
	Opaque   bool

	tree int    // index in the side's trees
	rel  string // relative to the tree's Dir
	// context: an ancestor of the cursor kept for lookups, not listed.
	context bool
}

// ModeString is the mode in octal ("0644", "4755").
func (e *Entry) ModeString() string { return fmt.Sprintf("%04o", e.Mode&0o7777) }

// Manifest is a side's entries in path order, up to Limits.MaxEntries.
type Manifest struct {
	Trees   []Tree
	Entries []Entry
}

// PathCompare orders in-sandbox paths component by component.
func PathCompare(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		ca, cb := a[i], b[i]
		if ca == cb {
			continue
		}
		if ca == '/' {
			ca = 0
		}
		if cb == '/' {
			cb = 0
		}
		if ca < cb {
			return -1
		}
		return 1
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}

// isAncestor reports whether a is a strict ancestor directory of p.
func isAncestor(a, p string) bool {
	if a == "/" {
		return p != "/" && strings.HasPrefix(p, "/")
	}
	return len(p) > len(a) && strings.HasPrefix(p, a) && p[len(a)] == '/'
}

func joinPath(dir, name string) string {
	if dir == "/" {
		return "/" + name
	}
	return dir + "/" + name
}

// cleanTrees checks and orders a side's trees.
func cleanTrees(trees []Tree) ([]Tree, error) {
	out := slices.Clone(trees)
	for i, t := range out {
		if !strings.HasPrefix(t.Path, "/") || (t.Path != "/" && strings.HasSuffix(t.Path, "/")) || strings.Contains(t.Path, "//") {
			return nil, fmt.Errorf("tree path %q is not a clean absolute path", t.Path)
		}
		if t.Dir == "" {
			return nil, fmt.Errorf("tree %s has no directory", t.Path)
		}
		for _, u := range out[:i] {
			if u.Path == t.Path {
				return nil, fmt.Errorf("tree path %s is listed twice", t.Path)
			}
		}
	}
	return out, nil
}

// walker builds one side's manifest.
type walker struct {
	ctx     context.Context
	trees   []Tree
	cursor  string
	max     int
	entries []Entry
	seen    int
}

// BuildManifest walks trees and returns their entries in path order. With cursor set, paths at
// or before it are left out (their ancestors are kept, marked, for the layer rules); past
// lim.MaxEntries it returns a *LimitError.
func BuildManifest(ctx context.Context, trees []Tree, cursor string, lim Limits) (*Manifest, error) {
	lim = lim.withDefaults()
	trees, err := cleanTrees(trees)
	if err != nil {
		return nil, err
	}
	w := &walker{ctx: ctx, trees: trees, cursor: cursor, max: lim.MaxEntries}
	for i := range trees {
		if err := w.walkTree(i); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(w.entries, func(a, b Entry) int { return PathCompare(a.Path, b.Path) })
	return &Manifest{Trees: trees, Entries: w.entries}, nil
}

// otherRoot reports whether p, in tree i, is the root of another tree nested in it: that tree
// wins, so tree i's entry at p (a mount point) and everything below it are not listed.
func (w *walker) otherRoot(i int, p string) bool {
	for j, t := range w.trees {
		if j != i && t.Path == p && isAncestor(w.trees[i].Path, p) {
			return true
		}
	}
	return false
}

// lookup returns the entry at p.
func (m *Manifest) lookup(p string) (*Entry, bool) {
	i, ok := slices.BinarySearchFunc(m.Entries, p, func(e Entry, p string) int { return PathCompare(e.Path, p) })
	if !ok {
		return nil, false
	}
	return &m.Entries[i], true
}

// state of a path a manifest does not hold.
type state int

const (
	stLower   state = iota // the image's (or nothing that fsdiff sees)
	stGone                 // deleted, or never there, for certain
	stPresent              // the entry is there
)

// absentState says what a side has at p where it holds no entry.
func (m *Manifest) absentState(p string) state {
	ti := -1
	for i, t := range m.Trees {
		if (t.Path == p || isAncestor(t.Path, p)) && (ti < 0 || len(t.Path) > len(m.Trees[ti].Path)) {
			ti = i
		}
	}
	if ti < 0 {
		return stLower
	}
	t := m.Trees[ti]
	if !t.Layer {
		return stGone
	}
	for a := parent(p); a != "" && isAncestor(t.Path, a); a = parent(a) {
		if e, ok := m.lookup(a); ok && (e.Whiteout || e.Type != TypeDir || e.Opaque) {
			return stGone
		}
	}
	return stLower
}

func parent(p string) string {
	if p == "/" || p == "" {
		return ""
	}
	i := strings.LastIndexByte(p, '/')
	if i == 0 {
		return "/"
	}
	return p[:i]
}
