package api

import (
	"net/http"
	"strings"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/wire"
)

// APIKeyHeader is the header an API key may come in, instead of "Authorization: Bearer".
const APIKeyHeader = "X-Api-Key"

// credential is the key or token the request presents: "Authorization: Bearer …", else
// X-Api-Key.
func credential(r *http.Request) string {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(tok)
	}
	if k := strings.TrimSpace(r.Header.Get(APIKeyHeader)); k != "" || !isE2BPath(r.URL.Path) {
		return k
	}
	return e2bCredential(r) // an E2B SDK's envd or interpreter call (e2b.go)
}

// authenticate identifies the caller: the server's token (the admin key, owning what it
// creates as TokenOwner, its principal gate.AdminPrincipal), a named API key (Options.Keys:
// its id, name, scope, and owner and principal "key:<id>"), or
// nobody (AUTH_FAILED saying why). Without a token (--insecure-no-auth) everyone is admin.
func (s *Server) authenticate(r *http.Request) (gate.Caller, string, error) {
	if s.opts.Token == "" {
		return gate.Caller{ID: s.owner, Name: "token", Scope: auth.ScopeAdmin, Principal: gate.AdminPrincipal}, s.owner, nil
	}
	cred := credential(r)
	if cred == "" {
		return gate.Caller{}, "", errcode.New(errcode.AuthFailed, "missing bearer token or API key: send \"Authorization: Bearer <token or API key>\" or \"X-Api-Key: <API key>\"; the server's token is in ~/.config/agentbox/token of the user running agentbox serve")
	}
	if s.opts.Keys != nil && auth.IsKey(cred) {
		k, err := s.opts.Keys.Authenticate(r.Context(), cred)
		if err != nil {
			return gate.Caller{}, "", err
		}
		return gate.Caller{ID: k.ID, Name: k.Name, Scope: k.Scope, Principal: k.Owner()}, k.Owner(), nil
	}
	if s.authorized(r) || constantEq(cred, s.opts.Token) {
		return gate.Caller{ID: s.owner, Name: "token", Scope: auth.ScopeAdmin, Principal: gate.AdminPrincipal}, s.owner, nil
	}
	return gate.Caller{}, "", errcode.New(errcode.AuthFailed, "wrong bearer token or API key: the server's token is in ~/.config/agentbox/token of the user running agentbox serve; API keys come from `agentbox token create`")
}

// keyRoutes serves the API keys (admin scope; the scope table is internal/auth).
func (s *Server) keyRoutes() {
	m := patternMux{s.mux, s}
	m.HandleFunc("POST /v1/keys", s.createKey)
	m.HandleFunc("GET /v1/keys", s.listKeys)
	m.HandleFunc("DELETE /v1/keys/{ref}", s.revokeKey)
}

func (s *Server) keys(w http.ResponseWriter, r *http.Request) *auth.Keys {
	if s.opts.Keys == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this server has no API keys (an in-process control plane); use `agentbox serve`"))
	}
	return s.opts.Keys
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	ks := s.keys(w, r)
	if ks == nil {
		return
	}
	var req auth.CreateRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	c, err := ks.Create(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wireCreatedKey(c))
}

// KeyList is GET /v1/keys's reply.
type KeyList = wire.KeyList

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	ks := s.keys(w, r)
	if ks == nil {
		return
	}
	l, err := ks.List(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, KeyList{Keys: convSlice(l, wireAPIKey)})
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) {
	ks := s.keys(w, r)
	if ks == nil {
		return
	}
	k, err := ks.Revoke(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireAPIKey(k))
}
