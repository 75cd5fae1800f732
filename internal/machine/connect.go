package machine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/store"
)

// ServeConnect is GET /v1/machines/connect: it upgrades to a WebSocket, sends a nonce, checks
// the machine's signature of it with the machine's stored public key, then runs one yamux
// session over the socket until it ends (the machine gone, removed, replaced by a newer
// connection, silent for three heartbeat intervals, or the registry closed).
func (r *Registry) ServeConnect(w http.ResponseWriter, req *http.Request) {
	c, err := websocket.Accept(w, req, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return // Accept answered the request
	}
	defer c.CloseNow()
	c.SetReadLimit(proto.MaxHandshakeMsg)
	hctx, cancel := context.WithTimeout(req.Context(), r.opts.HandshakeTimeout)
	m, err := r.handshake(hctx, c)
	cancel()
	if err != nil {
		r.log.Info("machine connection refused", "remote", req.RemoteAddr, "err", err)
		return
	}
	// The session outlives the handshake's context; it ends with the connection.
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	ys, err := yamux.Client(websocket.NetConn(sctx, c, websocket.MessageBinary), proto.YamuxConfig())
	if err != nil {
		r.log.Error("machine session", "machine_id", m.ID, "err", err)
		return
	}
	s := newSession(m, ys)
	defer r.disconnect(m.ID, s)
	r.wg.Add(1)
	defer r.wg.Done()
	if !r.register(s) {
		s.close()
		return
	}
	// A Remove between the handshake and register would have missed this session: look again.
	if cur, err := r.st.MachineByID(req.Context(), m.ID); err != nil || cur.RemovedAt != nil {
		s.close()
		return
	}
	r.log.Info("machine connected", "machine_id", m.ID, "name", m.Name, "remote", req.RemoteAddr)
	r.heartbeats(s)
	r.log.Info("machine disconnected", "machine_id", m.ID, "name", m.Name)
}

// handshake runs the challenge-response and answers with a Welcome; it returns the machine
// the connection proved to be.
func (r *Registry) handshake(ctx context.Context, c *websocket.Conn) (store.Machine, error) {
	nonce := make([]byte, proto.NonceLen)
	if _, err := rand.Read(nonce); err != nil {
		return store.Machine{}, err
	}
	if err := writeJSON(ctx, c, proto.Challenge{Nonce: nonce}); err != nil {
		return store.Machine{}, err
	}
	var p proto.Proof
	if err := readJSON(ctx, c, &p); err != nil {
		return store.Machine{}, err
	}
	refuse := func(w proto.Welcome) (store.Machine, error) {
		_ = writeJSON(ctx, c, w)
		c.Close(websocket.StatusPolicyViolation, "refused")
		return store.Machine{}, errors.New(w.Error)
	}
	if p.MachineID == "" || len(p.MachineID) > proto.MaxNameLen {
		return refuse(proto.Welcome{Code: string(errcode.InvalidArgument), Error: "proof: machine_id missing or too long"})
	}
	m, err := r.st.MachineByID(ctx, p.MachineID)
	if err != nil || !proto.Verify(m.PublicKey, p.MachineID, nonce, p.Signature) {
		if err != nil && errcode.Of(err) != errcode.MachineNotFound {
			return refuse(proto.Welcome{Code: string(errcode.Internal), Error: "the server could not read its machine records; try again"})
		}
		return refuse(proto.Welcome{Code: string(errcode.AuthFailed), Error: fmt.Sprintf("machine %q is unknown to this server or its key does not match; join again with a new token", p.MachineID)})
	}
	if m.RemovedAt != nil {
		return refuse(proto.Welcome{Code: string(errcode.AuthFailed), Removed: true,
			Error: fmt.Sprintf("machine %s (%s) was removed from this server at %s; join again with a new token to come back", m.Name, m.ID, m.RemovedAt.Format(time.RFC3339))})
	}
	if err := writeJSON(ctx, c, proto.Welcome{MachineID: m.ID, HeartbeatIntervalMS: r.opts.HeartbeatInterval.Milliseconds()}); err != nil {
		return store.Machine{}, err
	}
	return m, nil
}

func writeJSON(ctx context.Context, c *websocket.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.Write(ctx, websocket.MessageText, b)
}

// readJSON reads one bounded text message (the read limit is set) and decodes it strictly.
func readJSON(ctx context.Context, c *websocket.Conn, v any) error {
	typ, b, err := c.Read(ctx)
	if err != nil {
		return err
	}
	if typ != websocket.MessageText {
		return errors.New("handshake: want a text message")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	return nil
}

// heartbeats serves the session until it ends: it accepts the heartbeat stream the machine
// opens (one at a time; any other stream the machine opens is refused), reads bounded
// heartbeat lines, checks them and records them, and closes the session when none arrives for
// three intervals.
func (r *Registry) heartbeats(s *session) {
	timeout := 3 * r.opts.HeartbeatInterval
	defer s.close()
	for {
		actx, cancel := context.WithTimeout(context.Background(), timeout)
		st, err := s.ys.AcceptStreamWithContext(actx)
		cancel()
		if err != nil {
			if !s.ys.IsClosed() {
				r.log.Info("machine opened no heartbeat stream in time; closing its session", "machine_id", s.machine.ID)
			}
			return
		}
		err = r.readHeartbeats(s, st, timeout)
		st.Close()
		if s.ys.IsClosed() {
			return
		}
		if err != nil {
			r.log.Warn("machine heartbeat refused; closing its session", "machine_id", s.machine.ID, "err", err)
			return
		}
	}
}

func (r *Registry) readHeartbeats(s *session, st *yamux.Stream, timeout time.Duration) error {
	br := bufio.NewReaderSize(st, 4096)
	for {
		_ = st.SetReadDeadline(time.Now().Add(timeout))
		line, err := readLine(br, proto.MaxHeartbeat)
		if errors.Is(err, io.EOF) {
			return nil // the machine closed the stream (it is going away, or opens another)
		}
		if err != nil {
			return err
		}
		var hb proto.Heartbeat
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&hb); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		if err := hb.Facts.Check(); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		now := r.now()
		// A machine beating faster than the interval allows is not written more than once a second.
		if now.Sub(s.lastBeat) < time.Second {
			continue
		}
		s.lastBeat = now
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = r.st.RecordHeartbeat(ctx, s.machine.ID, store.MachineFacts{Platform: hb.Platform, Arch: hb.Arch, AgentVersion: hb.AgentVersion, GPUs: hb.GPUs}, now)
		cancel()
		if errcode.Of(err) == errcode.MachineNotFound {
			return fmt.Errorf("machine removed")
		}
		if err != nil {
			r.log.Warn("machine heartbeat not recorded", "machine_id", s.machine.ID, "err", err)
		}
	}
}

// readLine reads one newline-terminated line of at most max bytes (without the newline).
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > max+1 {
			return nil, fmt.Errorf("heartbeat longer than %d bytes", max)
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}
