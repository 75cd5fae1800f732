package image

// TEMPORARY STUB (engineer "control", issue 13): stands in for engineer "imagestore"'s *Store
// until it is merged, so that cmd/agentbox can wire image.Open now. THE LEAD DELETES THIS FILE
// ON MERGE: imagestore's store.go defines Store and Open for real.

import (
	"context"
	"io"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Store is the stub's cache: every operation is UNSUPPORTED_OPERATION.
type Store struct{ dir string }

var _ Cache = (*Store)(nil)

// Open returns the stub Store for dir.
func Open(dir string, o Options) (*Store, error) { return &Store{dir: dir}, nil }

func notBuilt() error { return errcode.New(errcode.UnsupportedOp, "not built yet") }

func (s *Store) Resolve(context.Context, string, ProgressFunc) (*Image, Lease, error) {
	return nil, nil, notBuilt()
}
func (s *Store) Pull(context.Context, string, ProgressFunc) (*Image, error) { return nil, notBuilt() }
func (s *Store) Get(context.Context, string) (*Image, error)                { return nil, notBuilt() }
func (s *Store) LayerDirs(context.Context, *Image) ([]string, error)        { return nil, notBuilt() }
func (s *Store) List(context.Context) ([]Image, error)                      { return nil, notBuilt() }
func (s *Store) Remove(context.Context, string, bool) ([]string, error)     { return nil, notBuilt() }
func (s *Store) Prune(context.Context, bool) (PruneReport, error)           { return PruneReport{}, notBuilt() }
func (s *Store) Import(context.Context, io.Reader, ProgressFunc) ([]Image, error) {
	return nil, notBuilt()
}
func (s *Store) Push(context.Context, string, string, ProgressFunc) error { return notBuilt() }
func (s *Store) Commit(context.Context, *Image, runtime.WritableLayer, string, *Config) (*Image, error) {
	return nil, notBuilt()
}
func (s *Store) Usage(context.Context) (Usage, error) { return Usage{Dir: s.dir}, notBuilt() }
