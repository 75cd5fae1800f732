package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
)

// The file relay's CLI: agentbox machine pull, agentbox machine push.

func machinePull(args []string) int {
	c := newClientCmd("machine pull", "agentbox machine pull [-o FILE|-] [--json] MACHINE PATH")
	out := c.fs.String("o", "", "also download the file here (- for stdout); without it, print the blob and its link")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		res, err := cl.RemotePull(ctx, pos[0], pos[1])
		if err != nil {
			return fail(err)
		}
		if *out != "" {
			if code := downloadBlob(ctx, cl, res.BlobID, res.SHA256, *out, filepath.Base(res.Name)); code != 0 {
				return code
			}
		}
		if c.json {
			printJSON(res)
			return 0
		}
		fmt.Fprintf(os.Stderr, "pulled %s:%s (%d bytes, sha256 %s) as blob %s, kept until %s\n",
			pos[0], pos[1], res.Size, res.SHA256, res.BlobID, res.ExpiresAt.Format("2006-01-02T15:04:05Z"))
		if *out != "-" {
			fmt.Fprintf(os.Stderr, "download link (no token needed; until %s):\n", res.LinkExpiresAt.Format("2006-01-02T15:04:05Z"))
			fmt.Println(res.URL)
		}
		return 0
	})
}

// downloadBlob writes blob id to out (- for stdout; a directory gets name), checking its
// SHA-256; a file is written beside out and renamed, so a failed download leaves nothing.
func downloadBlob(ctx context.Context, cl *client.Client, id, want, out, name string) int {
	rc, _, _, err := cl.DownloadBlob(ctx, id)
	if err != nil {
		return fail(err)
	}
	defer rc.Close()
	h := sha256.New()
	if out == "-" {
		if _, err := io.Copy(io.MultiWriter(os.Stdout, h), rc); err != nil {
			return fail(err)
		}
	} else {
		dst := out
		if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
			dst = filepath.Join(dst, name)
		}
		tmp, err := os.CreateTemp(filepath.Dir(dst), ".agentbox-pull-*")
		if err != nil {
			return fail(err)
		}
		defer os.Remove(tmp.Name())
		if _, err := io.Copy(io.MultiWriter(tmp, h), rc); err != nil {
			tmp.Close()
			return fail(fmt.Errorf("download blob %s: %w", id, err))
		}
		if err := tmp.Close(); err != nil {
			return fail(err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != want {
			return fail(errcode.New(errcode.Internal, "blob %s downloaded with sha256 %s, not %s; nothing written", id, got, want))
		}
		if err := os.Rename(tmp.Name(), dst); err != nil {
			return fail(err)
		}
		return 0
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fail(errcode.New(errcode.Internal, "blob %s downloaded with sha256 %s, not %s", id, got, want))
	}
	return 0
}

func machinePush(args []string) int {
	c := newClientCmd("machine push", "agentbox machine push [--json] MACHINE FILE DEST | agentbox machine push [--json] --blob ID MACHINE DEST")
	blob := c.fs.String("blob", "", "push this blob (from machine pull or POST /v1/blobs) instead of uploading FILE")
	return c.run(args, func(n int) bool { return n == 3 || (n == 2 && *blob != "") }, func(ctx context.Context, cl *client.Client, pos []string) int {
		machine, dest, id := pos[0], pos[len(pos)-1], *blob
		if len(pos) == 3 {
			if *blob != "" {
				fmt.Fprintln(os.Stderr, "usage: "+c.usage+"\n(give FILE or --blob, not both)")
				return 2
			}
			f, err := os.Open(pos[1])
			if err != nil {
				return fail(err)
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return fail(err)
			}
			if !fi.Mode().IsRegular() {
				return fail(errcode.New(errcode.InvalidArgument, "%s is not a regular file", pos[1]))
			}
			up, err := cl.UploadBlob(ctx, filepath.Base(pos[1]), fi.Size(), f)
			if err != nil {
				return fail(err)
			}
			id = up.BlobID
		}
		res, err := cl.RemotePush(ctx, machine, id, dest)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(res)
			return 0
		}
		verb := "wrote new file"
		if res.Replaced {
			verb = "replaced"
		}
		fmt.Printf("%s %s:%s (%d bytes, mode %s) from blob %s\n", verb, res.Machine, res.DestPath, res.Size, res.Mode, res.BlobID)
		return 0
	})
}
