package image

import (
	"context"
	"io"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

func (s *Store) Import(ctx context.Context, r io.Reader, progress ProgressFunc) ([]Image, error) {
	return nil, errcode.New(errcode.UnsupportedOp, "todo")
}
func (s *Store) Push(ctx context.Context, name, ref string, progress ProgressFunc) error {
	return errcode.New(errcode.UnsupportedOp, "todo")
}
func (s *Store) Commit(ctx context.Context, base *Image, layer runtime.WritableLayer, name string, cfg *Config) (*Image, error) {
	return nil, errcode.New(errcode.UnsupportedOp, "todo")
}
