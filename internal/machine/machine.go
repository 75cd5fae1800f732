// Package machine is the server side of joined machines: enrollment with join
// tokens, the connect handshake (a nonce signed with the machine's ed25519 key) and the one
// yamux session per machine that runs over its WebSocket, the map of live sessions, heartbeats,
// and Registry.Client, through which feature services reach a machine's HTTP handlers (one
// yamux stream per connection). Nothing a machine sends is trusted unchecked: every handshake
// message, heartbeat and string is bounded and validated.
package machine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/store"
)

// Store is the durable state the registry needs (store.MachineStore).
type Store = store.MachineStore

// Defaults and bounds.
const (
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultMaxMachines       = 1000
	DefaultMaxTokens         = 100
	MaxAliases               = 8
	DefaultTokenTTL          = 24 * time.Hour
	MaxTokenTTL              = 30 * 24 * time.Hour
	MaxTokenUses             = 1000
	listLimit                = 10000
)

// Options configures a Registry.
type Options struct {
	Logger *slog.Logger
	// Now is the clock (tests inject one); nil: time.Now.
	Now func() time.Time
	// HeartbeatInterval is how often machines are told to send heartbeats; a session that
	// sends none for 3 intervals is closed. 0: DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// MaxMachines and MaxTokens bound the live machines and usable join tokens.
	MaxMachines, MaxTokens int
	// HandshakeTimeout bounds the connect handshake; 0: 10 s.
	HandshakeTimeout time.Duration
}

// Registry knows the joined machines and holds their live sessions.
type Registry struct {
	st   Store
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	sessions map[string]*session
	closed   bool
	wg       sync.WaitGroup
}

// New returns a registry over st.
func New(st Store, opts Options) *Registry {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if opts.MaxMachines <= 0 {
		opts.MaxMachines = DefaultMaxMachines
	}
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = DefaultMaxTokens
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	return &Registry{st: st, opts: opts, log: opts.Logger, sessions: map[string]*session{}}
}

func (r *Registry) now() time.Time { return r.opts.Now().UTC().Truncate(time.Millisecond) }

// Info is a machine as the surfaces show it: its record and whether it is connected now.
type Info struct {
	store.Machine
	Online bool `json:"online"`
}

func (r *Registry) info(m store.Machine) Info {
	r.mu.Lock()
	_, ok := r.sessions[m.ID]
	r.mu.Unlock()
	return Info{Machine: m, Online: ok}
}

// List returns every live machine, by name.
func (r *Registry) List(ctx context.Context) ([]Info, error) {
	ms, err := r.st.ListMachines(ctx, listLimit)
	if err != nil {
		return nil, err
	}
	out := make([]Info, len(ms))
	for i, m := range ms {
		out[i] = r.info(m)
	}
	return out, nil
}

// Get returns the machine whose id, name or alias is ref (MACHINE_NOT_FOUND when none).
func (r *Registry) Get(ctx context.Context, ref string) (Info, error) {
	m, err := r.st.Machine(ctx, ref)
	if err != nil {
		return Info{}, err
	}
	return r.info(m), nil
}

// Remove removes the machine ref and cuts its session at once; its key is refused from then on.
func (r *Registry) Remove(ctx context.Context, ref string) (Info, error) {
	m, err := r.st.RemoveMachine(ctx, ref, r.now())
	if err != nil {
		return Info{}, err
	}
	r.disconnect(m.ID, nil)
	r.log.Info("machine removed", "machine_id", m.ID, "name", m.Name)
	return Info{Machine: m}, nil
}

// AddAlias gives machine ref the alias.
func (r *Registry) AddAlias(ctx context.Context, ref, alias string) (Info, error) {
	if err := proto.CheckName("alias", alias); err != nil {
		return Info{}, errcode.New(errcode.InvalidArgument, "%v", err)
	}
	m, err := r.st.AddMachineAlias(ctx, ref, alias, MaxAliases)
	if err != nil {
		return Info{}, err
	}
	return r.info(m), nil
}

// RemoveAlias takes alias from machine ref.
func (r *Registry) RemoveAlias(ctx context.Context, ref, alias string) (Info, error) {
	m, err := r.st.RemoveMachineAlias(ctx, ref, alias)
	if err != nil {
		return Info{}, err
	}
	return r.info(m), nil
}

// Client returns an HTTP client whose every connection is a new yamux stream to the machine
// whose id, name or alias is ref (the URL's host is ignored: use http://machine/...), and the
// machine's record. MACHINE_NOT_FOUND when there is no such machine; MACHINE_OFFLINE when it
// has no live session (or the session ends before a stream opens).
func (r *Registry) Client(ctx context.Context, ref string) (*http.Client, store.Machine, error) {
	m, err := r.st.Machine(ctx, ref)
	if err != nil {
		return nil, store.Machine{}, err
	}
	r.mu.Lock()
	s := r.sessions[m.ID]
	r.mu.Unlock()
	if s == nil {
		return nil, m, offline(m)
	}
	return &http.Client{Transport: s.transport}, m, nil
}

func offline(m store.Machine) error {
	seen := "never"
	if m.LastSeen != nil {
		seen = m.LastSeen.Format(time.RFC3339)
	}
	return errcode.New(errcode.MachineOffline, "machine %s (%s) is not connected to this server (last heartbeat: %s); it reconnects by itself when its agent runs and can reach the server",
		m.Name, m.ID, seen).With("machine_id", m.ID)
}

// Close cuts every session and waits for their handlers.
func (r *Registry) Close() {
	r.mu.Lock()
	r.closed = true
	ss := make([]*session, 0, len(r.sessions))
	for _, s := range r.sessions {
		ss = append(ss, s)
	}
	r.mu.Unlock()
	for _, s := range ss {
		s.close()
	}
	r.wg.Wait()
}

// Online returns how many machines have a live session.
func (r *Registry) Online() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sessions)
}

// session is one machine's live connection.
type session struct {
	machine   store.Machine
	ys        *yamux.Session
	transport *http.Transport
	once      sync.Once
	lastBeat  time.Time // when a heartbeat was last written (heartbeat loop only)
}

func (s *session) close() {
	s.once.Do(func() {
		_ = s.ys.Close()
		s.transport.CloseIdleConnections()
	})
}

// newSession wraps ys; its transport opens one stream per connection.
func newSession(m store.Machine, ys *yamux.Session) *session {
	s := &session{machine: m, ys: ys}
	s.transport = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			type res struct {
				c   net.Conn
				err error
			}
			ch := make(chan res, 1)
			go func() {
				c, err := ys.Open()
				ch <- res{c, err}
			}()
			select {
			case v := <-ch:
				if v.err != nil {
					return nil, errcode.Wrap(errcode.MachineOffline, v.err, "machine %s (%s): its connection closed; it reconnects by itself", m.Name, m.ID).With("machine_id", m.ID)
				}
				return v.c, nil
			case <-ctx.Done():
				go func() {
					if v := <-ch; v.c != nil {
						v.c.Close()
					}
				}()
				return nil, ctx.Err()
			}
		},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		// The machine's reply headers are bounded like any untrusted peer's.
		MaxResponseHeaderBytes: 64 << 10,
	}
	return s
}

// register makes s machine id's session, replacing (and cutting) an older one.
func (r *Registry) register(s *session) bool {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return false
	}
	old := r.sessions[s.machine.ID]
	r.sessions[s.machine.ID] = s
	r.mu.Unlock()
	if old != nil {
		r.log.Info("machine reconnected; its older session is closed", "machine_id", s.machine.ID)
		old.close()
	}
	return true
}

// disconnect cuts machine id's session (only if it is s, when s is not nil).
func (r *Registry) disconnect(id string, s *session) {
	r.mu.Lock()
	cur := r.sessions[id]
	if cur != nil && (s == nil || cur == s) {
		delete(r.sessions, id)
	} else {
		cur = nil
	}
	r.mu.Unlock()
	if cur != nil {
		cur.close()
	}
}

func newID(prefix string) (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return prefix + hex.EncodeToString(b[:]), nil
}

func hashSecret(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}
