package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/api/client"
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
	c := newClientCmd("cp", "agentbox cp LOCAL ID:PATH   or   agentbox cp ID:PATH LOCAL   (LOCAL may be - for stdin/stdout)")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		srcID, srcPath, srcRemote := splitRemote(pos[0])
		dstID, dstPath, dstRemote := splitRemote(pos[1])
		if srcRemote == dstRemote {
			fmt.Fprintln(os.Stderr, "agentbox cp: exactly one of SRC and DST must be ID:PATH (ids look like sb-0123456789ab)")
			return 2
		}
		if dstRemote {
			return copyIn(ctx, cl, pos[0], dstID, dstPath)
		}
		return copyOut(ctx, cl, srcID, srcPath, pos[1])
	})
}

func copyIn(ctx context.Context, cl *client.Client, local, id, dstPath string) int {
	var r io.Reader = os.Stdin
	mode := uint32(0o644)
	size := int64(0)
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return fail(err)
		}
		if !fi.Mode().IsRegular() {
			return fail(fmt.Errorf("%s is not a regular file", local))
		}
		mode = uint32(fi.Mode().Perm())
		size = fi.Size()
		r = f
		if strings.HasSuffix(dstPath, "/") {
			dstPath += filepath.Base(local)
		}
	}
	bar := newProgress(id+":"+dstPath, size)
	_, err := cl.WriteFile(ctx, id, dstPath, mode, bar.reader(r))
	bar.finish()
	if err != nil {
		return fail(err)
	}
	return 0
}

func copyOut(ctx context.Context, cl *client.Client, id, srcPath, local string) int {
	rc, size, err := cl.ReadFile(ctx, id, srcPath, 0, 0)
	if err != nil {
		return fail(err)
	}
	defer rc.Close()
	bar := newProgress(id+":"+srcPath, size)
	defer bar.finish()
	body := bar.reader(rc)
	if local == "-" {
		if _, err := io.Copy(os.Stdout, body); err != nil {
			return fail(err)
		}
		return 0
	}
	dst := local
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = filepath.Join(dst, path.Base(srcPath))
	}
	// Write beside the destination and rename, so an interrupted copy leaves no half file.
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".agentbox-cp-*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, body); err != nil {
		tmp.Close()
		return fail(fmt.Errorf("copy %s:%s: %w", id, srcPath, err))
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
