package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// TestTracingConfigured: the create trace is exported only when the standard OpenTelemetry
// environment names an OTLP endpoint, and its off switches and an unserved protocol win.
func TestTracingConfigured(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_SERVICE_NAME": "agentbox"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "TRUE"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, true},
	} {
		if got := tracingConfigured(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("tracingConfigured(%v) = %v; want %v", c.env, got, c.want)
		}
	}
}

// TestTracingExportsCreate: with the standard environment naming an OTLP/HTTP endpoint (a
// collector on loopback here), a create's spans reach it, the create span and its steps
// named, by shutdown at the latest.
func TestTracingExportsCreate(t *testing.T) {
	var mu sync.Mutex
	var names []string
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					names = append(names, sp.Name)
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	tp, err := newTracing(t.Context(), slog.New(slog.DiscardHandler))
	if err != nil || tp == nil {
		t.Fatalf("newTracing = %v, %v; want a provider", tp, err)
	}
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(context.Background())
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{Tracing: tp}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if _, err := svc.Create(t.Context(), sandbox.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := tp.Shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown (the flush): %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{sandbox.SpanCreate, sandbox.SpanCreateRecord, sandbox.SpanCreateRuntime, sandbox.SpanCreateAgent} {
		if !slices.Contains(names, want) {
			t.Errorf("the collector got spans %v; %s is missing", names, want)
		}
	}
}
