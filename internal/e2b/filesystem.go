package e2b

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/agentbox/agentbox/internal/e2b/envd/filesystem"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// filesystemService implements filesystem.Filesystem over agentbox's files paths (stat, list,
// mkdir, remove) and exec (move: mv, as the sandbox's user).
type filesystemService struct{ s *Server }

// maxListDepth bounds ListDir's depth (E2B's SDK asks for 1 by default).
const maxListDepth = 8

// homeOf is where a relative path is resolved: the user's home, as envd does (agentbox's
// default user is agent, home /home/agent).
func homeOf(user string) string {
	if user == "root" {
		return "/root"
	}
	return "/home/agent"
}

// absPath resolves p for user: absolute paths as they are, relative ones under the home.
func absPath(p, user string) (string, error) {
	if p == "" {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("path is required"))
	}
	if !strings.HasPrefix(p, "/") {
		p = path.Join(homeOf(user), p)
	}
	return path.Clean(p), nil
}

func entryOf(fi sandbox.FileInfo) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{Name: fi.Name, Path: fi.Path, Size: fi.Size, ModifiedTime: timestamppb.New(fi.ModTime)}
	switch fi.Type {
	case "file":
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
	case "symlink":
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		t := fi.LinkTarget
		e.SymlinkTarget = &t
	}
	if m, err := strconv.ParseUint(fi.Mode, 8, 32); err == nil {
		e.Mode = uint32(m)
		e.Permissions = permString(fi.Type, uint32(m))
	}
	return e
}

// permString is ls's "-rw-r--r--" for mode bits.
func permString(typ string, m uint32) string {
	b := []byte("----------")
	switch typ {
	case "dir":
		b[0] = 'd'
	case "symlink":
		b[0] = 'l'
	}
	const rwx = "rwxrwxrwx"
	for i := 0; i < 9; i++ {
		if m&(1<<uint(8-i)) != 0 {
			b[i+1] = rwx[i]
		}
	}
	return string(b)
}

func fsError(err error) error {
	if errcode.Of(err) == errcode.FileNotFound {
		return connect.NewError(connect.CodeNotFound, errors.New(errcode.Message(err)))
	}
	return toConnect(err)
}

func (fs filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	p, err := absPath(req.Msg.GetPath(), userFrom(ctx))
	if err != nil {
		return nil, err
	}
	fi, err := fs.s.svc.Stat(ctx, sandboxFrom(ctx), p)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entryOf(fi)}), nil
}

func (fs filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	p, err := absPath(req.Msg.GetPath(), userFrom(ctx))
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("depth must be at most %d; got %d", maxListDepth, depth))
	}
	id := sandboxFrom(ctx)
	fi, err := fs.s.svc.Stat(ctx, id, p)
	if err != nil {
		return nil, fsError(err)
	}
	if fi.Type != "dir" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", p))
	}
	var out []*filesystem.EntryInfo
	var walk func(dir string, left int) error
	walk = func(dir string, left int) error {
		l, err := fs.s.svc.ListDir(ctx, id, dir)
		if err != nil {
			return err
		}
		for _, e := range l.Entries {
			out = append(out, entryOf(e))
			if e.Type == "dir" && left > 1 {
				if err := walk(e.Path, left-1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(p, depth); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: out}), nil
}

func (fs filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	p, err := absPath(req.Msg.GetPath(), userFrom(ctx))
	if err != nil {
		return nil, err
	}
	id := sandboxFrom(ctx)
	if fi, err := fs.s.svc.Stat(ctx, id, p); err == nil {
		if fi.Type == "dir" {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s already exists and is not a directory", p))
	}
	fi, err := fs.s.svc.Mkdir(ctx, id, sandbox.MkdirRequest{Path: p, Parents: true})
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entryOf(fi)}), nil
}

func (fs filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	u := userFrom(ctx)
	src, err := absPath(req.Msg.GetSource(), u)
	if err != nil {
		return nil, err
	}
	dst, err := absPath(req.Msg.GetDestination(), u)
	if err != nil {
		return nil, err
	}
	id := sandboxFrom(ctx)
	if _, err := fs.s.svc.Stat(ctx, id, src); err != nil {
		return nil, fsError(err)
	}
	res, err := fs.s.svc.Exec(ctx, id, sandbox.ExecRequest{Argv: []string{"mv", "-f", "-T", "--", src, dst}, User: u, Timeout: time.Minute, MaxOutputBytes: 4 << 10}, nil)
	if err != nil {
		return nil, toConnect(err)
	}
	if res.ExitCode != 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("move %s to %s: %s", src, dst, strings.TrimSpace(res.Stderr)))
	}
	fi, err := fs.s.svc.Stat(ctx, id, dst)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entryOf(fi)}), nil
}

func (fs filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	p, err := absPath(req.Msg.GetPath(), userFrom(ctx))
	if err != nil {
		return nil, err
	}
	id := sandboxFrom(ctx)
	if _, err := fs.s.svc.Stat(ctx, id, p); err != nil {
		return nil, fsError(err)
	}
	if err := fs.s.svc.Remove(ctx, id, p, true); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

var errNoWatch = connect.NewError(connect.CodeUnimplemented, errors.New("the non-streaming watchers are not served by agentbox's envd: use WatchDir (docs/E2B.md)"))

// watchPoll is how often WatchDir lists the watched directory: agentbox has no inotify channel
// to the sandbox, so a watch compares listings (docs/E2B.md).
const watchPoll = 250 * time.Millisecond

// watched is what a listing says of one entry.
type watched struct {
	typ  string
	size int64
	mod  time.Time
}

// listing is the entries under dir by path relative to it (to maxListDepth with recursive).
func (fs filesystemService) listing(ctx context.Context, id, dir string, recursive bool) (map[string]watched, error) {
	out := map[string]watched{}
	var walk func(d, rel string, left int) error
	walk = func(d, rel string, left int) error {
		l, err := fs.s.svc.ListDir(ctx, id, d)
		if err != nil {
			return err
		}
		for _, e := range l.Entries {
			name := path.Join(rel, e.Name)
			out[name] = watched{typ: e.Type, size: e.Size, mod: e.ModTime}
			if recursive && e.Type == "dir" && left > 1 {
				if err := walk(e.Path, name, left-1); err != nil && errcode.Of(err) != errcode.FileNotFound {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(dir, "", maxListDepth)
}

// WatchDir streams the changes under a directory: created, written and removed entries, found
// by comparing listings every watchPoll.
func (fs filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], out *connect.ServerStream[filesystem.WatchDirResponse]) error {
	p, err := absPath(req.Msg.GetPath(), userFrom(ctx))
	if err != nil {
		return err
	}
	id := sandboxFrom(ctx)
	fi, err := fs.s.svc.Stat(ctx, id, p)
	if err != nil {
		return fsError(err)
	}
	if fi.Type != "dir" {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", p))
	}
	prev, err := fs.listing(ctx, id, p, req.Msg.GetRecursive())
	if err != nil {
		return fsError(err)
	}
	if err := out.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(watchPoll)
	defer tick.Stop()
	quiet := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		cur, err := fs.listing(ctx, id, p, req.Msg.GetRecursive())
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fsError(err)
		}
		var evs []*filesystem.FilesystemEvent
		for name, w := range cur {
			was, ok := prev[name]
			switch {
			case !ok:
				evs = append(evs, &filesystem.FilesystemEvent{Name: name, Type: filesystem.EventType_EVENT_TYPE_CREATE})
			case w.typ != "dir" && (w.size != was.size || !w.mod.Equal(was.mod)):
				evs = append(evs, &filesystem.FilesystemEvent{Name: name, Type: filesystem.EventType_EVENT_TYPE_WRITE})
			}
		}
		for name := range prev {
			if _, ok := cur[name]; !ok {
				evs = append(evs, &filesystem.FilesystemEvent{Name: name, Type: filesystem.EventType_EVENT_TYPE_REMOVE})
			}
		}
		prev = cur
		for _, ev := range evs {
			if err := out.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
			quiet = time.Now()
		}
		if time.Since(quiet) >= keepAliveEvery {
			if err := out.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			quiet = time.Now()
		}
	}
}

func (fs filesystemService) CreateWatcher(context.Context, *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	return nil, errNoWatch
}

func (fs filesystemService) GetWatcherEvents(context.Context, *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	return nil, errNoWatch
}

func (fs filesystemService) RemoveWatcher(context.Context, *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	return nil, errNoWatch
}
