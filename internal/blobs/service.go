package blobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/linksign"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/text"
)

// Result describes a stored blob and its download link (remote_pull, POST /v1/blobs).
type Result struct {
	BlobID string `json:"blob_id"`
	// URL downloads the blob without any other credential until LinkExpiresAt.
	URL       string    `json:"url"`
	Size      int64     `json:"size"`
	SHA256    string    `json:"sha256"`
	Name      string    `json:"name"`
	ExpiresAt time.Time `json:"expires_at"` // when the blob is deleted
	// LinkExpiresAt is when URL stops working (LinkTTL after it was made, at most ExpiresAt).
	LinkExpiresAt time.Time `json:"link_expires_at"`
	Source        string    `json:"source"`
	MachineID     string    `json:"machine_id,omitempty"`
	Path          string    `json:"path,omitempty"`
}

// PushResult is what remote_push wrote.
type PushResult struct {
	BlobID    string `json:"blob_id"`
	MachineID string `json:"machine_id"`
	Machine   string `json:"machine"`
	DestPath  string `json:"dest_path"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
	// Mode is the written file's permission bits (octal); Replaced says whether a file or
	// symlink stood there before; Owner is the replaced file's uid:gid when it was kept.
	Mode     string `json:"mode"`
	Replaced bool   `json:"replaced"`
	Owner    string `json:"owner,omitempty"`
}

const linkHint = "ask for a fresh link: GET /v1/blobs/{id} with your token, or pull again"

// Link returns b's signed download URL and when it stops working.
func (s *Service) Link(b store.Blob) (string, time.Time) {
	exp := s.now().Add(s.cfg.LinkTTL)
	if b.ExpiresAt.Before(exp) {
		exp = b.ExpiresAt
	}
	exp = exp.Truncate(time.Second)
	return s.cfg.BaseURL() + "/v1/blobs/" + url.PathEscape(b.ID) + "?" + s.signer.Query(exp, "blob", b.ID), exp
}

// VerifyLink checks a link's expires and sig for blob id: AUTH_FAILED for a bad signature,
// LINK_EXPIRED past expires.
func (s *Service) VerifyLink(id, expires, sig string) error {
	exp, err := linksign.ParseExpires("blob", expires)
	if err != nil {
		return err
	}
	return s.signer.Verify("blob", linkHint, exp, sig, "blob", id)
}

func (s *Service) result(b store.Blob) Result {
	u, exp := s.Link(b)
	return Result{BlobID: b.ID, URL: u, Size: b.Size, SHA256: b.SHA256, Name: b.Name, ExpiresAt: b.ExpiresAt.UTC(),
		LinkExpiresAt: exp.UTC(), Source: b.Source, MachineID: b.Machine, Path: b.Path}
}

// Get returns owner's blob id with a fresh link; BLOB_NOT_FOUND when it is not owner's, is
// gone, pending or expired.
func (s *Service) Get(ctx context.Context, owner, id string) (Result, error) {
	b, err := s.ready(ctx, owner, id)
	if err != nil {
		return Result{}, err
	}
	return s.result(b), nil
}

// readyAny returns blob id if it is *owner's (any owner's when owner is nil), ready and
// unexpired.
func (s *Service) readyAny(ctx context.Context, id string, owner *string) (store.Blob, error) {
	if !validID(id) {
		return store.Blob{}, errcode.New(errcode.InvalidArgument, "blob_id %q is not a blob id (they look like blob-0123456789abcdef01234567)", text.Truncate(id, 64))
	}
	b, err := s.st.GetBlob(ctx, id)
	if err != nil {
		return store.Blob{}, err
	}
	if owner != nil && b.Owner != *owner {
		// Another key's blob is not shown to exist.
		return store.Blob{}, errcode.New(errcode.BlobNotFound, "no blob %s for this key", id).With("blob_id", id)
	}
	if b.State != store.BlobReady {
		return store.Blob{}, errcode.New(errcode.BlobNotFound, "blob %s is still being stored (or its transfer failed)", id).With("blob_id", id)
	}
	if !s.now().Before(b.ExpiresAt) {
		return store.Blob{}, errcode.New(errcode.BlobNotFound, "blob %s expired at %s and is deleted (blobs live %s)", id, b.ExpiresAt.UTC().Format(time.RFC3339), s.cfg.TTL).With("blob_id", id)
	}
	return b, nil
}

func (s *Service) ready(ctx context.Context, owner, id string) (store.Blob, error) {
	return s.readyAny(ctx, id, &owner)
}

// Open opens blob id's bytes for download. owner nil: any owner's (a verified signed link).
func (s *Service) Open(ctx context.Context, id string, owner *string) (io.ReadCloser, store.Blob, error) {
	b, err := s.readyAny(ctx, id, owner)
	if err != nil {
		return nil, store.Blob{}, err
	}
	f, err := s.openBytes(b)
	if err != nil {
		return nil, store.Blob{}, err
	}
	return f, b, nil
}

// openBytes opens a ready blob's file, checking it still holds Size bytes.
func (s *Service) openBytes(b store.Blob) (*os.File, error) {
	f, err := os.Open(s.blobPath(b.ID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errcode.New(errcode.BlobNotFound, "blob %s's bytes are gone (swept)", b.ID).With("blob_id", b.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("blobs: open %s: %w", b.ID, err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != b.Size {
		f.Close()
		return nil, errcode.New(errcode.Internal, "blob %s's file does not hold its recorded %d bytes; delete it and transfer again", b.ID, b.Size)
	}
	return f, nil
}

// Delete removes owner's blob id (record, then bytes), ready or not.
func (s *Service) Delete(ctx context.Context, owner, id string) error {
	if !validID(id) {
		return errcode.New(errcode.InvalidArgument, "blob_id %q is not a blob id (they look like blob-0123456789abcdef01234567)", text.Truncate(id, 64))
	}
	b, err := s.st.GetBlob(ctx, id)
	if err != nil {
		return err
	}
	if b.Owner != owner {
		return errcode.New(errcode.BlobNotFound, "no blob %s for this key", id).With("blob_id", id)
	}
	return s.remove(ctx, b)
}

// remove deletes a blob's record, then its files (an orphan left by a crash in between is
// swept).
func (s *Service) remove(ctx context.Context, b store.Blob) error {
	if err := s.st.DeleteBlob(ctx, b.ID); err != nil {
		return err
	}
	for _, p := range []string{s.blobPath(b.ID), s.partPath(b.ID)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("remove blob file", "path", p, "err", err)
		}
	}
	return nil
}

// checkPath checks a machine path before it is sent (the machine checks it is absolute on its
// own platform).
func checkPath(name, p string) error {
	switch {
	case p == "":
		return errcode.New(errcode.InvalidArgument, "%s is required: an absolute path on the machine", name)
	case len(p) > 4096:
		return errcode.New(errcode.InvalidArgument, "%s is %d bytes long; at most 4096", name, len(p))
	case !utf8.ValidString(p) || strings.ContainsRune(p, 0):
		return errcode.New(errcode.InvalidArgument, "%s must be UTF-8 text without NUL bytes", name)
	}
	return nil
}

// store writes size bytes of r (size -1: up to MaxFileBytes) as blob b: the pending record
// first, then the bytes to <id>.part, synced and renamed, then the record ready. On any error
// the record and files are removed. what names the bytes' origin in messages.
func (s *Service) store(ctx context.Context, b store.Blob, size int64, r io.Reader, what string) (store.Blob, error) {
	b.State, b.CreatedAt = store.BlobPending, s.now()
	b.ExpiresAt = b.CreatedAt.Add(s.cfg.TTL)
	if err := s.st.CreateBlob(ctx, b); err != nil {
		return store.Blob{}, err
	}
	fail := func(err error) (store.Blob, error) {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if rerr := s.remove(rctx, b); rerr != nil {
			s.log.Warn("remove failed blob", "blob_id", b.ID, "err", rerr)
		}
		return store.Blob{}, err
	}
	f, err := os.OpenFile(s.partPath(b.ID), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fail(fmt.Errorf("blobs: create %s: %w", b.ID, err))
	}
	defer f.Close()
	h := sha256.New()
	limit := size
	if size < 0 {
		limit = s.cfg.MaxFileBytes + 1
	}
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, limit))
	if err != nil {
		if ctx.Err() != nil {
			return fail(errcode.Wrap(errcode.CommandTimeout, err, "%s did not finish within %s (%d bytes of %s moved); nothing was stored", what, s.cfg.CallTimeout, n, sizeText(size)).With("bytes_moved", n))
		}
		if e, ok := errcode.As(err); ok {
			return fail(e)
		}
		return fail(errcode.Wrap(errcode.Internal, err, "%s failed after %d bytes: %v; nothing was stored", what, n, err).With("bytes_moved", n))
	}
	if size >= 0 && n != size {
		return fail(errcode.New(errcode.InvalidArgument, "%s ended after %d of the %d bytes declared; nothing was stored", what, n, size))
	}
	if size < 0 && n > s.cfg.MaxFileBytes {
		return fail(errcode.New(errcode.FileTooLarge, "%s is over the per-file limit of %d bytes; nothing was stored", what, s.cfg.MaxFileBytes).With("max", s.cfg.MaxFileBytes))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("blobs: sync %s: %w", b.ID, err))
	}
	if err := f.Close(); err != nil {
		return fail(fmt.Errorf("blobs: close %s: %w", b.ID, err))
	}
	if err := os.Rename(s.partPath(b.ID), s.blobPath(b.ID)); err != nil {
		return fail(fmt.Errorf("blobs: rename %s: %w", b.ID, err))
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if err := s.st.CompleteBlob(ctx, b.ID, n, sum); err != nil {
		return fail(err)
	}
	b.State, b.Size, b.SHA256 = store.BlobReady, n, sum
	return b, nil
}

func sizeText(n int64) string {
	if n < 0 {
		return "an unknown length"
	}
	return fmt.Sprintf("%d", n)
}

// Upload stores a body as owner's blob (POST /v1/blobs): size is its declared length, -1 when
// unknown (then MaxFileBytes is reserved and the body is cut there).
func (s *Service) Upload(ctx context.Context, owner, name string, size int64, body io.Reader) (Result, error) {
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	name = path.Base(strings.ReplaceAll(name, "\\", "/"))
	if name == "." || name == "/" || len(name) > 255 || !utf8.ValidString(name) {
		name = "blob"
	}
	if size > s.cfg.MaxFileBytes {
		return Result{}, errcode.New(errcode.FileTooLarge, "the upload is %d bytes; the per-file limit is %d", size, s.cfg.MaxFileBytes).With("size", size).With("max", s.cfg.MaxFileBytes)
	}
	reserve := size
	if size < 0 {
		reserve = s.cfg.MaxFileBytes
	}
	t, err := s.admit(ctx, owner, kindUpload, reserve)
	if err != nil {
		return Result{}, err
	}
	b, err := s.store(ctx, store.Blob{ID: newID(), Owner: owner, Name: name, Source: store.BlobFromUpload}, size, body, "the upload")
	if err != nil {
		s.settle(t, 0)
		return Result{}, err
	}
	s.settle(t, b.Size)
	return s.result(b), nil
}

// Pull copies the regular file at path on machine into a blob of owner's (remote_pull).
func (s *Service) Pull(ctx context.Context, owner, machine, p string) (Result, error) {
	if err := checkPath("path", p); err != nil {
		return Result{}, err
	}
	if s.cfg.Machines == nil {
		return Result{}, errcode.New(errcode.UnsupportedOp, "this server has no joined machines")
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	hc, m, err := s.cfg.Machines.Client(ctx, machine)
	if err != nil {
		return Result{}, err
	}
	t, err := s.admit(ctx, owner, kindPull, s.cfg.MaxFileBytes)
	if err != nil {
		return Result{}, err
	}
	moved := int64(0)
	defer func() { s.settle(t, moved) }()
	rc, size, err := newClient(hc).Read(ctx, p, s.cfg.MaxFileBytes)
	if err != nil {
		return Result{}, err
	}
	defer rc.Close()
	name := path.Base(strings.ReplaceAll(p, "\\", "/"))
	b, err := s.store(ctx, store.Blob{ID: newID(), Owner: owner, Name: name, Source: store.BlobFromPull, Machine: m.ID, Path: p},
		size, rc, fmt.Sprintf("the pull of %s from %s", p, m.Name))
	if err != nil {
		return Result{}, err
	}
	moved = b.Size
	return s.result(b), nil
}

// Push writes owner's blob to dest on machine (remote_push).
func (s *Service) Push(ctx context.Context, owner, blobID, machine, dest string) (PushResult, error) {
	if err := checkPath("dest_path", dest); err != nil {
		return PushResult{}, err
	}
	if s.cfg.Machines == nil {
		return PushResult{}, errcode.New(errcode.UnsupportedOp, "this server has no joined machines")
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	b, err := s.ready(ctx, owner, blobID)
	if err != nil {
		return PushResult{}, err
	}
	hc, m, err := s.cfg.Machines.Client(ctx, machine)
	if err != nil {
		return PushResult{}, err
	}
	if _, err := s.admit(ctx, owner, kindPush, 0); err != nil {
		return PushResult{}, err
	}
	f, err := s.openBytes(b)
	if err != nil {
		return PushResult{}, err
	}
	defer f.Close()
	res, err := newClient(hc).Write(ctx, dest, b.Size, s.cfg.MaxFileBytes, f)
	if err != nil {
		if ctx.Err() != nil && !errcode.Is(err, errcode.CommandTimeout) {
			err = errcode.Wrap(errcode.CommandTimeout, err, "the push of %s to %s did not finish within %s; the machine removes its temporary file, so %s is as it was", b.ID, m.Name, s.cfg.CallTimeout, dest)
		}
		return PushResult{}, err
	}
	return PushResult{BlobID: b.ID, MachineID: m.ID, Machine: m.Name, DestPath: res.Path, Size: res.Size, SHA256: b.SHA256,
		Mode: res.Mode, Replaced: res.Replaced, Owner: res.Owner}, nil
}
