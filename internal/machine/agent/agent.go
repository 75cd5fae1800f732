// Package agent is the machine side of a joined machine: it keeps the machine's
// ed25519 identity in a 0600 state file, enrolls with a join token, dials the server's
// WebSocket and proves its identity, reconnects forever with capped jittered backoff, sends
// heartbeats (platform, arch, agent version, GPUs), and serves one http.Handler over the yamux
// session: each stream the server opens is one HTTP/1.1 connection. It builds for linux,
// darwin and windows.
package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/version"
)

// StateFile is the state file's name in the state dir.
const StateFile = "machine.json"

// State is the machine's identity: the server it joined, its id there and its private key.
type State struct {
	ServerURL  string `json:"server_url"`
	MachineID  string `json:"machine_id"`
	Name       string `json:"name"`
	PrivateKey []byte `json:"private_key"` // the ed25519 seed (32 bytes)
}

func (s State) key() ed25519.PrivateKey { return ed25519.NewKeyFromSeed(s.PrivateKey) }

// LoadState reads dir's state file (os.ErrNotExist when there is none).
func LoadState(dir string) (State, error) {
	var s State
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("state file %s: %w", filepath.Join(dir, StateFile), err)
	}
	if len(s.PrivateKey) != ed25519.SeedSize || s.MachineID == "" || s.ServerURL == "" {
		return s, fmt.Errorf("state file %s is incomplete; remove it and join again", filepath.Join(dir, StateFile))
	}
	return s, nil
}

// saveState writes s to dir's state file, 0600, atomically.
func saveState(dir string, s State) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".machine-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil && runtime.GOOS != "windows" {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, StateFile))
}

// Config configures the agent.
type Config struct {
	// ServerURL is the server's base URL (http:// or https://).
	ServerURL string
	// StateDir holds the state file.
	StateDir string
	// HTTPClient makes the enrollment request and the WebSocket dial (TLS settings); nil: a
	// default client.
	HTTPClient *http.Client
	// Handler serves the server's streams; nil: Handler(HandlerOptions{StateDir}).
	Handler http.Handler
	Logger  *slog.Logger
	// GPUs reports the machine's GPUs for heartbeats; nil: gpu.Query.
	GPUs func(context.Context) ([]gpu.GPU, error)
	// MinBackoff and MaxBackoff bound the reconnect delay (defaults 500 ms and 30 s).
	MinBackoff, MaxBackoff time.Duration
	// Connected, if set, is told each time a session starts (tests, the bench).
	Connected func()
}

func (c *Config) defaults() {
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 0}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.GPUs == nil {
		c.GPUs = gpu.Query
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 500 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	if c.Handler == nil {
		c.Handler = Handler(HandlerOptions{StateDir: c.StateDir})
	}
}

// facts are this machine's platform facts, with its GPUs (a failing nvidia-smi is logged and
// reported as none).
func facts(ctx context.Context, cfg *Config) proto.Facts {
	g, err := cfg.GPUs(ctx)
	if err != nil {
		cfg.Logger.Warn("cannot read GPUs", "err", err)
		g = nil
	}
	if gpu.Check(g) != nil {
		g = nil
	}
	return proto.Facts{Platform: runtime.GOOS, Arch: runtime.GOARCH, AgentVersion: version.Version, GPUs: g}
}

// Enroll joins the server with token under name (default: the host name): it generates a key
// pair, enrolls, and writes the state file. A state dir that already holds an identity is
// refused (remove its state file to join again).
func Enroll(ctx context.Context, cfg Config, token, name string) (State, error) {
	cfg.defaults()
	if _, err := LoadState(cfg.StateDir); err == nil {
		return State{}, fmt.Errorf("%s already holds a machine identity; run without --token to connect with it, or remove it to join again", filepath.Join(cfg.StateDir, StateFile))
	}
	if name == "" {
		h, _ := os.Hostname()
		name = proto.SanitizeName(h)
		if name == "" {
			return State{}, errors.New("the host name makes no valid machine name; pass --name")
		}
	}
	base, err := serverURL(cfg.ServerURL)
	if err != nil {
		return State{}, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return State{}, err
	}
	body, err := json.Marshal(proto.JoinRequest{Token: token, PublicKey: pub, Name: name, Facts: facts(ctx, &cfg)})
	if err != nil {
		return State{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base.JoinPath(proto.JoinPath).String(), bytes.NewReader(body))
	if err != nil {
		return State{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := cfg.HTTPClient.Do(req)
	if err != nil {
		return State{}, fmt.Errorf("join %s: %w", base, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return State{}, fmt.Errorf("join %s: %w", base, err)
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Code    errcode.Code `json:"code"`
				Message string       `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(rb, &e) == nil && e.Error.Code != "" {
			return State{}, errcode.New(e.Error.Code, "join refused: %s", e.Error.Message)
		}
		return State{}, fmt.Errorf("join %s: HTTP %d: %.200s", base, resp.StatusCode, rb)
	}
	var rep proto.JoinReply
	if err := json.Unmarshal(rb, &rep); err != nil || rep.MachineID == "" || len(rep.MachineID) > proto.MaxNameLen {
		return State{}, fmt.Errorf("join %s: unexpected reply %.200q", base, rb)
	}
	st := State{ServerURL: base.String(), MachineID: rep.MachineID, Name: rep.Name, PrivateKey: priv.Seed()}
	if err := saveState(cfg.StateDir, st); err != nil {
		return State{}, fmt.Errorf("joined as %s but cannot write the state file: %w", rep.MachineID, err)
	}
	return st, nil
}

func serverURL(s string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimRight(s, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("server URL %q: give http://HOST:PORT or https://HOST:PORT", s)
	}
	return u, nil
}

// ErrRemoved is returned by Run when the server says this machine was removed: its identity
// is dead and only a new join brings it back.
var ErrRemoved = errors.New("this machine was removed from the server")

// Run connects with st's identity and keeps connected until ctx ends, reconnecting with capped
// jittered backoff after every failure; it returns ErrRemoved (wrapped) when the server says
// the machine was removed, else ctx's error.
func Run(ctx context.Context, cfg Config, st State) error {
	cfg.defaults()
	backoff := cfg.MinBackoff
	for {
		began := time.Now()
		err := connectOnce(ctx, &cfg, st)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, ErrRemoved) {
			return err
		}
		if time.Since(began) > time.Minute {
			backoff = cfg.MinBackoff // a session that lasted starts the backoff over
		}
		wait := jitter(backoff)
		cfg.Logger.Info("disconnected from the server; reconnecting", "err", err, "in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		backoff = min(backoff*2, cfg.MaxBackoff)
	}
}

// jitter is a uniformly random duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	n, err := rand.Int(rand.Reader, big.NewInt(int64(d/2)+1))
	if err != nil {
		return d
	}
	return d/2 + time.Duration(n.Int64())
}

// connectOnce dials, proves the identity, and serves one session until it ends.
func connectOnce(ctx context.Context, cfg *Config, st State) error {
	base, err := serverURL(st.ServerURL)
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(dctx, base.JoinPath(proto.ConnectPath).String(), &websocket.DialOptions{
		HTTPClient: cfg.HTTPClient, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.CloseNow()
	c.SetReadLimit(proto.MaxHandshakeMsg)
	var ch proto.Challenge
	if err := readJSON(dctx, c, &ch); err != nil {
		return err
	}
	if len(ch.Nonce) != proto.NonceLen {
		return fmt.Errorf("handshake: the server's nonce is %d bytes, want %d", len(ch.Nonce), proto.NonceLen)
	}
	sig := ed25519.Sign(st.key(), proto.SignedBytes(st.MachineID, ch.Nonce))
	if err := writeJSON(dctx, c, proto.Proof{MachineID: st.MachineID, Signature: sig}); err != nil {
		return err
	}
	var w proto.Welcome
	if err := readJSON(dctx, c, &w); err != nil {
		return err
	}
	if w.Error != "" {
		if w.Removed {
			return fmt.Errorf("%w: %s", ErrRemoved, w.Error)
		}
		return fmt.Errorf("refused (%s): %s", w.Code, w.Error)
	}
	interval := time.Duration(w.HeartbeatIntervalMS) * time.Millisecond
	if interval < 100*time.Millisecond || interval > time.Minute {
		interval = 5 * time.Second
	}
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	ys, err := yamux.Server(websocket.NetConn(sctx, c, websocket.MessageBinary), proto.YamuxConfig())
	if err != nil {
		return err
	}
	defer ys.Close()
	cfg.Logger.Info("connected", "server", base.String(), "machine_id", st.MachineID)
	if cfg.Connected != nil {
		cfg.Connected()
	}
	srv := &http.Server{Handler: cfg.Handler, ReadHeaderTimeout: 30 * time.Second, MaxHeaderBytes: 64 << 10,
		ErrorLog: slogLogger(cfg.Logger)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ys) }()
	beat := make(chan error, 1)
	go func() { beat <- heartbeat(sctx, cfg, ys, interval) }()
	select {
	case <-ctx.Done():
		err = ctx.Err()
	case <-ys.CloseChan():
		err = errors.New("session closed")
	case err = <-beat:
	}
	ys.Close()
	srv.Close()
	return err
}

// heartbeat opens the heartbeat stream and writes one line per interval until the session ends.
func heartbeat(ctx context.Context, cfg *Config, ys *yamux.Session, interval time.Duration) error {
	st, err := ys.OpenStream()
	if err != nil {
		return err
	}
	defer st.Close()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		b, err := json.Marshal(proto.Heartbeat{Facts: facts(ctx, cfg), SentAt: time.Now().UTC()})
		if err != nil {
			return err
		}
		_ = st.SetWriteDeadline(time.Now().Add(3 * interval))
		if _, err := st.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func writeJSON(ctx context.Context, c *websocket.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.Write(ctx, websocket.MessageText, b)
}

func readJSON(ctx context.Context, c *websocket.Conn, v any) error {
	typ, b, err := c.Read(ctx)
	if err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if typ != websocket.MessageText {
		return errors.New("handshake: want a text message")
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	return nil
}
