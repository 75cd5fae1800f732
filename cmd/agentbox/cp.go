package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// splitRemote parses "ID:/path"; ok is false for a local path.
func splitRemote(s string) (id, p string, ok bool) {
	id, p, ok = strings.Cut(s, ":")
	if !ok || !sandbox.ValidID(id) {
		return "", "", false
	}
	return id, p, true
}

func cmdCp(args []string) int {
	fs := flag.NewFlagSet("cp", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 2 {
		fmt.Fprintln(os.Stderr, "usage: agentbox cp LOCAL ID:PATH   or   agentbox cp ID:PATH LOCAL   (LOCAL may be - for stdin/stdout)")
		return 2
	}
	srcID, srcPath, srcRemote := splitRemote(pos[0])
	dstID, dstPath, dstRemote := splitRemote(pos[1])
	if srcRemote == dstRemote {
		fmt.Fprintln(os.Stderr, "agentbox cp: exactly one of SRC and DST must be ID:PATH (ids look like sb-0123456789ab)")
		return 2
	}
	c, err := cf.client()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	if dstRemote {
		var r io.Reader = os.Stdin
		mode := uint32(0o644)
		if pos[0] != "-" {
			f, err := os.Open(pos[0])
			if err != nil {
				return fail(err)
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return fail(err)
			}
			if !fi.Mode().IsRegular() {
				return fail(fmt.Errorf("%s is not a regular file", pos[0]))
			}
			mode = uint32(fi.Mode().Perm())
			r = f
			if strings.HasSuffix(dstPath, "/") {
				dstPath += filepath.Base(pos[0])
			}
		}
		if _, err := c.WriteFile(ctx, dstID, dstPath, mode, r); err != nil {
			return fail(err)
		}
		return 0
	}
	body, _, err := c.ReadFile(ctx, srcID, srcPath, 0, 0)
	if err != nil {
		return fail(err)
	}
	defer body.Close()
	if pos[1] == "-" {
		if _, err := io.Copy(os.Stdout, body); err != nil {
			return fail(err)
		}
		return 0
	}
	dst := pos[1]
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = filepath.Join(dst, path.Base(srcPath))
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".agentbox-cp-*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, body); err != nil {
		tmp.Close()
		return fail(fmt.Errorf("copy %s: %w", pos[0], err))
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	_ = os.Chmod(tmp.Name(), 0o644)
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fail(err)
	}
	return 0
}
