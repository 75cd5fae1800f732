// Package pglab gives tests a throwaway Postgres: one server per test binary, started from
// Debian's postgresql binaries (initdb, postgres) on a unix socket only, with a fresh database
// per test. When AGENTBOX_TEST_POSTGRES holds a DSN, that server is used instead (its user must
// be allowed to CREATE DATABASE). Without either, tests that need Postgres skip, naming why —
// or fail, when AGENTBOX_TEST_REQUIRE_POSTGRES is set (make test sets it).
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pglab.Main(m)) }
//
// and call pglab.DSN(t) for an empty database that is dropped when the test ends. The server
// starts at the first DSN call and stops when Main's tests are over.
package pglab

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names the variable holding the DSN of an existing Postgres to test against.
const EnvDSN = "AGENTBOX_TEST_POSTGRES"

// EnvRequire, when set (make test sets it), makes DSN fail a test instead of skipping it when
// no Postgres can be had, so that a missing server is never counted as a pass.
const EnvRequire = "AGENTBOX_TEST_REQUIRE_POSTGRES"

// BinDir is where Debian's postgresql-15 package puts the server's binaries.
var BinDir = "/usr/lib/postgresql/15/bin"

// Server is a running Postgres the tests may create databases on.
type Server struct {
	admin string              // DSN of a database to run CREATE/DROP DATABASE from
	dir   string              // the throwaway server's directory ("" for AGENTBOX_TEST_POSTGRES)
	cred  *syscall.Credential // who runs the server: "postgres" when this process is root
	cmd   *exec.Cmd
	done  chan struct{}
	n     atomic.Int64
}

var (
	mu      sync.Mutex
	mainRan bool    // Main is running the tests
	started bool    // the server was asked for (DSN's first call)
	server  *Server // the server, once started
	skipWhy string  // why there is none, once started
)

// Runner is what Main runs: a *testing.M, or one wrapped (by a leak check, for example).
type Runner interface{ Run() int }

// Main runs m and then stops and removes the test binary's Postgres if a test started one (the
// server starts on the first DSN call, so a test binary that never asks pays nothing). It
// returns m.Run's code.
func Main(m Runner) int {
	mu.Lock()
	mainRan = true
	mu.Unlock()
	code := m.Run()
	mu.Lock()
	s := server
	server, skipWhy = nil, "the tests are over"
	mu.Unlock()
	if s != nil {
		if err := s.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pglab:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// get returns the test binary's server, starting it on the first call.
func get() (*Server, string) {
	mu.Lock()
	defer mu.Unlock()
	if !mainRan {
		return nil, "pglab.Main does not run this test binary's tests (call it from TestMain)"
	}
	if !started {
		started = true
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		s, err := Start(ctx)
		cancel()
		server = s
		if err != nil {
			skipWhy = err.Error()
		}
	}
	return server, skipWhy
}

// DSN returns the DSN of a new, empty database, dropped when t ends. It skips t when no
// Postgres is available (neither AGENTBOX_TEST_POSTGRES nor Debian's binaries), or fails it
// when AGENTBOX_TEST_REQUIRE_POSTGRES is set.
func DSN(t testing.TB) string {
	t.Helper()
	s, why := get()
	if s == nil {
		if os.Getenv(EnvRequire) != "" {
			t.Fatalf("no Postgres (%s is set, so this fails instead of skipping): %s", EnvRequire, why)
		}
		t.Skip("no Postgres: " + why)
	}
	dsn, err := s.CreateDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.DropDatabase(ctx, dsn); err != nil {
			t.Errorf("pglab: %v", err)
		}
	})
	return dsn
}

// Start returns the Postgres of AGENTBOX_TEST_POSTGRES if set, else starts a throwaway one.
func Start(ctx context.Context) (*Server, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		s := &Server{admin: dsn}
		if err := s.ping(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", EnvDSN, err)
		}
		return s, nil
	}
	initdb := filepath.Join(BinDir, "initdb")
	if _, err := os.Stat(initdb); err != nil {
		return nil, fmt.Errorf("set %s, or install Debian's postgresql-15 (%s: %w)", EnvDSN, initdb, err)
	}
	removeStale()
	dir, err := os.MkdirTemp("", dirPattern)
	if err != nil {
		return nil, fmt.Errorf("pglab: %w", err)
	}
	s := &Server{dir: dir, done: make(chan struct{})}
	if err := s.start(ctx); err != nil {
		s.kill()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pglab: %w", err)
	}
	return s, nil
}

// dirPattern names a throwaway server's directory in the temp dir.
const dirPattern = "agentbox-pglab-"

// staleAfter is how old a server directory without a running server must be before a later
// Start removes it: a test binary that died (a panic, a kill) stops its server (SIGQUIT on the
// binary's death) but cannot remove its directory.
const staleAfter = 10 * time.Minute

// removeStale removes the directories of throwaway servers that no longer run: no
// postmaster.pid (Postgres removes it when it stops, even on an immediate shutdown) and
// untouched for staleAfter (a server starting right now has none yet, but a fresh mtime).
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPattern+"*"))
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < staleAfter {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "data", "postmaster.pid")); err == nil {
			continue // a server runs there
		}
		if log, err := os.Stat(filepath.Join(d, "postgres.log")); err == nil && time.Since(log.ModTime()) < staleAfter {
			continue
		}
		_ = os.RemoveAll(d)
	}
}

// start runs initdb and the server, as the unprivileged user "postgres" when this process is
// root (Postgres refuses to run as root).
func (s *Server) start(ctx context.Context) error {
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("running as root needs the user postgres to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(s.dir, uid, gid); err != nil {
			return err
		}
	}
	if err := os.Chmod(s.dir, 0o755); err != nil { // the socket must be reachable by this process
		return err
	}
	s.cred = cred
	init := s.command("initdb", "-D", filepath.Join(s.dir, "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := init.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	return s.launch(ctx)
}

// command is one of Postgres's binaries, run as s.cred in its own process group.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(BinDir, name), args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"LC_ALL=C", "PATH=/usr/bin:/bin", "HOME=" + s.dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	return cmd
}

// launch starts the server on its data directory and waits until it accepts connections.
func (s *Server) launch(ctx context.Context) error {
	data := filepath.Join(s.dir, "data")
	logf, err := os.OpenFile(filepath.Join(s.dir, "postgres.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	// A test server: no durability (fsync off), unix socket only, room for parallel tests.
	s.done = make(chan struct{})
	s.cmd = s.command("postgres", "-D", data, "-k", s.dir, "-c", "listen_addresses=",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=32MB")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// The server dies with this test binary even if it is killed (SIGQUIT: immediate stop).
	s.cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	done := s.done
	go func() { _ = s.cmd.Wait(); close(done) }()
	s.admin = (&url.URL{Scheme: "postgres", User: url.User("postgres"), Path: "/postgres",
		RawQuery: url.Values{"host": {s.dir}, "sslmode": {"disable"}}.Encode()}).String()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := s.ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
			return fmt.Errorf("postgres exited: %s", log)
		case <-ctx.Done():
			return fmt.Errorf("postgres did not start: %w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections in 60 s: %w", err)
		}
	}
}

func (s *Server) ping(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.admin)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// CreateDatabase creates an empty database and returns its DSN.
func (s *Server) CreateDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("agentbox_test_%d_%d", os.Getpid(), s.n.Add(1))
	conn, err := pgx.Connect(ctx, s.admin)
	if err != nil {
		return "", fmt.Errorf("pglab: create database: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("pglab: create database %s: %w", name, err)
	}
	return withDatabase(s.admin, name)
}

// DropDatabase drops the database of dsn, ending its connections.
func (s *Server) DropDatabase(ctx context.Context, dsn string) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, s.admin)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", cfg.Database, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{cfg.Database}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", cfg.Database, err)
	}
	return nil
}

// withDatabase returns dsn (URL or key=value form) naming database name instead.
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("pglab: %w", err)
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	return dsn + " dbname=" + name, nil
}

// Restart stops the test binary's throwaway Postgres with a fast shutdown (committed
// transactions are kept; clients' connections are cut) and starts it again on the same data,
// as an operator's restart would. The Postgres of AGENTBOX_TEST_POSTGRES is not the tests' to
// restart: an error says so.
func Restart(ctx context.Context) error {
	s, why := get()
	if s == nil {
		return fmt.Errorf("pglab: no Postgres: %s", why)
	}
	if s.dir == "" {
		return fmt.Errorf("pglab: the Postgres of %s is not restarted by tests", EnvDSN)
	}
	mu.Lock()
	defer mu.Unlock()
	_ = s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.kill()
	}
	return s.launch(ctx)
}

// Stop stops a throwaway server and removes its directory; for AGENTBOX_TEST_POSTGRES it does
// nothing.
func (s *Server) Stop() error {
	if s.dir == "" {
		return nil
	}
	var errs []error
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			errs = append(errs, errors.New("postgres did not stop in 30 s; killed"))
			s.kill()
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (s *Server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
}

// AdminDSN returns the DSN of the test binary's server's maintenance database ("" without one).
func AdminDSN() string {
	mu.Lock()
	defer mu.Unlock()
	if server == nil {
		return ""
	}
	return server.admin
}
