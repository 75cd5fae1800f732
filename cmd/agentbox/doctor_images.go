//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/statedir"
	"github.com/agentbox/agentbox/internal/wire"
)

// overlayCheck is doctor's line on OCI images: the kernel's overlayfs, and which runtimes take
// an image's layers (Capabilities.Images has "oci": overlay root with id-mapped layers), as the
// runtimes report it.
func overlayCheck(runs []check) check {
	c := check{Name: "overlay", Warn: true}
	fsys, _ := os.ReadFile("/proc/filesystems")
	overlay := strings.Contains(string(fsys), "\toverlay\n")
	var oci, not []string
	for _, r := range runs {
		rt := r.Runtime
		if rt == nil {
			continue
		}
		switch {
		case !rt.Available:
			not = append(not, rt.Name+" (unavailable)")
		case slices.Contains(rt.Images, runtime.ImageOCI):
			how := "id-mapped layers"
			switch {
			case rt.Isolation == runtime.IsolationVM:
				how = "layers merged into a read-only disk"
			case !rt.UserNamespaces:
				how = "layers as they are, files id-mapped"
				if !rt.IDMappedFiles {
					how = "layers as they are"
				}
			}
			oci = append(oci, rt.Name+" ("+how+")")
		default:
			not = append(not, rt.Name)
		}
	}
	c.OK = overlay && len(oci) > 0
	c.Detail = yesNo(overlay, "overlayfs in the kernel", "no overlayfs in /proc/filesystems")
	if len(oci) > 0 {
		c.Detail += "; OCI images on " + strings.Join(oci, ", ")
	}
	if len(not) > 0 {
		c.Detail += "; host image only on " + strings.Join(not, ", ")
	}
	c.Fix = fixIf(!overlay, "sudo modprobe overlay (id-mapped layers need Linux 5.19 or later; layers by fd 6.13)")
	if overlay && len(oci) == 0 {
		c.Fix = "no runtime here runs OCI images: only image host works; see each runtime's reason above"
	}
	return c
}

// imageCacheCheck is doctor's line on the image cache: its size and budget, from the running
// server, or from the cache itself when no server holds the state dir.
func imageCacheCheck(stateDir string) check {
	c := check{Name: "image cache", Warn: true}
	dir := filepath.Join(stateDir, "images")
	if _, err := os.Stat(dir); err != nil {
		c.OK, c.Detail = true, "empty: no image pulled yet ("+dir+")"
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var u image.Usage
	lock, err := statedir.Acquire(stateDir)
	if err == nil {
		defer lock.Release()
		cfg := config.Default()
		cfg.StateDir = stateDir
		st, oerr := openImages(cfg, slog.New(slog.DiscardHandler), nil)
		if oerr != nil {
			c.Detail = oerr.Error()
			return c
		}
		if cl, ok := any(st).(io.Closer); ok {
			defer cl.Close()
		}
		u, err = st.Usage(ctx)
	} else {
		url := config.ServerURL()
		if info, ierr := config.ReadServerInfo(stateDir); ierr == nil && info.URL != "" {
			url = info.URL
		}
		tok, terr := config.ReadToken()
		if terr != nil {
			c.Detail = "a server holds " + stateDir + " but its token is not readable: " + terr.Error()
			return c
		}
		var wu wire.ImageUsage
		wu, err = client.New(url, tok).ImageUsage(ctx)
		u = image.Usage(wu)
	}
	if err != nil {
		c.Detail = "cannot read it: " + err.Error()
		return c
	}
	c.OK = u.BudgetBytes == 0 || u.Bytes <= u.BudgetBytes
	c.Detail = fmt.Sprintf("%s of %s budget, %d images, %d layers in %s", humanBytes(u.Bytes), humanBytes(u.BudgetBytes), u.Images, u.Layers, dir)
	c.Fix = fixIf(!c.OK, "agentbox image prune, or raise --image-cache-mb")
	return c
}
