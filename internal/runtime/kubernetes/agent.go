package kubernetes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes/tunnel"
)

// Bounds of the agent connection.
const (
	// pollRunning is how often a dial looks at a pod that is not running yet when it cannot
	// watch it (or the pod is not made yet).
	pollRunning = 50 * time.Millisecond
	// retryAfter: a tunnel that failed to open answers the same error, without I/O, for this
	// long (WaitReady dials every few milliseconds).
	retryAfter = 100 * time.Millisecond
	// maxStderr bounds what is kept of guest-tunnel's stderr for error messages.
	maxStderr = 4 << 10
	// openTimeout bounds opening one tunnel (the exec and its first ping).
	openTimeout = 30 * time.Second
)

// hardWaiting are container waiting reasons that will not clear by themselves: a dial reports
// them at once instead of waiting for the pod to run.
var hardWaiting = []string{"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
	"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}

// agentTunnel is one sandbox's connection to its agent: a yamux session over the stdin and stdout
// of `agentbox guest-tunnel` exec'd in the sandbox's container.
type agentTunnel struct {
	r   *Runtime
	id  string
	sem chan struct{} // one opening at a time

	phases podPhases // the pod's start, as the first opening saw it (held with sem)

	mu        sync.Mutex
	sess      *yamux.Session
	stop      context.CancelFunc // ends the exec
	lastErr   error
	lastErrAt time.Time
	closed    bool
}

// Agent returns a Dialer whose connections reach the sandbox's agent through the tunnel,
// opening (and, when it broke, re-opening) it as needed.
func (r *Runtime) Agent(ctx context.Context, id string) (runtime.Dialer, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	p, err := r.getPod(ctx, id)
	if err != nil {
		return nil, err
	}
	if p == nil {
		cm, err := r.getKept(ctx, id)
		if err != nil {
			return nil, err
		}
		if cm == nil {
			return nil, errcode.New(errcode.SandboxNotFound, "sandbox %s has no pod in namespace %s", id, r.cfg.Namespace)
		}
	}
	return func(ctx context.Context) (net.Conn, error) { return r.dial(ctx, id) }, nil
}

func (r *Runtime) dial(ctx context.Context, id string) (net.Conn, error) {
	for attempt := 0; ; attempt++ {
		t, err := r.tunnelFor(id)
		if err != nil {
			return nil, err
		}
		sess, err := t.session(ctx)
		if err != nil {
			return nil, err
		}
		c, err := tunnel.Dial(ctx, sess)
		var pe *tunnel.PeerError
		switch {
		case err == nil:
			return c, nil
		case errors.As(err, &pe):
			return nil, errcode.Wrap(errcode.SandboxNotRunning, &runtime.AgentPeerError{ID: id}, "sandbox %s: %s", id, pe.Msg)
		case sess.IsClosed() && attempt == 0 && ctx.Err() == nil:
			t.drop(sess) // the exec ended (a kubelet or API server restart): open a new one
			continue
		}
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
}

func (r *Runtime) tunnelFor(id string) (*agentTunnel, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errcode.New(errcode.RuntimeUnavailable, "runtime %s is closed", r.cfg.Name)
	}
	t := r.tunnels[id]
	if t == nil {
		t = &agentTunnel{r: r, id: id, sem: make(chan struct{}, 1)}
		r.tunnels[id] = t
	}
	return t, nil
}

// dropTunnel ends sandbox id's tunnel (Stop, Delete).
func (r *Runtime) dropTunnel(id string) {
	r.mu.Lock()
	t := r.tunnels[id]
	delete(r.tunnels, id)
	r.mu.Unlock()
	if t != nil {
		t.close()
	}
}

func (t *agentTunnel) close() {
	t.mu.Lock()
	t.closed = true
	sess, stop := t.sess, t.stop
	t.sess, t.stop = nil, nil
	t.mu.Unlock()
	if sess != nil {
		_ = sess.Close()
	}
	if stop != nil {
		stop()
	}
}

// drop forgets sess if it is still the tunnel's.
func (t *agentTunnel) drop(sess *yamux.Session) {
	t.mu.Lock()
	var stop context.CancelFunc
	if t.sess == sess {
		stop = t.stop
		t.sess, t.stop = nil, nil
	}
	t.mu.Unlock()
	_ = sess.Close()
	if stop != nil {
		stop()
	}
}

// live returns the open session, or why a new one should not be tried yet.
func (t *agentTunnel) live() (*yamux.Session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errcode.New(errcode.SandboxNotRunning, "sandbox %s has been stopped or deleted", t.id)
	}
	if t.sess != nil && !t.sess.IsClosed() {
		return t.sess, nil
	}
	if t.lastErr != nil && time.Since(t.lastErrAt) < retryAfter {
		return nil, t.lastErr
	}
	return nil, nil
}

func (t *agentTunnel) session(ctx context.Context) (*yamux.Session, error) {
	if s, err := t.live(); s != nil || err != nil {
		return s, err
	}
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-t.sem }()
	if s, err := t.live(); s != nil || err != nil {
		return s, err
	}
	began := time.Now()
	if t.phases.began.IsZero() {
		t.phases.began = began
	}
	sess, stop, err := t.r.openTunnel(ctx, t.id, &t.phases)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			t.lastErr, t.lastErrAt = err, time.Now()
		}
		return nil, err
	}
	if t.closed {
		_ = sess.Close()
		stop()
		return nil, errcode.New(errcode.SandboxNotRunning, "sandbox %s has been stopped or deleted", t.id)
	}
	if t.stop != nil {
		t.stop()
	}
	t.sess, t.stop, t.lastErr = sess, stop, nil
	t.phases.report(ctx, time.Now())
	t.r.log.Debug("agent tunnel open", "sandbox_id", t.id, "took", time.Since(began))
	return sess, nil
}

// podPhases are the times a sandbox's pod was first seen scheduled, ready to start its
// containers (its volumes mounted and its pod sandbox made), and running, from the first wait
// for it: the create trace's steps inside the agent's readiness (docs/TRACE.md).
type podPhases struct {
	began, scheduled, sandbox, running time.Time
	reported                           bool
}

// Steps of a pod's start, as the kubelet reports them (child spans of the create's agent step).
const (
	StepPodSchedule  = "runtime.pod.schedule"  // until the scheduler placed it
	StepPodSandbox   = "runtime.pod.sandbox"   // until its volumes are mounted and its pod sandbox made
	StepPodContainer = "runtime.pod.container" // until its container runs
	StepTunnel       = "runtime.tunnel"        // the agent tunnel's exec and first ping
)

// note records what pod p shows, at now.
func (ph *podPhases) note(p *corev1.Pod, now time.Time) {
	if p == nil || ph == nil {
		return
	}
	if ph.scheduled.IsZero() && p.Spec.NodeName != "" {
		ph.scheduled = now
	}
	for _, c := range p.Status.Conditions {
		if ph.sandbox.IsZero() && c.Type == corev1.PodReadyToStartContainers && c.Status == corev1.ConditionTrue {
			ph.sandbox = now
		}
	}
}

// report records the phases as spans under ctx's span once the tunnel is open (at opened),
// the first time only: a tunnel re-opened later is no create's.
func (ph *podPhases) report(ctx context.Context, opened time.Time) {
	if ph.reported || ph.began.IsZero() || ph.running.IsZero() {
		return
	}
	ph.reported = true
	prev := ph.began
	for _, s := range []struct {
		name string
		at   time.Time
	}{{StepPodSchedule, ph.scheduled}, {StepPodSandbox, ph.sandbox}, {StepPodContainer, ph.running}, {StepTunnel, opened}} {
		if s.at.IsZero() {
			continue // a phase the kubelet did not report apart (an older one: no PodReadyToStartContainers)
		}
		runtime.Observed(ctx, s.name, prev, s.at)
		prev = s.at
	}
}

// waitRunning waits until the sandbox's container runs, following its pod's changes through a
// watch (a poll would add half its period to every create); a pod that has stopped, failed to
// start, or does not exist is an error at once.
func (r *Runtime) waitRunning(ctx context.Context, id string, ph *podPhases) error {
	var w watch.Interface
	defer func() {
		if w != nil {
			w.Stop()
		}
	}()
	var p *corev1.Pod // the pod as the last watch event showed it; nil: get it
	for {
		if p == nil {
			var err error
			if p, err = r.getPod(ctx, id); err != nil {
				return err
			}
		}
		ph.note(p, time.Now())
		why := "its pod is not created yet (Start)"
		if p == nil {
			cm, err := r.getKept(ctx, id)
			if err != nil {
				return err
			}
			if cm == nil {
				return guest.Permanent(errcode.New(errcode.SandboxNotFound, "sandbox %s has no pod in namespace %s", id, r.cfg.Namespace))
			}
		} else {
			switch podStatus(p) {
			case runtime.StatusRunning:
				for _, cs := range p.Status.ContainerStatuses {
					if cs.Name == ContainerName && cs.State.Running != nil {
						if ph != nil && ph.running.IsZero() {
							ph.running = time.Now()
						}
						return nil
					}
				}
				why = "its container is not running yet"
			case runtime.StatusStopped:
				return guest.Permanent(errcode.New(errcode.SandboxNotRunning, "sandbox %s has stopped (pod phase %s%s)", id, p.Status.Phase, podReason(p)))
			default:
				if msg, ok := unschedulable(p); ok {
					// No node has room now. If none would even with every sandbox pod gone,
					// no wait helps: fail with the scheduler's word. Else room comes back as
					// other sandboxes end: wait, and a timeout says what the pod waited for.
					if never, err := r.neverPlaceable(ctx, p); err == nil && never {
						return guest.Permanent(errcode.New(errcode.CapacityUnavailable,
							"sandbox %s cannot be placed on the cluster: the scheduler says %q, and no node has that much cpu and memory even without sandboxes; ask for less cpu or memory, or add bigger nodes", id, msg).
							With("reason", "unschedulable").With("scheduler", msg))
					}
					why = "its pod waits for room on the cluster (the scheduler: " + msg + "); sandboxes that end make room"
					break
				}
				if reason, hard := waitingReason(p); hard {
					return guest.Permanent(errcode.New(errcode.SandboxNotRunning, "sandbox %s's pod cannot start: %s", id, reason))
				}
				why = "its pod is " + string(p.Status.Phase) + podReason(p)
			}
		}
		if p != nil && w == nil {
			// From the version just seen: no change between the get and the watch is missed.
			var err error
			w, err = r.api.pods(r.cfg.Namespace).Watch(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("metadata.name", id).String(), ResourceVersion: p.ResourceVersion, TimeoutSeconds: ptr(int64(watchTimeout / time.Second))})
			if err != nil {
				w = nil // poll instead, below
			}
		}
		if w == nil {
			p = nil
			select {
			case <-ctx.Done():
				return fmt.Errorf("sandbox %s: %s: %w", id, why, ctx.Err())
			case <-time.After(pollRunning):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: %s: %w", id, why, ctx.Err())
		case ev, ok := <-w.ResultChan():
			np, isPod := ev.Object.(*corev1.Pod)
			switch {
			case ok && (ev.Type == watch.Added || ev.Type == watch.Modified) && isPod && r.mine(np.ObjectMeta, id):
				p = np
			case ok && ev.Type == watch.Bookmark:
			default: // deleted, an error (a version too old), or the watch ended: look again
				w.Stop()
				w, p = nil, nil
			}
		}
	}
}

// unschedulable returns the scheduler's message once it has found no node for pod p (its
// PodScheduled condition False, reason Unschedulable): a create fails then, with that message,
// instead of waiting out its ready timeout for a pod that stays Pending.
func unschedulable(p *corev1.Pod) (string, bool) {
	if p.Spec.NodeName != "" {
		return "", false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message, true
		}
	}
	return "", false
}

// waitingReason is the first container's waiting reason and message, and whether it is hard.
func waitingReason(p *corev1.Pod) (string, bool) {
	for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return fmt.Sprintf("container %s: %s: %s", cs.Name, w.Reason, w.Message), slices.Contains(hardWaiting, w.Reason)
		}
		if term := cs.State.Terminated; term != nil && term.ExitCode != 0 && cs.Name == InstallContainerName {
			return fmt.Sprintf("container %s exited %d: %s %s", cs.Name, term.ExitCode, term.Reason, term.Message), true
		}
	}
	return "", false
}

func podReason(p *corev1.Pod) string {
	if r, _ := waitingReason(p); r != "" {
		return ", " + r
	}
	if p.Status.Reason != "" {
		return ", " + p.Status.Reason + ": " + p.Status.Message
	}
	return ""
}

// openTunnel execs guest-tunnel in the sandbox's container and starts a yamux client on its
// stdio; it returns once the pod side has answered a ping.
func (r *Runtime) openTunnel(ctx context.Context, id string, ph *podPhases) (*yamux.Session, context.CancelFunc, error) {
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	if err := r.waitRunning(ctx, id, ph); err != nil {
		return nil, nil, err
	}
	req := r.api.execRequest(r.cfg.Namespace, id, &corev1.PodExecOptions{Container: ContainerName,
		Command: []string{GuestBinaryPath, "guest-tunnel", "--socket", GuestSocketPath},
		Stdin:   true, Stdout: true, Stderr: true})
	ex, err := remotecommand.NewWebSocketExecutor(r.rest, "GET", req.URL().String())
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: exec: %w", id, err)
	}
	sctx, stop := context.WithCancel(context.Background())
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	stderr := &boundedBuffer{max: maxStderr}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: stderr})
		if err == nil {
			err = io.EOF
		}
		_ = outW.CloseWithError(err)
		_ = inR.CloseWithError(err)
	}()
	conn := &execConn{StdioConn: tunnel.StdioConn{In: outR, Out: inW}, ended: ended, stop: stop}
	sess, err := yamux.Client(conn, tunnel.Config())
	if err != nil {
		stop()
		return nil, nil, err
	}
	pinged := make(chan error, 1)
	go func() { _, err := sess.Ping(); pinged <- err }()
	select {
	case err = <-pinged:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = sess.Close()
		stop()
		select {
		case <-ended:
		case <-time.After(time.Second):
		}
		if msg := stderr.String(); msg != "" {
			err = fmt.Errorf("%w (guest-tunnel: %s)", err, msg)
		}
		return nil, nil, fmt.Errorf("sandbox %s: open the agent tunnel: %w", id, err)
	}
	return sess, func() { _ = sess.Close(); stop() }, nil
}

// execConn is the server's end of the tunnel's exec. Closing it ends the exec cleanly: stdin
// first (guest-tunnel sees EOF and exits, so the exec ends with its status), and only then, or
// after closeGrace, the stream itself.
type execConn struct {
	tunnel.StdioConn
	ended <-chan struct{}
	stop  context.CancelFunc
	once  sync.Once
}

// closeGrace bounds how long a closing tunnel waits for guest-tunnel to exit.
const closeGrace = 2 * time.Second

func (c *execConn) Close() error {
	c.once.Do(func() {
		_ = c.Out.Close()
		select {
		case <-c.ended:
		case <-time.After(closeGrace):
		}
		c.stop()
		_ = c.In.Close()
	})
	return nil
}

// boundedBuffer keeps the first max bytes written to it.
type boundedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(bytes.TrimSpace(b.buf.Bytes()))
}

func encodePod(p *corev1.Pod) ([]byte, error) { return json.Marshal(p) }

func decodePod(b []byte) (*corev1.Pod, error) {
	var p corev1.Pod
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	if p.Name == "" {
		return nil, errors.New("no pod name")
	}
	return &p, nil
}
