package main

import (
	"context"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// newTracing returns the tracer provider of the create trace (docs/TRACE.md): spans exported
// over OTLP/HTTP when the standard OpenTelemetry environment names an endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; the exporter reads the
// rest of its settings, headers and TLS from the same environment), nil otherwise: by default
// nothing is recorded or exported. OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none turn it
// off as they do everywhere.
func newTracing(ctx context.Context, log *slog.Logger) (*sdktrace.TracerProvider, error) {
	if !tracingConfigured(os.Getenv) {
		return nil, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	log.Info("create trace exported over OTLP/HTTP")
	return tp, nil
}

// tracingConfigured reports whether the OpenTelemetry environment (read through getenv) asks
// for traces exported over OTLP.
func tracingConfigured(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	switch e := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))); e {
	case "", "otlp":
	default: // "none", or an exporter this server does not have
		return false
	}
	if p := strings.ToLower(strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") + getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))); p != "" && !strings.HasPrefix(p, "http/protobuf") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}
