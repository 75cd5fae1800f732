package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// Images: the server flags of the image cache, its wiring, and the image and
// sandbox commit commands.

// MaxImageCacheMB is the largest default cache budget (20 GiB); the flag may set more.
const MaxImageCacheMB = 20 << 10

// maxRegistryAuthFile bounds a --registry-auth-file.
const maxRegistryAuthFile = 1 << 20

// registerImageFlags adds serve's and mcp's image flags to fs.
func registerImageFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.Int64Var(&cfg.ImageCacheMB, "image-cache-mb", 0, fmt.Sprintf("budget of the image cache (<state>/images) in MiB: past it, images no live sandbox uses are collected, least recently used first (default 10%% of the state dir's file system, at most %d)", MaxImageCacheMB))
	fs.Var((*listFlag)(&cfg.RegistryAuth), "registry-auth", "a registry credential host=user:password, used over ~/.docker/config.json for that host (repeatable; visible in ps: prefer --registry-auth-file)")
	fs.StringVar(&cfg.RegistryAuthFile, "registry-auth-file", "", "a file of registry credentials, one host=user:password a line (# comments); it must not be readable by group or others")
	fs.Var((*listFlag)(&cfg.InsecureRegistries), "insecure-registry", "a registry host[:port] reached over plain HTTP (repeatable; a registry on a loopback address always is)")
}

// parseRegistryAuth parses one host=user:password; what names the source in errors.
func parseRegistryAuth(what, s string) (image.RegistryAuth, error) {
	host, cred, ok := strings.Cut(strings.TrimSpace(s), "=")
	user, pass, ok2 := strings.Cut(cred, ":")
	if !ok || !ok2 || host == "" || user == "" || strings.ContainsAny(host, "/ \t") {
		return image.RegistryAuth{}, fmt.Errorf("%s: a credential must be host=user:password (host like ghcr.io or registry.example:5000)", what)
	}
	return image.RegistryAuth{Host: host, Username: user, Password: pass}, nil
}

// registryAuth is every credential of cfg: the flags', then the file's.
func registryAuth(cfg config.Config) ([]image.RegistryAuth, error) {
	var out []image.RegistryAuth
	for _, s := range cfg.RegistryAuth {
		a, err := parseRegistryAuth("--registry-auth", s)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	if cfg.RegistryAuthFile == "" {
		return out, nil
	}
	f, err := os.Open(cfg.RegistryAuthFile)
	if err != nil {
		return nil, fmt.Errorf("--registry-auth-file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("--registry-auth-file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("--registry-auth-file %s is readable by group or others (mode %04o): it holds passwords; chmod 600 it", cfg.RegistryAuthFile, st.Mode().Perm())
	}
	if st.Size() > maxRegistryAuthFile {
		return nil, fmt.Errorf("--registry-auth-file %s is %d bytes; at most %d", cfg.RegistryAuthFile, st.Size(), maxRegistryAuthFile)
	}
	sc := bufio.NewScanner(io.LimitReader(f, maxRegistryAuthFile))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		a, err := parseRegistryAuth(fmt.Sprintf("--registry-auth-file %s line %d", cfg.RegistryAuthFile, n), line)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, sc.Err()
}

// imageCacheBytes is the cache budget: the flag's, or 10% of the state dir's file system
// capped at MaxImageCacheMB.
func imageCacheBytes(cfg config.Config) (int64, error) {
	if cfg.ImageCacheMB < 0 {
		return 0, fmt.Errorf("--image-cache-mb must be at least 1 (or 0 for the default); got %d", cfg.ImageCacheMB)
	}
	if cfg.ImageCacheMB > 0 {
		return cfg.ImageCacheMB << 20, nil
	}
	_, total, err := hostinfo.DiskSpaceMiB(cfg.StateDir)
	if err != nil {
		return 0, err
	}
	return min(max(total/10, 1), MaxImageCacheMB) << 20, nil
}

// openImages opens the image cache under <state>/images; inUse is the store's ImagesInUse.
func openImages(cfg config.Config, log *slog.Logger, inUse func(context.Context) (map[string]int, error)) (*image.Store, error) {
	budget, err := imageCacheBytes(cfg)
	if err != nil {
		return nil, err
	}
	auth, err := registryAuth(cfg)
	if err != nil {
		return nil, err
	}
	st, err := image.Open(filepath.Join(cfg.StateDir, "images"), image.Options{Logger: log.With("component", "images"),
		BudgetBytes: budget, Auth: auth, Insecure: cfg.InsecureRegistries, InUse: inUse})
	if err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	return st, nil
}

func cmdImage(args []string) int {
	const subs = "pull, ls, rm, prune, inspect, import, push"
	if len(args) == 0 {
		fmt.Fprintf(os.Stderr, "usage: agentbox image %s ...\n", strings.ReplaceAll(subs, ", ", "|"))
		return 2
	}
	sub := map[string]func([]string) int{
		"pull": imagePull, "ls": imageList, "list": imageList, "rm": imageRemove, "prune": imagePrune,
		"inspect": imageInspect, "import": imageImport, "push": imagePush,
	}
	if f, ok := sub[args[0]]; ok {
		return f(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox image: unknown subcommand %q (%s)\n", args[0], subs)
	return 2
}

func imagePull(args []string) int {
	c := newClientCmd("image pull", "agentbox image pull [--json] [--quiet] REF")
	quiet := c.fs.Bool("quiet", false, "print no progress")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		v := newProgressView(os.Stderr, *quiet || c.json)
		img, err := cl.PullImage(ctx, pos[0], v.report)
		v.finish(err == nil)
		if err != nil {
			return fail(err)
		}
		c.printImage(img)
		return 0
	})
}

func imageList(args []string) int {
	c := newClientCmd("image ls", "agentbox image ls [--json]")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		imgs, err := cl.ListImages(ctx)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(imgs)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REF\tDIGEST\tSIZE\tLAYERS\tIN USE\tLAST USED\tCOMMITTED")
		for _, im := range imgs {
			used := "-"
			if !im.LastUsed.IsZero() {
				used = time.Since(im.LastUsed).Round(time.Second).String() + " ago"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%v\n", im.Ref, shortDigest(im.Digest), humanBytes(im.Size), len(im.Layers), im.InUse, used, im.Committed)
		}
		tw.Flush()
		return 0
	})
}

func imageInspect(args []string) int {
	c := newClientCmd("image inspect", "agentbox image inspect REF|DIGEST (JSON)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		img, err := cl.InspectImage(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		printJSON(img)
		return 0
	})
}

func imageRemove(args []string) int {
	c := newClientCmd("image rm", "agentbox image rm [--force] REF...")
	force := c.fs.Bool("force", false, "remove the name even if live sandboxes use the image (the image stays until they are gone)")
	return c.run(args, atLeast(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		rc := 0
		for _, ref := range pos {
			removed, err := cl.RemoveImage(ctx, ref, *force)
			if err != nil {
				rc = fail(err)
				continue
			}
			for _, r := range removed {
				fmt.Println("removed", r)
			}
		}
		return rc
	})
}

func imagePrune(args []string) int {
	c := newClientCmd("image prune", "agentbox image prune [--all] [--json]")
	all := c.fs.Bool("all", false, "remove every image no live sandbox uses, tagged ones too (default: untagged ones and what the budget needs)")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		rep, err := cl.PruneImages(ctx, *all)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(rep)
			return 0
		}
		for _, r := range rep.Removed {
			fmt.Println("removed", r)
		}
		fmt.Printf("freed %s; the cache holds %s of %s\n", humanBytes(rep.FreedBytes), humanBytes(rep.CacheBytes), humanBytes(rep.BudgetBytes))
		return 0
	})
}

func imageImport(args []string) int {
	c := newClientCmd("image import", "agentbox image import [--json] FILE.tar (a `docker save` or OCI-layout tarball; - reads stdin)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		var r io.Reader = os.Stdin
		if pos[0] != "-" {
			f, err := os.Open(pos[0])
			if err != nil {
				return fail(err)
			}
			defer f.Close()
			r = f
		}
		v := newProgressView(os.Stderr, c.json)
		imgs, err := cl.ImportImages(ctx, r, v.report)
		v.finish(err == nil)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(imgs)
			return 0
		}
		for _, im := range imgs {
			fmt.Printf("%s %s\n", im.Ref, im.Digest)
		}
		return 0
	})
}

func imagePush(args []string) int {
	c := newClientCmd("image push", "agentbox image push NAME REF (push the cached image NAME to the registry reference REF)")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		v := newProgressView(os.Stderr, c.json)
		err := cl.PushImage(ctx, pos[0], pos[1], v.report)
		v.finish(err == nil)
		if err != nil {
			return fail(err)
		}
		fmt.Printf("pushed %s to %s\n", pos[0], pos[1])
		return 0
	})
}

// sandboxCommit is `agentbox sandbox commit ID NAME[:TAG]`.
func sandboxCommit(args []string) int {
	c := newClientCmd("sandbox commit", "agentbox sandbox commit [--json] ID NAME[:TAG]")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		if err := sandbox.CheckImageName("NAME[:TAG]", pos[1]); err != nil {
			return fail(err)
		}
		img, err := cl.Commit(ctx, pos[0], pos[1])
		if err != nil {
			return fail(err)
		}
		c.printImage(img)
		return 0
	})
}

func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

// progressView shows an image operation's progress: a bar per layer on a terminal, else one
// line per layer and phase (never one per byte report).
type progressView struct {
	out   io.Writer
	quiet bool
	tty   bool

	mu    sync.Mutex
	p     *mpb.Progress
	bars  map[string]*mpb.Bar
	phase map[string]string // plain: layer → the last phase printed
	// barPhase is each bar's phase, read by its decorator while mpb renders: under a mutex of
	// its own, never held across a call into mpb.
	barMu    sync.Mutex
	barPhase map[string]string
}

// maxViewLayers bounds the layers a view tracks (an image has at most runtime.MaxRootfsLayers).
const maxViewLayers = 256

func newProgressView(out *os.File, quiet bool) *progressView {
	return newProgressViewTo(out, quiet, term.IsTerminal(int(out.Fd())))
}

func newProgressViewTo(out io.Writer, quiet, tty bool) *progressView {
	return &progressView{out: out, quiet: quiet, tty: tty, bars: map[string]*mpb.Bar{}, phase: map[string]string{}, barPhase: map[string]string{}}
}

// report is an func(wire.ImageProgress).
func (v *progressView) report(p wire.ImageProgress) {
	if v.quiet {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.tty {
		key := p.Layer
		if v.phase[key] == p.Phase || (len(v.phase) >= maxViewLayers && v.phase[key] == "") {
			return
		}
		v.phase[key] = p.Phase
		fmt.Fprintln(v.out, plainLine(p))
		return
	}
	if p.Layer == "" {
		return // the bars say it; the caller prints the result
	}
	done := p.Phase == "done" || p.Phase == "cached"
	b := v.bars[p.Layer]
	if b != nil || len(v.bars) < maxViewLayers {
		v.barMu.Lock()
		v.barPhase[p.Layer] = p.Phase
		v.barMu.Unlock()
	}
	if b == nil {
		if len(v.bars) >= maxViewLayers {
			return
		}
		if v.p == nil {
			v.p = mpb.New(mpb.WithOutput(v.out), mpb.WithWidth(40), mpb.WithAutoRefresh())
		}
		layer := p.Layer
		b = v.p.AddBar(max(p.Total, 0),
			mpb.PrependDecorators(decor.Name(shortDigest(layer)+" "), decor.Any(func(decor.Statistics) string {
				v.barMu.Lock()
				defer v.barMu.Unlock()
				return fmt.Sprintf("%-11s", v.barPhase[layer])
			})),
			mpb.AppendDecorators(decor.CountersKibiByte("% .1f / % .1f")))
		v.bars[p.Layer] = b
	}
	if p.Total > 0 {
		b.SetTotal(p.Total, false)
	}
	b.SetCurrent(p.Done)
	if done {
		b.SetTotal(-1, true)
	}
}

// finish completes (ok) or drops every bar and waits for the bars to be drawn.
func (v *progressView) finish(ok bool) {
	v.mu.Lock()
	p := v.p
	for _, b := range v.bars {
		if ok {
			b.SetTotal(-1, true)
		} else {
			b.Abort(false)
		}
	}
	v.mu.Unlock()
	if p != nil {
		p.Wait()
	}
}

// plainLine renders a report as one line.
func plainLine(p wire.ImageProgress) string {
	what := p.Ref
	if p.Layer != "" {
		what = shortDigest(p.Layer)
	}
	line := what + ": " + p.Phase
	if p.Total > 0 {
		line += fmt.Sprintf(" (%s)", humanBytes(p.Total))
	}
	if p.Message != "" {
		line += ": " + p.Message
	}
	return line
}

// printImage prints what a pull or a commit made: the image as JSON with --json, else its
// reference and digest.
func (c *clientCmd) printImage(img wire.Image) {
	if c.json {
		printJSON(img)
		return
	}
	fmt.Printf("%s %s\n", img.Ref, img.Digest)
}
