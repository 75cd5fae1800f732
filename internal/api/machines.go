package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/wire"
)

// machineRoutes serves joined machines: enrollment and the connect WebSocket (each
// checks its own credential: a join token, a signature with the machine's key), the machine
// list (read), and removal, aliases and join tokens (admin; the scope table is internal/auth).
func (s *Server) machineRoutes() {
	m := patternMux{s.mux, s}
	m.HandleFunc("POST "+proto.JoinPath, s.joinMachine)
	m.HandleFunc("GET "+proto.ConnectPath, s.connectMachine)
	m.HandleFunc("GET /v1/machines", s.listMachines)
	m.HandleFunc("GET /v1/machines/{ref}", s.getMachine)
	m.HandleFunc("DELETE /v1/machines/{ref}", s.removeMachine)
	m.HandleFunc("GET /v1/machines/{ref}/agent", s.probeMachine)
	m.HandleFunc("POST /v1/machines/{ref}/aliases", s.addMachineAlias)
	m.HandleFunc("DELETE /v1/machines/{ref}/aliases/{alias}", s.removeMachineAlias)
	m.HandleFunc("POST /v1/machines/tokens", s.createJoinToken)
	m.HandleFunc("GET /v1/machines/tokens", s.listJoinTokens)
	m.HandleFunc("DELETE /v1/machines/tokens/{ref}", s.revokeJoinToken)
}

// machineCredentialRequest reports whether r may go without the bearer token: enrollment
// (its join token is checked) and the connect WebSocket (its signature is checked).
func machineCredentialRequest(r *http.Request) bool {
	return (r.Method == http.MethodPost && r.URL.Path == proto.JoinPath) ||
		(r.Method == http.MethodGet && r.URL.Path == proto.ConnectPath)
}

func (s *Server) machines(w http.ResponseWriter, r *http.Request) *machine.Registry {
	if s.opts.Machines == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this server has no joined machines (an in-process control plane); use `agentbox serve`"))
	}
	return s.opts.Machines
}

func (s *Server) joinMachine(w http.ResponseWriter, r *http.Request) {
	reg := s.machines(w, r)
	if reg == nil {
		return
	}
	var req proto.JoinRequest
	if r.ContentLength > proto.MaxJoinBody {
		s.fail(w, r, bodyTooLarge(proto.MaxJoinBody))
		return
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, proto.MaxJoinBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			s.fail(w, r, bodyTooLarge(mbe.Limit))
			return
		}
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "join request: %v (a JSON object of at most %d bytes)", err, proto.MaxJoinBody))
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "join request has data after the JSON object"))
		return
	}
	rep, err := reg.Enroll(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, rep)
}

func (s *Server) connectMachine(w http.ResponseWriter, r *http.Request) {
	if reg := s.machines(w, r); reg != nil {
		reg.ServeConnect(w, r)
	}
}

// MachineList is GET /v1/machines's reply.
type MachineList = wire.MachineList

func (s *Server) listMachines(w http.ResponseWriter, r *http.Request) {
	reg := s.machines(w, r)
	if reg == nil {
		return
	}
	l, err := reg.List(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, MachineList{Machines: wireMachines(l)})
}

func (s *Server) getMachine(w http.ResponseWriter, r *http.Request) {
	s.machineCall(w, r, http.StatusOK, func(reg *machine.Registry) (machine.Info, error) {
		return reg.Get(r.Context(), r.PathValue("ref"))
	})
}

func (s *Server) removeMachine(w http.ResponseWriter, r *http.Request) {
	s.machineCall(w, r, http.StatusOK, func(reg *machine.Registry) (machine.Info, error) {
		return reg.Remove(r.Context(), r.PathValue("ref"))
	})
}

// AliasRequest is POST /v1/machines/{ref}/aliases's body.
type AliasRequest = wire.AliasRequest

func (s *Server) addMachineAlias(w http.ResponseWriter, r *http.Request) {
	var req AliasRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	s.machineCall(w, r, http.StatusOK, func(reg *machine.Registry) (machine.Info, error) {
		return reg.AddAlias(r.Context(), r.PathValue("ref"), req.Alias)
	})
}

func (s *Server) removeMachineAlias(w http.ResponseWriter, r *http.Request) {
	s.machineCall(w, r, http.StatusOK, func(reg *machine.Registry) (machine.Info, error) {
		return reg.RemoveAlias(r.Context(), r.PathValue("ref"), r.PathValue("alias"))
	})
}

func (s *Server) machineCall(w http.ResponseWriter, r *http.Request, status int, fn func(*machine.Registry) (machine.Info, error)) {
	reg := s.machines(w, r)
	if reg == nil {
		return
	}
	i, err := fn(reg)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, status, wireMachine(i))
}

func (s *Server) createJoinToken(w http.ResponseWriter, r *http.Request) {
	reg := s.machines(w, r)
	if reg == nil {
		return
	}
	var req wire.TokenRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	c, err := reg.CreateToken(r.Context(), machine.TokenRequest{Expires: req.Expires, Uses: req.Uses})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wire.CreatedToken{Token: wireJoinToken(c.Token), Secret: c.Secret})
}

// JoinTokenList is GET /v1/machines/tokens's reply: the tokens without their secrets.
type JoinTokenList = wire.JoinTokenList

func (s *Server) listJoinTokens(w http.ResponseWriter, r *http.Request) {
	reg := s.machines(w, r)
	if reg == nil {
		return
	}
	l, err := reg.ListTokens(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := JoinTokenList{Tokens: make([]wire.JoinToken, len(l))}
	for i, t := range l {
		out.Tokens[i] = wireJoinToken(t)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) revokeJoinToken(w http.ResponseWriter, r *http.Request) {
	reg := s.machines(w, r)
	if reg == nil {
		return
	}
	t, err := reg.RevokeToken(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireJoinToken(t))
}

// probeMachine asks the machine's agent who it is, over a stream of its live session.
func (s *Server) probeMachine(w http.ResponseWriter, r *http.Request) {
	reg := s.machines(w, r)
	if reg == nil {
		return
	}
	info, err := reg.Probe(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.AgentInfo(info))
}
