package sandbox

import (
	"context"
	"io"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// withGuest runs f against a running sandbox's agent, turning a dead agent into a recorded
// lost sandbox.
func withGuest[T any](ctx context.Context, s *Service, id string, f func(*guest.Client) (T, error)) (T, error) {
	var zero T
	sb, gc, err := s.running(ctx, id)
	if err != nil {
		return zero, err
	}
	v, err := f(gc)
	if err != nil {
		return v, s.guestFailed(ctx, sb, err)
	}
	return v, nil
}

// WriteFile writes r to path in the sandbox atomically, with mode's permission bits.
func (s *Service) WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) (FileInfo, error) {
	if err := checkPath(path); err != nil {
		return FileInfo{}, err
	}
	if mode > 0o7777 {
		return FileInfo{}, errcode.New(errcode.InvalidArgument, "mode must be permission bits such as 0644; got %o", mode)
	}
	return withGuest(ctx, s, id, func(gc *guest.Client) (FileInfo, error) {
		fi, err := gc.WriteFile(ctx, path, mode, r)
		return fileInfoFrom(fi), err
	})
}

// fileRange is an open byte range of a file and the file's total size.
type fileRange struct {
	body io.ReadCloser
	size int64
}

// ReadFile opens a byte range of a regular file (length 0 = to the end), refusing with
// FILE_TOO_LARGE past limit. It returns the body (closed by the caller) and the file's size.
func (s *Service) ReadFile(ctx context.Context, id, path string, offset, length, limit int64) (io.ReadCloser, int64, error) {
	if err := checkPath(path); err != nil {
		return nil, 0, err
	}
	if offset < 0 || length < 0 || limit < 0 {
		return nil, 0, errcode.New(errcode.InvalidArgument, "offset, length and limit must not be negative")
	}
	fr, err := withGuest(ctx, s, id, func(gc *guest.Client) (fileRange, error) {
		rc, size, err := gc.ReadFile(ctx, path, offset, length, limit)
		return fileRange{rc, size}, err
	})
	return fr.body, fr.size, err
}

// Stat describes a file in the sandbox.
func (s *Service) Stat(ctx context.Context, id, path string) (FileInfo, error) {
	if err := checkPath(path); err != nil {
		return FileInfo{}, err
	}
	return withGuest(ctx, s, id, func(gc *guest.Client) (FileInfo, error) {
		fi, err := gc.Stat(ctx, path)
		return fileInfoFrom(fi), err
	})
}

// ListDir lists a directory in the sandbox (bounded).
func (s *Service) ListDir(ctx context.Context, id, path string) (DirList, error) {
	if err := checkPath(path); err != nil {
		return DirList{}, err
	}
	return withGuest(ctx, s, id, func(gc *guest.Client) (DirList, error) {
		dl, err := gc.List(ctx, path)
		return dirListFrom(dl), err
	})
}

// Mkdir creates a directory in the sandbox.
func (s *Service) Mkdir(ctx context.Context, id string, req MkdirRequest) (FileInfo, error) {
	if err := checkPath(req.Path); err != nil {
		return FileInfo{}, err
	}
	return withGuest(ctx, s, id, func(gc *guest.Client) (FileInfo, error) {
		fi, err := gc.Mkdir(ctx, guest.MkdirRequest{Path: req.Path, Mode: req.Mode, Parents: req.Parents})
		return fileInfoFrom(fi), err
	})
}

// Remove deletes a file (or a tree, with recursive) in the sandbox.
func (s *Service) Remove(ctx context.Context, id, path string, recursive bool) error {
	if err := checkPath(path); err != nil {
		return err
	}
	_, err := withGuest(ctx, s, id, func(gc *guest.Client) (struct{}, error) { return struct{}{}, gc.Remove(ctx, path, recursive) })
	return err
}
