package client

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/internal/wire"
)

// Warm pools.

// ListPools returns the server's warm pools with their ready counts, hits and misses.
func (c *Client) ListPools(ctx context.Context) (wire.PoolList, error) {
	var l wire.PoolList
	err := c.doJSON(ctx, http.MethodGet, "/v1/pools", nil, nil, &l)
	return l, err
}

// SetPool creates or replaces a warm pool.
func (c *Client) SetPool(ctx context.Context, p wire.Pool) (wire.PoolStatus, error) {
	var st wire.PoolStatus
	size := p.Size
	req := wire.PoolSetRequest{Image: p.Image, Runtime: p.Runtime, CPU: p.CPU, MemoryMB: p.MemoryMB, DiskMB: p.DiskMB,
		Network: p.Network, Size: &size}
	err := c.doJSON(ctx, http.MethodPut, wire.PoolPath(p.Name), nil, req, &st)
	return st, err
}

// DeletePool removes a warm pool (its ready sandboxes are destroyed in the background).
func (c *Client) DeletePool(ctx context.Context, name string) error {
	return c.doJSON(ctx, http.MethodDelete, wire.PoolPath(name), nil, nil, nil)
}

// SetPool, ListPools and DeletePool make Backend an mcpserver.PoolBackend.
