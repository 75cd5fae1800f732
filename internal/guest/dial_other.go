//go:build !linux

package guest

import (
	"context"
	"net"
)

func dialSocket(ctx context.Context, d *net.Dialer, path string) (net.Conn, error) {
	return d.DialContext(ctx, "unix", path)
}
