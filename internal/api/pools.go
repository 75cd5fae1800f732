package api

import (
	"net/http"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// Warm pools: GET /v1/pools, PUT (or POST) /v1/pools/{name}, DELETE /v1/pools/{name}.

// PoolSetRequest is the body of PUT /v1/pools/{name}: the shape of the pool's sandboxes (zero
// fields take the server's create defaults) and how many it keeps ready.
type PoolSetRequest struct {
	Image    string  `json:"image,omitempty"`
	Runtime  string  `json:"runtime,omitempty"`
	CPU      float64 `json:"cpu,omitempty"`
	MemoryMB int64   `json:"memory_mb,omitempty"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	// Network is "none" (the default) or "egress" (sandboxes with the egress plumbing ready; a
	// create with any network policy, and secrets, claims one and its policy applies at the claim).
	Network string `json:"network,omitempty"`
	// Size is required: 0 parks the pool (keeps none ready).
	Size *int `json:"size"`
}

// Pool is the shape and size a PoolSetRequest asks for, named name.
func (r PoolSetRequest) Pool(name string) (sandbox.Pool, error) {
	if r.Size == nil {
		return sandbox.Pool{}, errcode.New(errcode.InvalidArgument, "size is required: how many ready sandboxes the pool keeps (0 keeps none)")
	}
	return sandbox.Pool{Name: name, Image: r.Image, Runtime: r.Runtime, CPU: r.CPU, MemoryMB: r.MemoryMB,
		DiskMB: r.DiskMB, Network: r.Network, Size: *r.Size}, nil
}

// PoolList is the reply of GET /v1/pools.
type PoolList = wire.PoolList

// PoolDeleted is the reply of DELETE /v1/pools/{name}.
type PoolDeleted struct {
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}

// poolRoutes registers the pool routes (one line in routes()).
func (s *Server) poolRoutes() {
	m := patternMux{s.mux, s}
	m.HandleFunc("GET /v1/pools", s.listPools)
	m.HandleFunc("PUT /v1/pools/{name}", s.setPool)
	m.HandleFunc("POST /v1/pools/{name}", s.setPool)
	m.HandleFunc("DELETE /v1/pools/{name}", s.deletePool)
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request) {
	pools, err := s.opts.Pools.ListPools(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if pools == nil {
		pools = []sandbox.PoolStatus{}
	}
	c, err := s.svc.Capacity(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, PoolList{Pools: convSlice(pools, wirePoolStatus), Count: len(pools), MaxPooled: c.MaxPooled})
}

func (s *Server) setPool(w http.ResponseWriter, r *http.Request) {
	var req PoolSetRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	p, err := req.Pool(r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	st, err := s.opts.Pools.SetPool(r.Context(), p)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wirePoolStatus(st))
}

func (s *Server) deletePool(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.opts.Pools.DeletePool(r.Context(), name); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, PoolDeleted{Name: name, Deleted: true})
}

// PoolPath is the REST path of pool name.
func PoolPath(name string) string { return wire.PoolPath(name) }
